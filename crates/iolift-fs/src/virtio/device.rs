//! The vhost-user virtio-fs device: rust-vmm's vhost-user-backend runs
//! the socket protocol (features, memory table, vring addresses, kick and
//! call eventfds) and one thread per virtqueue; [`FsDevice`] takes each
//! available descriptor chain, copies its device-readable part (the FUSE
//! request) out of guest memory, and hands it to the [`Session`] with a
//! [`Reply`] that writes the answer into the chain's device-writable
//! buffers, puts the chain on the used ring and signals the guest, from
//! whichever thread completes the request. Queue 0 is virtio-fs's
//! high-priority queue (FORGET), queues 1.. carry requests.

use super::pool::Pool;
use super::reply::{Reply, Sink};
use super::session::Session;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueOwnedT;
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

pub type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

pub struct FsDevice {
    session: Arc<Session>,
    mem: Mem,
    /// Request queues (the high-priority queue comes on top).
    request_queues: usize,
    queue_size: u16,
    tag: Option<String>,
    event_idx: AtomicBool,
    pool: Option<Pool>,
}

impl FsDevice {
    pub fn new(
        session: Arc<Session>,
        mem: Mem,
        request_queues: usize,
        queue_size: u16,
        tag: Option<String>,
        pool: Option<Pool>,
    ) -> FsDevice {
        FsDevice {
            session,
            mem,
            request_queues,
            queue_size,
            tag,
            event_idx: AtomicBool::new(false),
            pool,
        }
    }

    /// Serves every available chain of `vring`, until the guest has added
    /// no more since notifications were turned back on.
    fn process(&self, vring: &VringRwLock) -> io::Result<()> {
        loop {
            vring.disable_notification().map_err(io::Error::other)?;
            let chains: Vec<_> = {
                let mem = self.mem.memory();
                let mut g = vring.get_mut();
                let q = g.get_queue_mut();
                q.iter(mem).map_err(io::Error::other)?.collect()
            };
            // With a pool, the last request of a batch is served here:
            // a lone request (queue depth 1) then costs no hand-over.
            // One batch: I/O the requests queue is submitted together and
            // the guest is signalled once for every reply written here.
            let n = chains.len();
            crate::batch::run(|| {
                for (i, chain) in chains.into_iter().enumerate() {
                    self.one(vring, chain, i + 1 == n);
                }
            });
            if !vring.enable_notification().map_err(io::Error::other)? {
                return Ok(());
            }
        }
    }

    /// One descriptor chain: the request read out, the reply's buffers
    /// noted, and the request served (on the pool unless `last`, or here).
    fn one<M>(&self, vring: &VringRwLock, chain: virtio_queue::DescriptorChain<M>, last: bool)
    where
        M: std::ops::Deref<Target = GuestMemoryMmap> + Clone,
    {
        let head = chain.head_index();
        let max = self.session.max_request();
        let mut req = Vec::new();
        let mut out: Vec<(GuestAddress, usize)> = Vec::new();
        let mut bad: Option<String> = None;
        let mem = chain.memory().clone();
        for d in chain {
            let len = d.len() as usize;
            if d.is_write_only() {
                out.push((d.addr(), len));
            } else if !out.is_empty() {
                bad = Some("a device-readable buffer after a writable one".into());
            } else if req.len() + len > max {
                bad = Some(format!("a request of more than {max} bytes"));
            } else if bad.is_none() {
                if let Err(e) = append_guest(&mut req, &mem, d.addr(), len) {
                    bad = Some(format!("unreadable guest memory at {:#x}: {e}", d.addr().0));
                }
            }
        }
        let room: usize = out.iter().map(|o| o.1).sum();
        let sink = self.sink(vring.clone(), head, out);
        let reply = Reply::new(0, room, sink);
        if let Some(why) = bad {
            tracing::warn!("virtio-fs: bad descriptor chain {head}: {why}");
            return reply.err(crate::model::Errno::EINVAL);
        }
        match &self.pool {
            Some(p) if !last => p.submit(req, reply),
            _ => self.session.handle(&req, reply),
        }
    }

