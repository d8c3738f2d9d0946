//! `iolift crash-states`: rebuilds the states a power loss can leave on a
//! device from a `log-writes` log, and runs a check on each.
//!
//! ```text
//! iolift crash-states run.log --base base.img --check 'fsck.ext4 -fn {}'
//! iolift crash-states run.log --base base.img --replay 211:200,203-204 --out s.img
//! ```
//!
//! The model (see `docs/crash.md`): a crash after record `i` of the log
//! leaves every durable write up to `i` (those below the highest `covers`
//! of the flushes recorded up to `i`, and FUA writes) and any subset of the
//! others (pending), applied in log order. Unless `--tear` is given a
//! pending write is kept or lost whole; with `--tear SIZE` each SIZE-aligned
//! piece of it is kept or lost on its own.
//!
//! The log is cut into flush epochs (the records after one flush record up
//! to the next). For every epoch the explorer checks the state at its flush
//! point (every write before the flush record kept), the state with only
//! the durable writes kept, and a seeded sample of crash points in the
//! epoch with random subsets of their pending writes. States run in order
//! of their crash point, `--jobs` at a time; the first failing one is
//! printed with the command that rebuilds it.

use crate::stage::log_writes::{Log, RecKind, Record};
use crate::stage::Rng;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::IsTerminal;
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct CrashStatesArgs {
    /// The log written by the `log-writes` stage.
    #[arg(value_name = "LOG")]
    pub log_file: PathBuf,
    /// The device's image when the log was started (never modified).
    #[arg(long, value_name = "IMAGE")]
    pub base: PathBuf,
    /// Shell command run on every state; `{}` stands for the state's image
    /// file. A non-zero exit fails the state. It also gets IOLIFT_CRASH_STATE,
    /// IOLIFT_CRASH_EPOCH, IOLIFT_CRASH_POINT (the last record issued) and
    /// IOLIFT_CRASH_OFFSET (the log offset just past that record).
    #[arg(long, value_name = "CMD", required_unless_present = "replay")]
    pub check: Option<String>,
    /// Rebuild one state instead, as printed for a failing one:
    /// POINT:SUBSET (SUBSET is `all`, `none` or a list of pending records
    /// `R`, ranges `R1-R2` and, with --tear, pieces `R.P`).
    #[arg(
        long,
        value_name = "POINT:SUBSET",
        requires = "out",
        conflicts_with = "check"
    )]
    pub replay: Option<String>,
    /// Where --replay writes the state's image.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Checks run at once.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// At most this many states in all.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub max_states: usize,
    /// Random states per epoch, beside its flush point and its durable-only
    /// state.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub samples: usize,
    /// Seed of the sample.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub seed: u64,
    /// Tear pending writes into pieces of this size (e.g. 4k, 512) that are
    /// kept or lost on their own; off by default (writes are atomic).
    #[arg(long, value_name = "SIZE")]
    pub tear: Option<String>,
    /// Only crash points at or after this log offset (e.g. after mkfs).
    #[arg(long, value_name = "OFFSET")]
    pub from: Option<u64>,
    /// Accept a log whose last record is torn (cut it there, with a warning).
    #[arg(long)]
    pub cut_torn_tail: bool,
    /// A check running longer than this fails its state.
    #[arg(long, default_value = "120s", value_name = "DURATION")]
    pub timeout: String,
    /// Directory for the state images (default: a new one in $TMPDIR).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
}

/// Marks a whole record in a [`Unit`].
const WHOLE: u32 = u32::MAX;

/// What a power loss may keep or lose: a whole pending record, or one
/// piece of it under `--tear`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Unit {
    rec: usize,
    piece: u32,
}

/// One crash state: the last record issued and the pending units kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    point: usize,
    kept: Vec<Unit>,
}

/// The log with what the model needs of it.
struct Model {
    log: Log,
    file: File,
    /// `cov[i]`: the highest `covers` of the flush records up to `i`.
    cov: Vec<u64>,
    /// `epoch[i]`: flush records before record `i`.
    epoch: Vec<usize>,
    tear: Option<u64>,
}

