//! One ublk device served from a [`DevRef`], on libublk.
//!
//! [`Device::start`] spawns a control thread that adds the device, starts
//! one thread per hardware queue and starts the device (the kernel then
//! creates /dev/ublkbN); it waits there for the stop message. Each queue
//! thread turns the request descriptors the driver gives it into
//! [`Request`]s, runs them on the device to completion on the tokio
//! runtime given, and commits the results. [`Device::stop`] stops the
//! device (the queue threads see their queue go down and return), then
//! deletes it.
//!
//! If the process dies instead, the driver sees the queues' io_uring
//! instances go away and fails the device's outstanding and later I/O
//! (docs/ublk.md).

use super::UblkOptions;
use crate::block::{Completion, DevRef, Errno, Flags, Reply, Request};
use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, BufDescList, UblkFlags, UblkIORes};
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long [`Device::start`] waits for the kernel to create the device.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest discard or write-zeroes request, in 512-byte sectors: it must
/// fit the 32-bit length of a [`Request`].
const MAX_DISCARD_SECTORS: u32 = 1 << 22;

/// A served ublk device.
pub struct Device {
    id: u32,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Device {
    /// Adds and starts a ublk device that serves `dev` (`read_only`
    /// refuses writes), running requests on `rt`. Returns once
    /// /dev/ublkbN exists.
    pub fn start(
        dev: DevRef,
        read_only: bool,
        opts: UblkOptions,
        rt: tokio::runtime::Handle,
    ) -> Result<Device> {
        super::check_driver()?;
        opts.validate()?;
        let (id_tx, id_rx) = mpsc::channel::<Result<u32>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ublk-ctrl".into())
            .spawn(move || control(dev, read_only, opts, rt, id_tx, stop_rx))
            .context("cannot start the ublk control thread")?;
        let mut d = Device {
            id: u32::MAX,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        match id_rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(id)) => {
                d.id = id;
                Ok(d)
            }
            Ok(Err(e)) => {
                let _ = d.join();
                Err(e)
            }
            Err(_) => {
                // The control thread ended (its error is the cause) or the
                // kernel never answered.
                let e = d.join().err();
                Err(e.unwrap_or_else(|| anyhow!("the ublk device did not start in time")))
            }
        }
    }

    /// The device number N of /dev/ublkbN.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The block device's path.
    pub fn path(&self) -> String {
        format!("/dev/ublkb{}", self.id)
    }

    /// Stops the device (requests in flight finish first), waits for its
    /// threads and deletes it. Blocks: call it off the runtime's workers.
    pub fn stop(mut self) -> Result<()> {
        self.join()
    }

    fn join(&mut self) -> Result<()> {
        drop(self.stop.take());
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow!("the ublk control thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Err(e) = self.join() {
            tracing::warn!("ublk device {}: {e:#}", self.id);
        }
    }
}

/// The control thread: add, start, wait for the stop message, stop,
/// delete.
fn control(
    dev: DevRef,
    read_only: bool,
    opts: UblkOptions,
    rt: tokio::runtime::Handle,
    id_tx: mpsc::Sender<Result<u32>>,
    stop_rx: mpsc::Receiver<()>,
) -> Result<()> {
    let info = dev.info();
    let ctrl = match UblkCtrlBuilder::default()
        .name("iolift")
        .id(-1)
        .nr_queues(opts.queues)
        .depth(opts.depth)
        .io_buf_bytes(opts.max_io)
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            let e = anyhow!("cannot add a ublk device: {e}");
            let _ = id_tx.send(Err(anyhow!("{e:#}")));
            return Err(e);
        }
    };
    let read_only = read_only || info.read_only;
    let tgt_init = move |d: &mut UblkDev| {
        d.set_default_params(info.size);
        let p = &mut d.tgt.params;
        p.basic.attrs = 0;
        if info.can_flush {
            p.basic.attrs |= sys::UBLK_ATTR_VOLATILE_CACHE;
        }
        if info.can_fua {
            p.basic.attrs |= sys::UBLK_ATTR_FUA;
        }
        if read_only {
            p.basic.attrs |= sys::UBLK_ATTR_READ_ONLY;
        }
        if info.can_trim && !read_only {
            p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
            p.discard.discard_granularity = 4096;
            p.discard.max_discard_sectors = MAX_DISCARD_SECTORS;
            p.discard.max_write_zeroes_sectors = if info.can_zero {
                MAX_DISCARD_SECTORS
            } else {
                0
            };
            p.discard.max_discard_segments = 1;
        }
        Ok(())
    };
    let q_dev = dev.clone();
    let q_rt = rt.clone();
    let queue = move |qid: u16, d: &UblkDev| serve_queue(qid, d, &q_dev, read_only, &q_rt);
    // run_target wants a Sync closure; the receiver is used once.
    let stop_rx = std::sync::Mutex::new(stop_rx);
    let started = move |c: &UblkCtrl| {
        let _ = id_tx.send(Ok(c.dev_info().dev_id));
        // Wait until the Device is stopped or dropped.
        if let Ok(rx) = stop_rx.lock() {
            let _ = rx.recv();
        }
        if let Err(e) = c.kill_dev() {
            tracing::warn!("ublk: stopping the device: {e}");
        }
    };
    let run = ctrl.run_target(tgt_init, queue, started);
    let del = ctrl.del_dev();
    run.map_err(|e| anyhow!("ublk device: {e}"))?;
    del.map_err(|e| anyhow!("ublk: deleting the device: {e}"))?;
    Ok(())
}

