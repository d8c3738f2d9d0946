//! A host-side virtio-fs driver for benchmarks: it plays the guest's part
//! against any vhost-user-fs daemon (iolift's, QEMU's virtiofsd), so the
//! daemons' speed can be compared without an emulated guest in the way.
//! It shares a memfd as "guest memory", sets up the high-priority queue
//! and one or more request queues (as many as a guest's
//! `num-request-queues`) through rust-vmm's vhost-user front-end, and
//! sends FUSE requests on split virtqueues it lays out itself: INIT,
//! LOOKUP and OPEN of one file, then 4 KiB (or `bs`) reads or writes at
//! random offsets with `depth` requests in flight, spread round-robin
//! over the request queues, waiting on the call eventfds for completions.
//! With `verify`, each written block carries its own offset (every 8-byte
//! word is the file offset it lands at) and each block read must be that
//! pattern or zeros, so a request served at the wrong place shows.
//!
//! Memory: the shared region is fixed by the queue size and the depth
//! (both bounded: depth at most 128, blocks at most 1 MiB).

use super::wire::{op, IN_HEADER_LEN, OUT_HEADER_LEN};
use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

const QSIZE: u16 = 256;
const RING_AREA: usize = 64 << 10;
/// Per in-flight request: its request buffer and its reply buffer.
const SLOT: usize = 2 * ((1 << 20) + 4096);

/// What to run.
#[derive(Clone, Debug)]
pub struct DriveOptions {
    /// A regular file in the shared directory's root.
    pub file: String,
    pub write: bool,
    pub bs: u32,
    pub depth: usize,
    /// The file's size to pick offsets in (a multiple of `bs`).
    pub span: u64,
    pub runtime: Duration,
    /// Write offset patterns; check what is read (see the module doc).
    pub verify: bool,
}

/// What a run measured.
#[derive(Debug)]
pub struct DriveResult {
    pub ops: u64,
    pub secs: f64,
    /// Latency of each request, submission to completion, microseconds.
    pub lat_p50_us: f64,
    pub lat_mean_us: f64,
    /// Requests completed on each request queue.
    pub per_queue: Vec<u64>,
}

/// The largest number of request queues the driver sets up.
pub const MAX_QUEUES: usize = 16;

/// The block written at `off` with `verify`: each 8-byte word is its own
/// file offset.
fn pattern(off: u64, bs: usize, out: &mut Vec<u8>) {
    out.clear();
    for i in 0..bs / 8 {
        out.extend_from_slice(&(off + 8 * i as u64).to_le_bytes());
    }
    out.resize(bs, 0);
}

/// The shared "guest memory": a memfd mapped here, guest address 0.
struct Shm {
    fd: std::fs::File,
    base: *mut u8,
    len: usize,
}

