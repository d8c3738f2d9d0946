//! The mirror's data path on io_uring: reads (and, when asked, writes) of
//! open files are queued on one ring shared by every front-end thread and
//! complete later
//! through their `Done`, so the thread that received a request goes back
//! for the next one instead of waiting in pread/pwrite.
//!
//! - Submission: the calling thread takes a free slot (at most `depth`
//!   I/Os in flight), queues the SQE under the ring's lock and submits it
//!   with one `io_uring_enter`, or at the end of its [`batch`] (the virtio
//!   queue thread submits every request it popped with one call). Right
//!   after submitting it collects whatever has completed already: a read
//!   of cached data completes inside that call, so it is answered on the
//!   same thread, with no hand-over.
//! - Completion: what did not complete inside the submit (buffered writes
//!   run on the kernel's io-wq workers) is collected by one reaper thread,
//!   which sleeps in `io_uring_enter(GETEVENTS)` while I/Os are in flight
//!   and on a condition variable otherwise, and answers everything it
//!   collected as one batch (one guest notification per virtqueue).
//! - Budget: `depth` slots; when all are taken the request is served
//!   synchronously on the calling thread (the caller's fallback), so a
//!   full ring never blocks or fails a request. Each slot holds its
//!   buffer (at most one request's data, 1 MiB) and a reference to the
//!   host fd, so a release racing an I/O cannot close the fd under it.

use super::sys;
use crate::batch::{self, Key};
use crate::model::*;
use bytes::Bytes;
use io_uring::{opcode, types, IoUring};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

/// user_data of the NOP that wakes the reaper to stop.
const WAKE: u64 = u64::MAX;

enum Op {
    Read {
        fd: Arc<OwnedFd>,
        buf: Vec<u8>,
        want: usize,
        offset: u64,
        done: Done<Bytes>,
    },
    Write {
        fd: Arc<OwnedFd>,
        buf: Vec<u8>,
        offset: u64,
        done: Done<u32>,
    },
}

struct State {
    slots: Vec<Option<Op>>,
    free: Vec<u32>,
    stop: bool,
    reaper_idle: bool,
}

struct Shared {
    ring: IoUring,
    state: Mutex<State>,
    wake: Condvar,
    depth: usize,
}

/// The ring, its slots and its reaper thread.
pub struct Uring {
    shared: Arc<Shared>,
    reaper: Option<std::thread::JoinHandle<()>>,
}

impl Uring {
    /// A ring of `depth` entries (1-4096) and its reaper thread.
    pub fn new(depth: usize) -> std::io::Result<Uring> {
        let depth = depth.clamp(1, 4096);
        // One SQ entry more than slots: room for the NOP that stops the reaper.
        let ring = IoUring::new(depth as u32 + 1)?;
        let shared = Arc::new(Shared {
            ring,
            state: Mutex::new(State {
                slots: (0..depth).map(|_| None).collect(),
                free: (0..depth as u32).rev().collect(),
                stop: false,
                reaper_idle: false,
            }),
            wake: Condvar::new(),
            depth,
        });
        let s = shared.clone();
        let reaper = std::thread::Builder::new()
            .name("mirror-uring".into())
            .spawn(move || s.reap_loop())?;
        Ok(Uring {
            shared,
            reaper: Some(reaper),
        })
    }

    /// Queues a read of `size` bytes at `offset`; gives `done` back when
    /// every slot is taken (the caller then reads synchronously).
    pub fn read(
        &self,
        fd: Arc<OwnedFd>,
        offset: u64,
        size: u32,
        done: Done<Bytes>,
    ) -> Option<Done<Bytes>> {
        let mut buf: Vec<u8> = Vec::with_capacity(size as usize);
        let sqe = opcode::Read::new(types::Fd(fd.as_raw_fd()), buf.as_mut_ptr(), size)
            .offset(offset)
            .build();
        let op = Op::Read {
            fd,
            buf,
            want: size as usize,
            offset,
            done,
        };
        match self.shared.queue(sqe, op) {
            Ok(()) => None,
            Err(Op::Read { done, .. }) => Some(done),
            Err(Op::Write { .. }) => unreachable!("a read was queued"),
        }
    }

