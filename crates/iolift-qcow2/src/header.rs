//! The qcow2 header (versions 2 and 3) and its extensions: parsed, checked
//! against the file, and the feature bits judged. Only single fields are
//! ever written back (see [`field`]), so extensions this code does not know
//! are kept as they are.

use crate::error::{corrupt, Error, Result};

pub const MAGIC: u32 = 0x5146_49fb;
/// The largest header cluster this code reads (the format allows 2 MiB
/// clusters; the header and its extensions live in the first one).
const MAX_CLUSTER_BITS: u32 = 21;
const MIN_CLUSTER_BITS: u32 = 9;
/// The L1 table is held in memory: at most 4 Mi entries (32 MiB), which
/// at 64 KiB clusters maps 32 PiB.
pub const MAX_L1_ENTRIES: u64 = 4 << 20;
/// A virtual size beyond this is refused (2^61 bytes).
const MAX_SIZE: u64 = 1 << 61;

/// Byte offsets of the fields written back.
pub mod field {
    pub const REFCOUNT_TABLE_OFFSET: u64 = 48;
    pub const REFCOUNT_TABLE_CLUSTERS: u64 = 56;
    pub const AUTOCLEAR: u64 = 88;
}

/// Incompatible feature bits (version 3).
pub const INCOMPAT_DIRTY: u64 = 1 << 0;
pub const INCOMPAT_CORRUPT: u64 = 1 << 1;
pub const INCOMPAT_DATA_FILE: u64 = 1 << 2;
pub const INCOMPAT_COMPRESSION: u64 = 1 << 3;
pub const INCOMPAT_EXTL2: u64 = 1 << 4;

