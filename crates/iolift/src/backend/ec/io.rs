//! Requests to one child, and what a failing child turns into: it is
//! marked failed, the mark is written to every other child's superblock,
//! and the device goes on without it (up to m such children).

use super::join::{join_all, Fut};
use super::layout::{Found, Super};
use super::{Inner, FAILED, HEALTHY, REBUILDING};
use crate::block::{BlockDevExt, DevRef, Errno, Flags, Reply, Request};
use bytes::Bytes;
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

thread_local! {
    /// Set while this thread runs a background writer ([`writer_thread`]).
    static WRITER: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (a background writer, on a blocking-pool thread of its own)
/// marked as such: [`Inner::child_writes`] then writes one group of file
/// children on this thread, which would otherwise only wait for them.
pub fn writer_thread<T>(f: impl FnOnce() -> T) -> T {
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            WRITER.with(|w| w.set(false));
        }
    }
    WRITER.with(|w| w.set(true));
    let _u = Unmark;
    f()
}

/// One child write given to [`Inner::child_writes`]: (child, offset, bytes).
pub type ChildWrite = (usize, u64, Bytes);

/// Batches of fewer bytes than this are written as one group (on a
/// background writer's thread: no hand-off at all): a thread hand-off and
/// wake-up cost about as much CPU as writing 64 KiB into the page cache.
const SPLIT_MIN: usize = 128 << 10;

/// A write in a group: (index in the batch, child, device, offset, bytes).
type Item = (usize, usize, DevRef, u64, Bytes);

/// What became of writes: (index in the batch, child, result).
type Done = Vec<(usize, usize, Result<(), Errno>)>;

/// Threads the writes of `on_caller` children are spread over: as many
/// as the machine has cores (more could not run at once).
fn groups() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// A group's writes, one after another on this (blocking-pool) thread:
/// each child was opened with `inline_writes`, so `submit_cb` runs the
/// write here and calls back before it returns. (index, child, result).
fn write_here(items: Vec<Item>) -> Done {
    items
        .into_iter()
        .map(|(i, c, dev, offset, data)| {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let req = Request::Write {
                offset,
                data,
                flags: Flags::NONE,
            };
            dev.submit_cb(req, Box::new(move |r| drop(tx.send(r))));
            // at once (inline_writes); were it ever handed on, this waits
            let r = rx.recv().unwrap_or(Err(Errno::EIO));
            (i, c, r.map(drop))
        })
        .collect()
}

