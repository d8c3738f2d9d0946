//! Tests that use the kernel's own clients (the nbd driver, ublk) run them
//! in a throw-away QEMU guest booted by `scripts/vm/guest.sh` (see
//! docs/guest.md). A boot costs 5-30 s on a busy machine, so a test boots
//! once and runs one script that does all its checks in sequence, each one
//! a named step.
//!
//! The script runs as root in the guest, with the host's / as its root file
//! system (read-only, overlaid with tmpfs), so host binaries such as the
//! iolift cargo built are there at the same paths. [`PRELUDE`] comes first
//! and gives it:
//! - `step NAME`: starts a step; the output gets `=== step NAME`, and when
//!   the script exits, the last step started is named in `STEP-FAIL NAME`
//!   (non-zero status) or `STEP-OK NAME` lines for each step finished.
//! - `host_request NAME [SECONDS]`: asks the host test to do something
//!   (restart a server...) and waits until it has ([`Running::serve`]).
//!
//! A guest that fails, hangs or never boots fails the test with the
//! guest's whole console output.

use crate::process::wait_child;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Shell functions put before every guest script (see the module doc).
pub const PRELUDE: &str = r#"set -euo pipefail
_steps=() _step=""
step() {
    if [ -n "$_step" ]; then _steps+=("$_step"); fi
    _step=$1
    echo "=== step $1 (up $(cut -d' ' -f1 /proc/uptime) s)"
}
_on_exit() {
    local rc=$?
    for s in "${_steps[@]}"; do echo "STEP-OK $s"; done
    if [ -n "$_step" ]; then
        if [ $rc = 0 ]; then echo "STEP-OK $_step"; else echo "STEP-FAIL $_step (status $rc)"; fi
    fi
}
trap _on_exit EXIT
host_request() {
    local name=$1 limit=${2:-60} i
    rm -f "/run/job/$name.done"
    echo "$name" > "/run/job/$name.req"
    for i in $(seq $((limit * 10))); do
        if [ -e "/run/job/$name.done" ]; then
            rm -f "/run/job/$name.req"
            cat "/run/job/$name.done"
            return 0
        fi
        sleep 0.1
    done
    echo "host_request $name: no answer from the host in $limit s"
    return 1
}
"#;

/// Extra time the host allows past the guest's own timeout (QEMU start,
/// power-off) before it kills the script.
const GRACE: Duration = Duration::from_secs(30);

/// `scripts/vm/guest.sh` in this repository.
pub fn guest_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/vm/guest.sh")
}

/// A guest to boot: the script to run and how.
#[derive(Debug, Clone)]
pub struct Guest {
    script: String,
    timeout: Duration,
    net: bool,
    mem: String,
    env: Vec<(String, String)>,
    /// Host files copied into the job folder: `(name, source)`.
    files: Vec<(String, PathBuf)>,
}

impl Guest {
    /// A guest that runs `script` (bash, after [`PRELUDE`]), with a
    /// 600 s limit on the whole run, boot included.
    pub fn new(script: &str) -> Guest {
        Guest {
            script: format!("{PRELUDE}\n{script}\n"),
            timeout: Duration::from_secs(600),
            net: false,
            mem: "1G".into(),
            env: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Copies host file `from` into the job folder as `name`, where the
    /// guest sees it as `/run/job/NAME`. For binaries the guest runs: the
    /// guest's /tmp, /var/tmp, /run, /mnt and /root are its own tmpfs, so
    /// a build under one of them on the host (a CI clone in /tmp) is not
    /// visible through the 9p root.
    pub fn copy_in(mut self, name: &str, from: impl AsRef<Path>) -> Guest {
        self.files.push((name.into(), from.as_ref().to_path_buf()));
        self
    }

    /// Limit for the whole run, boot included.
    pub fn timeout(mut self, t: Duration) -> Guest {
        self.timeout = t;
        self
    }

    /// Network to the host's loopback: the host's 127.0.0.1 is 10.0.2.2
    /// in the guest, and nothing else is reachable.
    pub fn net(mut self) -> Guest {
        self.net = true;
        self
    }

    /// Guest memory, e.g. "1G".
    pub fn mem(mut self, m: &str) -> Guest {
        self.mem = m.into();
        self
    }

    /// Exports `k=v` in the guest's script.
    pub fn env(mut self, k: &str, v: impl ToString) -> Guest {
        self.env.push((k.into(), v.to_string()));
        self
    }

    /// Boots the guest and returns at once; see [`Running`].
    pub fn spawn(&self) -> Running {
        let job = new_job_dir();
        for (name, from) in &self.files {
            let to = job.join(name);
            std::fs::copy(from, &to)
                .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
        }
        let cmd_file = job.join("script.sh");
        std::fs::write(&cmd_file, &self.script)
            .unwrap_or_else(|e| panic!("write {}: {e}", cmd_file.display()));
        let mut c = Command::new("bash");
        c.arg(guest_script())
            .arg("--timeout")
            .arg(self.timeout.as_secs().to_string())
            .arg("--mem")
            .arg(&self.mem)
            .arg("--job")
            .arg(&job);
        if self.net {
            c.arg("--net");
        }
        for (k, v) in &self.env {
            c.arg("--env").arg(format!("{k}={v}"));
        }
        c.arg("-f").arg(&cmd_file);
        let cmdline = format!("{c:?}");
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmdline}: {e}"));
        let drain = |mut p: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = p.read_to_end(&mut v);
                String::from_utf8_lossy(&v).into_owned()
            })
        };
        let out = drain(Box::new(child.stdout.take().unwrap()));
        let err = drain(Box::new(child.stderr.take().unwrap()));
        Running {
            child,
            job,
            deadline: Instant::now() + self.timeout + GRACE,
            out: Some((out, err)),
        }
    }

    /// Boots the guest, runs the script and waits for the result.
    pub fn run(&self) -> GuestOut {
        self.spawn().finish()
    }
}

