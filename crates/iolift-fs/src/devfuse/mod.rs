//! A second kernel FUSE front-end that mounts /dev/fuse itself and serves
//! it with the FUSE session of the virtio-fs front-end (virtio/session.rs:
//! request bytes in, a [`Reply`](crate::virtio::reply::Reply) out), over
//! one of two transports:
//!
//! ```text
//!  uring (FUSE over io_uring, Linux 6.14+, fuse.enable_uring=Y):
//!    application -> kernel FUSE client -> queue of the caller's CPU
//!      -> ring entry (header + payload buffers) -> CQE on that queue's
//!         thread (ring.rs) -> session.rs -> FileSystem -> Done
//!      -> reply written into the same entry -> COMMIT_AND_FETCH SQE
//!         (answers and waits for the entry's next request)
//!  read/write (classic.rs; also INIT, and FORGET/INTERRUPT with the ring):
//!    read(/dev/fuse) -> session.rs -> FileSystem -> writev(/dev/fuse)
//! ```
//!
//! The INIT answer asks for FUSE_OVER_IO_URING when the ring is wanted and
//! the kernel offered it; without it (enable_uring=N, an older kernel, or
//! an io_uring that cannot be set up) the same mount is served over
//! read/write, with a log line saying why. See docs/fs.md.

mod abi;
mod classic;
mod mount;
mod patch;
mod ring;

use crate::fs::FileSystem;
use crate::stats::OpStats;
use crate::virtio::{Session, SessionOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

/// The largest ring depth accepted (entries per queue).
pub const MAX_RING_DEPTH: usize = 1024;

/// How requests travel between the kernel and this server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// FUSE over io_uring, falling back to read/write if the kernel says no.
    Uring,
    /// read()/write() on /dev/fuse, one cloned fd per thread.
    ReadWrite,
}

/// How the mount is set up and what it may hold.
#[derive(Clone, Debug)]
pub struct DevFuseOptions {
    pub transport: Transport,
    /// read/write: reader threads, each on its own cloned fd (1..=64).
    /// With the ring, one reader serves what does not go on it.
    pub threads: usize,
    /// uring: entries per queue (1..=MAX_RING_DEPTH). Memory: queues x
    /// depth x (the session's max_write + 4 KiB), touched as used.
    pub ring_depth: usize,
    /// uring: spin on the completion queue this long before sleeping (0:
    /// sleep at once). Spinning costs CPU while idle.
    pub spin: Duration,
    /// Let the kernel keep directory listings where the backend's
    /// directory mtimes change with their entries.
    pub dir_cache: bool,
    pub session: SessionOptions,
    /// The fstype shown in /proc/mounts is `fuse.<subtype>`.
    pub subtype: String,
}

impl Default for DevFuseOptions {
    fn default() -> Self {
        DevFuseOptions {
            transport: Transport::Uring,
            threads: 4,
            ring_depth: 8,
            spin: Duration::ZERO,
            dir_cache: true,
            session: SessionOptions::default(),
            subtype: "iolift-fs".into(),
        }
    }
}

/// Counters shared by the transport threads.
#[derive(Debug, Default)]
pub struct Shared {
    /// Requests that arrived through the ring.
    pub ring_requests: AtomicU64,
    /// Requests read from /dev/fuse (INIT, FORGETs, or all of them
    /// without the ring).
    pub dev_requests: AtomicU64,
    /// Whether the kernel agreed to the ring at INIT.
    pub uring: AtomicBool,
    dir_cache: bool,
}

/// A mounted file system. Dropping it unmounts and waits for its threads.
pub struct Mounted {
    dir: PathBuf,
    readers: Vec<JoinHandle<io::Result<()>>>,
    rings: Vec<JoinHandle<io::Result<()>>>,
    mounted: bool,
    pub stats: Arc<OpStats>,
    pub shared: Arc<Shared>,
}

impl Mounted {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the readers have stopped (the mount was taken away).
    pub fn is_finished(&self) -> bool {
        self.readers.iter().all(|h| h.is_finished())
    }

    /// Unmounts (lazily if `lazy` or busy) and waits for the threads.
    pub fn unmount(mut self, lazy: bool) -> io::Result<()> {
        self.finish(lazy)
    }