/// One hardware queue's thread: fetch, run, commit, until the queue goes
/// down.
fn serve_queue(qid: u16, d: &UblkDev, dev: &DevRef, read_only: bool, rt: &tokio::runtime::Handle) {
    let bufs = Rc::new(d.alloc_queue_io_bufs());
    let q = match UblkQueue::new(qid, d)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
    {
        Ok(q) => q,
        Err(e) => {
            tracing::error!("ublk queue {qid}: cannot start: {e}");
            return;
        }
    };
    let handler = |q: &UblkQueue, tag: u16, _io: &UblkIOCtx| {
        let buf = &bufs[tag as usize];
        // SAFETY: the driver gives a tag's buffer to one request at a
        // time and does not touch it until that request is committed
        // below; nothing else in this thread holds a reference to it.
        let data = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), buf.len()) };
        let res = run_one(q.get_iod(tag), data, dev, read_only, rt);
        if let Err(e) = q.complete_io_cmd_unified(
            tag,
            BufDesc::Slice(buf.as_slice()),
            Ok(UblkIORes::Result(res)),
        ) {
            tracing::warn!("ublk queue {qid}: commit of tag {tag} failed: {e}");
        }
    };
    q.wait_and_handle_io(handler);
}

/// Runs one request descriptor; returns bytes done or -errno.
fn run_one(
    iod: &sys::ublksrv_io_desc,
    buf: &mut [u8],
    dev: &DevRef,
    read_only: bool,
    rt: &tokio::runtime::Handle,
) -> i32 {
    let offset = iod.start_sector << 9;
    let bytes = u64::from(iod.nr_sectors) << 9;
    let op = iod.op_flags & 0xff;
    let fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
    let flags = Flags { fua, ..Flags::NONE };
    let is_write = matches!(
        op,
        sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_OP_DISCARD | sys::UBLK_IO_OP_WRITE_ZEROES
    );
    if is_write && read_only {
        return -libc::EROFS;
    }
    let len = match u32::try_from(bytes) {
        Ok(l) => l,
        Err(_) => return -libc::EINVAL,
    };
    let req = match op {
        sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE if bytes as usize > buf.len() => {
            return -libc::EINVAL
        }
        sys::UBLK_IO_OP_READ => Request::Read { offset, len },
        sys::UBLK_IO_OP_WRITE => Request::Write {
            offset,
            data: Bytes::copy_from_slice(&buf[..len as usize]),
            flags,
        },
        sys::UBLK_IO_OP_FLUSH => Request::Flush,
        sys::UBLK_IO_OP_DISCARD => Request::Trim { offset, len, flags },
        sys::UBLK_IO_OP_WRITE_ZEROES => Request::WriteZeroes {
            offset,
            len,
            flags: Flags {
                no_hole: iod.op_flags & sys::UBLK_IO_F_NOUNMAP != 0,
                ..flags
            },
        },
        _ => return -libc::EOPNOTSUPP,
    };
    let done: Completion = rt.block_on(dev.submit(req));
    match done {
        Ok(Reply::Data(d)) if op == sys::UBLK_IO_OP_READ => {
            if d.len() != len as usize {
                return -libc::EIO;
            }
            buf[..d.len()].copy_from_slice(&d);
            len as i32
        }
        Ok(_) if op == sys::UBLK_IO_OP_READ => -libc::EIO,
        Ok(_) if op == sys::UBLK_IO_OP_WRITE => len as i32,
        Ok(_) => 0,
        Err(Errno(e)) => -e.abs(),
    }
}
