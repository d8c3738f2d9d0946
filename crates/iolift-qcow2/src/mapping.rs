//! L1 and L2 entries, decoded and checked: what one guest cluster maps
//! to. A [`Mapping`] is what the control plane hands to a data path.

use crate::error::{corrupt, Result};

/// Bit 63 of L1 and standard L2 entries: refcount is exactly 1, so the
/// cluster may be written in place.
pub const COPIED: u64 = 1 << 63;
/// Bit 62 of L2 entries: a compressed cluster.
pub const COMPRESSED: u64 = 1 << 62;
/// Bit 0 of standard L2 entries (version 3): reads as zeroes.
pub const ZERO: u64 = 1;
/// Bits 9..55: a host offset in L1 and standard L2 entries.
pub const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// Bits that must be zero in an L1 entry.
const L1_RESERVED: u64 = !(OFFSET_MASK | COPIED);
/// Bits that must be zero in a standard L2 entry (bits 1..8 and 56..61).
const L2_RESERVED: u64 = 0x3f00_0000_0000_01fe;

/// What one guest cluster reads as, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// Reads as zeroes (the zero flag, possibly with a preallocated host
    /// cluster in `host`).
    Zero { host: Option<u64> },
    /// Not allocated here: reads from the backing file, or zeroes.
    Unallocated,
    /// A host cluster; `writable` when its refcount is 1 (COPIED), so a
    /// write may go there directly.
    Data { host: u64, writable: bool },
    /// Deflate-compressed data at `host`, `len` bytes (the last 512-byte
    /// sector may run past the data).
    Compressed { host: u64, len: u32 },
}

/// Checks an L1 entry and returns its L2 table offset (0: none).
pub fn l1_offset(i: usize, e: u64, cluster_bits: u32, file_len: u64) -> Result<u64> {
    if e & L1_RESERVED != 0 {
        return corrupt(format!("L1 entry {i} ({e:#x}) has reserved bits set"));
    }
    let off = e & OFFSET_MASK;
    if off & ((1 << cluster_bits) - 1) != 0 {
        return corrupt(format!(
            "L1 entry {i}: L2 table offset {off:#x} is not cluster aligned"
        ));
    }
    if off != 0 && off >= file_len {
        return corrupt(format!(
            "L1 entry {i}: L2 table offset {off:#x} is past the end of the file ({file_len} bytes)"
        ));
    }
    Ok(off)
}

/// Decodes the L2 entry of guest cluster `c`.
pub fn decode(c: u64, e: u64, version: u32, cluster_bits: u32, file_len: u64) -> Result<Mapping> {
    if e & COMPRESSED != 0 {
        if e & COPIED != 0 {
            return corrupt(format!(
                "L2 entry of guest cluster {c} ({e:#x}) is compressed with the COPIED bit set"
            ));
        }
        let x = 62 - (cluster_bits - 8);
        let host = e & ((1u64 << x) - 1);
        let sectors = ((e >> x) & ((1u64 << (cluster_bits - 8)) - 1)) + 1;
        let len = (host & !511) + sectors * 512 - host;
        if host >= file_len {
            return corrupt(format!(
                "L2 entry of guest cluster {c}: compressed data at {host:#x} is past the end of the file ({file_len} bytes)"
            ));
        }
        return Ok(Mapping::Compressed {
            host,
            len: len as u32,
        });
    }
    if e & L2_RESERVED != 0 || (version < 3 && e & ZERO != 0) {
        return corrupt(format!(
            "L2 entry of guest cluster {c} ({e:#x}) has reserved bits set"
        ));
    }
    let host = e & OFFSET_MASK;
    if host & ((1 << cluster_bits) - 1) != 0 {
        return corrupt(format!(
            "L2 entry of guest cluster {c}: host offset {host:#x} is not cluster aligned"
        ));
    }
    if host != 0 && host >= file_len {
        return corrupt(format!(
            "L2 entry of guest cluster {c}: host offset {host:#x} is past the end of the file ({file_len} bytes)"
        ));
    }
    if e & ZERO != 0 {
        return Ok(Mapping::Zero {
            host: (host != 0).then_some(host),
        });
    }
    if host == 0 {
        if e & COPIED != 0 {
            return corrupt(format!(
                "L2 entry of guest cluster {c} ({e:#x}) is unallocated with the COPIED bit set"
            ));
        }
        return Ok(Mapping::Unallocated);
    }
    Ok(Mapping::Data {
        host,
        writable: e & COPIED != 0,
    })
}

/// The host clusters a compressed cluster's data touches (their
/// refcounts count it once each).
pub fn compressed_clusters(
    host: u64,
    len: u32,
    cluster_bits: u32,
) -> std::ops::RangeInclusive<u64> {
    (host >> cluster_bits)..=((host + len as u64 - 1) >> cluster_bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_each_kind_and_refuses_bad_bits() {
        let len = 1 << 30;
        assert_eq!(decode(0, 0, 3, 16, len).unwrap(), Mapping::Unallocated);
        assert_eq!(
            decode(0, COPIED | 0x30000, 3, 16, len).unwrap(),
            Mapping::Data {
                host: 0x30000,
                writable: true
            }
        );
        assert_eq!(
            decode(0, 1, 3, 16, len).unwrap(),
            Mapping::Zero { host: None }
        );
        assert!(decode(0, 1, 2, 16, len).is_err(), "zero flag in v2");
        let e = format!("{}", decode(7, 0x30200, 3, 16, len).unwrap_err());
        assert!(
            e.contains("guest cluster 7") && e.contains("not cluster aligned"),
            "{e}"
        );
        let e = format!("{}", decode(7, 1 << 40, 3, 16, len).unwrap_err());
        assert!(e.contains("past the end of the file"), "{e}");
        let e = format!("{}", decode(7, 1 << 57, 3, 16, len).unwrap_err());
        assert!(e.contains("reserved bits"), "{e}");
        // compressed: x = 62 - 8 = 54 for 64 KiB clusters; 2 extra sectors
        let e = COMPRESSED | (2u64 << 54) | 0x10100;
        assert_eq!(
            decode(0, e, 3, 16, len).unwrap(),
            Mapping::Compressed {
                host: 0x10100,
                len: 3 * 512 - 0x100
            }
        );
        assert_eq!(compressed_clusters(0x1ff00, 0x200, 16), 1..=2);
    }
}
