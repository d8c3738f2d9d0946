//! `iolift accelfs` end to end: mkfs, cp-in / cp-out, ls, and kill -9 of a
//! copy in progress: fsck then finds no error and every hard-synced byte is
//! there (the crash ordering of iolift_direct::fs); `fsck --repair` frees
//! what the kill leaked.

use iolift_testkit::{write_random_file, Rng};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn iolift() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iolift"))
}

fn ok(c: &mut Command) -> Output {
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{c:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn fsck(img: &Path, repair: bool) -> String {
    let mut c = iolift();
    c.args(["accelfs", "fsck"]).arg(img);
    if repair {
        c.arg("--repair");
    }
    let o = ok(&mut c);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(!out.contains("error:"), "fsck found errors:\n{out}");
    out
}

fn cp_out(img: &Path, src: &str, dst: &Path) {
    ok(iolift()
        .args(["accelfs", "cp-out"])
        .arg(img)
        .arg(src)
        .arg(dst));
}

#[test]
fn kill_during_copies_leaves_a_consistent_fs_with_synced_bytes() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    ok(iolift()
        .args(["accelfs", "mkfs", "--size", "160M", "--block-size", "8K"])
        .arg(&img));
    let mut rng = Rng::new(7);
    let mut complete: Vec<(String, std::path::PathBuf)> = Vec::new();
    for round in 0..5 {
        let src = d.path().join(format!("src{round}"));
        write_random_file(&src, 20 << 20, 100 + round);
        let name = format!("/f{round}");
        let kill_after = 1 + rng.below(10);
        let mut child = iolift()
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
        ok(iolift()
            .args(["accelfs", "cp-in", "--force"])
            .arg(&img)
            .arg(&src)
            .arg(&name));
        complete.push((name, src));
    }
    let r = fsck(&img, true);
    println!("{r}");
    let r = fsck(&img, false);
    assert!(!r.contains("leaked"), "leaks left after --repair:\n{r}");
    assert!(r.contains("5 files"), "{r}");
    let ls = ok(iolift().args(["accelfs", "ls"]).arg(&img));
    let ls = String::from_utf8(ls.stdout).unwrap();
    for i in 0..5 {
        assert!(ls.contains(&format!("{} f{i}\n", 20 << 20)), "ls:\n{ls}");
    }
}

#[test]
fn bad_images_and_arguments_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("fs.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let o = iolift().args(["accelfs", "ls"]).arg(&img).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("bad magic"), "{e}");
    let o = iolift()
        .args(["accelfs", "mkfs", "--block-size", "3K", "--size", "8M"])
        .arg(&img)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("power of two"));
    ok(iolift().args(["accelfs", "mkfs", "--size", "8M"]).arg(&img));
    let o = iolift()
        .args(["accelfs", "cp-out"])
        .arg(&img)
        .args(["/nope", "-"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such file"));
}
