//! The virtio-fs front-end: serves a [`FileSystem`] to a virtual machine
//! over a vhost-user socket (QEMU's `-device vhost-user-fs-pci`), so the
//! guest mounts it with `mount -t virtiofs TAG /mnt`. See docs/fs.md.
//!
//! ```text
//!  guest FUSE client -> virtqueue (shared guest memory) -> device.rs: one
//!  thread per queue pops a chain, copies the request out
//!    -> [pool.rs: a worker thread] -> session.rs: request.rs decodes it,
//!       one FileSystem call -> Done -> reply.rs -> wire.rs encodes the
//!       answer into the chain's writable buffers -> used ring, guest signalled
//! ```

mod device;
pub mod driver;
mod pool;
pub mod reply;
pub mod request;
pub mod session;
pub mod wire;

pub use session::{Session, SessionOptions};

use crate::fs::FileSystem;
use crate::stats::OpStats;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// The front-end's budgets and options (see docs/fs.md).
#[derive(Clone, Debug)]
pub struct VirtioOptions {
    /// Request queues offered (the guest uses as many as its device has).
    pub queues: usize,
    /// Largest virtqueue the guest may set up (entries).
    pub queue_size: u16,
    /// Worker threads serving requests besides the queue threads; 0
    /// serves each request on its queue's thread.
    pub thread_pool_size: usize,
    /// The tag reported in the device config (for front-ends that ask).
    pub tag: Option<String>,
    pub session: SessionOptions,
}

impl Default for VirtioOptions {
    fn default() -> Self {
        VirtioOptions {
            queues: 1,
            queue_size: 1024,
            thread_pool_size: 0,
            tag: None,
            session: SessionOptions::default(),
        }
    }
}

/// A device that waits for one vhost-user connection on its socket.
pub struct Server {
    daemon: VhostUserDaemon<Arc<device::FsDevice>>,
    socket: PathBuf,
    pub stats: Arc<OpStats>,
}

impl Server {
    /// Makes the device; `serve` listens.
    pub fn new(fs: Arc<dyn FileSystem>, socket: &Path, o: &VirtioOptions) -> io::Result<Server> {
        if !(1..=64).contains(&o.queues) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queues {}: must be 1 to 64", o.queues),
            ));
        }
        if !o.queue_size.is_power_of_two() || o.queue_size < 16 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "queue size {}: must be a power of two, 16 to 32768",
                    o.queue_size
                ),
            ));
        }
        if o.tag.as_ref().is_some_and(|t| t.is_empty() || t.len() > 36) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "tag: must be 1 to 36 bytes",
            ));
        }
        let stats = Arc::new(OpStats::default());
        let session = Arc::new(Session::new(fs, stats.clone(), o.session.clone()));
        let pool = match o.thread_pool_size {
            0 => None,
            // At most two requests per worker wait: each holds a copy of
            // up to `max_request` bytes.
            n => Some(pool::Pool::new(session.clone(), n, 2 * n)?),
        };
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let dev = Arc::new(device::FsDevice::new(
            session,
            mem.clone(),
            o.queues,
            o.queue_size,
            o.tag.clone(),
            pool,
        ));
        let daemon = VhostUserDaemon::new("iolift-virtiofs".into(), dev, mem)
            .map_err(|e| io::Error::other(format!("vhost-user daemon: {e}")))?;
        Ok(Server {
            daemon,
            socket: socket.to_path_buf(),
            stats,
        })
    }

    /// Binds the socket, calls `ready`, then serves one front-end until
    /// it disconnects (a guest that powers off or vanishes ends it
    /// cleanly). The socket is removed at the end.
    pub fn serve(mut self, ready: impl FnOnce()) -> io::Result<()> {
        let r = self.serve_inner(ready);
        let _ = std::fs::remove_file(&self.socket);
        r
    }

    fn serve_inner(&mut self, ready: impl FnOnce()) -> io::Result<()> {
        use vhost::vhost_user::Error as VuError;
        use vhost_user_backend::Error;
        let sock = self.socket.display().to_string();
        let mut l = vhost::vhost_user::Listener::new(&self.socket, true)
            .map_err(|e| io::Error::other(format!("vhost-user socket {sock}: {e}")))?;
        ready();
        self.daemon
            .start(&mut l)
            .map_err(|e| io::Error::other(format!("vhost-user on {sock}: {e}")))?;
        match self.daemon.wait() {
            Ok(())
            | Err(Error::HandleRequest(
                VuError::Disconnected | VuError::PartialMessage | VuError::SocketBroken(_),
            )) => Ok(()),
            Err(e) => Err(io::Error::other(format!("vhost-user on {sock}: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests;
