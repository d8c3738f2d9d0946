//! The snapshot table: entries read from and encoded for the file.

use crate::error::{corrupt, io_ctx, Error, Result};
use crate::io::read_exact;
use std::fs::File;

/// More snapshots than this are refused (QEMU's own limit).
pub const MAX_SNAPSHOTS: u32 = 65536;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub l1_offset: u64,
    pub l1_size: u32,
    pub id: String,
    pub name: String,
    pub date_sec: u32,
    pub date_nsec: u32,
    pub vm_clock_nsec: u64,
    pub vm_state_size: u32,
    pub extra: Vec<u8>,
}

fn be16(b: &[u8], at: usize) -> usize {
    u16::from_be_bytes([b[at], b[at + 1]]) as usize
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// Reads `n` snapshot table entries at `off`; returns them and the
/// table's length in bytes.
pub fn read_table(file: &File, off: u64, n: u32, file_len: u64) -> Result<(Vec<Snapshot>, u64)> {
    if n > MAX_SNAPSHOTS {
        return corrupt(format!("nb_snapshots {n} (limit {MAX_SNAPSHOTS})"));
    }
    let mut out = Vec::new();
    let mut at = off;
    for i in 0..n {
        let bad = |what: &str| Error::Corrupt(format!("snapshot table entry {i}: {what}"));
        let mut h = [0u8; 40];
        if at + 40 > file_len {
            return Err(bad("past the end of the file"));
        }
        read_exact(file, at, &mut h).map_err(io_ctx("reading the snapshot table"))?;
        let (id_len, name_len) = (be16(&h, 12), be16(&h, 14));
        let extra_len = be32(&h, 36) as usize;
        if extra_len > 1024 {
            return Err(bad(&format!("extra_data_size {extra_len} (limit 1024)")));
        }
        let len = 40 + extra_len + id_len + name_len;
        if at + len as u64 > file_len {
            return Err(bad("past the end of the file"));
        }
        let mut rest = vec![0u8; len - 40];
        read_exact(file, at + 40, &mut rest).map_err(io_ctx("reading the snapshot table"))?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let l1_offset = u64::from_be_bytes(h[0..8].try_into().unwrap());
        out.push(Snapshot {
            l1_offset,
            l1_size: be32(&h, 8),
            date_sec: be32(&h, 16),
            date_nsec: be32(&h, 20),
            vm_clock_nsec: u64::from_be_bytes(h[24..32].try_into().unwrap()),
            vm_state_size: be32(&h, 32),
            extra: rest[..extra_len].to_vec(),
            id: text(&rest[extra_len..extra_len + id_len]),
            name: text(&rest[extra_len + id_len..]),
        });
        at += (len as u64).div_ceil(8) * 8;
    }
    Ok((out, at - off))
}

pub fn encode_table(snaps: &[Snapshot]) -> Vec<u8> {
    let mut b = Vec::new();
    for s in snaps {
        b.extend_from_slice(&s.l1_offset.to_be_bytes());
        b.extend_from_slice(&s.l1_size.to_be_bytes());
        b.extend_from_slice(&(s.id.len() as u16).to_be_bytes());
        b.extend_from_slice(&(s.name.len() as u16).to_be_bytes());
        b.extend_from_slice(&s.date_sec.to_be_bytes());
        b.extend_from_slice(&s.date_nsec.to_be_bytes());
        b.extend_from_slice(&s.vm_clock_nsec.to_be_bytes());
        b.extend_from_slice(&s.vm_state_size.to_be_bytes());
        b.extend_from_slice(&(s.extra.len() as u32).to_be_bytes());
        b.extend_from_slice(&s.extra);
        b.extend_from_slice(s.id.as_bytes());
        b.extend_from_slice(s.name.as_bytes());
        b.resize(b.len().div_ceil(8) * 8, 0);
    }
    b
}
