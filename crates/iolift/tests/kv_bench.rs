//! `iolift kv` end to end: db_bench-style runs on an AccelFS image with
//! every key read back (`verify`) and fsck clean, `dump` agreeing with
//! `readseq`; kill -9 during synced writes (`--sync=1` and `fillsync`):
//! fsck finds no error and every write reported synced is there with its
//! value; the same on a loop device; bad input gives one error line.

mod common;
use common::*;
use iolift_testkit::Loop;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs a command that must fail ([`run_fail`]); its error: no panic,
/// one line.
fn error_line(c: &mut Command) -> String {
    let o = run_fail(c);
    assert!(!o.stderr.contains("panicked"), "{}", o.report());
    assert_eq!(
        o.stderr.lines().count(),
        1,
        "one error line: {}",
        o.report()
    );
    o.stderr
}

/// `KEY -> VALUE-HEX` of `iolift kv dump`.
fn dump(img: &Path) -> HashMap<String, String> {
    let out = run_ok(
        Command::new(iolift_bin())
            .args(["kv", "dump", "--image"])
            .arg(img),
    )
    .stdout;
    out.lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            assert_eq!(k.len(), 16, "{l}");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn accelfs_fsck_clean(img: &Path) {
    let out = run_ok(
        Command::new(iolift_bin())
            .args(["accelfs", "fsck"])
            .arg(img),
    )
    .stdout;
    assert!(
        !out.contains("error:") && out.contains(", 0 errors"),
        "{out}"
    );
}

fn verified_run(img: &Path) {
    let out = run_ok(Command::new(iolift_bin())
        .args(["kv", "bench", "--mkfs", "256M", "--num", "4000", "--fsck"])
        .args(["--write_buffer_size", "65536", "--image"])
        .arg(img)
        .arg("--benchmarks=fillseq,verify,fillrandom,overwrite,verify,readseq,readrandom,fillsync,verify")).stdout;
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(" : ")).collect();
    assert_eq!(lines.len(), 9, "{out}");
    for l in &lines {
        let (name, rest) = l.split_once(" : ").unwrap();
        let micros: f64 = rest.split_whitespace().next().unwrap().parse().unwrap();
        assert!(micros > 0.0 && rest.contains("micros/op;"), "{l}");
        match name.trim() {
            "verify" => assert!(
                rest.contains("(4000 keys checked, 0 missing, 0 wrong)"),
                "{l}"
            ),
            "fillseq" | "fillrandom" | "overwrite" | "fillsync" => {
                assert!(rest.ends_with(" MB/s"), "{l}")
            }
            "readrandom" => assert!(rest.contains(" of 4000 found)"), "{l}"),
            "readseq" => {}
            other => panic!("unexpected line {other}: {out}"),
        }
    }
    assert!(out.contains(", 0 errors,"), "fsck after the run: {out}");
    // fillsync left num/1000 keys: dump and fsck agree.
    let d = dump(img);
    assert_eq!(d.len(), 4, "{out}");
    accelfs_fsck_clean(img);
}

#[test]
fn db_bench_runs_are_verified_and_dump_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("kv.img");
    verified_run(&img);
    // --mkfs allocated the new image in full (no holes for O_DIRECT
    // writes to fall into).
    let meta = std::fs::metadata(&img).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.len(), 256 << 20);
    assert!(
        meta.blocks() * 512 >= meta.len(),
        "allocated: {} of {} bytes",
        meta.blocks() * 512,
        meta.len()
    );
    // readseq counts what dump prints.
    let out = run_ok(
        Command::new(iolift_bin())
            .args([
                "kv",
                "bench",
                "--num",
                "4000",
                "--use_existing_db=1",
                "--stats",
                "--image",
            ])
            .arg(&img)
            .arg("--benchmarks=fillrandom,readseq"),
    )
    .stdout;
    // --stats: the engine wrote the fill's 4000 x 116 bytes at least.
    let eng = out
        .lines()
        .find(|l| l.starts_with("stats: engine: "))
        .unwrap_or_else(|| panic!("no engine stats line: {out}"));
    let w: Vec<&str> = eng.split(" writes (").collect();
    let writes: u64 = w[0].rsplit(' ').next().unwrap().parse().unwrap();
    let mib: f64 = w[1].split(' ').next().unwrap().parse().unwrap();
    assert!(writes > 0 && mib * 1048576.0 >= 4000.0 * 116.0, "{eng}");
    assert!(
        out.lines().any(|l| l.starts_with("stats: /proc/self/io: ")),
        "{out}"
    );
    let readseq = out.lines().find(|l| l.starts_with("readseq")).unwrap();
    let d = dump(&img);
    assert!(d.len() > 2000, "{}", d.len());
    // readseq's MB/s covers (16 + 100) bytes per entry it read.
    assert!(readseq.contains("MB/s"), "{readseq}");
    accelfs_fsck_clean(&img);
}

