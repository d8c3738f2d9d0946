//! A check of the engine's table files, for reading a whole database back
//! (`iolift kv dump`).
//!
//! rusty-leveldb's table iterator skips a block that fails its checksum
//! and goes on with the next, and a damaged footer or index can make it
//! see a few blocks of a table or panic: a dump of a damaged database
//! printed fewer keys and exited 0. This check reads every table
//! (`*.ldb`, `*.sst`) through the database's `Env` and verifies its
//! footer, its index and metaindex blocks and every data block the index
//! names, so that damage is an error naming the file and the offset.
//!
//! The format (LevelDB's): a 48-byte footer (the metaindex and index
//! block handles as varints, zero padding, the magic number
//! 0xdb4775248b80fb57 little-endian); every block is followed by a
//! 1-byte compression type and the masked CRC-32C of the block then that
//! byte; a block's entries are (shared key length, unshared key length,
//! value length as varints, the key's unshared bytes, the value) and it
//! ends with the restart offsets (u32 each) and their count (u32); an
//! index entry's value is a data block's handle (offset, size as varints).

use crate::logcheck::{check_files, unmask};
use rusty_leveldb::compressor::{Compressor, SnappyCompressor};
use rusty_leveldb::env::Env;
use std::path::Path;

const FOOTER: usize = 48;
const MAGIC: u64 = 0xdb47_7524_8b80_fb57;
const TRAILER: usize = 5;

fn varint(b: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&x) = b.get(*at) else {
            return Err("varint runs past its block".into());
        };
        *at += 1;
        v |= ((x & 0x7f) as u64) << shift;
        if x & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes".into())
}

/// A block handle at `at` of `b`: (offset, size).
fn handle(b: &[u8], at: &mut usize) -> Result<(usize, usize), String> {
    let off = varint(b, at)?;
    let size = varint(b, at)?;
    Ok((off as usize, size as usize))
}

/// CRC-32C of a block followed by its compression type (the other order
/// from a log record's).
fn block_crc(data: &[u8], kind: u8) -> u32 {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.extend_from_slice(data);
    v.push(kind);
    iolift_direct::fs::layout::crc32c(&v)
}

/// The block `(off, size)` of `t`, its trailer checked: its compression
/// type (0 none, 1 snappy) and its bytes as stored.
fn block<'a>(
    t: &'a [u8],
    (off, size): (usize, usize),
    what: &str,
) -> Result<(u8, &'a [u8]), String> {
    let end = off
        .checked_add(size)
        .and_then(|e| e.checked_add(TRAILER))
        .filter(|&e| e <= t.len())
        .ok_or_else(|| format!("{what} block at {off} ({size} bytes) runs past the file"))?;
    let data = &t[off..off + size];
    let kind = t[off + size];
    let stored = u32::from_le_bytes(t[off + size + 1..end].try_into().unwrap());
    if block_crc(data, kind) != unmask(stored) {
        return Err(format!("{what} block at {off}: checksum mismatch"));
    }
    if kind > 1 {
        return Err(format!("{what} block at {off}: compression type {kind}"));
    }
    Ok((kind, data))
}

/// The values of an uncompressed block's entries.
fn values(b: &[u8]) -> Result<Vec<&[u8]>, String> {
    if b.len() < 4 {
        return Err("block shorter than its restart count".into());
    }
    let n = u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap()) as usize;
    let entries_end = n
        .checked_mul(4)
        .and_then(|r| b.len().checked_sub(4 + r))
        .ok_or_else(|| format!("{n} restarts do not fit the block"))?;
    let mut at = 0;
    let mut out = Vec::new();
    while at < entries_end {
        let _shared = varint(b, &mut at)?;
        let unshared = varint(b, &mut at)? as usize;
        let len = varint(b, &mut at)? as usize;
        let end = at
            .checked_add(unshared)
            .and_then(|e| e.checked_add(len))
            .filter(|&e| e <= entries_end)
            .ok_or("entry runs past its block")?;
        out.push(&b[end - len..end]);
        at = end;
    }
    Ok(out)
}

