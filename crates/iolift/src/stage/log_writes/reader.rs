//! Reading a log back: every record checked, a torn tail found, payloads
//! read on demand.

use super::format::{crc32c, RecHead, RecKind, FILE_HEADER, FILE_MAGIC, RECORD_HEADER, VERSION};
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

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
            let Some(end) = data_pos.checked_add(head.payload()) else {
                bail!(
                    "{}: record length {} runs past the largest file offset",
                    at(pos),
                    head.payload()
                );
            };
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