impl Shm {
    fn new(len: usize) -> io::Result<Shm> {
        let name = CString::new("iolift-virtiofs-driver").unwrap();
        // SAFETY: memfd_create with a valid NUL-terminated name.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor we own.
        let fd: std::fs::File = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
        fd.set_len(len as u64)?;
        // SAFETY: a fresh shared mapping of the whole memfd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Shm {
            fd,
            base: p.cast(),
            len,
        })
    }

    fn write(&self, at: usize, b: &[u8]) {
        assert!(at + b.len() <= self.len);
        // SAFETY: in bounds (checked); the daemon only reads this area
        // while the descriptor is on the ring, which the protocol orders.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.base.add(at), b.len()) }
    }

    fn read(&self, at: usize, b: &mut [u8]) {
        assert!(at + b.len() <= self.len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), b.as_mut_ptr(), b.len()) }
    }

    fn put16(&self, at: usize, v: u16) {
        assert!(at + 2 <= self.len && at.is_multiple_of(2));
        // SAFETY: aligned and in bounds; volatile, the daemon reads it.
        unsafe { std::ptr::write_volatile(self.base.add(at).cast::<u16>(), v.to_le()) }
    }

    fn get16(&self, at: usize) -> u16 {
        assert!(at + 2 <= self.len && at.is_multiple_of(2));
        // SAFETY: aligned and in bounds; volatile, the daemon writes it.
        u16::from_le(unsafe { std::ptr::read_volatile(self.base.add(at).cast::<u16>()) })
    }

    fn get32(&self, at: usize) -> u32 {
        assert!(at + 4 <= self.len && at.is_multiple_of(4));
        // SAFETY: aligned and in bounds.
        u32::from_le(unsafe { std::ptr::read_volatile(self.base.add(at).cast::<u32>()) })
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// One split virtqueue laid out in the shared memory at `base`.
struct Ring {
    base: usize,
    avail_idx: u16,
    used_seen: u16,
    kick: EventFd,
    call: EventFd,
}

impl Ring {
    fn desc(&self) -> usize {
        self.base
    }
    fn avail(&self) -> usize {
        self.base + 16 * QSIZE as usize
    }
    fn used(&self) -> usize {
        self.base + 32 * QSIZE as usize
    }

    /// Puts the chain `[readable req][writable reply]` at descriptors
    /// 2*slot and 2*slot+1 on the avail ring (not kicked).
    fn push(&mut self, m: &Shm, slot: usize, req: (u64, u32), rep: (u64, u32)) {
        let d = self.desc() + 32 * slot;
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&req.0.to_le_bytes());
        b[8..12].copy_from_slice(&req.1.to_le_bytes());
        b[12..14].copy_from_slice(&1u16.to_le_bytes()); // NEXT
        b[14..16].copy_from_slice(&(2 * slot as u16 + 1).to_le_bytes());
        b[16..24].copy_from_slice(&rep.0.to_le_bytes());
        b[24..28].copy_from_slice(&rep.1.to_le_bytes());
        b[28..30].copy_from_slice(&2u16.to_le_bytes()); // WRITE
        m.write(d, &b);
        let a = self.avail();
        m.put16(
            a + 4 + 2 * (self.avail_idx % QSIZE) as usize,
            2 * slot as u16,
        );
        fence(Ordering::SeqCst);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        m.put16(a + 2, self.avail_idx);
        fence(Ordering::SeqCst);
    }

    fn kick(&self) -> io::Result<()> {
        self.kick.write(1)
    }

    /// Adds the slots the daemon has completed since the last call.
    fn harvest(&mut self, m: &Shm, out: &mut Vec<usize>) {
        fence(Ordering::SeqCst);
        let idx = m.get16(self.used() + 2);
        while self.used_seen != idx {
            let e = self.used() + 4 + 8 * (self.used_seen % QSIZE) as usize;
            out.push(m.get32(e) as usize / 2);
            self.used_seen = self.used_seen.wrapping_add(1);
        }
    }

    /// Waits for completions; returns the slots done.
    fn wait(&mut self, m: &Shm, out: &mut Vec<usize>) -> io::Result<()> {
        out.clear();
        loop {
            self.harvest(m, out);
            if !out.is_empty() {
                return Ok(());
            }
            self.call.read()?;
        }
    }
}

