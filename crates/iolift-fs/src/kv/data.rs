//! A file's bytes in its data objects: reads (a missing object or the
//! part past an object's end reads as zeros, so holes cost nothing),
//! writes, truncation and removal, each split at object boundaries by
//! [`Layout::pieces`].

use super::meta::{io_err, Layout};
use super::rados::Pool;
use crate::model::{Errno, FsResult};

/// Reads `len` bytes at `off` of file `id` (the caller clamps to the size).
pub fn read(pool: &Pool, l: &Layout, id: u64, off: u64, len: usize) -> FsResult<Vec<u8>> {
    let mut buf = vec![0u8; len];
    for (n, in_obj, at, plen) in l.pieces(off, len as u64) {
        let oid = l.data(id, n);
        match pool.read(&oid, &mut buf[at..at + plen], in_obj) {
            Ok(_) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(io_err("read", &oid, e)),
        }
    }
    Ok(buf)
}

/// Writes `data` at `off` of file `id`.
pub fn write(pool: &Pool, l: &Layout, id: u64, off: u64, data: &[u8]) -> FsResult<()> {
    for (n, in_obj, at, plen) in l.pieces(off, data.len() as u64) {
        let oid = l.data(id, n);
        pool.write(&oid, &data[at..at + plen], in_obj)
            .map_err(|e| io_err("write", &oid, e))?;
    }
    Ok(())
}

/// Shrinks file `id` from `old` to `new` bytes: whole objects past the new
/// end are removed and the last one cut, so a later extension reads zeros.
/// Growing needs no object change (the new bytes are a hole).
pub fn truncate(pool: &Pool, l: &Layout, id: u64, old: u64, new: u64) -> FsResult<()> {
    if new >= old {
        return Ok(());
    }
    for n in l.objects(new)..l.objects(old) {
        remove_one(pool, &l.data(id, n))?;
    }
    if !new.is_multiple_of(l.object_size) {
        let oid = l.data(id, new / l.object_size);
        match pool.trunc(&oid, new % l.object_size) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(io_err("truncate", &oid, e)),
        }
    }
    Ok(())
}

/// Removes every data object of a file of `size` bytes.
pub fn remove(pool: &Pool, l: &Layout, id: u64, size: u64) -> FsResult<()> {
    for n in 0..l.objects(size) {
        remove_one(pool, &l.data(id, n))?;
    }
    Ok(())
}

fn remove_one(pool: &Pool, oid: &str) -> FsResult<()> {
    match pool.remove(oid) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(io_err("remove", oid, e)),
    }
}