    /// Queues a write of (a copy of) `data` at `offset`; gives `done` back
    /// when every slot is taken.
    pub fn write(
        &self,
        fd: Arc<OwnedFd>,
        offset: u64,
        data: &[u8],
        done: Done<u32>,
    ) -> Option<Done<u32>> {
        let Ok(len) = u32::try_from(data.len()) else {
            return Some(done);
        };
        let buf = data.to_vec();
        let sqe = opcode::Write::new(types::Fd(fd.as_raw_fd()), buf.as_ptr(), len)
            .offset(offset)
            .build();
        let op = Op::Write {
            fd,
            buf,
            offset,
            done,
        };
        match self.shared.queue(sqe, op) {
            Ok(()) => None,
            Err(Op::Write { done, .. }) => Some(done),
            Err(Op::Read { .. }) => unreachable!("a write was queued"),
        }
    }
}

impl Shared {
    /// Takes a slot for `op` and queues `sqe` (its user_data set here);
    /// the submission follows now or at the end of this thread's batch.
    fn queue(self: &Arc<Self>, sqe: io_uring::squeue::Entry, op: Op) -> Result<(), Op> {
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.stop {
                return Err(op);
            }
            let Some(slot) = st.free.pop() else {
                return Err(op);
            };
            // SAFETY: the SQ is only touched under the state lock; the
            // buffer and fd the SQE points at live in the slot until its
            // completion is collected.
            let pushed = unsafe {
                let mut sq = self.ring.submission_shared();
                let r = sq.push(&sqe.user_data(slot as u64));
                sq.sync();
                r
            };
            if pushed.is_err() {
                // The SQ is as large as the slot table, so it cannot be
                // full while a slot is free; should it be, serve it here.
                st.free.push(slot);
                return Err(op);
            }
            st.slots[slot as usize] = Some(op);
        }
        let me = self.clone();
        batch::defer(Key::Submit(Arc::as_ptr(self) as usize), move || me.submit());
        Ok(())
    }

    /// Submits what is queued, answers what completed at once, and wakes
    /// the reaper for the rest.
    fn submit(&self) {
        if let Err(e) = self.ring.submitter().submit() {
            // EBUSY/EAGAIN: the kernel is short of room; the reaper's next
            // enter or the next submit takes the queued SQEs.
            tracing::debug!("mirror: io_uring submit: {e}");
        }
        let outstanding = self.collect();
        if outstanding {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.reaper_idle {
                self.wake.notify_one();
            }
        }
    }

    /// Collects every completion now in the CQ and answers them (as one
    /// batch); returns whether I/Os are still in flight.
    fn collect(&self) -> bool {
        let mut finished = Vec::new();
        let outstanding = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the CQ is only touched under the state lock.
            let cq = unsafe { self.ring.completion_shared() };
            for cqe in cq {
                let slot = cqe.user_data();
                if slot == WAKE {
                    continue;
                }
                if let Some(op) = st.slots.get_mut(slot as usize).and_then(Option::take) {
                    st.free.push(slot as u32);
                    finished.push((op, cqe.result()));
                }
            }
            st.free.len() < self.depth
        };
        if !finished.is_empty() {
            batch::run(|| finished.into_iter().for_each(|(op, r)| finish(op, r)));
        }
        outstanding
    }

    fn reap_loop(&self) {
        loop {
            {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if st.free.len() < self.depth {
                        break;
                    }
                    if st.stop {
                        return;
                    }
                    st.reaper_idle = true;
                    st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                    st.reaper_idle = false;
                }
            }
            // Waits for one completion (and submits what another thread
            // queued but has not submitted yet, which that thread's own
            // submit then finds done).
            let r = self.ring.submitter().submit_and_wait(1);
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::EINTR) {
                    tracing::warn!("mirror: io_uring wait: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.collect();
        }
    }
}

/// Answers one completed I/O; a short read or write is finished
/// synchronously (a read that comes back short again has met the end of
/// the file).
fn finish(op: Op, res: i32) {
    match op {
        Op::Read {
            fd,
            mut buf,
            want,
            offset,
            done,
        } => {
            if res < 0 {
                return done.err(Errno(-res));
            }
            // SAFETY: the kernel wrote `res` (<= want) bytes into buf.
            unsafe { buf.set_len((res as usize).min(want)) };
            if res > 0 && buf.len() < want {
                while buf.len() < want {
                    let got = buf.len();
                    let at = offset + got as u64;
                    match sys::pread_into(
                        fd.as_fd(),
                        &mut buf.spare_capacity_mut()[..want - got],
                        at,
                    ) {
                        Ok(0) => break,
                        // SAFETY: pread initialised n bytes after `got`.
                        Ok(n) => unsafe { buf.set_len(got + n) },
                        Err(e) => return done.err(e),
                    }
                }
            }
            done.ok(Bytes::from(buf))
        }
        Op::Write {
            fd,
            buf,
            offset,
            done,
        } => {
            if res < 0 {
                return done.err(Errno(-res));
            }
            let n = res as usize;
            if n < buf.len() {
                if let Err(e) = sys::pwrite_all(fd.as_fd(), &buf[n..], offset + n as u64) {
                    return done.err(e);
                }
            }
            done.ok(buf.len() as u32)
        }
    }
}

