//! Ceph's little-endian wire encoding: a bounds-checked reader whose
//! errors name the field and the byte offset, the matching writer helpers,
//! and the CRC32C (Castagnoli) Ceph seals full OSDMaps with.

use crate::{OsdMapError, Result};

/// Reads a byte slice front to back. Offsets in errors are from the start
/// of the whole map (`base` is added), so a message points at the byte.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            buf,
            pos: 0,
            base: 0,
        }
    }

    /// Absolute offset of the next byte.
    pub fn offset(&self) -> usize {
        self.base + self.pos
    }

    pub fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(OsdMapError::Truncated {
                offset: self.offset(),
                field: field.to_string(),
                needed: n,
                left: self.left(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }

    /// The next byte, not consumed.
    pub fn peek_u8(&self, field: &str) -> Result<u8> {
        match self.buf.get(self.pos) {
            Some(&b) => Ok(b),
            None => Err(OsdMapError::Truncated {
                offset: self.offset(),
                field: field.to_string(),
                needed: 1,
                left: 0,
            }),
        }
    }

    pub fn u16(&mut self, field: &str) -> Result<u16> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self, field: &str) -> Result<u32> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    pub fn i32(&mut self, field: &str) -> Result<i32> {
        Ok(self.u32(field)? as i32)
    }

    pub fn u64(&mut self, field: &str) -> Result<u64> {
        let b = self.take(8, field)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    pub fn i64(&mut self, field: &str) -> Result<i64> {
        Ok(self.u64(field)? as i64)
    }

    /// A `u32` element count, checked against the bytes left assuming each
    /// element takes at least `min_elem` bytes, so that a corrupt count can
    /// never cause a huge allocation.
    pub fn count(&mut self, field: &str, min_elem: usize) -> Result<usize> {
        let at = self.offset();
        let n = self.u32(field)? as usize;
        let need = n.saturating_mul(min_elem.max(1));
        if need > self.left() {
            return Err(OsdMapError::Truncated {
                offset: at,
                field: format!("{field} ({n} entries)"),
                needed: need,
                left: self.left(),
            });
        }
        Ok(n)
    }

    /// A length-prefixed string (`u32` length, bytes); must be UTF-8.
    pub fn string(&mut self, field: &str) -> Result<String> {
        let n = self.count(field, 1)?;
        let at = self.offset();
        let b = self.take(n, field)?;
        String::from_utf8(b.to_vec()).map_err(|_| OsdMapError::Corrupt {
            offset: at,
            field: field.to_string(),
            msg: "not UTF-8".into(),
        })
    }

    /// A length-prefixed blob (`bufferlist`): its bytes.
    pub fn blob(&mut self, field: &str) -> Result<&'a [u8]> {
        let n = self.count(field, 1)?;
        self.take(n, field)
    }

    /// `ENCODE_START` header: struct_v, compat_v, length. Checks that the
    /// length fits, and returns a reader over exactly the struct's body.
    pub fn header(&mut self, field: &str) -> Result<(u8, u8, Reader<'a>)> {
        let v = self.u8(field)?;
        let compat = self.u8(field)?;
        let at = self.offset();
        let len = self.u32(field)? as usize;
        if len > self.left() {
            return Err(OsdMapError::Truncated {
                offset: at,
                field: format!("{field} (struct v{v} of {len} bytes)"),
                needed: len,
                left: self.left(),
            });
        }
        let base = self.offset();
        let body = self.take(len, field)?;
        Ok((
            v,
            compat,
            Reader {
                buf: body,
                pos: 0,
                base,
            },
        ))
    }

    /// Skip one `ENCODE_START` struct; returns its whole encoding.
    pub fn skip_struct(&mut self, field: &str) -> Result<&'a [u8]> {
        let start = self.pos;
        self.header(field)?;
        Ok(&self.buf[start..self.pos])
    }

    /// The bytes from `start` (a position of this reader) to here.
    pub fn since(&self, start: usize) -> &'a [u8] {
        &self.buf[start..self.pos]
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// Error unless every byte was read.
    pub fn finish(&self, field: &str) -> Result<()> {
        if self.left() != 0 {
            return Err(OsdMapError::Corrupt {
                offset: self.offset(),
                field: field.to_string(),
                msg: format!("{} unread bytes at the end", self.left()),
            });
        }
        Ok(())
    }

    pub fn corrupt(&self, at: usize, field: &str, msg: impl Into<String>) -> OsdMapError {
        OsdMapError::Corrupt {
            offset: at,
            field: field.to_string(),
            msg: msg.into(),
        }
    }
}

pub fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_string(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

/// Start an `ENCODE_START` struct; returns the position of its length,
/// for [`end_struct`].
pub fn begin_struct(out: &mut Vec<u8>, v: u8, compat: u8) -> usize {
    out.push(v);
    out.push(compat);
    let at = out.len();
    put_u32(out, 0);
    at
}

/// Fill in the length of a struct started with [`begin_struct`].
pub fn end_struct(out: &mut [u8], len_at: usize) {
    let len = (out.len() - len_at - 4) as u32;
    out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
}

/// CRC32C (Castagnoli, reflected) continuing from `crc`, without the
/// final inversion: Ceph's `ceph_crc32c(crc, data, len)`. A map's CRC is
/// started with `u32::MAX`. The crc32c crate (the CPU's crc32 instruction
/// where it has one) inverts on the way in and out, hence the two `!`.
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    !::crc32c::crc32c_append(!crc, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standard CRC-32C check value of "123456789" is 0xe3069283 with
    /// the initial and final inversion; without the final one it is the
    /// complement.
    #[test]
    fn crc32c_check_value() {
        assert_eq!(!crc32c(u32::MAX, b"123456789"), 0xe306_9283);
        // continuing over a split equals one pass
        let a = crc32c(u32::MAX, b"1234");
        assert_eq!(crc32c(a, b"56789"), crc32c(u32::MAX, b"123456789"));
    }

    #[test]
    fn reader_errors_name_field_and_offset() {
        let mut r = Reader::new(&[1, 2, 3]);
        r.u8("a").unwrap();
        let e = r.u32("epoch").unwrap_err().to_string();
        assert!(e.contains("epoch") && e.contains("byte 1"), "{e}");
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0x7f, 0]);
        let e = r.count("pools", 8).unwrap_err().to_string();
        assert!(e.contains("pools"), "{e}");
        let mut r = Reader::new(&[9, 1, 100, 0, 0, 0, 1]);
        let e = r.header("client data").unwrap_err().to_string();
        assert!(e.contains("client data") && e.contains("100"), "{e}");
    }

    #[test]
    fn struct_roundtrip() {
        let mut out = Vec::new();
        let at = begin_struct(&mut out, 9, 1);
        put_u32(&mut out, 7);
        put_string(&mut out, "rbd");
        end_struct(&mut out, at);
        let mut r = Reader::new(&out);
        let (v, c, mut body) = r.header("s").unwrap();
        assert_eq!((v, c), (9, 1));
        assert_eq!(body.u32("x").unwrap(), 7);
        assert_eq!(body.string("name").unwrap(), "rbd");
        body.finish("s").unwrap();
        r.finish("all").unwrap();
    }
}
