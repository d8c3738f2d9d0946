//! Shared harness for iolift's integration tests.
//!
//! Every integration test file does `mod common; use common::*;`.
//! What it gives:
//! - [`ServerBuilder`] / [`Server`]: start `iolift serve ...` (or `nbdkit`, the
//!   sanity peer) on a unique unix socket in a fresh temp dir (optionally also
//!   TCP on a free loopback port), wait until it speaks NBD, give URIs for
//!   libnbd/qemu clients, and SIGTERM + wait on drop (SIGKILL after a timeout).
//! - [`python3_nbd`], [`nbdsh`], [`run_python`]: libnbd's python side.
//! - [`Attached`] (attach.rs): a running `iolift attach`, detached and
//!   cleaned up on drop.
//! - re-exported from iolift-testkit (the helpers every crate shares):
//!   [`require_tool`] (a missing peer tool fails the test with "missing X:
//!   run scripts/test.sh, which installs it"; never a skip), [`cmd`],
//!   [`run_ok`] / [`run_fail`] / [`run_timeout`] (run a command with a time
//!   limit and assert on its exit status, showing its output on failure),
//!   [`Rng`], [`random_bytes`], [`write_random_file`], [`sha256_file`],
//!   [`parse_size`], and the kernel helpers ([`require_root`], [`Mount`],
//!   [`is_mounted`], [`mkfs_ext4`], [`fsck_clean`], [`sync`]) and
//!   [`qemu_img_convert`] / [`qemu_img_compare`].
//! - [`heavy`]: a process-wide lock for CPU-heavy tests (fio), so that a
//!   2-core CI machine does not run several of them at once.
//!
//! Set `IOLIFT_TEST_PEER=nbdkit` to run the generic client tests (those that
//! start their server with [`ServerBuilder::peer`]) against nbdkit instead:
//! this checks the tests themselves against a known-good server.
//!
//! Keep this API stable: other test files (stages, FUSE, RBD) use it.
#![allow(dead_code, unused_imports)]

pub use iolift_testkit::{
    cmd, find_tool, fsck_clean, is_mounted, mkfs_ext4, parse_size, qemu_img_compare,
    qemu_img_convert, random_bytes, require_root, require_tool, run_capture, run_fail, run_ok,
    run_timeout, sha256_file, sync, umount_lazy, wait_child, write_random_file, Mount, Out, Rng,
    CMD_TIMEOUT,
};

mod attach;
pub use attach::Attached;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a server may take to start accepting.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to exit after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The iolift binary cargo built for this test run.
pub fn iolift_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_iolift"))
}

/// The repository (workspace) root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// A script under `tests/python/` at the repository root.
pub fn python_script(name: &str) -> PathBuf {
    let p = repo_root().join("tests/python").join(name);
    assert!(p.exists(), "missing test script {}", p.display());
    p
}

/// A python3 interpreter that can `import nbd` (python3-libnbd). Prefers the
/// system interpreter (/usr/bin/python3: pyenv or venv interpreters on PATH
/// do not see Debian's dist-packages). Panics if none can.
pub fn python3_nbd() -> PathBuf {
    static PY: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = PY.get_or_init(|| {
        let mut cands = vec![PathBuf::from("/usr/bin/python3")];
        if let Some(p) = find_tool("python3") {
            cands.push(p);
        }
        cands.into_iter().find(|py| {
            py.exists()
                && Command::new(py)
                    .args(["-c", "import nbd"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false)
        })
    });
    match found {
        Some(p) => p.clone(),
        None => panic!("missing python3-libnbd (python3 -c 'import nbd' fails): run scripts/test.sh, which installs it"),
    }
}

/// Serializes CPU-heavy tests (fio, big copies) within one test binary.
pub fn heavy() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// A memory line of /proc/PID/status (`VmRSS`, `VmHWM`: the resident
/// size now, its peak since the process started), in bytes.
pub fn proc_mem(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    kb << 10
}

/// A free TCP port on 127.0.0.1 (bound and released; a small race is possible).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// Which server a builder starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Iolift,
    Nbdkit,
}

impl Peer {
    /// `IOLIFT_TEST_PEER=nbdkit` selects nbdkit; anything else iolift.
    pub fn from_env() -> Peer {
        match std::env::var("IOLIFT_TEST_PEER").as_deref() {
            Ok("nbdkit") => Peer::Nbdkit,
            _ => Peer::Iolift,
        }
    }
}

