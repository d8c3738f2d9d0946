//! A check of the engine's write-ahead logs before the database is opened.
//!
//! rusty-leveldb replays a log until the first record that fails to read
//! and drops the rest without a word: one damaged byte early in a log
//! loses every write after it, and the database opens as if nothing were
//! wrong. This check reads each `*.log` file of the database directory
//! through the same `Env` and refuses a log that is damaged *before* its
//! end, naming the file and the offset. What a crash can leave at the end
//! (a record cut short, a last record whose checksum fails, unwritten
//! zero bytes) is accepted, as the engine accepts it: that write was never
//! acknowledged as synced.
//!
//! The format (LevelDB's): 32 KiB blocks; a record is a 7-byte header
//! (masked CRC-32C of the type byte and the data, u32 LE; data length, u16
//! LE; type: 1 full, 2 first, 3 middle, 4 last) and its data, never across
//! a block end; fewer than 7 bytes left in a block are zero padding.

use rusty_leveldb::env::Env;
use std::io::Read;
use std::path::Path;

const BLOCK: usize = 32 * 1024;
const HEADER: usize = 7;

/// LevelDB's masked CRC (so that a CRC of data holding CRCs is not
/// itself a CRC of zeros).
pub(crate) fn unmask(m: u32) -> u32 {
    let r = m.wrapping_sub(0xa282_ead8);
    r.rotate_left(15)
}

/// CRC-32C of the type byte followed by the data.
fn crc32c(kind: u8, data: &[u8]) -> u32 {
    let mut v = Vec::with_capacity(1 + data.len());
    v.push(kind);
    v.extend_from_slice(data);
    iolift_direct::fs::layout::crc32c(&v)
}

/// Where and why a log is damaged before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub offset: usize,
    pub why: String,
}

/// Checks one log's bytes: `Ok` when every record reads back, or only its
/// tail is cut short, fails its checksum or is zeros.
pub fn check_log(b: &[u8]) -> Result<(), Damage> {
    let mut p = 0;
    while p < b.len() {
        let left = BLOCK - p % BLOCK;
        if left < HEADER {
            p += left;
            continue;
        }
        let bad = |why: String| Damage { offset: p, why };
        // A header cut short, or zeros (unwritten) from here on: the end.
        if b.len() - p < HEADER || b[p..].iter().all(|&x| x == 0) {
            return Ok(());
        }
        let crc = u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
        let len = u16::from_le_bytes(b[p + 4..p + 6].try_into().unwrap()) as usize;
        let kind = b[p + 6];
        let end = p + HEADER + len;
        let fault = if HEADER + len > left {
            Some(format!("record of {len} bytes crosses its 32 KiB block"))
        } else if !(1..=4).contains(&kind) {
            Some(format!("record type {kind}"))
        } else if end > b.len() {
            // Cut short by the end of the file: a torn tail.
            return Ok(());
        } else if crc32c(kind, &b[p + HEADER..end]) != unmask(crc) {
            Some("checksum mismatch".to_string())
        } else {
            None
        };
        if let Some(f) = fault {
            // The last record, or one followed only by zeros, may be torn.
            let after = end.min(b.len());
            if after >= b.len() || b[after..].iter().all(|&x| x == 0) {
                return Ok(());
            }
            return Err(bad(format!(
                "{f}, with {} bytes of log after it",
                b.len() - after
            )));
        }
        p = end;
    }
    Ok(())
}

/// Reads every file of the database directory `db` whose extension is
/// one of `exts` through `env` and runs `check` on its bytes; the error
/// (`what FILE: ...`) names the file. No directory yet: a new database,
/// nothing to check. (The log and the table checks share this.)
pub(crate) fn check_files(
    env: &dyn Env,
    db: &Path,
    exts: &[&str],
    what: &str,
    check: impl Fn(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let Ok(names) = env.children(db) else {
        return Ok(());
    };
    for name in names {
        if name
            .extension()
            .is_none_or(|e| !exts.iter().any(|x| e == *x))
        {
            continue;
        }
        let path = db.join(&name);
        let mut bytes = Vec::new();
        env.open_sequential_file(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes).map_err(Into::into))
            .map_err(|e| format!("{what} {}: cannot read: {e}", path.display()))?;
        check(&bytes).map_err(|e| format!("{what} {} {e}", path.display()))?;
    }
    Ok(())
}