impl Drop for Uring {
    /// Lets every I/O in flight complete, then stops the reaper.
    fn drop(&mut self) {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.stop = true;
            // SAFETY: as in `queue`; a NOP points at nothing.
            unsafe {
                let mut sq = self.shared.ring.submission_shared();
                let _ = sq.push(&opcode::Nop::new().build().user_data(WAKE));
                sq.sync();
            }
            self.shared.wake.notify_one();
        }
        let _ = self.shared.ring.submitter().submit();
        if let Some(t) = self.reaper.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Writes 64 blocks through a ring of 4 slots from 4 threads at once
    /// (so some find it full and get their `Done` back), reads them back
    /// through the ring, and checks every byte and the short read at the end.
    #[test]
    fn writes_and_reads_complete_later_with_the_right_bytes_and_a_full_ring_gives_back() {
        let tmp = tempfile::tempfile().unwrap();
        let fd = Arc::new(OwnedFd::from(tmp));
        let u = Arc::new(Uring::new(4).unwrap());
        let (tx, rx) = mpsc::channel();
        let gave_back = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (u, fd, tx, gb) = (u.clone(), fd.clone(), tx.clone(), gave_back.clone());
                s.spawn(move || {
                    for b in (t..64).step_by(4) {
                        let data = vec![b as u8 ^ 0x5a; 4096];
                        let tx2 = tx.clone();
                        let done = Done::new(move |r| tx2.send((b, r)).unwrap());
                        if let Some(d) = u.write(fd.clone(), b * 4096, &data, done) {
                            gb.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let r = sys::pwrite_all(fd.as_fd(), &data, b * 4096);
                            d.send(r.map(|n| n as u32));
                        }
                    }
                });
            }
        });
        let mut seen = [false; 64];
        for _ in 0..64 {
            let (b, r) = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
            assert_eq!(r, Ok(4096), "write of block {b}");
            seen[b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        let (tx, rx) = mpsc::channel();
        for b in 0..64u64 {
            let tx2 = tx.clone();
            let done = Done::new(move |r| tx2.send((b, r)).unwrap());
            if let Some(d) = u.read(fd.clone(), b * 4096, 4096, done) {
                d.err(Errno(libc::EAGAIN));
            }
        }
        let mut read = 0;
        for _ in 0..64 {
            let (b, r) = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
            match r {
                Ok(v) => {
                    assert_eq!(v.len(), 4096);
                    assert!(v.iter().all(|&x| x == b as u8 ^ 0x5a), "block {b}");
                    read += 1;
                }
                Err(e) => assert_eq!(e, Errno(libc::EAGAIN), "block {b}"),
            }
        }
        assert!(read >= 4, "the ring served no reads");
        // Past the end: a short read, then nothing.
        let (tx, rx) = mpsc::channel();
        let t2 = tx.clone();
        assert!(u
            .read(
                fd.clone(),
                63 * 4096 + 100,
                8192,
                Done::new(move |r| t2.send(r).unwrap())
            )
            .is_none());
        assert_eq!(rx.recv().unwrap().unwrap().len(), 4096 - 100);
        assert!(u
            .read(
                fd.clone(),
                1 << 30,
                4096,
                Done::new(move |r| tx.send(r).unwrap())
            )
            .is_none());
        assert_eq!(rx.recv().unwrap().unwrap().len(), 0);
        drop(u);
    }

    #[test]
    fn errors_come_back_as_errnos() {
        let tmp = tempfile::tempdir().unwrap();
        // A directory fd: read(2) fails with EISDIR.
        let fd = Arc::new(OwnedFd::from(std::fs::File::open(tmp.path()).unwrap()));
        let u = Uring::new(2).unwrap();
        let (tx, rx) = mpsc::channel();
        assert!(u
            .read(fd, 0, 4096, Done::new(move |r| tx.send(r).unwrap()))
            .is_none());
        assert_eq!(rx.recv().unwrap().err(), Some(Errno(libc::EISDIR)));
    }
}
