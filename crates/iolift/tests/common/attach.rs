//! [`Attached`]: a running `iolift attach` (FUSE file and loop device)
//! that cleans up after itself, for the tests of `attach` and `detach`.

use super::{iolift_bin, is_mounted, run_ok, umount_lazy, wait_child, START_TIMEOUT, STOP_TIMEOUT};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running `iolift attach --file DIR/fuse/disk.img ARGS... BACKEND` (in
/// the foreground: FUSE file + loop device; needs root). Drop: SIGTERM,
/// wait, then clean up whatever is left (loop device, FUSE mount) with
/// `iolift detach` and, failing that, by hand, also when the test panics.
pub struct Attached {
    child: Option<Child>,
    /// /dev/loopN, or the FUSE file with --no-loop (what attach printed).
    pub dev: PathBuf,
    /// The FUSE file.
    pub file: PathBuf,
    stderr: PathBuf,
}

impl Attached {
    /// Starts attach with `args` (flags such as `--no-loop`, `--stage S`)
    /// before `backend`, and waits (up to [`START_TIMEOUT`]) for the device
    /// path it prints; panics with its log if it prints none.
    pub fn start(dir: &Path, backend: &str, args: &[&str]) -> Attached {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = dir.join("fuse").join("disk.img");
        let stderr = dir.join(format!("attach-{n}.log"));
        let mut c = Command::new(iolift_bin());
        c.arg("attach")
            .arg("--file")
            .arg(&file)
            .args(args)
            .arg(backend)
            .env("IOLIFT_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr).expect("create attach log"));
        let mut child = c.spawn().expect("spawn iolift attach");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
            let _ = tx.send(line);
        });
        let mut a = Attached {
            child: Some(child),
            dev: PathBuf::new(),
            file,
            stderr,
        };
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(line) if !line.trim().is_empty() => a.dev = PathBuf::from(line.trim()),
            _ => panic!("iolift attach did not print its device\n{}", a.log()),
        }
        a
    }

    /// What attach wrote to stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The attach process's pid (0 once it is reaped).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// SIGKILL and reap the attach process (loop device and FUSE mount are
    /// left for `iolift detach` or the drop to clean up).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `iolift detach DEV`; asserts it succeeds, the server exits 0 within
    /// [`STOP_TIMEOUT`] and no FUSE mount is left.
    pub fn detach(&mut self) {
        run_ok(Command::new(iolift_bin()).arg("detach").arg(&self.dev));
        if let Some(mut c) = self.child.take() {
            let st = wait_child(&mut c, STOP_TIMEOUT).expect("server exit after detach");
            assert!(st.success(), "server exit {st}\n{}", self.log());
        }
        assert!(
            !is_mounted(self.file.parent().unwrap()),
            "FUSE mount left after detach"
        );
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if wait_child(&mut c, STOP_TIMEOUT).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if self.dev.starts_with("/dev") {
            let _ = Command::new("losetup")
                .arg("-d")
                .arg(&self.dev)
                .stderr(Stdio::null())
                .status();
        }
        let dir = self.file.parent().unwrap();
        if is_mounted(dir) {
            let _ = Command::new(iolift_bin())
                .arg("detach")
                .arg(dir)
                .stderr(Stdio::null())
                .status();
        }
        umount_lazy(dir);
    }
}
