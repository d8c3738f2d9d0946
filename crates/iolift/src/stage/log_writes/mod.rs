//! `log-writes`: records every write, trim, write-zeroes and flush passing
//! through it, in order and with its data, to an append-only log file.
//!
//! `log-writes:path=/var/tmp/run.log` (options in [`OPTIONS`]). Reads,
//! cache and block-status requests pass through unrecorded. The log is what
//! `iolift crash-states` replays to rebuild every state a power loss can
//! leave on the device below (see `docs/crash.md`).
//!
//! The recording rule, which is what makes the log a faithful account of
//! what the device below has promised:
//! - a write, trim or write-zeroes is appended when the device below has
//!   completed it, before its completion goes up; so the log holds every
//!   write anyone above saw acknowledged, in the order of those
//!   acknowledgements. A failed request is not recorded (what it left on
//!   the device is unknown; the explorer does not model it).
//! - a flush takes the number of records appended so far (`covers`) when it
//!   is submitted, is passed down, and is appended when the device below
//!   has completed it, before its completion goes up. Every record numbered
//!   below `covers` completed (above this stage) before the flush was
//!   submitted, so the device's flush rule makes them durable; records
//!   appended between the flush's submission and its record are not covered.
//! - a FUA write is durable when it completes: its record carries the flag.
//!
//! Each record is written with one `write(2)` before the request is
//! acknowledged, so the log survives the server being killed at any point
//! (with `sync`, flush and FUA records are also fdatasync'ed, for logs that
//! must survive the host). If appending fails, the request fails with EIO
//! and so does every later write: a log with a hole would be worse than none.
//!
//! `fault=ack-flush-early` is a deliberate defect for testing crash
//! checkers: a flush is acknowledged at once and passed down (and recorded)
//! only when the next flush arrives or the device is closed.

mod format;
mod reader;
#[cfg(test)]
mod tests;

pub use format::{
    crc32c, RecHead, RecKind, FILE_HEADER, FILE_MAGIC, RECORD_HEADER, RECORD_MAGIC, VERSION,
};
pub use reader::{Log, Record, TornTail};

use format::file_header;

use super::{Kind, OptHelp, Opts};
use crate::block::{BlockDev, DevInfo, DevRef, Errno, IoFuture, Reply, Request};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "path",
        kind: Kind::Text("PATH"),
        default: "",
        help: "the log file to create (required; must not exist or be empty)",
    },
    OptHelp {
        name: "sync",
        kind: Kind::Flag,
        default: "off",
        help: "fdatasync the log after each flush and FUA record",
    },
    OptHelp {
        name: "fault",
        kind: Kind::Choice(&["none", "ack-flush-early"]),
        default: "none",
        help: "deliberate defect for testing crash checkers: ack-flush-early",
    },
];

/// The checked options of one log-writes stage.
pub struct LogWritesConfig {
    pub path: PathBuf,
    pub sync: bool,
    pub ack_flush_early: bool,
}

pub fn parse(o: &Opts) -> Result<LogWritesConfig> {
    let Some(path) = o.get("path") else {
        bail!("stage log-writes: option path is required (log-writes:path=FILE)");
    };
    Ok(LogWritesConfig {
        path: PathBuf::from(path),
        sync: o.flag("sync")?,
        ack_flush_early: o.choice("fault", &["none", "ack-flush-early"], "none")? != "none",
    })
}

pub fn build(o: Opts, below: DevRef) -> Result<DevRef> {
    let cfg = parse(&o)?;
    Ok(Arc::new(LogWritesDev::new(cfg, below)?))
}

// ---------------------------------------------------------------------------
// The stage.

/// The log file being appended to.
struct Appender {
    file: File,
    path: PathBuf,
    /// The number the next record gets.
    next_seq: u64,
    sync: bool,
    /// Set once an append failed: every later write fails.
    broken: bool,
}

