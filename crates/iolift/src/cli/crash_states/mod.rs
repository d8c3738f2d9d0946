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

mod explore;
mod model;
mod sample;
mod spec;
#[cfg(test)]
mod tests;

use explore::explore;
use model::{sparse_copy, Model};
use sample::plan;
use spec::decode_state;

use crate::stage::log_writes::{Log, RecKind};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::ExitCode;

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