impl Model {
    fn new(log: Log, tear: Option<u64>) -> Result<Model> {
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

    fn rec(&self, i: usize) -> &Record {
        &self.log.records[i]
    }

    fn is_data(&self, i: usize) -> bool {
        self.rec(i).head.kind != RecKind::Flush
    }

    /// Whether data record `j` is durable after a crash following record `i`.
    fn durable(&self, j: usize, i: usize) -> bool {
        (j as u64) < self.cov[i] || self.rec(j).head.fua
    }

    /// The data records up to `i` that a crash after `i` may lose.
    fn pending(&self, i: usize) -> Vec<usize> {
        (self.cov[i] as usize..=i)
            .filter(|&j| self.is_data(j) && !self.durable(j, i))
            .collect()
    }

    /// The first record a crash after `i` may lose (every one before it is
    /// durable), or `i + 1`.
    fn first_pending(&self, i: usize) -> usize {
        self.pending(i).first().copied().unwrap_or(i + 1)
    }

    /// The pieces of record `j` under `--tear` (`[offset, len)` each).
    fn pieces(&self, j: usize) -> Vec<(u64, u64)> {
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
    fn units(&self, i: usize) -> Vec<Unit> {
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
    fn apply(&self, img: &File, from: usize, s: &State, buf: &mut Vec<u8>) -> Result<()> {
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
    fn apply_piece(
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
fn zero_range(f: &File, off: u64, len: u64) -> Result<()> {
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
fn sparse_copy(src: &Path, dst: &Path) -> Result<()> {
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

/// Quotes `s` for sh.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Writes `kept` as SUBSET: `none`, or pending records and ranges of them
/// (a range `a-b` keeps every pending record from `a` to `b`), or `R.P`.
fn encode_subset(pending: &[usize], kept: &[Unit]) -> String {
    if kept.is_empty() {
        return "none".into();
    }
    if kept.len() == pending.len() && kept.iter().all(|u| u.piece == WHOLE) {
        return "all".into();
    }
    let mut parts = Vec::new();
    let mut k = 0;
    let mut i = 0;
    while k < kept.len() {
        let u = kept[k];
        if u.piece != WHOLE {
            parts.push(format!("{}.{}", u.rec, u.piece));
            k += 1;
            continue;
        }
        while pending[i] != u.rec {
            i += 1;
        }
        // Extend the run while the next pending record is kept whole.
        let start = u.rec;
        let mut last = u.rec;
        while k + 1 < kept.len()
            && i + 1 < pending.len()
            && kept[k + 1].piece == WHOLE
            && kept[k + 1].rec == pending[i + 1]
        {
            k += 1;
            i += 1;
            last = pending[i];
        }
        parts.push(if last == start {
            start.to_string()
        } else {
            format!("{start}-{last}")
        });
        k += 1;
    }
    parts.join(",")
}

/// Parses POINT:SUBSET against the model.
fn decode_state(m: &Model, spec: &str) -> Result<State> {
    let bad = |why: String| anyhow::anyhow!("--replay {spec:?}: {why}");
    let (p, sub) = spec
        .split_once(':')
        .ok_or_else(|| bad("want POINT:SUBSET".into()))?;
    let point: usize = p.parse().map_err(|_| bad(format!("bad POINT {p:?}")))?;
    if point >= m.log.records.len() {
        return Err(bad(format!(
            "the log has {} records (0 to {})",
            m.log.records.len(),
            m.log.records.len().saturating_sub(1)
        )));
    }
    let pending = m.pending(point);
    let all_units = m.units(point);
    let mut kept: Vec<Unit> = match sub {
        "all" => all_units,
        "none" => Vec::new(),
        _ => {
            let mut v = Vec::new();
            for item in sub.split(',') {
                let num = |s: &str| -> Result<usize> {
                    s.parse().map_err(|_| bad(format!("bad item {item:?}")))
                };
                if let Some((r, piece)) = item.split_once('.') {
                    let (r, piece) = (num(r)?, num(piece)? as u32);
                    if m.tear.is_none() {
                        return Err(bad(format!("piece {item:?} needs --tear")));
                    }
                    if !all_units.contains(&Unit { rec: r, piece }) {
                        return Err(bad(format!("{item:?} is no pending piece of this state")));
                    }
                    v.push(Unit { rec: r, piece });
                } else {
                    let (a, b) = match item.split_once('-') {
                        Some((a, b)) => (num(a)?, num(b)?),
                        None => (num(item)?, num(item)?),
                    };
                    if a > b || b > point {
                        return Err(bad(format!(
                            "{item:?} is not a range of records up to {point}"
                        )));
                    }
                    let mut any = false;
                    for &j in pending.iter().filter(|&&j| (a..=b).contains(&j)) {
                        any = true;
                        v.extend(all_units.iter().filter(|u| u.rec == j));
                    }
                    if !any {
                        return Err(bad(format!("{item:?} names no pending write")));
                    }
                }
            }
            v
        }
    };
    kept.sort();
    kept.dedup();
    Ok(State { point, kept })
}

/// The outcome of one state's check.
struct Failure {
    status: String,
    output: String,
}

/// Runs the check on `img`; `None` if it passed.
fn run_check(
    cmd: &str,
    img: &Path,
    env: &[(&str, String)],
    out_path: &Path,
    timeout: Duration,
) -> Result<Option<Failure>> {
    let line = cmd.replace("{}", &shell_quote(&img.to_string_lossy()));
    let out = File::create(out_path)?;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(&line)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().context("spawn sh for the check")?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if t0.elapsed() > timeout {
            // SAFETY: kill(2) on the process group of our own child.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let output = std::fs::read(out_path).unwrap_or_default();
    let text = String::from_utf8_lossy(&output);
    let tail: String = {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    Ok(match status {
        Some(st) if st.success() => None,
        Some(st) => Some(Failure {
            status: format!("{st}"),
            output: tail,
        }),
        None => Some(Failure {
            status: format!("timed out after {timeout:?}"),
            output: tail,
        }),
    })
}

/// Picks the states to check, in order of their crash point.
fn plan(m: &Model, a: &CrashStatesArgs) -> Vec<State> {
    let from = a.from.unwrap_or(0);
    // The crash points of each epoch: data records at or after --from.
    let mut epochs: Vec<Vec<usize>> = Vec::new();
    for (i, r) in m.log.records.iter().enumerate() {
        if r.head.kind == RecKind::Flush || r.end < from {
            continue;
        }
        let e = m.epoch[i];
        match epochs.last_mut() {
            Some(v) if m.epoch[v[0]] == e => v.push(i),
            _ => epochs.push(vec![i]),
        }
    }
    if epochs.is_empty() || a.max_states == 0 {
        return Vec::new();
    }
    // Too many epochs for the budget: spread the ones taken evenly.
    let take = epochs.len().min(a.max_states);
    let mut rng = Rng::new(a.seed);
    let mut seen = HashSet::new();
    // Each epoch's candidates: its flush point, its durable-only state,
    // then distinct random ones (small epochs have fewer to give).
    let mut cands: Vec<Vec<State>> = Vec::with_capacity(take);
    for k in 0..take {
        let idx = if take == 1 {
            epochs.len() - 1
        } else {
            k * (epochs.len() - 1) / (take - 1)
        };
        let pts = &epochs[idx];
        let last = *pts.last().unwrap();
        let want = a.samples + 2;
        let mut mine = Vec::new();
        let mut push = |s: State, mine: &mut Vec<State>| {
            if seen.insert(s.clone()) {
                mine.push(s);
            }
        };
        push(
            State {
                point: last,
                kept: m.units(last),
            },
            &mut mine,
        );
        push(
            State {
                point: last,
                kept: Vec::new(),
            },
            &mut mine,
        );
        let mut tries = 0;
        while mine.len() < want && tries < want * 8 {
            tries += 1;
            let point = pts[(rng.next_u64() % pts.len() as u64) as usize];
            let kept: Vec<Unit> = m
                .units(point)
                .into_iter()
                .filter(|_| rng.next_u64() & 1 == 1)
                .collect();
            push(State { point, kept }, &mut mine);
        }
        cands.push(mine);
    }
    // Over budget: the same quota for every epoch, as high as fits; what
    // small epochs leave unused goes to the others.
    let total: usize = cands.iter().map(Vec::len).sum();
    if total > a.max_states {
        let fits = |q: usize| cands.iter().map(|c| c.len().min(q)).sum::<usize>() <= a.max_states;
        let mut q = 0;
        while fits(q + 1) {
            q += 1;
        }
        let mut left = a.max_states - cands.iter().map(|c| c.len().min(q)).sum::<usize>();
        for c in &mut cands {
            let extra = usize::from(left > 0 && c.len() > q);
            left -= extra;
            c.truncate(q + extra);
        }
    }
    let mut states: Vec<State> = cands.into_iter().flatten().collect();
    states.sort_by_key(|s| s.point);
    states
}

pub fn run(a: CrashStatesArgs) -> Result<ExitCode> {
    let tear = match &a.tear {
        None => None,
        Some(t) => {
            let v = crate::util::parse_size(t).with_context(|| format!("--tear {t:?}"))?;
            if v == 0 || !v.is_power_of_two() {
                bail!("--tear {t:?}: want a power of two (512, 4k)");
            }
            Some(v)
        }
    };
    let timeout = crate::util::parse_duration(&a.timeout)
        .with_context(|| format!("--timeout {:?}", a.timeout))?;
    let log = Log::open(&a.log_file, a.cut_torn_tail)?;
    let base_size = std::fs::metadata(&a.base)
        .with_context(|| format!("--base {}", a.base.display()))?
        .len();
    if base_size < log.dev_size {
        bail!(
            "--base {} is {base_size} bytes, the logged device {} bytes",
            a.base.display(),
            log.dev_size
        );
    }
    let m = Model::new(log, tear)?;
    if let Some(spec) = &a.replay {
        let out = a.out.as_ref().expect("clap requires --out");
        let s = decode_state(&m, spec)?;
        sparse_copy(&a.base, out)?;
        let img = OpenOptions::new().write(true).open(out)?;
        m.apply(&img, 0, &s, &mut Vec::new())?;
        img.sync_all()?;
        eprintln!(
            "state {spec} written to {} (epoch {}, {} of {} pending units kept)",
            out.display(),
            m.epoch[s.point],
            s.kept.len(),
            m.units(s.point).len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let check = a.check.clone().expect("clap requires --check");
    if !check.contains("{}") {
        bail!("--check {check:?}: put {{}} where the image path goes");
    }
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let states = plan(&m, &a);
    let epochs = states
        .iter()
        .map(|s| m.epoch[s.point])
        .collect::<HashSet<_>>()
        .len();
    let flushes = m
        .log
        .records
        .iter()
        .filter(|r| r.head.kind == RecKind::Flush)
        .count();
    eprintln!(
        "crash-states: {} records, {flushes} flushes; checking {} states in {epochs} epochs, \
         {jobs} at a time",
        m.log.records.len(),
        states.len()
    );
    let (work, made) = match &a.workdir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("iolift-crash-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let r = explore(&m, &a, &check, &states, jobs, timeout, &work);
    if made {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        for e in std::fs::read_dir(&work).into_iter().flatten().flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with("crash-") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    r
}

fn explore(
    m: &Model,
    a: &CrashStatesArgs,
    check: &str,
    states: &[State],
    jobs: usize,
    timeout: Duration,
    work: &Path,
) -> Result<ExitCode> {
    let t0 = Instant::now();
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(states.len() as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "[{bar:30}] {pos}/{len} crash states, {elapsed} elapsed, eta {eta}",
            )
            .expect("progress template")
            .progress_chars("#>-"),
        );
        Some(b)
    } else {
        None
    };
    let prefix = work.join("crash-prefix.img");
    sparse_copy(&a.base, &prefix)?;
    let prefix_file = OpenOptions::new().write(true).open(&prefix)?;
    // Records below `done` are in the prefix image.
    let mut done = 0usize;
    let mut buf = Vec::new();
    let batch = jobs * 4;
    let mut first = 0;
    while first < states.len() {
        let end = (first + batch).min(states.len());
        let group = &states[first..end];
        // Every record below the group's first pending one is durable in
        // each of its states (that record only grows with the crash point).
        let lo = m.first_pending(group[0].point);
        debug_assert!(lo >= done);
        if lo > done {
            for j in (done..lo).filter(|&j| m.is_data(j)) {
                m.apply_piece(&prefix_file, j, None, &mut buf)?;
            }
            done = lo;
        }
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<(usize, Result<Option<Failure>>)>> = Mutex::new(Vec::new());
        std::thread::scope(|sc| {
            for job in 0..jobs.min(group.len()) {
                let (next, results, prefix, bar) = (&next, &results, &prefix, &bar);
                sc.spawn(move || {
                    let img = work.join(format!("crash-job{job}.img"));
                    let out = work.join(format!("crash-job{job}.out"));
                    let mut buf = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= group.len() {
                            break;
                        }
                        let s = &group[k];
                        let n = first + k;
                        let r = (|| {
                            sparse_copy(prefix, &img)?;
                            let f = OpenOptions::new().write(true).open(&img)?;
                            m.apply(&f, done, s, &mut buf)?;
                            drop(f);
                            let env = [
                                ("IOLIFT_CRASH_STATE", n.to_string()),
                                ("IOLIFT_CRASH_EPOCH", m.epoch[s.point].to_string()),
                                ("IOLIFT_CRASH_POINT", s.point.to_string()),
                                ("IOLIFT_CRASH_OFFSET", m.rec(s.point).end.to_string()),
                            ];
                            run_check(check, &img, &env, &out, timeout)
                        })();
                        results
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((n, r));
                        if let Some(b) = bar {
                            b.inc(1);
                        }
                    }
                });
            }
        });
        let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
        results.sort_by_key(|(n, _)| *n);
        for (n, r) in results {
            if let Some(f) = r? {
                if let Some(b) = &bar {
                    b.abandon();
                }
                report_failure(m, a, &states[n], n, states.len(), &f);
                println!(
                    "crash-states: stopped after {:.1} s",
                    t0.elapsed().as_secs_f64()
                );
                return Ok(ExitCode::from(1));
            }
        }
        first = end;
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    println!(
        "crash-states: {} states checked, all passed ({:.1} s)",
        states.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

fn report_failure(m: &Model, a: &CrashStatesArgs, s: &State, n: usize, total: usize, f: &Failure) {
    let pending = m.pending(s.point);
    let units = m.units(s.point).len();
    let subset = encode_subset(&pending, &s.kept);
    println!(
        "crash-states: state {n} of {total} FAILED: epoch {}, crash after record {} \
         (log offset {}), {} of {units} pending units kept",
        m.epoch[s.point],
        s.point,
        m.rec(s.point).end,
        s.kept.len()
    );
    println!("check {}; its output ends:", f.status);
    for l in f.output.lines() {
        println!("  {l}");
    }
    let tear = a
        .tear
        .as_ref()
        .map(|t| format!(" --tear {t}"))
        .unwrap_or_default();
    let cut = if a.cut_torn_tail {
        " --cut-torn-tail"
    } else {
        ""
    };
    println!(
        "rebuild it: iolift crash-states {} --base {}{tear}{cut} --replay {}:{subset} --out state.img",
        shell_quote(&a.log_file.to_string_lossy()),
        shell_quote(&a.base.to_string_lossy()),
        s.point
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDev;
    use crate::block::{BlockDev, BlockDevExt, DevRef, Flags, Request};
    use crate::stage::log_writes::{LogWritesConfig, LogWritesDev};
    use bytes::Bytes;
    use std::sync::Arc;

    /// Writes a log through the stage: `ops` are (offset, byte, fua) writes
    /// or `None` for a flush.
    fn make_log(dir: &Path, ops: &[Option<(u64, u8, bool)>]) -> PathBuf {
        let p = dir.join("t.log");
        let mem: DevRef = Arc::new(MemoryDev::new(64 << 10));
        let dev = LogWritesDev::new(
            LogWritesConfig {
                path: p.clone(),
                sync: false,
                ack_flush_early: false,
            },
            mem,
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            for op in ops {
                match op {
                    Some((off, b, fua)) => {
                        let flags = if *fua { Flags::FUA } else { Flags::NONE };
                        dev.write(*off, Bytes::from(vec![*b; 8192]), flags)
                            .await
                            .unwrap();
                    }
                    None => {
                        dev.submit(Request::Flush).await.unwrap();
                    }
                }
            }
        });
        p
    }

    fn model(p: &Path, tear: Option<u64>) -> Model {
        Model::new(Log::open(p, false).unwrap(), tear).unwrap()
    }

    /// A zeroed 64 KiB image with state `s` applied.
    fn state_image(dir: &Path, m: &Model, s: &State) -> File {
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(dir.join("i.img"))
            .unwrap();
        f.set_len(64 << 10).unwrap();
        m.apply(&f, 0, s, &mut Vec::new()).unwrap();
        f
    }

    /// The byte at each 8 KiB slot of the state's image.
    fn image(m: &Model, s: &State) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let f = state_image(dir.path(), m, s);
        let mut b = vec![0u8; 64 << 10];
        f.read_exact_at(&mut b, 0).unwrap();
        b.chunks(8192).map(|c| c[0]).collect()
    }

    #[test]
    fn durable_and_pending_follow_flushes_and_fua() {
        let dir = tempfile::tempdir().unwrap();
        // 0: w slot0=1, 1: flush, 2: w slot1=2, 3: FUA slot2=3, 4: w slot0=4
        let p = make_log(
            dir.path(),
            &[
                Some((0, 1, false)),
                None,
                Some((8192, 2, false)),
                Some((16384, 3, true)),
                Some((0, 4, false)),
            ],
        );
        let m = model(&p, None);
        assert_eq!(m.pending(0), [0]);
        assert_eq!(m.pending(4), [2, 4]);
        assert_eq!(m.first_pending(4), 2);
        assert_eq!(m.epoch, [0, 0, 1, 1, 1]);
        let none = State {
            point: 4,
            kept: vec![],
        };
        assert_eq!(image(&m, &none), [1, 0, 3, 0, 0, 0, 0, 0]);
        let all = State {
            point: 4,
            kept: m.units(4),
        };
        assert_eq!(image(&m, &all), [4, 2, 3, 0, 0, 0, 0, 0]);
        let s = decode_state(&m, "4:4").unwrap();
        assert_eq!(image(&m, &s), [4, 0, 3, 0, 0, 0, 0, 0]);
        assert_eq!(encode_subset(&m.pending(4), &s.kept), "4");
        assert_eq!(encode_subset(&m.pending(4), &all.kept), "all");
        assert_eq!(decode_state(&m, "4:2-4").unwrap(), all);
        for bad in ["9:all", "4:1", "4:7", "x", "4:2.1", "2:3"] {
            assert!(decode_state(&m, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tear_splits_pending_writes_into_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let p = make_log(dir.path(), &[Some((4096, 9, false))]);
        let m = model(&p, Some(4096));
        assert_eq!(m.pieces(0), [(4096, 4096), (8192, 4096)]);
        let s = decode_state(&m, "0:0.1").unwrap();
        let dir2 = tempfile::tempdir().unwrap();
        let f = state_image(dir2.path(), &m, &s);
        let mut b = vec![0u8; 3 * 4096];
        f.read_exact_at(&mut b, 0).unwrap();
        assert!(b[..8192].iter().all(|&x| x == 0), "piece 0 lost");
        assert!(b[8192..].iter().all(|&x| x == 9), "piece 1 kept");
        assert_eq!(encode_subset(&m.pending(0), &s.kept), "0.1");
    }

    #[test]
    fn plan_covers_every_epoch_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let mut ops = Vec::new();
        for e in 0..10u64 {
            for w in 0..4u64 {
                ops.push(Some(((w * 8192) % (64 << 10), (e * 4 + w) as u8, false)));
            }
            ops.push(None);
        }
        let p = make_log(dir.path(), &ops);
        let m = model(&p, None);
        let mut a = CrashStatesArgs {
            log_file: p.clone(),
            base: p.clone(),
            check: None,
            replay: None,
            out: None,
            jobs: None,
            max_states: 1000,
            samples: 8,
            seed: 1,
            tear: None,
            from: None,
            cut_torn_tail: false,
            timeout: "1s".into(),
            workdir: None,
        };
        let s = plan(&m, &a);
        let epochs: HashSet<usize> = s.iter().map(|s| m.epoch[s.point]).collect();
        assert_eq!(epochs.len(), 10);
        assert!(s.len() > 20 && s.len() <= 100, "{}", s.len());
        assert!(s.windows(2).all(|w| w[0].point <= w[1].point));
        // Every epoch's flush point (all kept) is there.
        for e in 0..10 {
            let last = e * 5 + 3;
            assert!(s.iter().any(|x| x.point == last && x.kept.len() == 4));
        }
        assert_eq!(plan(&m, &a), s, "seeded");
        a.seed = 2;
        assert_ne!(plan(&m, &a), s);
        a.max_states = 5;
        assert_eq!(plan(&m, &a).len(), 5);
        a.max_states = 35;
        let s = plan(&m, &a);
        assert_eq!(s.len(), 35, "the budget is used up");
        let per: Vec<usize> = (0..10)
            .map(|e| s.iter().filter(|x| m.epoch[x.point] == e).count())
            .collect();
        assert!(per.iter().all(|&n| n == 3 || n == 4), "{per:?}");
        a.max_states = 1000;
        a.from = Some(m.rec(30).end);
        let s = plan(&m, &a);
        assert!(s.iter().all(|x| x.point >= 30), "--from");
    }

    #[test]
    fn command_line_parses() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "iolift",
            "--log",
            "debug",
            "crash-states",
            "r.log",
            "--base",
            "b.img",
            "--check",
            "true {}",
            "--jobs",
            "3",
            "--tear",
            "4k",
        ])
        .unwrap();
        let crate::cli::Cmd::CrashStates(a) = cli.cmd else {
            panic!("wrong command");
        };
        assert_eq!(cli.log, "debug");
        assert_eq!(a.log_file, Path::new("r.log"));
        assert_eq!((a.jobs, a.tear.as_deref()), (Some(3), Some("4k")));
        for bad in [
            &["iolift", "crash-states", "r.log", "--base", "b"][..],
            &[
                "iolift",
                "crash-states",
                "r.log",
                "--base",
                "b",
                "--replay",
                "1:all",
            ],
            &[
                "iolift",
                "crash-states",
                "r",
                "--base",
                "b",
                "--check",
                "x",
                "--replay",
                "1:all",
                "--out",
                "o",
            ],
        ] {
            assert!(crate::cli::Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sparse_copy_keeps_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let f = File::create(&a).unwrap();
        f.set_len(4 << 20).unwrap();
        f.write_all_at(&[5u8; 4096], 1 << 20).unwrap();
        std::fs::write(&b, vec![1u8; 8 << 20]).unwrap();
        sparse_copy(&a, &b).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    }
}