impl Appender {
    /// Appends one record (header + payload in one write) and returns its
    /// number; EIO if the log cannot take it.
    fn append(&mut self, mut head: RecHead, data: &[u8]) -> Result<u64, Errno> {
        if self.broken {
            return Err(Errno::EIO);
        }
        head.seq = self.next_seq;
        let mut rec = Vec::with_capacity(RECORD_HEADER + data.len());
        rec.extend_from_slice(&head.encode());
        rec.extend_from_slice(data);
        let r = self.file.write_all(&rec).and_then(|()| {
            if self.sync && (head.kind == RecKind::Flush || head.fua) {
                self.file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            self.broken = true;
            tracing::error!(
                "log-writes {}: append failed ({e}); every further write fails",
                self.path.display()
            );
            return Err(Errno::EIO);
        }
        self.next_seq += 1;
        Ok(head.seq)
    }
}

pub struct LogWritesDev {
    below: DevRef,
    log: Arc<Mutex<Appender>>,
    ack_flush_early: bool,
    /// With `fault=ack-flush-early`: the `covers` of the flush acknowledged
    /// but not yet passed down.
    deferred: Arc<Mutex<Option<u64>>>,
    label: String,
}

impl LogWritesDev {
    pub fn new(cfg: LogWritesConfig, below: DevRef) -> Result<Self> {
        let path = cfg.path;
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("stage log-writes: create {}", path.display()))?;
        let len = file.metadata()?.len();
        if len != 0 {
            bail!(
                "stage log-writes: {} exists and holds {len} bytes (a log records one run \
                 from its base image: give a new path)",
                path.display()
            );
        }
        file.write_all(&file_header(below.info().size))
            .with_context(|| format!("stage log-writes: write {}", path.display()))?;
        let label = format!(
            "log-writes({}{})",
            path.display(),
            if cfg.ack_flush_early {
                ",fault=ack-flush-early"
            } else {
                ""
            }
        );
        Ok(LogWritesDev {
            below,
            log: Arc::new(Mutex::new(Appender {
                file,
                path,
                next_seq: 0,
                sync: cfg.sync,
                broken: false,
            })),
            ack_flush_early: cfg.ack_flush_early,
            deferred: Arc::new(Mutex::new(None)),
            label,
        })
    }

    fn lock(log: &Mutex<Appender>) -> std::sync::MutexGuard<'_, Appender> {
        log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Passes a flush down and records it as covering records below `covers`.
    fn flush_below(below: &DevRef, log: Arc<Mutex<Appender>>, covers: u64) -> IoFuture {
        let f = below.submit(Request::Flush);
        Box::pin(async move {
            let r = f.await?;
            let head = RecHead {
                kind: RecKind::Flush,
                fua: false,
                no_hole: false,
                seq: 0,
                offset: 0,
                len: 0,
                covers,
                data_crc: 0,
            };
            Self::lock(&log).append(head, &[])?;
            Ok(r)
        })
    }

    /// A flush acknowledged at once; the one acknowledged before it (if
    /// any) is passed down and recorded first (`fault=ack-flush-early`).
    fn flush_early(&self, covers: u64) -> IoFuture {
        let prev = self
            .deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(covers);
        match prev {
            None => crate::block::ready(Ok(Reply::Done(0))),
            Some(c) => {
                let f = Self::flush_below(&self.below, self.log.clone(), c);
                Box::pin(async move {
                    f.await?;
                    Ok(Reply::Done(0))
                })
            }
        }
    }
}

impl BlockDev for LogWritesDev {
    fn info(&self) -> DevInfo {
        self.below.info()
    }

    fn submit(&self, req: Request) -> IoFuture {
        let (kind, offset, len, flags, data) = match &req {
            Request::Write {
                offset,
                data,
                flags,
            } => (
                RecKind::Write,
                *offset,
                data.len() as u64,
                *flags,
                data.clone(),
            ),
            Request::Trim { offset, len, flags } => {
                (RecKind::Trim, *offset, *len as u64, *flags, Bytes::new())
            }
            Request::WriteZeroes { offset, len, flags } => (
                RecKind::WriteZeroes,
                *offset,
                *len as u64,
                *flags,
                Bytes::new(),
            ),
            Request::Flush => {
                let covers = Self::lock(&self.log).next_seq;
                if self.ack_flush_early {
                    return self.flush_early(covers);
                }
                return Self::flush_below(&self.below, self.log.clone(), covers);
            }
            _ => return self.below.submit(req),
        };
        let log = self.log.clone();
        let f = self.below.submit(req);
        Box::pin(async move {
            let r = f.await?;
            let head = RecHead {
                kind,
                fua: flags.fua,
                no_hole: flags.no_hole,
                seq: 0,
                offset,
                len,
                covers: 0,
                data_crc: if kind == RecKind::Write {
                    crc32c(&data)
                } else {
                    0
                },
            };
            Self::lock(&log).append(head, &data)?;
            Ok(r)
        })
    }

    fn name(&self) -> String {
        self.label.clone()
    }

    /// Passes down (and records) a flush acknowledged early, then a final
    /// flush, then closes the device below.
    fn close(&self) -> IoFuture {
        let deferred = self
            .deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let log = self.log.clone();
        let below = self.below.clone();
        Box::pin(async move {
            if let Some(c) = deferred {
                Self::flush_below(&below, log.clone(), c).await?;
            }
            let covers = Self::lock(&log).next_seq;
            Self::flush_below(&below, log, covers).await?;
            below.close().await
        })
    }
}
