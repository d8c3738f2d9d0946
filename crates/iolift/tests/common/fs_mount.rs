//! Helpers for tests that mount an `iolift fs mount` on the kernel's FUSE
//! client: [`FsMount`] (start, SIGTERM and a check that it unmounted),
//! [`tree_sums`] and [`make_tree`]. Included with
//! `#[path = "common/fs_mount.rs"] mod fs_mount;` next to `mod common;`.
#![allow(dead_code)]

use crate::common::*;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// A running `iolift fs mount`; SIGTERM and a check that it unmounted on drop.
pub struct FsMount {
    child: Option<Child>,
    pub mnt: PathBuf,
    /// The first lines it printed (the serving line; the metrics line
    /// with `--metrics`).
    pub lines: Vec<String>,
}

impl FsMount {
    /// Mounts `backend` on `mnt` and waits for the serving line (and,
    /// when `extra` has `--metrics`, the metrics line after it).
    pub fn start(backend: &str, mnt: &Path, extra: &[&str]) -> FsMount {
        require_root("the FUSE tests need root (mount(2))");
        fs::create_dir_all(mnt).unwrap();
        let mut child = Command::new(iolift_bin())
            .args(["fs", "mount", backend])
            .arg(mnt)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn iolift fs mount");
        let out = child.stdout.take().unwrap();
        let want = if extra.contains(&"--metrics") { 2 } else { 1 };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut lines = Vec::new();
        let deadline = Instant::now() + START_TIMEOUT;
        while lines.len() < want {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => lines.push(l),
                Err(_) => {
                    let _ = child.kill();
                    let st = child.wait();
                    panic!("iolift fs mount {backend} did not come up ({st:?}); printed {lines:?}");
                }
            }
        }
        assert!(is_mounted(mnt), "{} is not a mount point", mnt.display());
        FsMount {
            child: Some(child),
            mnt: mnt.to_path_buf(),
            lines,
        }
    }

    /// `name` under the mount point.
    pub fn p(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// SIGTERM; the server must unmount and exit 0.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let st = wait_child(&mut c, STOP_TIMEOUT);
        if st.is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mounted = is_mounted(&self.mnt);
        if mounted {
            umount_lazy(&self.mnt);
        }
        assert!(!mounted, "still mounted after SIGTERM");
        assert!(
            st.is_some_and(|s| s.success()),
            "exit after SIGTERM: {st:?}"
        );
    }

    /// Kills the server and lazily unmounts (for tests whose server is
    /// expected to be in trouble).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        umount_lazy(&self.mnt);
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.kill();
        } else {
            self.stop();
        }
    }
}

/// `sha256sum` of every regular file under `dir`, as "hash  ./relative"
/// lines, sorted.
pub fn tree_sums(dir: &Path) -> String {
    run_ok(
        Command::new("sh")
            .arg("-c")
            .arg("find . -type f -print0 | sort -z | xargs -0 -r sha256sum")
            .current_dir(dir),
    )
    .stdout
}

/// A tree of random files in subdirectories, one 8 MiB file, a symlink
/// and a hard link.
pub fn make_tree(root: &Path, seed: u64) {
    let mut rng = Rng::new(seed);
    for d in 0..6 {
        let dir = root.join(format!("dir{d}")).join(format!("sub{}", d % 3));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..25 {
            let len = (rng.next_u64() % 200_000) as usize;
            write_random_file(&dir.join(format!("f{f}.bin")), len, rng.next_u64());
        }
    }
    write_random_file(&root.join("big.bin"), 8 << 20, seed);
    std::os::unix::fs::symlink("dir0/sub0/f1.bin", root.join("link")).unwrap();
    fs::hard_link(root.join("big.bin"), root.join("big.hard")).unwrap();
}
