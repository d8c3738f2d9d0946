//! The refcount table and refcount blocks: reading and writing one
//! cluster's refcount, for every refcount width the format allows (1 to 64
//! bits; widths under 8 bits are packed from the least significant bit of
//! each byte up).

use crate::error::{corrupt, io_ctx, Error, Result};
use crate::io::{read_exact, write_all};
use std::fs::File;

/// The refcount table is held in memory: at most this many bytes of it.
pub const MAX_TABLE_BYTES: u64 = 32 << 20;
/// Bits 9..63 of a refcount table entry: the refcount block's offset.
const TABLE_OFFSET_MASK: u64 = !0x1ff;

pub struct Refcounts {
    /// log2 of the refcount width in bits.
    pub order: u32,
    cluster_bits: u32,
    /// Offsets of the refcount blocks (0: none yet).
    pub table: Vec<u64>,
    pub table_offset: u64,
    pub table_clusters: u64,
}

impl Refcounts {
    /// Reads and checks the refcount table.
    pub fn load(
        file: &File,
        cluster_bits: u32,
        order: u32,
        table_offset: u64,
        table_clusters: u64,
        file_len: u64,
    ) -> Result<Refcounts> {
        let bytes = table_clusters << cluster_bits;
        if bytes > MAX_TABLE_BYTES {
            return Err(Error::Unsupported(format!(
                "refcount table of {bytes} bytes (this implementation holds at most {MAX_TABLE_BYTES})"
            )));
        }
        let mut raw = vec![0u8; bytes as usize];
        read_exact(file, table_offset, &mut raw).map_err(io_ctx("reading the refcount table"))?;
        let cs = 1u64 << cluster_bits;
        let mut table = Vec::with_capacity(raw.len() / 8);
        for (i, e) in raw.chunks_exact(8).enumerate() {
            let e = u64::from_be_bytes(e.try_into().unwrap());
            let off = e & TABLE_OFFSET_MASK;
            if e & 0x1ff != 0 {
                return corrupt(format!(
                    "refcount table entry {i} ({e:#x}) has reserved bits set"
                ));
            }
            if !off.is_multiple_of(cs) {
                return corrupt(format!(
                    "refcount table entry {i}: block offset {off:#x} is not cluster aligned"
                ));
            }
            if off != 0 && off >= file_len {
                return corrupt(format!(
                    "refcount table entry {i}: block offset {off:#x} is past the end of the file ({file_len} bytes)"
                ));
            }
            table.push(off);
        }
        Ok(Refcounts {
            order,
            cluster_bits,
            table,
            table_offset,
            table_clusters,
        })
    }

    /// log2 of the entries in one refcount block.
    pub fn block_bits(&self) -> u32 {
        self.cluster_bits + 3 - self.order
    }

    pub fn bits(&self) -> u32 {
        1 << self.order
    }

    pub fn max_value(&self) -> u64 {
        if self.order == 6 {
            u64::MAX
        } else {
            (1u64 << self.bits()) - 1
        }
    }

    /// Where cluster `k`'s refcount lives: (block index, byte offset in the
    /// block, bytes to read, bit shift in that byte for narrow widths).
    fn place(&self, k: u64) -> (u64, u64, usize, u32) {
        let b = k >> self.block_bits();
        let idx = k & ((1u64 << self.block_bits()) - 1);
        let bit = idx << self.order;
        if self.order >= 3 {
            (b, bit / 8, 1 << (self.order - 3), 0)
        } else {
            (b, bit / 8, 1, (bit % 8) as u32)
        }
    }

    /// Decodes entry `idx` of an in-memory refcount block.
    pub fn decode(&self, block: &[u8], idx: u64) -> u64 {
        let bit = idx << self.order;
        if self.order >= 3 {
            let n = 1usize << (self.order - 3);
            let at = (bit / 8) as usize;
            block[at..at + n]
                .iter()
                .fold(0u64, |v, &b| (v << 8) | b as u64)
        } else {
            let byte = block[(bit / 8) as usize];
            ((byte >> (bit % 8)) as u64) & self.max_value()
        }
    }

    /// Cluster `k`'s refcount (0 where no block covers it).
    pub fn get(&self, file: &File, k: u64) -> Result<u64> {
        let (b, at, n, shift) = self.place(k);
        let Some(&block) = self.table.get(b as usize) else {
            return Ok(0);
        };
        if block == 0 {
            return Ok(0);
        }
        let mut buf = [0u8; 8];
        read_exact(file, block + at, &mut buf[..n])
            .map_err(io_ctx(format!("reading the refcount of cluster {k}")))?;
        Ok(if self.order >= 3 {
            buf[..n].iter().fold(0u64, |v, &b| (v << 8) | b as u64)
        } else {
            ((buf[0] >> shift) as u64) & self.max_value()
        })
    }

    /// Sets cluster `k`'s refcount; its block must exist (`Alloc` makes
    /// it first).
    pub fn set(&self, file: &File, k: u64, v: u64) -> Result<()> {
        if v > self.max_value() {
            return corrupt(format!(
                "refcount of cluster {k} would overflow its {} bits",
                self.bits()
            ));
        }
        let (b, at, n, shift) = self.place(k);
        let block = self.table.get(b as usize).copied().unwrap_or(0);
        if block == 0 {
            return Err(Error::Invalid(format!(
                "internal: no refcount block for cluster {k}"
            )));
        }
        let mut buf = [0u8; 8];
        if self.order >= 3 {
            for (i, byte) in buf[..n].iter_mut().enumerate() {
                *byte = (v >> (8 * (n - 1 - i))) as u8;
            }
        } else {
            read_exact(file, block + at, &mut buf[..1])
                .map_err(io_ctx(format!("reading the refcount of cluster {k}")))?;
            let mask = (self.max_value() as u8) << shift;
            buf[0] = (buf[0] & !mask) | ((v as u8) << shift);
        }
        write_all(file, block + at, &buf[..n])
            .map_err(io_ctx(format!("writing the refcount of cluster {k}")))
    }

    /// Sets entry `idx` of an in-memory refcount block.
    pub fn encode(&self, block: &mut [u8], idx: u64, v: u64) {
        let bit = idx << self.order;
        if self.order >= 3 {
            let n = 1usize << (self.order - 3);
            let at = (bit / 8) as usize;
            for i in 0..n {
                block[at + i] = (v >> (8 * (n - 1 - i))) as u8;
            }
        } else {
            let shift = (bit % 8) as u32;
            let mask = (self.max_value() as u8) << shift;
            let at = (bit / 8) as usize;
            block[at] = (block[at] & !mask) | ((v as u8) << shift);
        }
    }

    /// Writes table entry `b` to the table's current place in the file.
    pub fn write_entry(&self, file: &File, b: u64) -> Result<()> {
        let v = self.table[b as usize].to_be_bytes();
        write_all(file, self.table_offset + b * 8, &v)
            .map_err(io_ctx(format!("writing refcount table entry {b}")))
    }
}
