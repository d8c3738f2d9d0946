//! The log file's format: the file and record headers, their encoding and
//! decoding, and the CRC-32C that guards them (little-endian; see
//! `docs/crash.md`).

/// First bytes of a log file.
pub const FILE_MAGIC: &[u8; 8] = b"IOLIFTLW";
/// Format version written and accepted.
pub const VERSION: u32 = 1;
/// Bytes of the file header.
pub const FILE_HEADER: usize = 32;
/// First bytes of every record header.
pub const RECORD_MAGIC: &[u8; 4] = b"LWRC";
/// Bytes of a record header (the payload of a write follows it).
pub const RECORD_HEADER: usize = 48;

/// What a record describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecKind {
    Write = 1,
    Trim = 2,
    WriteZeroes = 3,
    Flush = 4,
}

impl RecKind {
    fn from_u8(v: u8) -> Option<RecKind> {
        Some(match v {
            1 => RecKind::Write,
            2 => RecKind::Trim,
            3 => RecKind::WriteZeroes,
            4 => RecKind::Flush,
            _ => return None,
        })
    }
}

const FLAG_FUA: u8 = 1;
const FLAG_NO_HOLE: u8 = 2;

/// CRC-32C (Castagnoli) of `data`, from the crc32c crate (the CPU's
/// crc32 instruction where it has one).
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

pub(super) fn file_header(dev_size: u64) -> [u8; FILE_HEADER] {
    let mut h = [0u8; FILE_HEADER];
    h[0..8].copy_from_slice(FILE_MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(FILE_HEADER as u32).to_le_bytes());
    h[16..24].copy_from_slice(&dev_size.to_le_bytes());
    let c = crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&c.to_le_bytes());
    h
}

/// One decoded record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecHead {
    pub kind: RecKind,
    pub fua: bool,
    pub no_hole: bool,
    /// Record number, from 0, one more than the record before.
    pub seq: u64,
    /// Device offset (0 for a flush).
    pub offset: u64,
    /// Bytes of the range (the payload's length for a write; 0 for a flush).
    pub len: u64,
    /// Flush only: the records numbered below this are durable.
    pub covers: u64,
    /// CRC-32C of the payload (writes; 0 otherwise).
    pub data_crc: u32,
}

impl RecHead {
    pub fn encode(&self) -> [u8; RECORD_HEADER] {
        let mut h = [0u8; RECORD_HEADER];
        h[0..4].copy_from_slice(RECORD_MAGIC);
        h[4] = self.kind as u8;
        h[5] =
            (if self.fua { FLAG_FUA } else { 0 }) | (if self.no_hole { FLAG_NO_HOLE } else { 0 });
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.offset.to_le_bytes());
        h[24..32].copy_from_slice(&self.len.to_le_bytes());
        h[32..40].copy_from_slice(&self.covers.to_le_bytes());
        h[40..44].copy_from_slice(&self.data_crc.to_le_bytes());
        let c = crc32c(&h[0..44]);
        h[44..48].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// Decodes a header; `None` if the magic, the checksum or a field is bad.
    pub fn decode(h: &[u8]) -> Option<RecHead> {
        if h.len() < RECORD_HEADER || &h[0..4] != RECORD_MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        if crc32c(&h[0..44]) != u32_at(44) || h[6] != 0 || h[7] != 0 {
            return None;
        }
        let kind = RecKind::from_u8(h[4])?;
        if h[5] & !(FLAG_FUA | FLAG_NO_HOLE) != 0 {
            return None;
        }
        Some(RecHead {
            kind,
            fua: h[5] & FLAG_FUA != 0,
            no_hole: h[5] & FLAG_NO_HOLE != 0,
            seq: u64_at(8),
            offset: u64_at(16),
            len: u64_at(24),
            covers: u64_at(32),
            data_crc: u32_at(40),
        })
    }

    /// Bytes of payload that follow the header.
    pub fn payload(&self) -> u64 {
        if self.kind == RecKind::Write {
            self.len
        } else {
            0
        }
    }
}