/// Builds and starts a server. By default: a unix socket `nbd.sock` in a fresh
/// temp dir, no TCP.
pub struct ServerBuilder {
    peer: Peer,
    backend: Option<String>,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    socket: bool,
    socket_arg: bool,
    tcp: bool,
    dir: Option<tempfile::TempDir>,
}

impl ServerBuilder {
    /// `iolift serve`.
    pub fn iolift() -> Self {
        Self::new(Peer::Iolift)
    }

    /// `nbdkit` (the sanity peer). Give the plugin with [`Self::backend`]
    /// (translated) or [`Self::args`] (plugin and its arguments, verbatim).
    pub fn nbdkit() -> Self {
        Self::new(Peer::Nbdkit)
    }

    /// iolift, or nbdkit when `IOLIFT_TEST_PEER=nbdkit` (see module docs).
    pub fn peer() -> Self {
        Self::new(Peer::from_env())
    }

    pub fn new(peer: Peer) -> Self {
        ServerBuilder {
            peer,
            backend: None,
            args: Vec::new(),
            envs: Vec::new(),
            socket: true,
            socket_arg: true,
            tcp: false,
            dir: None,
        }
    }

    pub fn kind(&self) -> Peer {
        self.peer
    }

    /// The temp dir the server will live in (created on first use); put
    /// backing files and config files here before [`Self::start`].
    pub fn dir(&mut self) -> &Path {
        self.dir
            .get_or_insert_with(|| {
                tempfile::Builder::new()
                    .prefix("iolift-test-")
                    .tempdir()
                    .expect("tempdir")
            })
            .path()
    }

    /// The socket path the server will use.
    pub fn socket_path(&mut self) -> PathBuf {
        self.dir().join("nbd.sock")
    }

    /// The default export's backend, iolift syntax: `memory:1G`, `null:1G`,
    /// `file:PATH,size=1G`. For nbdkit it is translated to a plugin.
    pub fn backend(mut self, spec: &str) -> Self {
        self.backend = Some(spec.to_string());
        self
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn args<I, S>(mut self, it: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for a in it {
            self = self.arg(a);
        }
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }

    /// Also listen on TCP 127.0.0.1:(free port).
    pub fn tcp(mut self) -> Self {
        self.tcp = true;
        self
    }

    /// Listen on TCP only (no unix socket).
    pub fn tcp_only(mut self) -> Self {
        self.tcp = true;
        self.socket = false;
        self
    }

    /// Do not pass `--socket`: the server gets its socket path elsewhere
    /// (a config file). The harness still waits on `dir/nbd.sock`.
    pub fn socket_from_config(mut self) -> Self {
        self.socket_arg = false;
        self
    }

    /// The command line that [`Self::start`] would run (for error tests).
    pub fn command(&mut self) -> (Command, Option<SocketAddr>) {
        let sock = self.socket_path();
        let dir = self.dir().to_path_buf();
        let tcp = self
            .tcp
            .then(|| SocketAddr::from(([127, 0, 0, 1], free_port())));
        let mut c;
        match self.peer {
            Peer::Iolift => {
                c = Command::new(iolift_bin());
                c.arg("serve");
                if self.socket && self.socket_arg {
                    c.arg("--socket").arg(&sock);
                }
                if let Some(a) = tcp {
                    c.arg("--tcp").arg(a.to_string());
                }
                c.args(&self.args);
                if let Some(b) = &self.backend {
                    c.arg(b);
                }
                c.env("IOLIFT_LOG", "info");
            }
            Peer::Nbdkit => {
                c = Command::new(require_tool("nbdkit"));
                c.arg("-f").arg("--exit-with-parent");
                if self.socket {
                    c.arg("-U").arg(&sock);
                } else if let Some(a) = tcp {
                    c.arg("-i")
                        .arg("127.0.0.1")
                        .arg("-p")
                        .arg(a.port().to_string());
                }
                let mut plugin = Vec::new();
                if let Some(b) = &self.backend {
                    plugin = nbdkit_plugin(b, &dir);
                }
                // Flags (starting with '-') go before the plugin.
                let (flags, rest): (Vec<_>, Vec<_>) =
                    self.args.iter().cloned().partition(|a| a.starts_with('-'));
                c.args(flags);
                c.args(plugin);
                c.args(rest);
            }
        }
        for (k, v) in &self.envs {
            c.env(k, v);
        }
        c.current_dir(&dir);
        (
            c,
            if self.socket && self.peer == Peer::Nbdkit {
                None
            } else {
                tcp
            },
        )
    }

    /// Starts the server and waits until it accepts NBD connections; panics
    /// (showing the server's stderr) if it exits or does not answer in time.
    pub fn start(mut self) -> Server {
        let (mut c, tcp) = self.command();
        let dir = self.dir.take().expect("dir created by command()");
        let sock = dir.path().join("nbd.sock");
        let err_path = dir.path().join("server.stderr");
        let err = fs::File::create(&err_path).expect("create stderr file");
        c.stdin(Stdio::null())
            .stdout(err.try_clone().unwrap())
            .stderr(err);
        let cmdline = format!("{c:?}");
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmdline}: {e}"));
        let mut s = Server {
            child: Some(child),
            exited: None,
            peer: self.peer,
            socket: self.socket.then_some(sock),
            tcp,
            err_path,
            cmdline,
            dir,
        };
        s.wait_ready();
        s
    }
}

