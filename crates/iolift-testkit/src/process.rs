//! Peer tools and child processes: find a tool or fail loudly, run a
//! command under a time limit with its output captured, wait for a child.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Default time limit of [`run_ok`] / [`run_fail`].
pub const CMD_TIMEOUT: Duration = Duration::from_secs(180);

/// Finds `name` on PATH (then /usr/sbin, /sbin), or checks an absolute
/// path; None when it is not there.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.is_absolute() {
        return p.exists().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in
        std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
    {
        let c = dir.join(name);
        if c.is_file() {
            return Some(c);
        }
    }
    None
}

/// Finds `name` like [`find_tool`]; a missing tool fails the test with
/// "missing NAME: run scripts/test.sh, which installs it" (never a skip).
pub fn require_tool(name: &str) -> PathBuf {
    match find_tool(name) {
        Some(p) => p,
        None => panic!("missing {name}: run scripts/test.sh, which installs it"),
    }
}

/// `Command::new(prog)` after [`require_tool`] has found it.
pub fn cmd(prog: &str) -> Command {
    Command::new(require_tool(prog))
}

/// A finished (or timed-out) command's output, as text.
#[derive(Debug)]
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The command line, for messages.
    pub cmdline: String,
    /// The command ran past its limit and was killed ([`run_capture`]
    /// only; the other runners panic instead).
    pub timed_out: bool,
}

impl Out {
    /// stdout followed by stderr.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Command line, status and both outputs, for a failure message.
    pub fn report(&self) -> String {
        format!(
            "command: {}\nstatus: {}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmdline,
            self.status,
            if self.timed_out { " (timed out)" } else { "" },
            self.stdout,
            self.stderr
        )
    }
}

/// Runs `c` with stdin from /dev/null and its output captured, for at most
/// `t`; past that the command is killed and `timed_out` is set. Panics only
/// when the command cannot be started.
///
/// The output goes to unlinked temporary files, not pipes: a command that
/// leaves daemons behind (which inherit its stdout) still counts as done
/// when the command itself exits.
pub fn run_capture(c: &mut Command, t: Duration) -> Out {
    let cmdline = format!("{c:?}");
    let mut so = tempfile::tempfile().expect("temporary file for stdout");
    let mut se = tempfile::tempfile().expect("temporary file for stderr");
    let mut child = c
        .stdin(Stdio::null())
        .stdout(so.try_clone().expect("dup stdout file"))
        .stderr(se.try_clone().expect("dup stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmdline}: {e}"));
    let (status, timed_out) = match wait_child(&mut child, t) {
        Some(st) => (st, false),
        None => {
            let _ = child.kill();
            (child.wait().expect("wait for killed command"), true)
        }
    };
    let text = |f: &mut std::fs::File| {
        let mut v = Vec::new();
        f.seek(SeekFrom::Start(0)).expect("rewind output file");
        f.read_to_end(&mut v).expect("read output file");
        String::from_utf8_lossy(&v).into_owned()
    };
    Out {
        status,
        stdout: text(&mut so),
        stderr: text(&mut se),
        cmdline,
        timed_out,
    }
}

/// [`run_capture`], but a command that runs past `t` fails the test
/// (showing what it printed).
pub fn run_timeout(c: &mut Command, t: Duration) -> Out {
    let o = run_capture(c, t);
    assert!(
        !o.timed_out,
        "command timed out after {t:?}\n{}",
        o.report()
    );
    o
}

/// Runs `c` (limit [`CMD_TIMEOUT`]) and asserts it exits 0; shows its
/// output otherwise.
pub fn run_ok(c: &mut Command) -> Out {
    let o = run_timeout(c, CMD_TIMEOUT);
    assert!(o.status.success(), "command failed\n{}", o.report());
    o
}

/// Runs `c` (limit [`CMD_TIMEOUT`]) and asserts it exits with a non-zero
/// code (a death by signal does not count).
pub fn run_fail(c: &mut Command) -> Out {
    let o = run_timeout(c, CMD_TIMEOUT);
    assert!(
        !o.status.success() && o.status.code().is_some(),
        "command should have failed with an exit code\n{}",
        o.report()
    );
    o
}