#[test]
fn db_bench_runs_on_a_loop_device() {
    require_root("kv on a loop device needs root (losetup)");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("loop.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let lo = Loop::new(&img);
    verified_run(lo.path());
}

/// Runs a synced fill, kills it after `kill_after` synced writes, then
/// checks fsck and that every reported write is there.
fn kill_during(img: &Path, args: &[&str], kill_after: usize) {
    let mut child = Command::new(iolift_bin())
        .args(["kv", "bench", "--print_synced", "--image"])
        .arg(img)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut synced: HashMap<String, String> = HashMap::new();
    let mut seen = 0;
    for l in BufReader::new(child.stdout.take().unwrap()).lines() {
        let l = l.unwrap();
        let Some(rest) = l.strip_prefix("synced ") else {
            continue;
        };
        let (k, v) = rest.split_once(' ').unwrap();
        synced.insert(k.to_string(), v.to_string());
        seen += 1;
        if seen == kill_after {
            break;
        }
    }
    assert_eq!(seen, kill_after, "the run ended early");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    accelfs_fsck_clean(img);
    let d = dump(img);
    for (k, v) in &synced {
        assert_eq!(d.get(k), Some(v), "synced key {k} after kill -9");
    }
    accelfs_fsck_clean(img);
}

#[test]
fn kill_9_keeps_every_synced_write() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("kv.img");
    let mut rng = Rng::new(17);
    run_ok(
        Command::new(iolift_bin())
            .args(["accelfs", "mkfs", "--size", "256M"])
            .arg(&img),
    );
    // Sequential keys, every write synced; later rounds append to the
    // same database (and recover its log first).
    for round in 0..3 {
        let n = 20 + rng.below(200) as usize;
        let existing = if round == 0 { "0" } else { "1" };
        kill_during(
            &img,
            &[
                "--benchmarks=fillseq",
                "--sync=1",
                "--num=100000",
                &format!("--use_existing_db={existing}"),
                &format!("--seed={round}"),
            ],
            n,
        );
    }
    // db_bench's fillsync: random keys, num/1000 writes each synced.
    let n = 50 + rng.below(200) as usize;
    kill_during(&img, &["--benchmarks=fillsync", "--num=10000000"], n);
    // Soft syncs (no device flush): a killed process loses nothing synced
    // either, the kernel keeps every completed write.
    let n = 50 + rng.below(200) as usize;
    kill_during(
        &img,
        &[
            "--benchmarks=fillsync",
            "--num=10000000",
            "--use_existing_db=1",
            "--accelfs_sync=soft",
        ],
        n,
    );
}

#[test]
fn bad_input_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("kv.img");
    let e = error_line(
        Command::new(iolift_bin())
            .args(["kv", "bench", "--benchmarks=fillseq,nosuch", "--image"])
            .arg(&img),
    );
    assert!(e.contains("--benchmarks") && e.contains("nosuch"), "{e}");
    let e = error_line(
        Command::new(iolift_bin())
            .args(["kv", "bench", "--value_size", "0", "--image"])
            .arg(&img),
    );
    assert!(e.contains("--value_size"), "{e}");
    let e = error_line(
        Command::new(iolift_bin())
            .args(["kv", "bench", "--accelfs_cache_mb", "0", "--image"])
            .arg(&img),
    );
    assert!(e.contains("--accelfs_cache_mb"), "{e}");
    let e = error_line(Command::new(iolift_bin()).args(["kv", "bench", "--num", "10"]));
    assert!(e.contains("--image"), "{e}");
    // Not an AccelFS image.
    iolift_testkit::write_random_file(&img, 1 << 20, 5);
    let e = error_line(
        Command::new(iolift_bin())
            .args(["kv", "bench", "--num", "10", "--image"])
            .arg(&img),
    );
    assert!(e.contains("superblock"), "{e}");
    let e = error_line(
        Command::new(iolift_bin())
            .args(["kv", "dump", "--image"])
            .arg(&img),
    );
    assert!(e.contains("superblock"), "{e}");
}

/// `iolift kv SUB --env posix --db DB`.
fn posix_kv(db: &Path, sub: &str) -> Command {
    let mut c = Command::new(iolift_bin());
    c.args(["kv", sub, "--env", "posix", "--db"]).arg(db);
    c
}

/// The first file in `dir` with extension `ext`.
fn first_with_ext(dir: &Path, ext: &str) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == ext))
        .unwrap_or_else(|| panic!("no *.{ext} in {}", dir.display()))
}

/// A write-ahead log damaged before its end: the engine alone would open
/// the database without the writes from the damage on (it drops the rest
/// of a log at its first bad record); `iolift kv dump` refuses it in one
/// error line naming the log and the offset. A tail cut short by a crash
/// is still accepted.
#[test]
fn a_log_damaged_before_its_end_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let kv = |sub: &str| posix_kv(&db, sub);
    run_ok(kv("bench").args(["--num", "2000", "--benchmarks", "fillseq"]));
    let log = first_with_ext(&db, "log");
    let good = std::fs::read(&log).unwrap();
    assert!(good.len() > 100_000, "{} bytes of log", good.len());
    let mut bad = good.clone();
    bad[good.len() / 3] ^= 0xff;
    std::fs::write(&log, &bad).unwrap();
    let e = error_line(&mut kv("dump"));
    assert!(
        e.contains(&log.display().to_string()) && e.contains("damaged at offset"),
        "{e}"
    );
    // Cut inside its last record, as a crash leaves it: read as before,
    // less that record.
    std::fs::write(&log, &good[..good.len() - 10]).unwrap();
    let out = run_ok(&mut kv("dump")).stdout;
    assert_eq!(out.lines().count(), 1999);
}

/// A table damaged anywhere: the engine alone skips the damaged block
/// (a dump printed fewer keys and exited 0; a damaged footer panicked);
/// `iolift kv dump` refuses it in one error line naming the table.
#[test]
fn a_damaged_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let kv = |sub: &str| posix_kv(&db, sub);
    run_ok(kv("bench").args([
        "--num",
        "20000",
        "--benchmarks",
        "fillseq",
        "--write_buffer_size",
        "262144",
    ]));
    let table = first_with_ext(&db, "ldb");
    let good = std::fs::read(&table).unwrap();
    assert_eq!(run_ok(&mut kv("dump")).stdout.lines().count(), 20000);
    for at in [good.len() / 2, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0xff;
        std::fs::write(&table, &bad).unwrap();
        let e = error_line(&mut kv("dump"));
        assert!(
            e.contains(&table.display().to_string()) && e.contains("damaged"),
            "byte {at}: {e}"
        );
    }
}
