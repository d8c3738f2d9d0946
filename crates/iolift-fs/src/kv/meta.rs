//! What the kv backend keeps per file, and how it is laid out in the
//! store: [`Meta`] (id, size, mode, owner, times) encoded as the value of
//! the file's name in the index object's omap, and the data objects the
//! file's bytes are striped over ([`Layout`]).

use crate::model::{Attr, Errno};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Format version of an encoded [`Meta`] (its first byte).
const VERSION: u8 = 1;
/// Encoded size: version, id, size, mode, uid, gid, three times.
pub const META_LEN: usize = 1 + 8 + 8 + 4 + 4 + 4 + 3 * 12;

/// One file's metadata. `id` names its data objects and is its node id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub id: u64,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

fn put_time(out: &mut Vec<u8>, t: SystemTime) {
    let (s, n) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            // Up to 2^63 s before the epoch: -2^63 is i64::MIN itself.
            let d = e.duration();
            ((d.as_secs() as i64).wrapping_neg(), d.subsec_nanos())
        }
    };
    out.extend_from_slice(&s.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
}

/// The time `put_time` wrote at `b[..12]`; an error names `what` when it
/// is more than a `SystemTime` holds.
fn get_time(b: &[u8], what: &str) -> Result<SystemTime, String> {
    let s = i64::from_le_bytes(b[..8].try_into().unwrap());
    let n = u32::from_le_bytes(b[8..12].try_into().unwrap()).min(999_999_999);
    let t = if s >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(s as u64, n))
    } else {
        UNIX_EPOCH.checked_sub(Duration::new(s.unsigned_abs(), n))
    };
    t.ok_or_else(|| format!("{what} {s} s is out of range"))
}

impl Meta {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(META_LEN);
        v.push(VERSION);
        v.extend_from_slice(&self.id.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.mode.to_le_bytes());
        v.extend_from_slice(&self.uid.to_le_bytes());
        v.extend_from_slice(&self.gid.to_le_bytes());
        put_time(&mut v, self.atime);
        put_time(&mut v, self.mtime);
        put_time(&mut v, self.ctime);
        v
    }

    /// Decodes a value written by [`encode`](Self::encode); an error says
    /// what is wrong with it.
    pub fn decode(b: &[u8]) -> Result<Meta, String> {
        if b.len() != META_LEN {
            return Err(format!("{} bytes, expected {META_LEN}", b.len()));
        }
        if b[0] != VERSION {
            return Err(format!("format version {}, expected {VERSION}", b[0]));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let m = Meta {
            id: u64_at(1),
            size: u64_at(9),
            mode: u32_at(17),
            uid: u32_at(21),
            gid: u32_at(25),
            atime: get_time(&b[29..41], "atime")?,
            mtime: get_time(&b[41..53], "mtime")?,
            ctime: get_time(&b[53..65], "ctime")?,
        };
        if m.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(format!("mode {:o} is not a regular file", m.mode));
        }
        if m.id < super::FIRST_ID {
            return Err(format!("file id {} is reserved", m.id));
        }
        Ok(m)
    }

    pub fn attr(&self, blksize: u32) -> Attr {
        Attr {
            ino: self.id,
            size: self.size,
            blocks: self.size.div_ceil(512),
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            mode: self.mode,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize,
        }
    }
}

/// Names of the objects in the pool, all starting with `prefix` and a dot.
#[derive(Clone, Debug)]
pub struct Layout {
    pub prefix: String,
    /// Bytes per data object (a power of two).
    pub object_size: u64,
}

impl Layout {
    /// The index object: its omap maps file names to encoded [`Meta`].
    pub fn index(&self) -> String {
        format!("{}.index", self.prefix)
    }

    /// Data object `n` of file `id`: bytes `n*object_size ..`.
    pub fn data(&self, id: u64, n: u64) -> String {
        format!("{}.{id:x}.{n:08x}", self.prefix)
    }

    /// Data objects a file of `size` bytes may use.
    pub fn objects(&self, size: u64) -> u64 {
        size.div_ceil(self.object_size)
    }

