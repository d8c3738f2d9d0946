//! The io_uring transport: one thread and one io_uring (128-byte SQEs)
//! per kernel FUSE queue. Each ring entry is a header buffer plus a
//! payload buffer handed to the kernel with FUSE_IO_URING_CMD_REGISTER;
//! its command completes when the kernel has written a request into the
//! buffers. The thread rebuilds the request's bytes, hands them to the
//! shared FUSE session, and the reply, written into the same buffers, goes
//! back with FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which also waits for the
//! entry's next request: one submission per request in each direction.

use super::abi;
use super::patch;
use super::Shared;
use crate::model::Errno;
use crate::virtio::reply::Reply;
use crate::virtio::wire::{IN_HEADER_LEN, OUT_HEADER_LEN};
use crate::virtio::Session;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One queue's settings.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    pub qid: u16,
    /// Ring entries (requests in flight on this queue).
    pub depth: usize,
    /// Bytes of each entry's payload buffer (the kernel's largest request
    /// or reply body).
    pub payload: usize,
    /// Spin on the completion queue this long before sleeping.
    pub spin: Duration,
}

/// user_data of the eventfd read that wakes the thread for replies
/// completed on other threads.
const WAKE: u64 = u64::MAX;
const IORING_ENTER_GETEVENTS: u32 = 1;

thread_local! {
    /// qid + 1 of the ring thread running here (0: none).
    static ON_RING: Cell<u32> = const { Cell::new(0) };
}

/// Replies written into their entries, waiting to be committed.
struct Ready {
    list: Mutex<Vec<usize>>,
    wake: OwnedFd,
    qid: u16,
}

impl Ready {
    fn push(&self, i: usize) {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).push(i);
        if ON_RING.with(|c| c.get()) != self.qid as u32 + 1 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: 8 valid bytes; an eventfd write of 1 cannot block
            // (non-blocking fd) or fail short of counter overflow.
            unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }
}

/// One ring entry's buffers. They move only with the `Vec` of boxes
/// (the boxed memory stays put), and between a request's arrival and its
/// commit only its `Reply` touches them.
struct Ent {
    hdr: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
    commit_id: u64,
}

/// Raw pointers to an entry's buffers, for the reply sink.
struct EntPtr {
    hdr: *mut u8,
    payload: *mut u8,
    cap: usize,
}
// SAFETY: the buffers outlive every reply (the thread joins only after
// all entries are dead, and replies are dropped by then), and each is used
// by one reply at a time.
unsafe impl Send for EntPtr {}