/// Checks one table's bytes: footer, metaindex and index blocks (read,
/// decompressed when snappy wrote them) and every block they name (the
/// filter block, the data blocks: their checksums).
pub fn check_table(t: &[u8]) -> Result<(), String> {
    if t.len() < FOOTER {
        return Err(format!("{} bytes: shorter than a table's footer", t.len()));
    }
    let f = &t[t.len() - FOOTER..];
    if u64::from_le_bytes(f[40..].try_into().unwrap()) != MAGIC {
        return Err("footer: not a table (bad magic)".into());
    }
    let mut at = 0;
    let meta = handle(f, &mut at).map_err(|e| format!("footer: {e}"))?;
    let index = handle(f, &mut at).map_err(|e| format!("footer: {e}"))?;
    // The metaindex names the filter block, the index every data block.
    for (h, what, named) in [(meta, "metaindex", "filter"), (index, "index", "data")] {
        let b = match block(t, h, what)? {
            (0, b) => b.to_vec(),
            (_, b) => SnappyCompressor
                .decode(b.to_vec())
                .map_err(|e| format!("{what} block at {}: {e}", h.0))?,
        };
        for v in values(&b).map_err(|e| format!("{what} block at {}: {e}", h.0))? {
            let mut at = 0;
            let h = handle(v, &mut at).map_err(|e| format!("{what} entry: {e}"))?;
            block(t, h, named)?;
        }
    }
    Ok(())
}

/// Checks every table file in the database directory `db` through `env`;
/// the error names the file.
pub fn check_tables(env: &dyn Env, db: &Path) -> Result<(), String> {
    check_files(env, db, &["ldb", "sst"], "table", |b| {
        check_table(b).map_err(|e| format!("damaged: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusty_leveldb::PosixDiskEnv;

    /// A database of the engine's own tables (small memtables: several
    /// tables of many blocks each), compressed with `compressor`.
    fn tables(dir: &Path, compressor: u8) -> Vec<std::path::PathBuf> {
        crate::logcheck::tests::engine_files(dir, 4000, 64 << 10, compressor, "ldb")
    }

    #[test]
    fn snappy_tables_are_read_too() {
        let d = tempfile::tempdir().unwrap();
        let t = tables(d.path(), 1);
        let good = std::fs::read(&t[0]).unwrap();
        check_table(&good).unwrap();
        let mut b = good.clone();
        b[good.len() / 2] ^= 4;
        assert!(check_table(&b).is_err());
    }

    #[test]
    fn every_changed_byte_of_a_table_is_found() {
        let d = tempfile::tempdir().unwrap();
        let t = tables(d.path(), 0);
        assert!(!t.is_empty());
        let env = PosixDiskEnv::new();
        check_tables(&env, d.path()).unwrap();
        let good = std::fs::read(&t[0]).unwrap();
        check_table(&good).unwrap();
        // Every byte of the table is covered by a checksum or checked
        // (the footer's padding aside).
        let pad = {
            let f = &good[good.len() - FOOTER..];
            let mut at = 0;
            handle(f, &mut at).unwrap();
            handle(f, &mut at).unwrap();
            good.len() - FOOTER + at..good.len() - 8
        };
        for i in (0..good.len()).filter(|i| !pad.contains(i)) {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(check_table(&b).is_err(), "byte {i} of {}", good.len());
        }
        for n in [0, 10, good.len() / 2, good.len() - 1] {
            assert!(check_table(&good[..n]).is_err(), "cut at {n}");
        }
        let mut b = good.clone();
        b[100] ^= 1;
        std::fs::write(&t[0], &b).unwrap();
        let e = check_tables(&env, d.path()).unwrap_err();
        assert!(e.contains(&t[0].display().to_string()), "{e}");
    }
}