    /// Splits `off..off+len` into (object, offset in it, position in the
    /// buffer, length) pieces.
    pub fn pieces(&self, off: u64, len: u64) -> impl Iterator<Item = (u64, u64, usize, usize)> {
        let osz = self.object_size;
        let end = off + len;
        let mut pos = off;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let n = pos / osz;
            let in_obj = pos % osz;
            let l = (osz - in_obj).min(end - pos);
            let piece = (n, in_obj, (pos - off) as usize, l as usize);
            pos += l;
            Some(piece)
        })
    }
}

/// A librados error on a data or index object, logged with what failed.
pub fn io_err(what: &str, oid: &str, e: Errno) -> Errno {
    tracing::warn!("kv: {what} {oid}: {e:?}");
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_bad_values_are_named() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123);
        let m = Meta {
            id: 77,
            size: 5 << 30,
            mode: libc::S_IFREG | 0o640,
            uid: 1000,
            gid: 100,
            atime: t,
            mtime: UNIX_EPOCH - Duration::new(5, 7),
            ctime: t,
        };
        let b = m.encode();
        assert_eq!(b.len(), META_LEN);
        assert_eq!(Meta::decode(&b), Ok(m));
        assert!(Meta::decode(&b[..10]).unwrap_err().contains("10 bytes"));
        let mut v = b.clone();
        v[0] = 9;
        assert!(Meta::decode(&v).unwrap_err().contains("version 9"));
        let dir = Meta {
            mode: libc::S_IFDIR | 0o755,
            ..m
        };
        assert!(Meta::decode(&dir.encode()).unwrap_err().contains("regular"));
        let mut v = b.clone();
        // 2^63 s before the epoch is the earliest time; a nanosecond more
        // is out of range.
        v[41..49].copy_from_slice(&i64::MIN.to_le_bytes());
        v[49..53].copy_from_slice(&0u32.to_le_bytes());
        let early = Meta::decode(&v).unwrap();
        assert_eq!(Meta::decode(&early.encode()), Ok(early));
        v[49..53].copy_from_slice(&1u32.to_le_bytes());
        assert!(Meta::decode(&v).unwrap_err().contains("mtime"));
    }

    /// Every value of every byte of an index entry, and a few lengths
    /// around the right one: decode answers (a value or an error naming
    /// the bad part), never panics. Values that decode encode back to
    /// the same meaning.
    #[test]
    fn every_single_byte_corruption_is_decoded_or_named() {
        let m = Meta {
            id: 1 << 40,
            size: 12345,
            mode: libc::S_IFREG | 0o600,
            uid: 7,
            gid: 8,
            atime: UNIX_EPOCH + Duration::new(1_700_000_000, 5),
            mtime: UNIX_EPOCH - Duration::new(3, 4),
            ctime: UNIX_EPOCH,
        };
        let good = m.encode();
        let (mut ok, mut bad) = (0, 0);
        for at in 0..good.len() {
            for byte in 0..=255u8 {
                let mut v = good.clone();
                v[at] = byte;
                match Meta::decode(&v) {
                    Ok(d) => {
                        assert_eq!(Meta::decode(&d.encode()), Ok(d), "byte {at} = {byte}");
                        ok += 1;
                    }
                    Err(e) => {
                        assert!(!e.is_empty());
                        bad += 1;
                    }
                }
            }
        }
        // The version byte and the file type bits are checked; most other
        // bytes are plain numbers.
        assert!(bad >= 255 && ok > bad, "{ok} decoded, {bad} refused");
        for len in [0, 1, META_LEN - 1, META_LEN + 1, 4 * META_LEN] {
            let mut v = good.clone();
            v.resize(len, 0xff);
            let e = Meta::decode(&v).unwrap_err();
            assert!(e.contains(&format!("{len} bytes")), "{e}");
        }
    }

    #[test]
    fn pieces_cover_the_range_object_by_object() {
        let l = Layout {
            prefix: "p".into(),
            object_size: 4096,
        };
        let v: Vec<_> = l.pieces(4000, 5000).collect();
        assert_eq!(
            v,
            vec![(0, 4000, 0, 96), (1, 0, 96, 4096), (2, 0, 4192, 808)]
        );
        assert_eq!(l.pieces(10, 0).count(), 0);
        assert_eq!(l.objects(8193), 3);
        assert_eq!(l.data(0x1f, 2), "p.1f.00000002");
    }
}
