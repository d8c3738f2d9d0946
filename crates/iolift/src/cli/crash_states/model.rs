//! The crash model: which records a crash after record `i` must keep and
//! which it may lose (whole or, under `--tear`, piece by piece), and how a
//! state is applied to an image (with the image helpers it needs).

use crate::stage::log_writes::{Log, RecKind, Record};
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Marks a whole record in a [`Unit`].
pub(super) const WHOLE: u32 = u32::MAX;

/// What a power loss may keep or lose: a whole pending record, or one
/// piece of it under `--tear`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Unit {
    pub(super) rec: usize,
    pub(super) piece: u32,
}

/// One crash state: the last record issued and the pending units kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct State {
    pub(super) point: usize,
    pub(super) kept: Vec<Unit>,
}

/// The log with what the model needs of it.
pub(super) struct Model {
    pub(super) log: Log,
    pub(super) file: File,
    /// `cov[i]`: the highest `covers` of the flush records up to `i`.
    pub(super) cov: Vec<u64>,
    /// `epoch[i]`: flush records before record `i`.
    pub(super) epoch: Vec<usize>,
    pub(super) tear: Option<u64>,
}

impl Model {
    pub(super) fn new(log: Log, tear: Option<u64>) -> Result<Model> {
        let file =
            File::open(&log.path).with_context(|| format!("open log {}", log.path.display()))?;
        let mut cov = Vec::with_capacity(log.records.len());
        let mut epoch = Vec::with_capacity(log.records.len());
        let (mut c, mut e) = (0u64, 0usize);
        for r in &log.records {
            epoch.push(e);
            if r.head.kind == RecKind::Flush {
                c = c.max(r.head.covers);
                e += 1;
            }
            cov.push(c);
        }
        Ok(Model {
            log,
            file,
            cov,
            epoch,
            tear,
        })
    }

    pub(super) fn rec(&self, i: usize) -> &Record {
        &self.log.records[i]
    }

    pub(super) fn is_data(&self, i: usize) -> bool {
        self.rec(i).head.kind != RecKind::Flush
    }

    /// Whether data record `j` is durable after a crash following record `i`.
    pub(super) fn durable(&self, j: usize, i: usize) -> bool {
        (j as u64) < self.cov[i] || self.rec(j).head.fua
    }

    /// The data records up to `i` that a crash after `i` may lose.
    pub(super) fn pending(&self, i: usize) -> Vec<usize> {
        (self.cov[i] as usize..=i)
            .filter(|&j| self.is_data(j) && !self.durable(j, i))
            .collect()
    }

    /// The first record a crash after `i` may lose (every one before it is
    /// durable), or `i + 1`.
    pub(super) fn first_pending(&self, i: usize) -> usize {
        self.pending(i).first().copied().unwrap_or(i + 1)
    }

    /// The pieces of record `j` under `--tear` (`[offset, len)` each).
    pub(super) fn pieces(&self, j: usize) -> Vec<(u64, u64)> {
        let h = &self.rec(j).head;
        let Some(t) = self.tear else {
            return vec![(h.offset, h.len)];
        };
        let mut v = Vec::new();
        let (mut o, end) = (h.offset, h.offset + h.len);
        while o < end {
            let next = ((o / t) + 1) * t;
            let e = next.min(end);
            v.push((o, e - o));
            o = e;
        }
        v
    }

    /// The units a crash after `i` may keep or lose.
    pub(super) fn units(&self, i: usize) -> Vec<Unit> {
        let mut u = Vec::new();
        for j in self.pending(i) {
            if self.tear.is_some() {
                for p in 0..self.pieces(j).len() {
                    u.push(Unit {
                        rec: j,
                        piece: p as u32,
                    });
                }
            } else {
                u.push(Unit {
                    rec: j,
                    piece: WHOLE,
                });
            }
        }
        u
    }

    /// Applies the records `from..=s.point` of state `s` to `img`: durable
    /// ones whole, pending ones as far as `s.kept` keeps them. Every record
    /// below `from` must already be in `img` (and be durable in `s`).
    pub(super) fn apply(
        &self,
        img: &File,
        from: usize,
        s: &State,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        for j in from..=s.point {
            if !self.is_data(j) {
                continue;
            }
            if self.durable(j, s.point) {
                self.apply_piece(img, j, None, buf)?;
                continue;
            }
            let lo = s.kept.partition_point(|u| u.rec < j);
            for u in s.kept[lo..].iter().take_while(|u| u.rec == j) {
                self.apply_piece(img, j, (u.piece != WHOLE).then_some(u.piece), buf)?;
            }
        }
        Ok(())
    }

    /// Writes record `j` (or piece `piece` of it) to `img`.
    pub(super) fn apply_piece(
        &self,
        img: &File,
        j: usize,
        piece: Option<u32>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let r = *self.rec(j);
        let (off, len) = match piece {
            None => (r.head.offset, r.head.len),
            Some(p) => self.pieces(j)[p as usize],
        };
        match r.head.kind {
            RecKind::Write => {
                buf.resize(len as usize, 0);
                let at = r.data_pos + (off - r.head.offset);
                self.file
                    .read_exact_at(buf, at)
                    .with_context(|| format!("read log at {at}"))?;
                img.write_all_at(buf, off).context("write state image")?;
            }
            // A trim may read back as zeroes or as the old data; the model
            // takes zeroes (what the file and memory backends give).
            RecKind::Trim | RecKind::WriteZeroes => zero_range(img, off, len)?,
            RecKind::Flush => {}
        }
        Ok(())
    }
}

/// Zeroes `[off, off+len)` of `f`: punches a hole, else writes zeroes.
pub(super) fn zero_range(f: &File, off: u64, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an open fd with in-range arguments.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let z = vec![0u8; (len as usize).min(1 << 20)];
    let mut o = off;
    while o < off + len {
        let n = ((off + len - o) as usize).min(z.len());
        f.write_all_at(&z[..n], o).context("zero state image")?;
        o += n as u64;
    }
    Ok(())
}

/// Copies `src` to `dst` (created or truncated), keeping holes: only the
/// data segments are copied (SEEK_DATA/SEEK_HOLE, copy_file_range).
pub(super) fn sparse_copy(src: &Path, dst: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let s = File::open(src).with_context(|| format!("open {}", src.display()))?;
    let size = s.metadata()?.len();
    let d = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .with_context(|| format!("create {}", dst.display()))?;
    d.set_len(size)?;
    let (sfd, dfd) = (s.as_raw_fd(), d.as_raw_fd());
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: lseek on an open fd.
        let data = unsafe { libc::lseek(sfd, pos, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: only a hole is left
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(sfd, data, libc::SEEK_HOLE) };
        let end = if hole < 0 { size as i64 } else { hole };
        let (mut so, mut dof) = (data, data);
        while so < end {
            // SAFETY: both fds are open; the offsets are ours.
            let n = unsafe {
                libc::copy_file_range(sfd, &mut so, dfd, &mut dof, (end - so) as usize, 0)
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("copy {} to {}", src.display(), dst.display()));
            }
            if n == 0 {
                break;
            }
        }
        pos = end;
    }
    Ok(())
}
