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

use super::{Kind, OptHelp, Opts};
use crate::block::{BlockDev, DevInfo, DevRef, Errno, IoFuture, Reply, Request};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
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
    let Some(path) = o.text("path") else {
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
// The log format (little-endian; see docs/crash.md).

/// First bytes of a log file.
pub const FILE_MAGIC: &[u8; 8] = b"IOLIFTLW";
/// Format version written and accepted.
pub const VERSION: u32 = 1;
/// Bytes of the file header.
pub const FILE_HEADER: usize = 32;
/// First bytes of every record header.
pub const RECORD_MAGIC: &[u8; 4] = b"LWRC";
/// Bytes of a record header (the payload of a write follows it).
pub const RECORD_HEADER: usize = 48;

/// What a record describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecKind {
    Write = 1,
    Trim = 2,
    WriteZeroes = 3,
    Flush = 4,
}

impl RecKind {
    fn from_u8(v: u8) -> Option<RecKind> {
        Some(match v {
            1 => RecKind::Write,
            2 => RecKind::Trim,
            3 => RecKind::WriteZeroes,
            4 => RecKind::Flush,
            _ => return None,
        })
    }
}

const FLAG_FUA: u8 = 1;
const FLAG_NO_HOLE: u8 = 2;

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) lookup table.
const fn crc_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static CRC_TABLE: [u32; 256] = crc_table();

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = CRC_TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

fn file_header(dev_size: u64) -> [u8; FILE_HEADER] {
    let mut h = [0u8; FILE_HEADER];
    h[0..8].copy_from_slice(FILE_MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(FILE_HEADER as u32).to_le_bytes());
    h[16..24].copy_from_slice(&dev_size.to_le_bytes());
    let c = crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&c.to_le_bytes());
    h
}

/// One decoded record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecHead {
    pub kind: RecKind,
    pub fua: bool,
    pub no_hole: bool,
    /// Record number, from 0, one more than the record before.
    pub seq: u64,
    /// Device offset (0 for a flush).
    pub offset: u64,
    /// Bytes of the range (the payload's length for a write; 0 for a flush).
    pub len: u64,
    /// Flush only: the records numbered below this are durable.
    pub covers: u64,
    /// CRC-32C of the payload (writes; 0 otherwise).
    pub data_crc: u32,
}

impl RecHead {
    pub fn encode(&self) -> [u8; RECORD_HEADER] {
        let mut h = [0u8; RECORD_HEADER];
        h[0..4].copy_from_slice(RECORD_MAGIC);
        h[4] = self.kind as u8;
        h[5] =
            (if self.fua { FLAG_FUA } else { 0 }) | (if self.no_hole { FLAG_NO_HOLE } else { 0 });
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.offset.to_le_bytes());
        h[24..32].copy_from_slice(&self.len.to_le_bytes());
        h[32..40].copy_from_slice(&self.covers.to_le_bytes());
        h[40..44].copy_from_slice(&self.data_crc.to_le_bytes());
        let c = crc32c(&h[0..44]);
        h[44..48].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// Decodes a header; `None` if the magic, the checksum or a field is bad.
    pub fn decode(h: &[u8]) -> Option<RecHead> {
        if h.len() < RECORD_HEADER || &h[0..4] != RECORD_MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
        if crc32c(&h[0..44]) != u32_at(44) || h[6] != 0 || h[7] != 0 {
            return None;
        }
        let kind = RecKind::from_u8(h[4])?;
        if h[5] & !(FLAG_FUA | FLAG_NO_HOLE) != 0 {
            return None;
        }
        Some(RecHead {
            kind,
            fua: h[5] & FLAG_FUA != 0,
            no_hole: h[5] & FLAG_NO_HOLE != 0,
            seq: u64_at(8),
            offset: u64_at(16),
            len: u64_at(24),
            covers: u64_at(32),
            data_crc: u32_at(40),
        })
    }

    /// Bytes of payload that follow the header.
    pub fn payload(&self) -> u64 {
        if self.kind == RecKind::Write {
            self.len
        } else {
            0
        }
    }
}

/// One record of a log read back: its header and where it lies in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub head: RecHead,
    /// File offset of the record's header.
    pub pos: u64,
    /// File offset of its payload (writes).
    pub data_pos: u64,
    /// File offset just past the record.
    pub end: u64,
}

/// A torn tail: the last record is incomplete or fails its checksum and
/// nothing follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// File offset where the torn record starts (the last whole one ends here).
    pub offset: u64,
    pub why: String,
}

