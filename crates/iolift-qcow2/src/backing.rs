//! Backing files: read-only, raw or qcow2. Guest bytes past the backing
//! file's size read as zeroes.

use crate::error::{io_ctx, Result};
use crate::io::read_zero_fill;
use std::fs::File;
use std::sync::Arc;

/// A backing image other than raw (a qcow2 image opened read-only with
/// no cache, read under its own control plane's lock).
pub trait Image: Send + Sync {
    fn size(&self) -> u64;
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()>;
}

pub enum Backing {
    Raw { file: File, size: u64 },
    Qcow2(Arc<dyn Image>),
}

impl Backing {
    fn size(&self) -> u64 {
        match self {
            Backing::Raw { size, .. } => *size,
            Backing::Qcow2(img) => img.size(),
        }
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let size = self.size();
        let n = if off >= size {
            0
        } else {
            (size - off).min(buf.len() as u64) as usize
        };
        buf[n..].fill(0);
        if n == 0 {
            return Ok(());
        }
        match self {
            Backing::Raw { file, .. } => read_zero_fill(file, off, &mut buf[..n])
                .map_err(io_ctx(format!("reading the backing file at {off}"))),
            Backing::Qcow2(img) => img.read(off, &mut buf[..n]),
        }
    }
}
