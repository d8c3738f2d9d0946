//! `iolift accelfs` end to end: mkfs, cp-in / cp-out, ls, and kill -9 of a
//! copy in progress: fsck then finds no error and every hard-synced byte is
//! there (the crash ordering of iolift_direct::fs); `fsck --repair` frees
//! what the kill leaked.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

fn fsck(img: &Path, repair: bool) -> String {
    let mut c = Command::new(iolift_bin());
    c.args(["accelfs", "fsck"]).arg(img);
    if repair {
        c.arg("--repair");
    }
    let out = run_ok(&mut c).stdout;
    assert!(!out.contains("error:"), "fsck found errors:\n{out}");
    out
}

fn cp_out(img: &Path, src: &str, dst: &Path) {
    run_ok(
        Command::new(iolift_bin())
            .args(["accelfs", "cp-out"])
            .arg(img)
            .arg(src)
            .arg(dst),
    );
}

#[test]
fn kill_during_copies_leaves_a_consistent_fs_with_synced_bytes() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    run_ok(
        Command::new(iolift_bin())
            .args(["accelfs", "mkfs", "--size", "160M", "--block-size", "8K"])
            .arg(&img),
    );
    let mut rng = Rng::new(7);
    let mut complete: Vec<(String, std::path::PathBuf)> = Vec::new();
    for round in 0..5 {
        let src = d.path().join(format!("src{round}"));
        write_random_file(&src, 20 << 20, 100 + round);
        let name = format!("/f{round}");
        let kill_after = 1 + rng.below(10);
        let mut child = Command::new(iolift_bin())
            .args(["accelfs", "cp-in", "--sync-every", "1M"])
            .arg(&img)
            .arg(&src)
            .arg(&name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut synced = 0u64;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = 0;
        for l in lines.by_ref() {
            let l = l.unwrap();
            synced = l.strip_prefix("synced ").unwrap().parse().unwrap();
            seen += 1;
            if seen == kill_after {
                break;
            }
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let st = child.wait().unwrap();
        println!("round {round}: killed after {seen} hard syncs ({synced} bytes): {st:?}");
        assert!(synced >= 1 << 20, "round {round}: no sync reported");
        let report = fsck(&img, false);
        println!("{report}");
        // Every hard-synced byte is there, and nothing else differs.
        let out = d.path().join("out");
        cp_out(&img, &name, &out);
        let got = std::fs::read(&out).unwrap();
        let want = std::fs::read(&src).unwrap();
        assert!(
            got.len() as u64 >= synced,
            "round {round}: {} bytes after the kill, {synced} were hard-synced",
            got.len()
        );
        assert!(
            got[..] == want[..got.len()],
            "round {round}: contents differ"
        );
        // Files copied completely before stay intact.
        for (n, s) in &complete {
            cp_out(&img, n, &out);
            assert!(
                std::fs::read(&out).unwrap() == std::fs::read(s).unwrap(),
                "{n} changed"
            );
        }
        // Then copy it completely (replacing the partial one).
        run_ok(
            Command::new(iolift_bin())
                .args(["accelfs", "cp-in", "--force"])
                .arg(&img)
                .arg(&src)
                .arg(&name),
        );
        complete.push((name, src));
    }
    let r = fsck(&img, true);
    println!("{r}");
    let r = fsck(&img, false);
    assert!(!r.contains("leaked"), "leaks left after --repair:\n{r}");
    assert!(r.contains("5 files"), "{r}");
    let ls = run_ok(Command::new(iolift_bin()).args(["accelfs", "ls"]).arg(&img));
    let ls = ls.stdout;
    for i in 0..5 {
        assert!(ls.contains(&format!("{} f{i}\n", 20 << 20)), "ls:\n{ls}");
    }
}

#[test]
fn bad_images_and_arguments_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let o = run_fail(Command::new(iolift_bin()).args(["accelfs", "ls"]).arg(&img));
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stderr.contains("bad magic"), "{}", o.report());
    let o = run_fail(
        Command::new(iolift_bin())
            .args(["accelfs", "mkfs", "--block-size", "3K", "--size", "8M"])
            .arg(&img),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stderr.contains("power of two"), "{}", o.report());
    run_ok(
        Command::new(iolift_bin())
            .args(["accelfs", "mkfs", "--size", "8M"])
            .arg(&img),
    );
    let o = run_fail(
        Command::new(iolift_bin())
            .args(["accelfs", "cp-out"])
            .arg(&img)
            .args(["/nope", "-"]),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stderr.contains("no such file"), "{}", o.report());
}
