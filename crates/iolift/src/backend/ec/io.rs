//! Requests to one child, and what a failing child turns into: it is
//! marked failed, the mark is written to every other child's superblock,
//! and the device goes on without it (up to m such children).

use super::layout::{Found, Super};
use super::{Inner, FAILED, HEALTHY, REBUILDING};
use crate::block::{BlockDevExt, Errno, Flags, Reply, Request};
use bytes::Bytes;
use std::sync::atomic::Ordering;

impl Inner {
    /// Reads from child `c`; an error marks it failed.
    pub async fn child_read(&self, c: usize, off: u64, len: u64) -> Result<Bytes, Errno> {
        let Some(dev) = &self.children[c].dev else {
            return Err(Errno::EIO);
        };
        match dev.read(off, len as u32).await {
            Ok(b) if b.len() as u64 == len => Ok(b),
            Ok(_) => {
                self.fail(c, "short read").await;
                Err(Errno::EIO)
            }
            Err(e) => {
                self.fail(c, &format!("read error {e:?}")).await;
                Err(e)
            }
        }
    }

    /// Writes to child `c`; an error marks it failed.
    pub async fn child_write(&self, c: usize, off: u64, data: Bytes) -> Result<(), Errno> {
        let Some(dev) = &self.children[c].dev else {
            return Err(Errno::EIO);
        };
        self.metrics.child_writes.fetch_add(1, Ordering::Relaxed);
        match dev.write(off, data, Flags::NONE).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.fail(c, &format!("write error {e:?}")).await;
                Err(e)
            }
        }
    }

    /// Flushes child `c`; an error marks it failed.
    pub async fn child_flush(&self, c: usize) -> Result<(), Errno> {
        let Some(dev) = &self.children[c].dev else {
            return Err(Errno::EIO);
        };
        match dev.submit(Request::Flush).await {
            Ok(Reply::Done(_)) | Ok(_) => Ok(()),
            Err(e) => {
                self.fail(c, &format!("flush error {e:?}")).await;
                Err(e)
            }
        }
    }

    /// EIO when more than m children are failed: the data is gone.
    pub fn check_alive(&self) -> Result<(), Errno> {
        if self.degraded_failed() > self.geo.m {
            return Err(Errno::EIO);
        }
        Ok(())
    }

    /// Children that are failed (not those being rebuilt, which take writes).
    pub fn degraded_failed(&self) -> usize {
        (0..self.n())
            .filter(|&c| self.children[c].dev.is_none() || self.state(c) == FAILED)
            .count()
    }

    /// Marks child `c` failed and records it in the other superblocks.
    pub async fn fail(&self, c: usize, why: &str) {
        self.bitmap_ok.store(false, Ordering::Release);
        let was = self.children[c].state.swap(FAILED, Ordering::AcqRel);
        if was == FAILED {
            return;
        }
        tracing::warn!(
            "ec: child {c} ({}) failed: {why}; {} of {} children failed, m={}",
            self.children[c].label,
            self.degraded_failed(),
            self.n(),
            self.geo.m
        );
        self.metrics.failures.fetch_add(1, Ordering::Relaxed);
        self.persist_super().await;
    }

    /// Rewrites the superblock of every healthy child with a higher epoch
    /// and the current failed set (children failed or being rebuilt). A
    /// child that fails this write is marked failed and the round repeats.
    pub async fn persist_super(&self) {
        let mut sb = self.sb.lock().await;
        for _ in 0..=self.n() {
            sb.epoch += 1;
            sb.failed = (0..self.n())
                .filter(|&c| !self.readable(c))
                .fold(0u64, |m, c| m | (1 << c));
            let mut again = false;
            for c in 0..self.n() {
                if !self.readable(c) {
                    continue;
                }
                let one = Super {
                    index: c as u32,
                    ..sb.clone()
                };
                let dev = self.children[c].dev.as_ref().expect("readable");
                let r = dev.write(0, Bytes::from(one.encode()), Flags::NONE).await;
                let r = match r {
                    Ok(_) => dev.submit(Request::Flush).await.map(drop),
                    Err(e) => Err(e),
                };
                if let Err(e) = r {
                    tracing::warn!("ec: child {c}: superblock write failed ({e:?})");
                    self.children[c].state.store(FAILED, Ordering::Release);
                    self.metrics.failures.fetch_add(1, Ordering::Relaxed);
                    again = true;
                }
            }
            if !again {
                return;
            }
        }
    }

    /// Writes child `c`'s own superblock (after a rebuild), then marks it
    /// healthy and rewrites everyone's.
    pub async fn admit(&self, c: usize) -> Result<(), Errno> {
        let one = {
            let sb = self.sb.lock().await;
            Super {
                index: c as u32,
                ..sb.clone()
            }
        };
        self.child_write(c, 0, Bytes::from(one.encode())).await?;
        self.child_flush(c).await?;
        if self.children[c]
            .state
            .compare_exchange(REBUILDING, HEALTHY, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Errno::EIO);
        }
        self.persist_super().await;
        self.bitmap_resume().await;
        Ok(())
    }

    /// What block 0 of child `c` holds, or `None` if it cannot be read.
    pub async fn read_super(&self, c: usize) -> Option<Found> {
        let dev = self.children[c].dev.as_ref()?;
        dev.read(0, super::BLOCK as u32)
            .await
            .ok()
            .map(|b| Super::decode(&b))
    }
}
