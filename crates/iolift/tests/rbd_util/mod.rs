//! A throwaway Ceph cluster for the rbd_* tests: `scripts/ceph-local.sh`
//! in a temp dir, stopped (daemons killed, files removed) when the guard
//! drops, including when the test panics.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct Cluster {
    dir: tempfile::TempDir,
    pub conf: PathBuf,
    pub pool: String,
    pub image: String,
    pub image_size: u64,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-local.sh")
}

/// A missing Ceph tool fails the test (never a skip).
fn need(tool: &str) {
    assert!(
        iolift_testkit::find_tool(tool).is_some(),
        "missing {tool}: run scripts/test.sh, which installs the Ceph packages"
    );
}

impl Cluster {
    /// Starts mon + mgr + 3 memstore OSDs, pool `rbd` (size 3) and image
    /// `img` of `image_size` (e.g. "64M"); `extra` are more env settings.
    pub fn start(image_size: &str, extra: &[(&str, &str)]) -> Cluster {
        for t in ["ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd", "rados"] {
            need(t);
        }
        // On disk (not tmpfs), short path (admin socket paths are limited).
        let dir = tempfile::Builder::new()
            .prefix("iolift-ceph-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let cdir = dir.path().join("c");
        let mut c = Command::new("bash");
        c.arg(script()).arg("start").arg(&cdir);
        c.env("CEPH_LOCAL_IMAGE_SIZE", image_size);
        for (k, v) in extra {
            c.env(k, v);
        }
        let out = run_limited(&mut c, Duration::from_secs(150));
        let cl = Cluster {
            conf: cdir.join("ceph.conf"),
            dir,
            pool: "rbd".into(),
            image: "img".into(),
            image_size: iolift_testkit::parse_size(image_size),
        };
        if !out.0 {
            panic!("ceph-local.sh start failed:\n{}", out.1);
        }
        let last = out
            .1
            .lines()
            .rfind(|l| l.ends_with("ceph.conf"))
            .unwrap_or("");
        assert_eq!(
            Path::new(last),
            cl.conf,
            "start should print the conf path:\n{}",
            out.1
        );
        cl
    }

    pub fn cdir(&self) -> PathBuf {
        self.dir.path().join("c")
    }

    /// The iolift backend spec of the image.
    pub fn spec(&self) -> String {
        format!(
            "rbd:{}/{},conf={}",
            self.pool,
            self.image,
            self.conf.display()
        )
    }

    /// `rbd -c CONF ARGS...` with a time limit; panics on failure.
    pub fn rbd(&self, args: &[&str]) -> String {
        let mut c = Command::new("rbd");
        c.arg("-c").arg(&self.conf).args(args);
        let (ok, out) = run_limited(&mut c, Duration::from_secs(120));
        assert!(ok, "rbd {args:?} failed:\n{out}");
        out
    }

    /// `rbd export` of the image into `path`.
    pub fn export(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
        let img = format!("{}/{}", self.pool, self.image);
        self.rbd(&["export", "--no-progress", &img, path.to_str().unwrap()]);
    }

    /// SIGKILLs osd.N; returns its pid.
    pub fn kill_osd(&self, n: u32) -> u32 {
        let mut c = Command::new("bash");
        c.arg(script())
            .arg("kill-osd")
            .arg(self.cdir())
            .arg(n.to_string());
        let (ok, out) = run_limited(&mut c, Duration::from_secs(20));
        assert!(ok, "kill-osd {n} failed:\n{out}");
        out.trim().parse().unwrap_or(0)
    }

    /// `ceph -s` text (for messages).
    pub fn status(&self) -> String {
        let mut c = Command::new("ceph");
        c.arg("-c")
            .arg(&self.conf)
            .args(["--connect-timeout", "10", "-s"]);
        run_limited(&mut c, Duration::from_secs(20)).1
    }

    fn stop(&mut self) {
        let mut c = Command::new("bash");
        c.arg(script()).arg("stop").arg(self.cdir());
        let (ok, out) = run_limited(&mut c, Duration::from_secs(60));
        if !ok {
            eprintln!("ceph-local.sh stop failed:\n{out}");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs a command with a time limit: (success, stdout+stderr, plus a line
/// saying so when it timed out and was killed).
pub fn run_limited(c: &mut Command, t: Duration) -> (bool, String) {
    let o = iolift_testkit::run_capture(c, t);
    let mut text = o.all();
    if o.timed_out {
        text.push_str(&format!("\n(timed out after {t:?}: {})", o.cmdline));
    }
    (o.status.success() && !o.timed_out, text)
}