impl Inner {
    /// Reads from child `c`; an error marks it failed. An `on_caller`
    /// child (a plain file) is read through `submit_cb`, so a read alone
    /// on its file (the file backend's rule, `backend/alone.rs`: nothing
    /// in flight there, idle a while) runs on this thread instead of a
    /// hop to the blocking pool and back; others go to the pool as before.
    pub async fn child_read(&self, c: usize, off: u64, len: u64) -> Result<Bytes, Errno> {
        let Some(dev) = &self.children[c].dev else {
            return Err(Errno::EIO);
        };
        let r = if self.children[c].on_caller {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let req = Request::Read {
                offset: off,
                len: len as u32,
            };
            dev.submit_cb(req, Box::new(move |r| drop(tx.send(r))));
            match rx.await {
                Ok(Ok(Reply::Data(b))) => Ok(b),
                Ok(Ok(_)) | Err(_) => Err(Errno::EIO),
                Ok(Err(e)) => Err(e),
            }
        } else {
            dev.read(off, len as u32).await
        };
        match r {
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

    /// Writes `writes` at once; their results in the same order, a
    /// failure marking its child failed (as [`Inner::child_write`]). The
    /// writes of `on_caller` children (plain files) go to at most
    /// [`groups`] blocking-pool threads (one if the batch is under
    /// [`SPLIT_MIN`] bytes), each writing its children's
    /// writes one after another (a child's writes in one group, in
    /// order): one thread hop per group, not per write, while the groups
    /// still write in parallel. On a background writer's thread
    /// ([`writer_thread`]) the last group is written on that thread
    /// (after the others were handed on). Other children are written
    /// through their `write`, concurrently.
    pub async fn child_writes(&self, writes: Vec<ChildWrite>) -> Vec<Result<(), Errno>> {
        let n = writes.len();
        self.metrics
            .child_writes
            .fetch_add(n as u64, Ordering::Relaxed);
        // a small batch (a 4 KiB read-modify-write's few blocks) is one
        // group: a hand-off would cost more than the writes it spreads
        let bytes: usize = writes.iter().map(|w| w.2.len()).sum();
        let g = if bytes < SPLIT_MIN {
            1
        } else {
            groups().min(n).max(1)
        };
        let mut group: Vec<Vec<Item>> = (0..g).map(|_| Vec::new()).collect();
        let mut futs: Vec<Fut<'_, Done>> = Vec::new();
        for (i, (c, off, data)) in writes.into_iter().enumerate() {
            match &self.children[c].dev {
                Some(dev) if self.children[c].on_caller => {
                    group[c % g].push((i, c, dev.clone(), off, data));
                }
                Some(dev) => {
                    let f = dev.write(off, data, Flags::NONE);
                    futs.push(Box::pin(async move { vec![(i, c, f.await.map(drop))] }));
                }
                None => futs.push(Box::pin(async move { vec![(i, c, Err(Errno::EIO))] })),
            }
        }
        let mut group: Vec<_> = group.into_iter().filter(|v| !v.is_empty()).collect();
        let here = if WRITER.with(|w| w.get()) {
            group.pop()
        } else {
            None
        };
        for items in group {
            let fall: Vec<(usize, usize)> = items.iter().map(|w| (w.0, w.1)).collect();
            let h = tokio::task::spawn_blocking(move || write_here(items));
            futs.push(Box::pin(async move {
                h.await.unwrap_or_else(|_| {
                    fall.into_iter()
                        .map(|(i, c)| (i, c, Err(Errno::EIO)))
                        .collect()
                })
            }));
        }
        let mine = here.map(write_here).unwrap_or_default();
        let mut out: Vec<Result<(), Errno>> = vec![Ok(()); n];
        for (i, c, r) in join_all(futs).await.into_iter().flatten().chain(mine) {
            if let Err(e) = r {
                self.fail(c, &format!("write error {e:?}")).await;
            }
            out[i] = r;
        }
        out
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

#[cfg(test)]
mod tests {
    use super::super::tests::{files, open_ec, rnd, spec};
    use super::super::FAILED;
    use crate::block::{BlockDevExt, Flags};
    use bytes::Bytes;

    /// File children are opened on the caller and written in groups
    /// (`child_writes`): writes of every shape land at their chunks'
    /// places in the child files, with and without the journal.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grouped_file_child_writes_land_at_their_chunks() {
        for opts in [
            "chunk=16K,slots=8",
            "chunk=16K,slots=8,consistency=journal,wb=0",
        ] {
            let dir = tempfile::tempdir().unwrap();
            let s = spec(&files(dir.path(), 6, "4M"), &format!("{opts},rebuild=off"));
            let (d, inner) = open_ec(&s);
            assert!(inner.children.iter().all(|c| c.on_caller), "{opts}");
            let data = rnd(7, 1 << 20);
            // a run of whole stripes, half stripes, an unaligned piece
            d.write(0, Bytes::copy_from_slice(&data[..256 << 10]), Flags::NONE)
                .await
                .unwrap();
            for i in 0..8 {
                let (a, b) = (
                    (256 << 10) + i * (32 << 10),
                    (256 << 10) + (i + 1) * (32 << 10),
                );
                d.write(a as u64, Bytes::copy_from_slice(&data[a..b]), Flags::NONE)
                    .await
                    .unwrap();
            }
            let (a, b) = (512 << 10, (1 << 20) - 1000);
            d.write(a as u64, Bytes::copy_from_slice(&data[a..b]), Flags::NONE)
                .await
                .unwrap();
            d.flush().await.unwrap();
            let want = &data[..b];
            assert_eq!(&d.read(0, b as u32).await.unwrap()[..], want, "{opts}");
            // the child files hold every data chunk where the layout says
            let (k, chunk) = (inner.geo.k, inner.geo.chunk as usize);
            let kids: Vec<Vec<u8>> = (0..6)
                .map(|c| std::fs::read(dir.path().join(format!("s{c}.img"))).unwrap())
                .collect();
            for (i, piece) in want.chunks(chunk).enumerate() {
                let (s, c) = ((i / k) as u64, i % k);
                let at = inner.geo.chunk_off(s) as usize;
                assert_eq!(
                    &kids[c][at..at + piece.len()],
                    piece,
                    "{opts}: stripe {s} chunk {c}"
                );
            }
            let chk = super::super::rebuild::check(&inner, &|_| {}).await;
            assert_eq!((chk.inconsistent, chk.crc_errors), (0, 0), "{opts}: {chk}");
            d.close().await.unwrap();
        }
    }

    /// A write that fails in a group marks its child failed; the others'
    /// results come back in order: a small batch (one group) and a large
    /// one (split into groups).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_grouped_write_fails_its_child_only() {
        for len in [4096usize, 65536] {
            let dir = tempfile::tempdir().unwrap();
            let s = spec(&files(dir.path(), 6, "4M"), "chunk=16K,slots=8,rebuild=off");
            let (d, inner) = open_ec(&s);
            let b = Bytes::from(vec![0xa5u8; len]);
            let at = inner.geo.chunk_off(3);
            // child 4's write lies past its end: refused by the file backend
            let writes = (0..6)
                .map(|c| (c, if c == 4 { 1 << 40 } else { at }, b.clone()))
                .collect();
            let r = inner.child_writes(writes).await;
            assert_eq!(
                r.iter().map(|r| r.is_ok()).collect::<Vec<_>>(),
                [true, true, true, true, false, true],
                "{len}"
            );
            assert_eq!(inner.state(4), FAILED);
            assert!((0..6).filter(|&c| c != 4).all(|c| inner.readable(c)));
            for c in [0, 2, 5] {
                let f = std::fs::read(dir.path().join(format!("s{c}.img"))).unwrap();
                assert_eq!(
                    &f[at as usize..at as usize + len],
                    &b[..],
                    "{len}: child {c}"
                );
            }
            d.close().await.unwrap();
        }
    }

    /// File children are read through `submit_cb`: alone on its file a
    /// read runs on the caller's thread, back to back through the pool;
    /// either way the bytes are right, and a chunk corrupted on disk is
    /// caught by its crc, decoded and repaired through the same path.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn file_children_reads_inline_or_pooled_read_back_and_repair() {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let s = spec(&files(dir.path(), 6, "4M"), "chunk=16K,slots=8,rebuild=off");
        let (d, inner) = open_ec(&s);
        let data = rnd(11, 1 << 20);
        d.write(0, Bytes::copy_from_slice(&data), Flags::NONE)
            .await
            .unwrap();
        d.flush().await.unwrap();
        let mut x = 0x1234_5678u64;
        for i in 0..64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) as usize % (1 << 20);
            let len = (1 + (x >> 40) as usize % (96 << 10)).min((1 << 20) - off);
            if i % 2 == 0 {
                // idle files: the reads run on this task's thread
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            let got = d.read(off as u64, len as u32).await.unwrap();
            assert_eq!(&got[..], &data[off..off + len], "read {off}+{len}");
        }
        // corrupt 4 KiB of data chunk 1 of stripe 2 in child 1's file
        let at = inner.geo.chunk_off(2) + 4096;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("s1.img"))
            .unwrap();
        f.write_all_at(&[0x5a; 4096], at).unwrap();
        drop(f);
        let stripe = inner.geo.k as u64 * inner.geo.chunk;
        let off = 2 * stripe + inner.geo.chunk + 4096;
        let got = d.read(off, 4096).await.unwrap();
        assert_eq!(&got[..], &data[off as usize..off as usize + 4096]);
        assert!(inner.metrics.crc_errors.load(Ordering::Relaxed) >= 1);
        assert!(inner.metrics.repairs.load(Ordering::Relaxed) >= 1);
        let mut back = vec![0u8; 4096];
        std::fs::File::open(dir.path().join("s1.img"))
            .unwrap()
            .read_exact_at(&mut back, at)
            .unwrap();
        assert_eq!(
            &back[..],
            &data[off as usize..off as usize + 4096],
            "repaired on disk"
        );
        d.close().await.unwrap();
    }
}