    fn finish(&mut self, lazy: bool) -> io::Result<()> {
        if self.mounted {
            self.mounted = false;
            match crate::kernel::umount(&self.dir, lazy) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
                Err(_) if !lazy => crate::kernel::umount(&self.dir, true)?,
                Err(e) => return Err(e),
            }
        }
        let mut first = Ok(());
        for h in self.readers.drain(..).chain(self.rings.drain(..)) {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a devfuse thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.finish(false) {
            tracing::warn!("unmounting {}: {e}", self.dir.display());
        }
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Mounts `fs` on `dir` and serves it over `opts.transport`.
pub fn mount(fs: Arc<dyn FileSystem>, dir: &Path, opts: &DevFuseOptions) -> io::Result<Mounted> {
    if !(1..=64).contains(&opts.threads) {
        return Err(invalid(format!(
            "threads {}: must be 1 to 64",
            opts.threads
        )));
    }
    if !(1..=MAX_RING_DEPTH).contains(&opts.ring_depth) {
        return Err(invalid(format!(
            "ring depth {}: must be 1 to {MAX_RING_DEPTH}",
            opts.ring_depth
        )));
    }
    if opts.spin > Duration::from_millis(10) {
        return Err(invalid(format!("spin {:?}: at most 10 ms", opts.spin)));
    }
    let dir_cache = opts.dir_cache && fs.cacheable_listings();
    let name = fs.name();
    let (fd, dir) = mount::mount(dir, &name, &opts.subtype)?;
    let fd = Arc::new(fd);
    let stats = Arc::new(OpStats::default());
    let shared = Arc::new(Shared {
        dir_cache,
        ..Shared::default()
    });
    let mut m = Mounted {
        dir,
        readers: Vec::new(),
        rings: Vec::new(),
        mounted: true,
        stats: stats.clone(),
        shared: shared.clone(),
    };
    let session = Arc::new(Session::new(fs, stats, opts.session.clone()));
    let room = session.max_request();
    // The ring threads create their rings first (a single-issuer ring
    // belongs to the thread that made it), then wait for INIT.
    let mut go = Vec::new();
    let mut ring_ok = false;
    if opts.transport == Transport::Uring {
        match start_rings(&fd, &session, &shared, opts, room, &mut m.rings) {
            Ok(g) => {
                go = g;
                ring_ok = true;
            }
            Err(e) => tracing::warn!(
                "devfuse: {e}; serving {} over read/write on /dev/fuse",
                m.dir.display()
            ),
        }
    }
    let mut buf = vec![0u8; room];
    let n = classic::read_one(&fd, &mut buf)?
        .ok_or_else(|| io::Error::other("the FUSE connection closed before INIT"))?;
    let req = &buf[..n];
    let offer = patch::Offer::parse(req).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the kernel's first FUSE request is not INIT",
        )
    })?;
    shared.dev_requests.fetch_add(1, Ordering::Relaxed);
    let uring = ring_ok && offer.uring();
    if opts.transport == Transport::Uring && ring_ok && !uring {
        tracing::warn!(
            "devfuse: the kernel did not offer FUSE over io_uring (needs Linux 6.14+ with \
             /sys/module/fuse/parameters/enable_uring = Y): serving {} over read/write on /dev/fuse",
            m.dir.display()
        );
    }
    classic::answer(
        &session,
        &fd,
        req,
        room,
        patch::for_request(req, uring, dir_cache),
    );
    shared.uring.store(uring, Ordering::Relaxed);
    for g in go {
        let _ = g.send(uring);
    }
    if uring {
        tracing::info!(
            "devfuse: {} served over io_uring ({} queues x {} entries)",
            m.dir.display(),
            m.rings.len(),
            opts.ring_depth
        );
    }
    let readers = if uring { 1 } else { opts.threads };
    for t in 0..readers {
        let f = if t == 0 {
            fd.clone()
        } else {
            Arc::new(mount::clone_fd(&fd)?)
        };
        let (s, sh) = (session.clone(), shared.clone());
        m.readers.push(
            std::thread::Builder::new()
                .name(format!("devfuse-rd{t}"))
                .spawn(move || classic::serve(f, s, sh))?,
        );
    }
    Ok(m)
}

/// Starts one thread per kernel queue; returns their go signals once
/// every ring is set up.
fn start_rings(
    fd: &Arc<OwnedFd>,
    session: &Arc<Session>,
    shared: &Arc<Shared>,
    opts: &DevFuseOptions,
    room: usize,
    handles: &mut Vec<JoinHandle<io::Result<()>>>,
) -> io::Result<Vec<mpsc::Sender<bool>>> {
    let queues = mount::possible_cpus()?;
    if queues > u16::MAX as usize {
        return Err(invalid(format!("{queues} CPUs: too many queues")));
    }
    let mut go = Vec::new();
    let mut setups = Vec::new();
    for qid in 0..queues {
        let (stx, srx) = mpsc::channel();
        let (gtx, grx) = mpsc::channel();
        let cfg = ring::QueueConfig {
            qid: qid as u16,
            depth: opts.ring_depth,
            payload: room,
            spin: opts.spin,
        };
        let (f, s, sh) = (fd.clone(), session.clone(), shared.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("devfuse-q{qid}"))
                .spawn(move || ring::run(f, s, sh, cfg, stx, grx))?,
        );
        go.push(gtx);
        setups.push(srx);
    }
    let mut err = None;
    for s in setups {
        match s.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => err = err.or(Some(e)),
            Err(_) => err = err.or(Some(io::Error::other("a ring thread ended early"))),
        }
    }
    match err {
        None => Ok(go),
        Some(e) => {
            for g in go {
                let _ = g.send(false);
            }
            Err(e)
        }
    }
}