/// Waits up to `t` for `c` to exit and reaps it; None if it is still
/// running then (it is left running).
pub fn wait_child(c: &mut Child, t: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + t;
    loop {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Time limit of [`tool_output`] and [`tool_ok`]: generous, as some peer
/// runs (osdmaptool on maps with a million PGs) take minutes on a loaded
/// two-core machine.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(900);

/// Runs `prog` (found like [`require_tool`], or an absolute path) with
/// `args` and returns its exit code (-1 when killed by a signal), stdout
/// and stderr. The program sees `prog` as given as its name (argv\[0\]), so
/// messages that print it read as they would from a shell. A run past
/// [`TOOL_TIMEOUT`] fails the test.
pub fn tool_output(prog: &str, args: &[&str]) -> (i32, String, String) {
    use std::os::unix::process::CommandExt;
    let mut c = cmd(prog);
    c.arg0(prog).args(args);
    let o = run_timeout(&mut c, TOOL_TIMEOUT);
    (o.status.code().unwrap_or(-1), o.stdout, o.stderr)
}

/// [`tool_output`], asserting exit code 0; returns stdout.
pub fn tool_ok(prog: &str, args: &[&str]) -> String {
    let (code, out, err) = tool_output(prog, args);
    assert_eq!(code, 0, "{prog} {args:?}: {out}{err}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_and_require_tool() {
        assert!(find_tool("sh").is_some());
        assert_eq!(find_tool("/bin/sh").as_deref(), Some(Path::new("/bin/sh")));
        assert_eq!(find_tool("no-such-tool-xyz"), None);
        assert_eq!(find_tool("/no/such/tool"), None);
        let e = std::panic::catch_unwind(|| require_tool("no-such-tool-xyz")).unwrap_err();
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(
            msg,
            "missing no-such-tool-xyz: run scripts/test.sh, which installs it"
        );
    }

    #[test]
    fn runners_capture_output_and_check_status() {
        let o = run_ok(cmd("sh").args(["-c", "echo out; echo err >&2"]));
        assert_eq!(o.stdout, "out\n");
        assert_eq!(o.stderr, "err\n");
        assert_eq!(o.all(), "out\nerr\n");
        assert!(!o.timed_out);
        let o = run_fail(cmd("sh").args(["-c", "echo bad >&2; exit 3"]));
        assert_eq!(o.status.code(), Some(3));
        assert!(o.report().contains("bad"), "{}", o.report());
        // run_ok on a failing command and run_fail on a succeeding one panic.
        assert!(std::panic::catch_unwind(|| run_ok(cmd("sh").args(["-c", "exit 1"]))).is_err());
        assert!(std::panic::catch_unwind(|| run_fail(&mut cmd("true"))).is_err());
        // A death by signal is not a failure with an exit code.
        assert!(
            std::panic::catch_unwind(|| run_fail(cmd("sh").args(["-c", "kill -9 $$"]))).is_err()
        );
    }

    #[test]
    fn time_limits_kill_the_command() {
        let t0 = Instant::now();
        let o = run_capture(
            cmd("sh").args(["-c", "echo started; exec sleep 30"]),
            Duration::from_millis(300),
        );
        assert!(o.timed_out);
        assert!(!o.status.success());
        assert_eq!(o.stdout, "started\n");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        let e = std::panic::catch_unwind(|| {
            run_timeout(cmd("sleep").arg("30"), Duration::from_millis(200))
        })
        .unwrap_err();
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("timed out"), "{msg}");
    }

    #[test]
    fn a_daemon_left_behind_does_not_hold_the_runner() {
        let t0 = Instant::now();
        // The background sleep inherits stdout and outlives the shell.
        let o = run_ok(cmd("sh").args(["-c", "sleep 20 & echo $!; echo done"]));
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        let mut lines = o.stdout.lines();
        let pid: i32 = lines.next().unwrap().parse().unwrap();
        assert_eq!(lines.next(), Some("done"));
        // SAFETY: kill(2) on the sleep this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }

    #[test]
    fn wait_child_reaps_or_gives_up() {
        let mut c = Command::new("sh").args(["-c", "exit 4"]).spawn().unwrap();
        let st = wait_child(&mut c, Duration::from_secs(10)).expect("exits");
        assert_eq!(st.code(), Some(4));
        let mut c = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(wait_child(&mut c, Duration::from_millis(100)).is_none());
        c.kill().unwrap();
        assert!(wait_child(&mut c, Duration::from_secs(10)).is_some());
    }
}