/// Translates an iolift backend spec into nbdkit plugin arguments.
fn nbdkit_plugin(spec: &str, dir: &Path) -> Vec<String> {
    let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut parts = rest.split(',');
    let arg = parts.next().unwrap_or("").to_string();
    match kind {
        "memory" | "null" => vec![kind.into(), arg],
        "file" => {
            let path = dir.join(&arg);
            for p in parts {
                if let Some(sz) = p.strip_prefix("size=") {
                    if !path.exists() {
                        let f = fs::File::create(&path).expect("create file");
                        f.set_len(parse_size(sz)).expect("set_len");
                    }
                }
            }
            vec!["file".into(), path.to_string_lossy().into_owned()]
        }
        other => panic!("no nbdkit equivalent for backend {other:?}"),
    }
}

/// A running server; SIGTERM + wait on drop.
pub struct Server {
    child: Option<Child>,
    /// How the process ended, once it has been reaped.
    exited: Option<ExitStatus>,
    peer: Peer,
    socket: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    err_path: PathBuf,
    cmdline: String,
    dir: tempfile::TempDir,
}

impl Server {
    /// `iolift serve memory:SIZE` on a unix socket.
    pub fn memory(size: &str) -> Server {
        ServerBuilder::iolift()
            .backend(&format!("memory:{size}"))
            .start()
    }

    pub fn peer(&self) -> Peer {
        self.peer
    }