const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
const EXT_FEATURE_NAMES: u32 = 0x6803_f857;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub backing_file_offset: u64,
    pub backing_file_size: u32,
    pub cluster_bits: u32,
    pub size: u64,
    pub crypt_method: u32,
    pub l1_size: u32,
    pub l1_table_offset: u64,
    pub refcount_table_offset: u64,
    pub refcount_table_clusters: u32,
    pub nb_snapshots: u32,
    pub snapshots_offset: u64,
    pub incompatible: u64,
    pub compatible: u64,
    pub autoclear: u64,
    pub refcount_order: u32,
    pub header_length: u32,
    pub compression_type: u8,
    /// The backing file name, if any.
    pub backing_file: Option<String>,
    /// From the backing format extension (`raw`, `qcow2`, ...).
    pub backing_format: Option<String>,
    /// From the feature name table: (type, bit, name).
    pub feature_names: Vec<(u8, u8, String)>,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Entries of one L2 table (log2).
    pub fn l2_bits(&self) -> u32 {
        self.cluster_bits - 3
    }

    /// L1 entries the virtual size needs.
    pub fn l1_needed(&self) -> u64 {
        let per_l1 = 1u64 << (self.cluster_bits + self.l2_bits());
        self.size.div_ceil(per_l1)
    }

    /// Parses the fixed fields from the first bytes of the file (at least
    /// 72, ideally the whole first cluster) and checks them against the
    /// file length. Extensions come from [`Header::parse_extensions`].
    pub fn parse(b: &[u8], file_len: u64) -> Result<Header> {
        if b.len() < 72 {
            return corrupt(format!(
                "file is {} bytes, shorter than a qcow2 header (72)",
                b.len()
            ));
        }
        let magic = be32(b, 0);
        if magic != MAGIC {
            return corrupt(format!(
                "bad magic {magic:#010x} (want {MAGIC:#010x}, \"QFI\\xfb\")"
            ));
        }
        let version = be32(b, 4);
        if version != 2 && version != 3 {
            return Err(Error::Unsupported(format!(
                "version {version} (only 2 and 3 are known)"
            )));
        }
        let mut h = Header {
            version,
            backing_file_offset: be64(b, 8),
            backing_file_size: be32(b, 16),
            cluster_bits: be32(b, 20),
            size: be64(b, 24),
            crypt_method: be32(b, 32),
            l1_size: be32(b, 36),
            l1_table_offset: be64(b, 40),
            refcount_table_offset: be64(b, 48),
            refcount_table_clusters: be32(b, 56),
            nb_snapshots: be32(b, 60),
            snapshots_offset: be64(b, 64),
            incompatible: 0,
            compatible: 0,
            autoclear: 0,
            refcount_order: 4,
            header_length: 72,
            compression_type: 0,
            backing_file: None,
            backing_format: None,
            feature_names: Vec::new(),
        };
        if version == 3 {
            if b.len() < 104 {
                return corrupt("version 3 header shorter than 104 bytes");
            }
            h.incompatible = be64(b, 72);
            h.compatible = be64(b, 80);
            h.autoclear = be64(b, 88);
            h.refcount_order = be32(b, 96);
            h.header_length = be32(b, 100);
            if h.header_length < 104 || !h.header_length.is_multiple_of(8) {
                return corrupt(format!(
                    "header_length {} (must be a multiple of 8, at least 104)",
                    h.header_length
                ));
            }
            if h.header_length > 104 && b.len() > 104 {
                h.compression_type = b[104];
            }
        }
        h.check(file_len)?;
        Ok(h)
    }

    /// Checks the fixed fields: geometry, table offsets inside the file.
    fn check(&self, file_len: u64) -> Result<()> {
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&self.cluster_bits) {
            return corrupt(format!(
                "cluster_bits {} (must be {MIN_CLUSTER_BITS}..={MAX_CLUSTER_BITS})",
                self.cluster_bits
            ));
        }
        let cs = self.cluster_size();
        if self.header_length as u64 > cs {
            return corrupt(format!(
                "header_length {} larger than a cluster ({cs})",
                self.header_length
            ));
        }
        if self.size > MAX_SIZE {
            return corrupt(format!("size {} too large (limit 2^61)", self.size));
        }
        if self.refcount_order > 6 {
            return corrupt(format!(
                "refcount_order {} (must be 0..=6)",
                self.refcount_order
            ));
        }
        if self.crypt_method != 0 {
            return Err(Error::Unsupported(format!(
                "encryption (crypt_method {})",
                self.crypt_method
            )));
        }
        let need = self.l1_needed();
        if (self.l1_size as u64) < need {
            return corrupt(format!(
                "l1_size {} too small for size {} (needs {need})",
                self.l1_size, self.size
            ));
        }
        if self.l1_size as u64 > MAX_L1_ENTRIES {
            return Err(Error::Unsupported(format!(
                "l1_size {} (this implementation holds at most {MAX_L1_ENTRIES} L1 entries)",
                self.l1_size
            )));
        }
        let span = |what: &str, off: u64, len: u64| -> Result<()> {
            if !off.is_multiple_of(cs) {
                return corrupt(format!("{what} {off:#x} is not cluster aligned"));
            }
            match off.checked_add(len) {
                Some(end) if end <= file_len => Ok(()),
                _ => corrupt(format!(
                    "{what} {off:#x} (+{len} bytes) is past the end of the file ({file_len} bytes)"
                )),
            }
        };
        if self.l1_size > 0 {
            span(
                "l1_table_offset",
                self.l1_table_offset,
                self.l1_size as u64 * 8,
            )?;
        }
        if self.refcount_table_clusters == 0 {
            return corrupt("refcount_table_clusters is 0");
        }
        span(
            "refcount_table_offset",
            self.refcount_table_offset,
            self.refcount_table_clusters as u64 * cs,
        )?;
        if self.backing_file_offset != 0 {
            if self.backing_file_size == 0 || self.backing_file_size > 1023 {
                return corrupt(format!(
                    "backing_file_size {} (must be 1..=1023)",
                    self.backing_file_size
                ));
            }
            match self
                .backing_file_offset
                .checked_add(self.backing_file_size as u64)
            {
                Some(end) if end <= file_len => {}
                _ => {
                    return corrupt(format!(
                        "backing_file_offset {:#x} is past the end of the file",
                        self.backing_file_offset
                    ))
                }
            }
        }
        Ok(())
    }

    /// Reads the extensions (from the first cluster `b`) and the backing
    /// file name (`name`: the bytes at `backing_file_offset`).
    pub fn parse_extensions(&mut self, b: &[u8], name: &[u8]) -> Result<()> {
        if self.backing_file_offset != 0 {
            let n = std::str::from_utf8(name)
                .map_err(|_| Error::Corrupt("backing file name is not UTF-8".into()))?;
            self.backing_file = Some(n.to_string());
        }
        let end = b.len().min(self.cluster_size() as usize);
        let mut at = self.header_length as usize;
        loop {
            if at + 8 > end {
                // Version 2 images may have no end marker when there are
                // no extensions; the spec allows the header cluster to
                // simply end.
                return Ok(());
            }
            let kind = be32(b, at);
            let len = be32(b, at + 4) as usize;
            let data = at + 8;
            if kind == EXT_END {
                return Ok(());
            }
            let next = data + len.div_ceil(8) * 8;
            if next > end {
                return corrupt(format!(
                    "header extension {kind:#010x} at byte {at} (length {len}) runs past the first cluster"
                ));
            }
            let body = &b[data..data + len];
            match kind {
                EXT_BACKING_FORMAT => {
                    let f = std::str::from_utf8(body).map_err(|_| {
                        Error::Corrupt("backing format extension is not UTF-8".into())
                    })?;
                    self.backing_format = Some(f.trim_end_matches('\0').to_string());
                }
                EXT_FEATURE_NAMES => {
                    for e in body.chunks_exact(48) {
                        let name = &e[2..];
                        let n = name.iter().position(|&c| c == 0).unwrap_or(name.len());
                        let name = String::from_utf8_lossy(&name[..n]).into_owned();
                        self.feature_names.push((e[0], e[1], name));
                    }
                }
                // Other extensions (bitmaps, encryption, data file, ...) are
                // judged by the feature bits, not here.
                _ => {}
            }
            at = next;
        }
    }

    fn feature_name(&self, kind: u8, bit: u32) -> String {
        self.feature_names
            .iter()
            .find(|(t, b, _)| *t == kind && *b as u32 == bit)
            .map(|(_, _, n)| n.clone())
            .unwrap_or_else(|| "no name in the image".into())
    }

    /// Judges the feature bits for an open (`writable` or not). Unknown
    /// incompatible bits are refused naming the bit; so are data files,
    /// extended L2 entries and compression types other than deflate.
    pub fn check_features(&self, writable: bool) -> Result<()> {
        let known = INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_COMPRESSION;
        for bit in 0..64 {
            let m = 1u64 << bit;
            if self.incompatible & m == 0 || known & m != 0 {
                continue;
            }
            let what = match m {
                INCOMPAT_DATA_FILE => "external data file".to_string(),
                INCOMPAT_EXTL2 => "extended L2 entries (subclusters)".to_string(),
                _ => format!("unknown feature ({})", self.feature_name(0, bit)),
            };
            return Err(Error::Unsupported(format!(
                "incompatible feature bit {bit} set: {what}"
            )));
        }
        if self.incompatible & INCOMPAT_COMPRESSION != 0 && self.compression_type != 0 {
            return Err(Error::Unsupported(format!(
                "compression_type {} (only 0, deflate, is read)",
                self.compression_type
            )));
        }
        if writable {
            if self.incompatible & INCOMPAT_CORRUPT != 0 {
                return Err(Error::ReadOnly(
                    "the image is marked corrupt (incompatible bit 1): repair it with qemu-img check -r all, or open it read-only".into(),
                ));
            }
            if self.incompatible & INCOMPAT_DIRTY != 0 {
                return Err(Error::ReadOnly(
                    "the image is marked dirty (incompatible bit 0, lazy refcounts): its refcounts need a repair (qemu-img check -r all) before writing".into(),
                ));
            }
        }
        Ok(())
    }
}
