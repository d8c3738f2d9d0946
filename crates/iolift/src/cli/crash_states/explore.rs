//! Running the check on every planned state, `--jobs` at a time, and
//! reporting the first failure with the command that rebuilds it.

use super::model::{sparse_copy, Model, State};
use super::spec::{encode_subset, shell_quote};
use super::CrashStatesArgs;
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::io::IsTerminal;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The outcome of one state's check.
pub(super) struct Failure {
    pub(super) status: String,
    pub(super) output: String,
}

/// Runs the check on `img`; `None` if it passed.
pub(super) fn run_check(
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

pub(super) fn explore(
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

pub(super) fn report_failure(
    m: &Model,
    a: &CrashStatesArgs,
    s: &State,
    n: usize,
    total: usize,
    f: &Failure,
) {
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