/// A log read back and checked.
#[derive(Debug, Clone)]
pub struct Log {
    pub path: PathBuf,
    pub dev_size: u64,
    pub records: Vec<Record>,
    /// Set when the file ends in a torn record (not in `records`).
    pub torn: Option<TornTail>,
}

impl Log {
    /// Reads and checks every record of the log at `path`. A record that is
    /// damaged with more data after it fails, naming its offset; a damaged
    /// last record is reported in [`Log::torn`] (callers decide whether to
    /// accept it: see [`Log::open`]).
    pub fn read(path: &Path) -> Result<Log> {
        let f = File::open(path).with_context(|| format!("open log {}", path.display()))?;
        let size = f.metadata()?.len();
        let at = |off: u64| format!("log {} at offset {off}", path.display());
        let mut h = [0u8; FILE_HEADER];
        if size < FILE_HEADER as u64 {
            bail!(
                "{}: file is {size} bytes, shorter than the {FILE_HEADER}-byte header",
                at(0)
            );
        }
        f.read_exact_at(&mut h, 0)?;
        if &h[0..8] != FILE_MAGIC {
            bail!("{}: not an iolift write log (bad magic)", at(0));
        }
        if crc32c(&h[0..28]) != u32::from_le_bytes(h[28..32].try_into().unwrap()) {
            bail!("{}: file header checksum mismatch", at(0));
        }
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
        if version != VERSION {
            bail!(
                "{}: log version {version}, this iolift reads {VERSION}",
                at(8)
            );
        }
        let dev_size = u64::from_le_bytes(h[16..24].try_into().unwrap());
        let mut log = Log {
            path: path.to_path_buf(),
            dev_size,
            records: Vec::new(),
            torn: None,
        };
        let mut pos = FILE_HEADER as u64;
        let mut buf = Vec::new();
        while pos < size {
            let torn = |why: String| TornTail { offset: pos, why };
            if size - pos < RECORD_HEADER as u64 {
                log.torn = Some(torn(format!(
                    "record header cut short ({} of {RECORD_HEADER} bytes)",
                    size - pos
                )));
                break;
            }
            let mut hb = [0u8; RECORD_HEADER];
            f.read_exact_at(&mut hb, pos)?;
            let Some(head) = RecHead::decode(&hb) else {
                if zero_to_end(&f, pos, size)? {
                    log.torn = Some(torn("unwritten (zero) bytes to the end".into()));
                    break;
                }
                bail!("{}: bad record header (magic or checksum)", at(pos));
            };
            let want = log.records.len() as u64;
            if head.seq != want {
                bail!(
                    "{}: record number {} where {want} was due",
                    at(pos),
                    head.seq
                );
            }
            let data_pos = pos + RECORD_HEADER as u64;
            let end = data_pos
                .checked_add(head.payload())
                .context("record length overflows")?;
            if end > size {
                log.torn = Some(torn(format!(
                    "payload cut short ({} of {} bytes)",
                    size - data_pos,
                    head.payload()
                )));
                break;
            }
            if head.kind == RecKind::Write {
                buf.resize(head.len as usize, 0);
                f.read_exact_at(&mut buf, data_pos)?;
                if crc32c(&buf) != head.data_crc {
                    if end == size {
                        log.torn = Some(torn("payload checksum mismatch".into()));
                        break;
                    }
                    bail!("{}: payload checksum mismatch", at(pos));
                }
            }
            if head.kind != RecKind::Flush
                && head
                    .offset
                    .checked_add(head.len)
                    .is_none_or(|e| e > dev_size)
            {
                bail!(
                    "{}: range {}+{} runs past the device ({dev_size} bytes)",
                    at(pos),
                    head.offset,
                    head.len
                );
            }
            if head.kind == RecKind::Flush && head.covers > head.seq {
                bail!(
                    "{}: flush covers records below {} but is record {}",
                    at(pos),
                    head.covers,
                    head.seq
                );
            }
            log.records.push(Record {
                head,
                pos,
                data_pos,
                end,
            });
            pos = end;
        }
        Ok(log)
    }

    /// [`Log::read`], then: a torn tail fails naming its offset unless
    /// `cut_torn` is set, in which case the log ends at the last whole
    /// record and a warning says so. Cutting loses nothing acknowledged:
    /// a record is whole before its request is acknowledged.
    pub fn open(path: &Path, cut_torn: bool) -> Result<Log> {
        let log = Log::read(path)?;
        if let Some(t) = &log.torn {
            if !cut_torn {
                bail!(
                    "log {}: torn tail at offset {}: {} (the request it records was never \
                     acknowledged; --cut-torn-tail replays the log up to that offset)",
                    path.display(),
                    t.offset,
                    t.why
                );
            }
            tracing::warn!(
                "log {}: torn tail at offset {} ({}): ignoring it, the log ends there",
                path.display(),
                t.offset,
                t.why
            );
        }
        Ok(log)
    }

