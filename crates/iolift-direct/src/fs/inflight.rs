//! Write-back that does not wait for the disk: when a file's cache must
//! make room, its dirty blocks are started (submitted through the engine
//! without waiting) and the caller goes on; the pointers to newly
//! allocated blocks (indirect blocks) are written only once those data
//! blocks are on the disk (rule 2 of the crash order in the module
//! above). At most one such batch is out at a time: every other block
//! request of the file system ([`Dev::settle`] at the start of each) first
//! waits for it and writes its pointers, so no read can see a block
//! before its write landed and nothing is written out of the crash order.
//! Syncs (soft and hard) wait as before; a hard sync's device flush comes
//! after the batch.
//!
//! Memory: the batch holds copies of the blocks it writes, at most one
//! file's cache worth (`Fs::set_cache_blocks`), plus its indirect blocks.
//!
//! A write-back that fails makes every later request of the file system
//! fail (its pointers are never written, so the disk stays consistent):
//! unmount, fsck, mount again.

use super::Dev;
use crate::buf::AlignedBuf;
use crate::engine::Done;
use crate::slot::Pending;
use std::io;

/// The batch out: its data requests (first block, blocks, completion),
/// then groups of blocks to write, in order, once they all succeeded.
#[derive(Default)]
pub(crate) struct Inflight {
    waits: Vec<(u64, usize, Pending<Done>)>,
    after: Vec<Vec<(u64, AlignedBuf)>>,
}

impl Dev {
    /// Waits for the batch out (if any), then writes its pointer blocks.
    /// After a failure every call fails.
    pub fn settle(&self) -> io::Result<()> {
        if let Some((kind, msg)) = &*self.failed.borrow() {
            return Err(io::Error::new(
                *kind,
                format!("an earlier write-back failed ({msg}): unmount and fsck"),
            ));
        }
        let Some(b) = self.inflight.borrow_mut().take() else {
            return Ok(());
        };
        self.eng.wait_started();
        let r = self.check(b.waits).and_then(|()| {
            b.after
                .into_iter()
                .try_for_each(|g| self.write_runs(self.runs(g)))
        });
        if let Err(e) = &r {
            *self.failed.borrow_mut() = Some((e.kind(), e.to_string()));
        }
        r
    }

    /// Starts writing runs of blocks (see [`Dev::write_many`]) and returns
    /// without waiting.
    pub fn start_runs(&self, runs: Vec<(u64, usize, AlignedBuf)>) -> io::Result<()> {
        self.settle()?;
        let (ops, waits) = self.run_writes(runs);
        self.eng.start_batch(ops);
        *self.inflight.borrow_mut() = Some(Inflight {
            waits,
            after: Vec::new(),
        });
        Ok(())
    }

    /// Writes `groups` (in order) once the batch out is on the disk: now
    /// when none is out.
    pub fn after_started(&self, groups: Vec<Vec<(u64, AlignedBuf)>>) -> io::Result<()> {
        if let Some(b) = self.inflight.borrow_mut().as_mut() {
            b.after.extend(groups);
            return Ok(());
        }
        groups
            .into_iter()
            .try_for_each(|g| self.write_runs(self.runs(g)))
    }

    /// Waits for each request; the first error, naming its blocks.
    pub(super) fn check(&self, waits: Vec<(u64, usize, Pending<Done>)>) -> io::Result<()> {
        let mut first_err = None;
        for (b, n, rx) in waits {
            let mut d = rx.wait();
            if let Some(crate::buf::Buf::Aligned(a)) = d.buf.take() {
                self.recycle(a);
            }
            let what = if n == 1 {
                format!("block {b}")
            } else {
                format!("blocks {b}..{}", b + n as u64)
            };
            let r = match d.result() {
                Ok(got) if got == n * self.bs => Ok(()),
                Ok(got) => Err(io::Error::other(format!(
                    "{what}: short write ({got} bytes)"
                ))),
                Err(e) => Err(super::io_ctx(e, &format!("write of {what}"))),
            };
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