/// Checks every `*.log` file in the database directory `db` through
/// `env`; the error names the file and the offset.
pub fn check_logs(env: &dyn Env, db: &Path) -> Result<(), String> {
    check_files(env, db, &["log"], "log", |b| {
        check_log(b).map_err(|d| {
            format!(
                "damaged at offset {}: {} (the engine would drop every write from there on; \
                 refusing to open the database)",
                d.offset, d.why
            )
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rusty_leveldb::PosixDiskEnv;

    /// A database the engine wrote on the host (`puts` keys of 100-byte
    /// values, memtables of `write_buffer` bytes, blocks compressed with
    /// `compressor`), closed; its files with extension `ext`.
    pub(crate) fn engine_files(
        dir: &Path,
        puts: u32,
        write_buffer: usize,
        compressor: u8,
        ext: &str,
    ) -> Vec<std::path::PathBuf> {
        use rusty_leveldb::{Options, DB};
        let o = Options {
            env: std::rc::Rc::new(Box::new(PosixDiskEnv::new())),
            write_buffer_size: write_buffer,
            compressor,
            ..Options::default()
        };
        let mut db = DB::open(dir, o).unwrap();
        for i in 0..puts {
            db.put(format!("key{i:08}").as_bytes(), &[i as u8; 100])
                .unwrap();
        }
        db.close().unwrap();
        drop(db);
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect()
    }

    /// A log written by the engine itself: 3000 puts of 100-byte values
    /// (about 10 blocks), the database left without a compaction.
    fn engine_log(dir: &Path) -> Vec<u8> {
        let logs = engine_files(dir, 3000, 64 << 20, 0, "log");
        std::fs::read(&logs[0]).unwrap()
    }

    #[test]
    fn damage_before_the_end_is_found_a_torn_tail_is_not() {
        let d = tempfile::tempdir().unwrap();
        let log = engine_log(d.path());
        assert!(log.len() > 8 * BLOCK, "{} bytes", log.len());
        check_log(&log).unwrap();
        // Every cut is a torn tail (a crash while appending).
        for n in (0..log.len()).step_by(997).chain([log.len() - 1]) {
            check_log(&log[..n]).unwrap_or_else(|e| panic!("cut at {n}: {e:?}"));
        }
        // Zeros after the last record (unwritten space) are fine too.
        check_log(&[&log[..], &[0u8; 5000][..]].concat()).unwrap();
        // A changed byte anywhere before the last record is damage.
        let last = log.len() - 200;
        for i in (0..last).step_by(1009) {
            let mut b = log.clone();
            b[i] ^= 0x40;
            let e = check_log(&b).expect_err(&format!("byte {i} changed"));
            assert!(e.offset <= i && e.why.contains("after it"), "{i}: {e:?}");
        }
        // In the last record it reads as a torn tail.
        let mut b = log.clone();
        *b.last_mut().unwrap() ^= 1;
        check_log(&b).unwrap();
    }

    #[test]
    fn check_logs_names_the_file_and_leaves_other_files_alone() {
        let d = tempfile::tempdir().unwrap();
        let log = engine_log(d.path());
        let env = PosixDiskEnv::new();
        check_logs(&env, d.path()).unwrap();
        let name = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "log"))
            .unwrap();
        let mut b = log.clone();
        b[150] ^= 0xff;
        std::fs::write(&name, &b).unwrap();
        let e = check_logs(&env, d.path()).unwrap_err();
        assert!(
            e.contains(&name.display().to_string()) && e.contains("damaged at offset"),
            "{e}"
        );
        check_logs(&env, &d.path().join("none")).unwrap();
    }
}