    /// The server's temp dir (backing files, config, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The unix socket path (panics for a TCP-only server).
    pub fn socket(&self) -> &Path {
        self.socket.as_deref().expect("server has no unix socket")
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// URI of the default export (unix socket if there is one, else TCP).
    pub fn uri(&self) -> String {
        self.uri_named("")
    }

    /// URI of the export `name` (unix socket if there is one, else TCP).
    pub fn uri_named(&self, name: &str) -> String {
        if self.socket.is_some() {
            self.unix_uri(name)
        } else {
            self.tcp_uri(name)
        }
    }

    /// `nbd+unix:///NAME?socket=PATH` (libnbd and qemu syntax).
    pub fn unix_uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket().display())
    }

    /// `nbd://127.0.0.1:PORT/NAME`.
    pub fn tcp_uri(&self, name: &str) -> String {
        let a = self.tcp.expect("server has no TCP listener");
        format!("nbd://{a}/{name}")
    }

    /// What the server wrote to stdout/stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err_path).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().map(|s| s.is_none()).unwrap_or(false),
            None => false,
        }
    }

    /// Asserts the server is still running (e.g. after a bad client), showing
    /// its stderr if not.
    pub fn assert_running(&mut self) {
        if !self.is_running() {
            let st = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            panic!(
                "server exited unexpectedly ({st:?}); stderr:\n{}",
                self.stderr()
            );
        }
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "server exited during startup with {st}\ncommand: {}\nstderr:\n{}",
                    self.cmdline,
                    self.stderr()
                );
            }
            if self.probe() {
                return;
            }
            if Instant::now() > deadline {
                let out = self.stderr();
                let _ = self.kill9();
                panic!(
                    "server did not accept NBD connections within {START_TIMEOUT:?}\ncommand: {}\nstderr:\n{out}",
                    self.cmdline
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Connects and reads the 8-byte "NBDMAGIC" greeting start.
    fn probe(&self) -> bool {
        fn greet(mut s: impl Read + Write) -> bool {
            let mut b = [0u8; 8];
            s.read_exact(&mut b).is_ok() && &b == b"NBDMAGIC"
        }
        let t = Some(Duration::from_secs(2));
        // Each listener the server has must greet; the unix socket is
        // tried first.
        self.socket.as_ref().is_none_or(|p| {
            UnixStream::connect(p).is_ok_and(|s| {
                s.set_read_timeout(t).ok();
                greet(s)
            })
        }) && self.tcp.is_none_or(|a| {
            TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok_and(|s| {
                s.set_read_timeout(t).ok();
                greet(s)
            })
        })
    }

    /// Sends a signal to the server.
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// SIGTERM, then waits up to [`STOP_TIMEOUT`] (SIGKILL after that, and
    /// panics). Returns the exit status: for a server that had already died
    /// (crashed, or killed by [`Self::signal`]) how it died, not a clean
    /// exit; for one already stopped, the status it exited with then.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        match self.wait_exit(STOP_TIMEOUT) {
            Some(st) => st,
            None => {
                let out = self.stderr();
                self.kill9();
                panic!("server did not exit within {STOP_TIMEOUT:?} of SIGTERM; stderr:\n{out}");
            }
        }
    }

    /// Waits for the process to exit by itself, up to `t`, and reaps it;
    /// None if it still runs then. Once reaped, returns the same status.
    pub fn wait_exit(&mut self, t: Duration) -> Option<ExitStatus> {
        let Some(c) = self.child.as_mut() else {
            return self.exited;
        };
        let st = wait_child(c, t)?;
        self.child = None;
        self.exited = Some(st);
        Some(st)
    }

    /// SIGKILL and reap; returns the status (None if already reaped).
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = c.kill();
        self.exited = c.wait().ok();
        self.exited
    }

    /// Number of open file descriptors of the server (from /proc/PID/fd).
    pub fn open_fds(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Waits (up to 10 s) until the server has at most `max` open fds;
    /// panics naming the count otherwise (a connection or file leak).
    pub fn wait_fds_at_most(&self, max: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = self.open_fds();
            if n <= max {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "server still has {n} open fds (want <= {max}): leaked connections?\nstderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// utime+stime of the server in seconds (from /proc/PID/stat).
    pub fn cpu_seconds(&self) -> f64 {
        let s = fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let ut: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0);
        let st: f64 = f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
        (ut + st) / tck
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        self.signal(libc::SIGTERM);
        if self.wait_exit(STOP_TIMEOUT).is_none() {
            eprintln!(
                "harness: server {} ignored SIGTERM for {STOP_TIMEOUT:?}, killing; stderr:\n{}",
                self.pid(),
                self.stderr()
            );
            self.kill9();
        }
    }
}

/// `nbdsh` with PATH set so that its `python3` is one that has libnbd
/// (nbdsh runs `python3 -mnbd`; a pyenv/venv python3 first on PATH lacks it).
pub fn nbdsh() -> Command {
    let py = python3_nbd();
    let dir = py.parent().expect("python3 dir").to_path_buf();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let joined = std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&path)))
        .expect("PATH");
    let mut c = cmd("nbdsh");
    c.env("PATH", joined);
    c
}

/// Runs a `tests/python/NAME` script with a python3 that has libnbd; extra
/// args follow. Asserts success and returns its output.
pub fn run_python(name: &str, args: &[&str]) -> Out {
    let py = python3_nbd();
    let mut c = Command::new(py);
    c.arg(python_script(name)).args(args);
    run_ok(&mut c)
}

/// fio 4k random writes with crc32c verification through an NBD URI
/// (`numjobs` connections, each on its own `size` range, `offset_increment`
/// apart), then asserts no bad block, no job error, and a verify read phase.
pub fn fio_randwrite_verify(
    uri: &str,
    iodepth: u32,
    jobs: u32,
    size: &str,
    offset_increment: &str,
) {
    fio_randwrite_verify_bs(uri, "4k", iodepth, jobs, size, offset_increment);
}

/// [`fio_randwrite_verify`] with block size `bs` (e.g. "1536" for writes
/// that are not 4k-aligned).
pub fn fio_randwrite_verify_bs(
    uri: &str,
    bs: &str,
    iodepth: u32,
    jobs: u32,
    size: &str,
    offset_increment: &str,
) {
    let o = run_ok(cmd("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        &format!("--bs={bs}"),
        &format!("--iodepth={iodepth}"),
        &format!("--numjobs={jobs}"),
        &format!("--size={size}"),
        &format!("--offset_increment={offset_increment}"),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]));
    let all = o.all();
    assert!(!all.contains("verify: bad"), "{all}");
    assert!(
        all.matches("err=").count() > 0
            && all.matches("err=").count() == all.matches("err= 0").count(),
        "fio reported errors (bs {bs}, iodepth {iodepth}, {jobs} jobs):\n{all}"
    );
    assert!(all.contains("read: IOPS="), "no verify read phase:\n{all}");
}