/// A fresh, empty job folder under the system's temp dir.
fn new_job_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "iolift-guest-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    d
}

type Drain = JoinHandle<String>;

/// A booted (or booting) guest.
pub struct Running {
    child: Child,
    job: PathBuf,
    deadline: Instant,
    out: Option<(Drain, Drain)>,
}

impl Running {
    /// The job folder: the guest sees it as /run/job.
    pub fn job(&self) -> &Path {
        &self.job
    }

    /// Waits until the guest script calls `host_request NAME`, runs `f`
    /// and answers with what `f` returns (the guest's `host_request`
    /// prints it). Returns false, without running `f`, when the guest
    /// exits or `limit` passes first.
    pub fn serve(&mut self, name: &str, limit: Duration, f: impl FnOnce() -> String) -> bool {
        let req = self.job.join(format!("{name}.req"));
        let end = Instant::now() + limit;
        while !req.exists() {
            if Instant::now() >= end || !matches!(self.child.try_wait(), Ok(None)) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let answer = f();
        let done = self.job.join(format!("{name}.done"));
        std::fs::write(&done, format!("{answer}\n"))
            .unwrap_or_else(|e| panic!("write {}: {e}", done.display()));
        // The guest removes its request once it has the answer (removing
        // it here could race with the guest still writing it); wait for
        // that, so that a later request of the same name is a new one.
        let end = Instant::now() + Duration::from_secs(30);
        while req.exists() && Instant::now() < end && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Waits for the guest to power off (killing it past its time limit)
    /// and collects its output.
    pub fn finish(mut self) -> GuestOut {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let (status, killed) = match wait_child(&mut self.child, left) {
            Some(st) => (st, false),
            None => {
                let _ = self.child.kill();
                (self.child.wait().expect("wait for the killed guest"), true)
            }
        };
        let (o, e) = self.out.take().unwrap();
        GuestOut {
            status,
            killed,
            console: o.join().unwrap(),
            host_log: e.join().unwrap(),
            job: self.job.clone(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a guest run left.
#[derive(Debug)]
pub struct GuestOut {
    /// guest.sh's exit status: the script's, 124 when the guest ran past
    /// its limit, 125 when it reported none (boot failure, crash).
    pub status: ExitStatus,
    /// The host killed guest.sh past its limit plus a grace period.
    pub killed: bool,
    /// The guest's console: its script's output, boot messages.
    pub console: String,
    /// guest.sh's own messages (downloads, timing, QEMU errors).
    pub host_log: String,
    /// The job folder: removed when this is dropped, unless the test is
    /// failing (panicking) or `IOLIFT_KEEP_GUEST_JOB=1`, for a look.
    pub job: PathBuf,
}

impl Drop for GuestOut {
    fn drop(&mut self) {
        if !std::thread::panicking() && std::env::var("IOLIFT_KEEP_GUEST_JOB").as_deref() != Ok("1")
        {
            let _ = std::fs::remove_dir_all(&self.job);
        }
    }
}

impl GuestOut {
    /// The steps the script finished (`STEP-OK` lines), in order.
    pub fn steps_ok(&self) -> Vec<String> {
        self.console
            .lines()
            .filter_map(|l| l.strip_prefix("STEP-OK "))
            .map(|s| s.trim().to_string())
            .collect()
    }

    /// The step that failed, if one did.
    pub fn step_failed(&self) -> Option<String> {
        self.console
            .lines()
            .find_map(|l| l.strip_prefix("STEP-FAIL "))
            .map(|s| s.trim().to_string())
    }

    /// Everything, for a failure message.
    pub fn report(&self) -> String {
        format!(
            "guest status: {}{}\nfailed step: {}\nsteps done: {:?}\njob folder: {}\n\
             --- guest console ---\n{}\n--- guest.sh ---\n{}",
            self.status,
            if self.killed {
                " (killed by the test)"
            } else {
                ""
            },
            self.step_failed().as_deref().unwrap_or("-"),
            self.steps_ok(),
            self.job.display(),
            self.console,
            self.host_log
        )
    }

    /// Asserts that the script exited 0 and finished every step in
    /// `steps`; panics with [`GuestOut::report`] otherwise.
    pub fn assert_steps(&self, steps: &[&str]) {
        assert!(
            self.status.success() && !self.killed,
            "the guest script failed\n{}",
            self.report()
        );
        let done = self.steps_ok();
        for s in steps {
            assert!(
                done.iter().any(|d| d == s),
                "the guest never finished step {s}\n{}",
                self.report()
            );
        }
    }

    /// The value of the last `KEY=VALUE` line the guest printed for
    /// `key`, for checks on the host side.
    pub fn value(&self, key: &str) -> Option<String> {
        let prefix = format!("{key}=");
        self.console
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix(&prefix).map(|v| v.trim().to_string()))
    }
}