    /// Reads the payload of write record `r`.
    pub fn payload(&self, file: &File, r: &Record, buf: &mut Vec<u8>) -> Result<()> {
        buf.resize(r.head.payload() as usize, 0);
        file.read_exact_at(buf, r.data_pos)
            .with_context(|| format!("read log {} at {}", self.path.display(), r.data_pos))
    }
}

/// Whether every byte of `f` from `pos` to `size` is zero.
fn zero_to_end(f: &File, mut pos: u64, size: u64) -> Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    while pos < size {
        let n = (size - pos).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], pos)?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        pos += n as u64;
    }
    Ok(true)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDev;
    use crate::block::{BlockDevExt, Flags};

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn stage(path: &Path, early: bool) -> (LogWritesDev, DevRef) {
        let mem: DevRef = Arc::new(MemoryDev::new(1 << 20));
        let cfg = LogWritesConfig {
            path: path.to_path_buf(),
            sync: false,
            ack_flush_early: early,
        };
        (LogWritesDev::new(cfg, mem.clone()).unwrap(), mem)
    }

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn records_every_write_kind_in_order_with_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.log");
        let (dev, mem) = stage(&p, false);
        block_on(async {
            dev.write(4096, Bytes::from(vec![7u8; 8192]), Flags::NONE)
                .await
                .unwrap();
            dev.flush().await.unwrap();
            dev.write(0, Bytes::from_static(b"hello"), Flags::FUA)
                .await
                .unwrap();
            dev.submit(Request::Trim {
                offset: 65536,
                len: 4096,
                flags: Flags::NONE,
            })
            .await
            .unwrap();
            let nh = Flags {
                no_hole: true,
                ..Flags::NONE
            };
            dev.submit(Request::WriteZeroes {
                offset: 8192,
                len: 512,
                flags: nh,
            })
            .await
            .unwrap();
            // Reads are not recorded.
            dev.read(0, 5).await.unwrap();
        });
        // The data reached the device below too.
        let got = block_on(mem.read(0, 5)).unwrap();
        assert_eq!(&got[..], b"hello");
        let log = Log::open(&p, false).unwrap();
        assert_eq!(log.dev_size, 1 << 20);
        assert!(log.torn.is_none());
        let kinds: Vec<_> = log.records.iter().map(|r| r.head.kind).collect();
        assert_eq!(
            kinds,
            [
                RecKind::Write,
                RecKind::Flush,
                RecKind::Write,
                RecKind::Trim,
                RecKind::WriteZeroes
            ]
        );
        let r = &log.records;
        assert_eq!((r[0].head.offset, r[0].head.len), (4096, 8192));
        assert_eq!(r[1].head.covers, 1, "the flush covers the write before it");
        assert!(r[2].head.fua && !r[0].head.fua);
        assert!(r[4].head.no_hole);
        assert_eq!((r[3].head.offset, r[3].head.len), (65536, 4096));
        let f = File::open(&p).unwrap();
        let mut buf = Vec::new();
        log.payload(&f, &r[2], &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        log.payload(&f, &r[0], &mut buf).unwrap();
        assert_eq!(buf, vec![7u8; 8192]);
        for (i, rec) in r.iter().enumerate() {
            assert_eq!(rec.head.seq, i as u64);
        }
    }

    #[test]
    fn a_flush_covers_only_writes_completed_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.log");
        let (dev, _mem) = stage(&p, false);
        block_on(async {
            dev.write(0, Bytes::from(vec![1u8; 512]), Flags::NONE)
                .await
                .unwrap();
            // Submitted, not yet driven: the write below completes after.
            let fl = dev.flush();
            dev.write(512, Bytes::from(vec![2u8; 512]), Flags::NONE)
                .await
                .unwrap();
            fl.await.unwrap();
        });
        let log = Log::open(&p, false).unwrap();
        let r = &log.records;
        assert_eq!(r.len(), 3);
        assert_eq!(r[2].head.kind, RecKind::Flush);
        assert_eq!(r[2].head.covers, 1, "the second write is after the flush");
    }

    #[test]
    fn refuses_an_existing_log() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.log");
        std::fs::write(&p, b"x").unwrap();
        let mem: DevRef = Arc::new(MemoryDev::new(4096));
        let cfg = LogWritesConfig {
            path: p.clone(),
            sync: false,
            ack_flush_early: false,
        };
        let e = match LogWritesDev::new(cfg, mem) {
            Ok(_) => panic!("an existing log was accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(e.contains("exists"), "{e}");
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"x",
            "the old file is untouched"
        );
    }

    #[test]
    fn torn_tails_and_damage_name_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.log");
        let (dev, _mem) = stage(&p, false);
        block_on(async {
            for i in 0..3u8 {
                dev.write(i as u64 * 4096, Bytes::from(vec![i; 4096]), Flags::NONE)
                    .await
                    .unwrap();
            }
        });
        let whole = std::fs::read(&p).unwrap();
        let log = Log::open(&p, false).unwrap();
        let last = log.records[2];
        assert_eq!(last.end, whole.len() as u64);
        // Cut inside the last payload, inside its header, and zeroes after it.
        let cases: [(Vec<u8>, &str); 3] = [
            (whole[..whole.len() - 100].to_vec(), "payload cut short"),
            (whole[..last.pos as usize + 20].to_vec(), "header cut short"),
            (
                [&whole[..last.pos as usize], &vec![0u8; 4096][..]].concat(),
                "unwritten",
            ),
        ];
        for (bytes, why) in cases {
            std::fs::write(&p, &bytes).unwrap();
            let e = format!("{:#}", Log::open(&p, false).unwrap_err());
            assert!(
                e.contains(&format!("torn tail at offset {}", last.pos)) && e.contains(why),
                "{e}"
            );
            let cut = Log::open(&p, true).unwrap();
            assert_eq!(cut.records.len(), 2);
            assert_eq!(cut.torn.as_ref().unwrap().offset, last.pos);
        }
        // A bad payload checksum in the last record is a torn tail...
        let mut bytes = whole.clone();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let e = format!("{:#}", Log::open(&p, false).unwrap_err());
        assert!(e.contains("checksum") && e.contains("torn"), "{e}");
        // ...but in the middle, damage with records after it.
        let mut bytes = whole.clone();
        bytes[log.records[1].data_pos as usize + 10] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let e = format!("{:#}", Log::open(&p, true).unwrap_err());
        assert!(
            e.contains(&format!("at offset {}", log.records[1].pos))
                && e.contains("payload checksum mismatch")
                && !e.contains("torn"),
            "{e}"
        );
        let mut bytes = whole.clone();
        bytes[log.records[0].pos as usize + 17] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let e = format!("{:#}", Log::open(&p, true).unwrap_err());
        assert!(
            e.contains(&format!(
                "at offset {}: bad record header",
                log.records[0].pos
            )),
            "{e}"
        );
        std::fs::write(&p, b"IOLIFTLX").unwrap();
        let e = format!("{:#}", Log::open(&p, true).unwrap_err());
        assert!(e.contains("shorter than"), "{e}");
    }

    #[test]
    fn ack_flush_early_records_the_flush_one_flush_late() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.log");
        let (dev, _mem) = stage(&p, true);
        block_on(async {
            dev.write(0, Bytes::from(vec![1u8; 512]), Flags::NONE)
                .await
                .unwrap();
            dev.flush().await.unwrap();
        });
        // Acknowledged, yet nothing durable is recorded.
        let log = Log::open(&p, false).unwrap();
        assert_eq!(log.records.len(), 1);
        block_on(async {
            dev.write(512, Bytes::from(vec![2u8; 512]), Flags::NONE)
                .await
                .unwrap();
            dev.flush().await.unwrap();
        });
        let log = Log::open(&p, false).unwrap();
        let r = &log.records;
        assert_eq!(r.len(), 3);
        assert_eq!((r[2].head.kind, r[2].head.covers), (RecKind::Flush, 1));
        block_on(dev.close()).unwrap();
        let log = Log::open(&p, false).unwrap();
        let covers: Vec<u64> = log
            .records
            .iter()
            .filter(|r| r.head.kind == RecKind::Flush)
            .map(|r| r.head.covers)
            .collect();
        assert_eq!(covers, [1, 2, 4], "close passes the deferred flush down");
    }

    #[test]
    fn options_are_checked() {
        for (spec, want) in [
            ("log-writes", "path is required"),
            ("log-writes:path=/x,fault=maybe", "fault"),
            ("log-writes:/tmp/x", "unknown option"),
        ] {
            let e = format!("{:#}", super::super::check_spec(spec).unwrap_err());
            assert!(e.contains(want), "{spec}: {e}");
        }
        super::super::check_spec("log-writes:path=/tmp/x.log,sync,fault=none").unwrap();
    }
}
