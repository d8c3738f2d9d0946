//! `null:SIZE`: reads zeroes, drops writes. Measures the framework's own cost.

use super::{BackendSpec, OptHelp};
use crate::block::{ready, BlockDev, DevInfo, DevRef, Extent, IoFuture, Reply, Request};
use anyhow::Result;
use bytes::Bytes;
use std::sync::Arc;

pub struct NullDev {
    size: u64,
    /// Shared zero buffer handed out for reads up to its length.
    zeroes: Bytes,
}

impl NullDev {
    pub fn new(size: u64) -> Self {
        NullDev {
            size,
            zeroes: Bytes::from(vec![0u8; 1 << 20]),
        }
    }
}

/// No options: the positional SIZE is all.
pub const OPTIONS: &[OptHelp] = &[];

pub fn open(s: &BackendSpec) -> Result<DevRef> {
    let size = s.size_arg()?;
    Ok(Arc::new(NullDev::new(size)))
}

impl BlockDev for NullDev {
    fn info(&self) -> DevInfo {
        DevInfo::full(self.size)
    }

    fn submit(&self, req: Request) -> IoFuture {
        ready(Ok(match req {
            Request::Read { len, .. } => {
                let len = len as usize;
                if len <= self.zeroes.len() {
                    Reply::Data(self.zeroes.slice(..len))
                } else {
                    Reply::Data(Bytes::from(vec![0u8; len]))
                }
            }
            Request::Write { data, .. } => Reply::Done(data.len() as u64),
            Request::BlockStatus { len, .. } => Reply::Extents(vec![Extent {
                len: len as u64,
                hole: true,
                zero: true,
            }]),
            _ => Reply::Done(0),
        }))
    }

    fn name(&self) -> String {
        "null".into()
    }
}