impl EntPtr {
    /// Writes a reply's pieces (header first) into the entry.
    fn write(&self, parts: Option<&[&[u8]]>) {
        // SAFETY: see `EntPtr`.
        let hdr = unsafe { std::slice::from_raw_parts_mut(self.hdr, abi::HEADER_BUF_LEN) };
        // SAFETY: see `EntPtr`.
        let pay = unsafe { std::slice::from_raw_parts_mut(self.payload, self.cap) };
        let body: usize = parts.map_or(0, |p| p.iter().skip(1).map(|b| b.len()).sum());
        match parts {
            Some(p) if p.first().is_some_and(|h| h.len() == OUT_HEADER_LEN) && body <= self.cap => {
                hdr[abi::IN_OUT_OFF..][..OUT_HEADER_LEN].copy_from_slice(p[0]);
                let mut at = 0;
                for b in &p[1..] {
                    pay[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
                hdr[abi::PAYLOAD_SZ_OFF..][..4].copy_from_slice(&(at as u32).to_le_bytes());
            }
            _ => {
                // No reply (or one that cannot be placed): the entry must
                // still go back, so answer EIO.
                let unique = abi::u64_at(hdr, abi::COMMIT_ID_OFF).unwrap_or(0);
                let h = &mut hdr[abi::IN_OUT_OFF..][..OUT_HEADER_LEN];
                h[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_le_bytes());
                h[4..8].copy_from_slice(&(-libc::EIO).to_le_bytes());
                h[8..16].copy_from_slice(&unique.to_le_bytes());
                hdr[abi::PAYLOAD_SZ_OFF..][..4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
    }
}

/// Sets an SQE's `len` (the io-uring crate's UringCmd80 has no setter;
/// FUSE's REGISTER wants the iovec count there).
fn with_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is a repr(C) io_uring_sqe (64 bytes) followed by
    // 64 command bytes, plain data; `len` is the u32 at offset 24.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&len.to_le_bytes());
    // SAFETY: as above; every bit pattern of the plain fields is valid.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Pins the calling thread to `cpu` (best effort: requests from tasks on
/// that CPU arrive on this queue).
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < 1024 {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

fn build_ring(entries: u32) -> io::Result<IoUring<squeue::Entry128, cqueue::Entry>> {
    // Task work (the kernel filling an entry) runs when this thread waits.
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
        .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(entries))
}

/// One queue's thread: sets up its ring, reports that on `setup`, waits
/// for `go` (the INIT reply is written, the ring wanted), registers its
/// entries and serves until they are all torn down (unmount).
pub fn run(
    fd: Arc<OwnedFd>,
    session: Arc<Session>,
    shared: Arc<Shared>,
    cfg: QueueConfig,
    setup: mpsc::Sender<io::Result<()>>,
    go: mpsc::Receiver<bool>,
) -> io::Result<()> {
    pin(cfg.qid as usize);
    let sq = (cfg.depth as u32 + 1).next_power_of_two();
    let ring = build_ring(sq).and_then(|r| super::mount::eventfd().map(|w| (r, w)));
    let (ring, wake) = match ring {
        Ok(x) => {
            let _ = setup.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = setup.send(Err(io::Error::new(e.kind(), format!("io_uring: {e}"))));
            return Ok(());
        }
    };
    if go.recv() != Ok(true) {
        return Ok(());
    }
    ON_RING.with(|c| c.set(cfg.qid as u32 + 1));
    let ents = (0..cfg.depth)
        .map(|_| {
            let mut hdr = vec![0u8; abi::HEADER_BUF_LEN].into_boxed_slice();
            let mut payload = vec![0u8; cfg.payload].into_boxed_slice();
            let iov = Box::new([
                libc::iovec {
                    iov_base: hdr.as_mut_ptr().cast(),
                    iov_len: hdr.len(),
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: payload.len(),
                },
            ]);
            Ent {
                hdr,
                payload,
                iov,
                commit_id: 0,
            }
        })
        .collect();
    let ready = Arc::new(Ready {
        list: Mutex::new(Vec::with_capacity(cfg.depth)),
        wake,
        qid: cfg.qid,
    });
    let mut q = Queue {
        fd,
        session,
        shared,
        cfg,
        ents,
        ready,
        scratch: Vec::new(),
    };
    q.serve(ring)
}

struct Queue {
    fd: Arc<OwnedFd>,
    session: Arc<Session>,
    shared: Arc<Shared>,
    cfg: QueueConfig,
    ents: Vec<Ent>,
    ready: Arc<Ready>,
    /// One request's bytes, rebuilt in one piece for the session.
    scratch: Vec<u8>,
}

impl Queue {
    fn sqe(&self, i: usize, cmd: u32) -> squeue::Entry128 {
        let e = &self.ents[i];
        let commit = if cmd == abi::CMD_REGISTER {
            0
        } else {
            e.commit_id
        };
        let s = opcode::UringCmd80::new(types::Fd(self.fd.as_raw_fd()), cmd)
            .cmd(abi::cmd_req(commit, self.cfg.qid))
            .addr(Some(e.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        with_len(s, abi::IOV_SEGS)
    }

    fn serve(&mut self, mut ring: IoUring<squeue::Entry128, cqueue::Entry>) -> io::Result<()> {
        let mut todo: Vec<(usize, u32)> = (0..self.ents.len())
            .map(|i| (i, abi::CMD_REGISTER))
            .collect();
        let mut live = self.ents.len();
        let mut wake_buf = Box::new([0u8; 8]);
        let mut wake_armed = false;
        let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(self.ents.len() + 1);
        while live > 0 {
            {
                let ready =
                    std::mem::take(&mut *self.ready.list.lock().unwrap_or_else(|e| e.into_inner()));
                todo.extend(ready.into_iter().map(|i| (i, abi::CMD_COMMIT_AND_FETCH)));
                let entries: Vec<squeue::Entry128> =
                    todo.drain(..).map(|(i, c)| self.sqe(i, c)).collect();
                let mut sq = ring.submission();
                for e in &entries {
                    // SAFETY: the buffers an SQE names live in `self.ents`
                    // until the thread ends; the SQ holds depth + 1 entries.
                    unsafe { sq.push(e) }.map_err(|_| io::Error::other("SQ full"))?;
                }
                if !wake_armed {
                    let r = opcode::Read::new(
                        types::Fd(self.ready.wake.as_raw_fd()),
                        wake_buf.as_mut_ptr(),
                        8,
                    )
                    .build()
                    .user_data(WAKE);
                    // SAFETY: `wake_buf` lives until the thread ends.
                    unsafe { sq.push(&r.into()) }.map_err(|_| io::Error::other("SQ full"))?;
                    wake_armed = true;
                }
            }
            self.wait(&mut ring)?;
            cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
            // One batch: what the requests defer (the mirror's io_uring
            // submissions) runs once after all of them.
            crate::batch::run(|| {
                for (ud, res) in cqes.drain(..) {
                    if ud == WAKE {
                        wake_armed = false;
                        continue;
                    }
                    let i = ud as usize;
                    if res == -libc::EAGAIN {
                        // Not initialised yet: register again shortly.
                        std::thread::sleep(Duration::from_millis(1));
                        todo.push((i, abi::CMD_REGISTER));
                    } else if res < 0 {
                        live -= 1;
                        let e = io::Error::from_raw_os_error(-res);
                        if res != -libc::ENOTCONN && res != -libc::ECANCELED {
                            tracing::warn!("devfuse: queue {} entry {i}: {e}", self.cfg.qid);
                        }
                    } else {
                        self.request(i);
                    }
                }
            });
        }
        Ok(())
    }

    /// Submits and waits for at least one completion, spinning first if
    /// configured.
    fn wait(&self, ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> io::Result<()> {
        let r = if self.cfg.spin.is_zero() {
            ring.submit_and_wait(1)
        } else {
            ring.submit()?;
            let t = Instant::now();
            loop {
                if !ring.completion().is_empty() {
                    break Ok(0);
                }
                if t.elapsed() >= self.cfg.spin {
                    break ring.submit_and_wait(1);
                }
                // SAFETY: no SQEs are passed; GETEVENTS runs deferred task work.
                let r = unsafe {
                    ring.submitter()
                        .enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None)
                };
                if let Err(e) = r {
                    if e.raw_os_error() != Some(libc::EINTR) {
                        break Err(e);
                    }
                }
            }
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), format!("io_uring_enter: {e}"))),
        }
    }

    /// Serves the request the kernel wrote into entry `i`.
    fn request(&mut self, i: usize) {
        self.shared.ring_requests.fetch_add(1, Ordering::Relaxed);
        let e = &mut self.ents[i];
        let hdr = &e.hdr;
        e.commit_id = abi::u64_at(hdr, abi::COMMIT_ID_OFF).unwrap_or(0);
        let unique = abi::u64_at(hdr, 8).unwrap_or(0);
        let ptr = EntPtr {
            hdr: e.hdr.as_mut_ptr(),
            payload: e.payload.as_mut_ptr(),
            cap: e.payload.len(),
        };
        let ready = self.ready.clone();
        let room = OUT_HEADER_LEN + e.payload.len();
        let hdr = &e.hdr;
        let len = abi::u32_at(hdr, 0).unwrap_or(0) as usize;
        let psz = abi::u32_at(hdr, abi::PAYLOAD_SZ_OFF).unwrap_or(0) as usize;
        let op_len = len.checked_sub(IN_HEADER_LEN + psz);
        self.scratch.clear();
        let patch = match op_len {
            Some(n) if n <= abi::OP_IN_LEN && psz <= e.payload.len() => {
                self.scratch.extend_from_slice(&hdr[..IN_HEADER_LEN]);
                self.scratch
                    .extend_from_slice(&hdr[abi::OP_IN_OFF..abi::OP_IN_OFF + n]);
                self.scratch.extend_from_slice(&e.payload[..psz]);
                patch::for_request(&self.scratch, false, self.shared.dir_cache)
            }
            _ => None,
        };
        let reply = Reply::new(
            unique,
            room,
            Box::new(move |parts: Option<&[&[u8]]>| {
                match (patch, parts) {
                    (Some(p), Some(parts)) => {
                        let mut v = parts.concat();
                        patch::apply(p, &mut v);
                        let (h, b) = v.split_at(OUT_HEADER_LEN.min(v.len()));
                        ptr.write(Some(&[h, b]))
                    }
                    _ => ptr.write(parts),
                }
                ready.push(i)
            }),
        );
        if self.scratch.is_empty() {
            tracing::warn!(
                "devfuse: queue {} entry {i}: bad lengths (len {len}, payload {psz}): EIO",
                self.cfg.qid
            );
            return reply.err(Errno::EIO);
        }
        self.session.handle(&self.scratch, reply);
    }
}