    /// Where a reply goes: written piece by piece into the writable
    /// buffers, then the chain is returned and the guest signalled.
    fn sink(&self, vring: VringRwLock, head: u16, out: Vec<(GuestAddress, usize)>) -> Sink {
        let mem = self.mem.clone();
        // The vring's own allocation names it for the batch.
        let key = vring.get_ref().get_queue() as *const _ as usize;
        Box::new(move |parts: Option<&[&[u8]]>| {
            let m = mem.memory();
            let mut written = 0usize;
            let (mut i, mut off) = (0usize, 0usize);
            for p in parts.unwrap_or(&[]) {
                let mut p: &[u8] = p;
                while !p.is_empty() && i < out.len() {
                    let (addr, len) = out[i];
                    let n = p.len().min(len - off);
                    if m.write_slice(&p[..n], GuestAddress(addr.0 + off as u64))
                        .is_err()
                    {
                        tracing::warn!(
                            "virtio-fs: reply buffer of chain {head} is not guest memory"
                        );
                        break;
                    }
                    written += n;
                    p = &p[n..];
                    off += n;
                    if off == len {
                        i += 1;
                        off = 0;
                    }
                }
            }
            if let Err(e) = vring.get_mut().add_used(head, written as u32) {
                tracing::warn!("virtio-fs: cannot return chain {head}: {e}");
            }
            // At the end of this thread's batch (at once outside one): one
            // notification for every chain the batch returned.
            crate::batch::defer(crate::batch::Key::Notify(key), move || {
                if vring.get_mut().needs_notification().unwrap_or(true) {
                    if let Err(e) = vring.signal_used_queue() {
                        tracing::warn!("virtio-fs: cannot signal the guest: {e}");
                    }
                }
            })
        })
    }
}

/// Appends `len` bytes of guest memory at `addr` to `req`. A buffer that
/// lies in one memory region (the usual case) is copied with one memcpy
/// into the vector's spare room; one that spans regions goes through
/// vm-memory's piecewise read (zero-filled first).
fn append_guest(
    req: &mut Vec<u8>,
    mem: &GuestMemoryMmap,
    addr: GuestAddress,
    len: usize,
) -> Result<(), vm_memory::GuestMemoryError> {
    let at = req.len();
    if let Ok(vs) = mem.get_slice(addr, len) {
        req.reserve(len);
        let src = vs.ptr_guard();
        // SAFETY: `src` covers `len` readable bytes of the mapping (checked
        // by get_slice, kept mapped by the guard), `req` has room for
        // `len` more bytes after `at`, and the two do not overlap (one is
        // guest memory, the other this vector's heap block). The bytes
        // copied are plain u8s, so every value is valid, and set_len
        // covers only what was written.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), req.as_mut_ptr().add(at), len);
            req.set_len(at + len);
        }
        return Ok(());
    }
    req.resize(at + len, 0);
    mem.read_slice(&mut req[at..], addr)
        .inspect_err(|_| req.truncate(at))
}

impl VhostUserBackend for FsDevice {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        1 + self.request_queues
    }

    fn max_queue_size(&self) -> usize {
        self.queue_size as usize
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        if self.tag.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        f
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    /// virtio_fs_config: the tag (36 bytes, NUL-padded) and the number of
    /// request queues, for front-ends that take them from the device
    /// (QEMU's vhost-user-fs-pci has its own `tag=`).
    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut cfg = [0u8; 40];
        if let Some(t) = &self.tag {
            let b = t.as_bytes();
            cfg[..b.len().min(36)].copy_from_slice(&b[..b.len().min(36)]);
        }
        cfg[36..40].copy_from_slice(&(self.request_queues as u32).to_le_bytes());
        let start = (offset as usize).min(cfg.len());
        let end = start.saturating_add(size as usize).min(cfg.len());
        cfg[start..end].to_vec()
    }

    fn update_memory(&self, _mem: Mem) -> io::Result<()> {
        Ok(())
    }

    /// One thread per queue.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.num_queues()).map(|i| 1u64 << i).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        let Some(vring) = vrings.get(device_event as usize) else {
            return Err(io::Error::other(format!(
                "event for unknown queue {device_event}"
            )));
        };
        self.process(vring)
    }
}