/// Waits until any of `qs` has completions (at most 10 s without any:
/// an error); returns the slots done.
fn wait_any(qs: &mut [Ring], m: &Shm, out: &mut Vec<usize>) -> io::Result<()> {
    if qs.len() == 1 {
        return qs[0].wait(m, out);
    }
    out.clear();
    loop {
        for q in qs.iter_mut() {
            q.harvest(m, out);
        }
        if !out.is_empty() {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = qs
            .iter()
            .map(|q| libc::pollfd {
                fd: q.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of fds.len() pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10_000) };
        if n == 0 {
            return Err(io::Error::other("no completion on any queue for 10 s"));
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        for (q, f) in qs.iter().zip(&fds) {
            if f.revents & libc::POLLIN != 0 {
                q.call.read()?;
            }
        }
    }
}

/// A connected driver with its file open.
pub struct Driver {
    _fe: Frontend,
    mem: Shm,
    /// The request queues (the high-priority queue is set up, not used).
    qs: Vec<Ring>,
    nodeid: u64,
    fh: u64,
    unique: u64,
}

/// Where slot `slot`'s request buffer lies (after the rings' areas of
/// the high-priority queue and at most MAX_QUEUES request queues).
fn slot_req(slot: usize) -> usize {
    (1 + MAX_QUEUES) * RING_AREA + slot * SLOT
}
fn slot_rep(slot: usize) -> usize {
    slot_req(slot) + SLOT / 2
}

impl Driver {
    /// Connects to the daemon on `socket`, negotiates, sets up the
    /// high-priority queue and `queues` request queues, INIT, LOOKUP and
    /// OPEN of `file` (read-write).
    pub fn connect(socket: &Path, file: &str, depth: usize, queues: usize) -> io::Result<Driver> {
        if !(1..=128).contains(&depth) {
            return Err(io::Error::other("depth: 1 to 128"));
        }
        if !(1..=MAX_QUEUES).contains(&queues) {
            return Err(io::Error::other(format!("queues: 1 to {MAX_QUEUES}")));
        }
        let e = |what: &str| {
            let what = what.to_string();
            move |err: vhost::Error| io::Error::other(format!("vhost-user {what}: {err}"))
        };
        let mem = Shm::new(slot_req(depth.max(1)))?;
        let mut fe = Frontend::connect(socket, 1 + queues as u64).map_err(e("connect"))?;
        fe.set_owner().map_err(e("set_owner"))?;
        let feats = fe.get_features().map_err(e("get_features"))?;
        let pf_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let want = (1u64 << 32) | pf_bit;
        fe.set_features(feats & want).map_err(e("set_features"))?;
        if feats & pf_bit != 0 {
            let pf = fe.get_protocol_features().map_err(e("protocol features"))?;
            fe.set_protocol_features(pf & VhostUserProtocolFeatures::MQ)
                .map_err(e("set_protocol_features"))?;
            if queues > 1 {
                if !pf.contains(VhostUserProtocolFeatures::MQ) {
                    return Err(io::Error::other("the daemon offers no multi-queue"));
                }
                let n = fe.get_queue_num().map_err(e("get_queue_num"))?;
                if n < 1 + queues as u64 {
                    return Err(io::Error::other(format!(
                        "the daemon offers {} request queues, not {queues}",
                        n.saturating_sub(1)
                    )));
                }
            }
        }
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: mem.len as u64,
            userspace_addr: mem.base as u64,
            mmap_offset: 0,
            mmap_handle: mem.fd.as_raw_fd(),
        };
        fe.set_mem_table(&[region]).map_err(e("set_mem_table"))?;
        let mut rings = Vec::new();
        for qi in 0..=queues {
            let r = Ring {
                base: qi * RING_AREA,
                avail_idx: 0,
                used_seen: 0,
                kick: EventFd::new(0)?,
                call: EventFd::new(0)?,
            };
            let va = |off: usize| mem.base as u64 + off as u64;
            fe.set_vring_num(qi, QSIZE).map_err(e("set_vring_num"))?;
            let cfg = VringConfigData {
                queue_max_size: QSIZE,
                queue_size: QSIZE,
                flags: 0,
                desc_table_addr: va(r.desc()),
                used_ring_addr: va(r.used()),
                avail_ring_addr: va(r.avail()),
                log_addr: None,
            };
            fe.set_vring_addr(qi, &cfg).map_err(e("set_vring_addr"))?;
            fe.set_vring_base(qi, 0).map_err(e("set_vring_base"))?;
            fe.set_vring_call(qi, &r.call)
                .map_err(e("set_vring_call"))?;
            fe.set_vring_kick(qi, &r.kick)
                .map_err(e("set_vring_kick"))?;
            if feats & pf_bit != 0 {
                fe.set_vring_enable(qi, true)
                    .map_err(e("set_vring_enable"))?;
            }
            rings.push(r);
        }
        rings.remove(0);
        let mut d = Driver {
            _fe: fe,
            mem,
            qs: rings,
            nodeid: 1,
            fh: 0,
            unique: 0,
        };
        let mut init = Vec::new();
        for v in [7u32, 31, 1 << 20, 0] {
            init.extend_from_slice(&v.to_le_bytes());
        }
        d.call_sync(op::INIT, 0, &init)?;
        let mut name = file.as_bytes().to_vec();
        name.push(0);
        let ent = d.call_sync(op::LOOKUP, 1, &name)?;
        d.nodeid = u64::from_le_bytes(ent[0..8].try_into().unwrap());
        let mut o = Vec::new();
        o.extend_from_slice(&(libc::O_RDWR as u32).to_le_bytes());
        o.extend_from_slice(&0u32.to_le_bytes());
        let opened = d.call_sync(op::OPEN, d.nodeid, &o)?;
        d.fh = u64::from_le_bytes(opened[0..8].try_into().unwrap());
        Ok(d)
    }

    fn header(&mut self, opcode: u32, nodeid: u64, body_len: usize) -> Vec<u8> {
        self.unique += 1;
        let mut v = Vec::with_capacity(IN_HEADER_LEN + body_len);
        v.extend_from_slice(&((IN_HEADER_LEN + body_len) as u32).to_le_bytes());
        v.extend_from_slice(&opcode.to_le_bytes());
        v.extend_from_slice(&self.unique.to_le_bytes());
        v.extend_from_slice(&nodeid.to_le_bytes());
        v.extend_from_slice(&[0u8; 16]);
        v
    }

    /// One request on slot 0, waited for; returns the reply body.
    fn call_sync(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> io::Result<Vec<u8>> {
        let mut r = self.header(opcode, nodeid, body.len());
        r.extend_from_slice(body);
        self.mem.write(slot_req(0), &r);
        let room = 4096u32;
        let q = &mut self.qs[0];
        q.push(
            &self.mem,
            0,
            (slot_req(0) as u64, r.len() as u32),
            (slot_rep(0) as u64, room),
        );
        q.kick()?;
        let mut done = Vec::new();
        q.wait(&self.mem, &mut done)?;
        let mut h = [0u8; OUT_HEADER_LEN];
        self.mem.read(slot_rep(0), &mut h);
        let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as usize;
        let err = i32::from_le_bytes(h[4..8].try_into().unwrap());
        if err != 0 {
            return Err(io::Error::from_raw_os_error(-err));
        }
        let mut body = vec![0u8; len.saturating_sub(OUT_HEADER_LEN).min(room as usize)];
        self.mem.read(slot_rep(0) + OUT_HEADER_LEN, &mut body);
        Ok(body)
    }

    /// Random `bs` reads or writes of the open file with `depth` in flight
    /// (slot `s` on request queue `s % queues`) for `runtime`.
    pub fn run(&mut self, o: &DriveOptions) -> io::Result<DriveResult> {
        let bs = o.bs.clamp(512, 1 << 20);
        let blocks = (o.span / bs as u64).max(1);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let depth = o.depth.clamp(1, 128);
        let nq = self.qs.len();
        let mut data = vec![0x5au8; bs as usize];
        let mut started = vec![Instant::now(); depth];
        let mut offs = vec![0u64; depth];
        let mut per_queue = vec![0u64; nq];
        let mut lats: Vec<u32> = Vec::with_capacity(1 << 20);
        let mut submit = |d: &mut Driver, slot: usize, off: u64, started: &mut [Instant]| {
            let opcode = if o.write { op::WRITE } else { op::READ };
            let extra = if o.write { bs as usize } else { 0 };
            let mut r = d.header(opcode, d.nodeid, 40 + extra);
            r.extend_from_slice(&d.fh.to_le_bytes());
            r.extend_from_slice(&off.to_le_bytes());
            r.extend_from_slice(&bs.to_le_bytes());
            r.extend_from_slice(&[0u8; 20]);
            if o.write {
                if o.verify {
                    pattern(off, bs as usize, &mut data);
                }
                r.extend_from_slice(&data);
            }
            d.mem.write(slot_req(slot), &r);
            let room = OUT_HEADER_LEN as u32 + if o.write { 8 } else { bs };
            d.qs[slot % nq].push(
                &d.mem,
                slot,
                (slot_req(slot) as u64, r.len() as u32),
                (slot_rep(slot) as u64, room),
            );
            started[slot] = Instant::now();
        };
        let t0 = Instant::now();
        for (s, off) in offs.iter_mut().enumerate() {
            *off = (rnd() % blocks) * bs as u64;
            submit(self, s, *off, &mut started);
        }
        for q in &self.qs[..depth.min(nq)] {
            q.kick()?;
        }
        let mut done = Vec::new();
        let mut got = Vec::new();
        let mut want = Vec::new();
        let mut kick = vec![false; nq];
        let mut inflight = depth;
        while inflight > 0 {
            wait_any(&mut self.qs, &self.mem, &mut done)?;
            let now = Instant::now();
            let more = now.duration_since(t0) < o.runtime;
            kick.fill(false);
            for &s in &done {
                let mut h = [0u8; OUT_HEADER_LEN];
                self.mem.read(slot_rep(s), &mut h);
                let err = i32::from_le_bytes(h[4..8].try_into().unwrap());
                if err != 0 {
                    return Err(io::Error::other(format!(
                        "{} failed: {}",
                        if o.write { "WRITE" } else { "READ" },
                        io::Error::from_raw_os_error(-err)
                    )));
                }
                if o.verify && !o.write {
                    got.resize(bs as usize, 0);
                    self.mem.read(slot_rep(s) + OUT_HEADER_LEN, &mut got);
                    pattern(offs[s], bs as usize, &mut want);
                    if got != want && got.iter().any(|&b| b != 0) {
                        return Err(io::Error::other(format!(
                            "READ at {}: neither its pattern nor zeros",
                            offs[s]
                        )));
                    }
                }
                per_queue[s % nq] += 1;
                lats.push(
                    now.duration_since(started[s])
                        .as_micros()
                        .min(u32::MAX as u128) as u32,
                );
                if more && lats.len() < lats.capacity() {
                    offs[s] = (rnd() % blocks) * bs as u64;
                    submit(self, s, offs[s], &mut started);
                    kick[s % nq] = true;
                } else {
                    inflight -= 1;
                }
            }
            for (q, &k) in self.qs.iter().zip(&kick) {
                if k {
                    q.kick()?;
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let ops = lats.len() as u64;
        let mean = lats.iter().map(|&l| l as f64).sum::<f64>() / ops.max(1) as f64;
        lats.sort_unstable();
        let p50 = lats.get(lats.len() / 2).copied().unwrap_or(0) as f64;
        Ok(DriveResult {
            ops,
            secs,
            lat_p50_us: p50,
            lat_mean_us: mean,
            per_queue,
        })
    }
}
