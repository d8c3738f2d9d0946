//! A Ceph cluster for the rbd_*, osdmap_*_cluster and fs_kv tests, as a
//! guard that cleans up when it drops (also when the test panics):
//! - [`Cluster::start`]: a throwaway cluster of the test's own
//!   (`scripts/ceph-local.sh` in a temp dir, stopped and removed on drop),
//!   for tests that change the cluster (kill an OSD, reweight) or need
//!   another shape;
//! - [`Cluster::shared`]: a pool (and image) of the test's own in the one
//!   cluster the suite's binaries share (iolift_testkit::ceph), removed on
//!   drop; with `IOLIFT_CEPH_SHARED=0`, a throwaway cluster as above.
#![allow(dead_code)]

use iolift_testkit::ceph::{self, SharedCluster};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct Cluster {
    kind: Kind,
    pub conf: PathBuf,
    pub pool: String,
    /// The image's name; empty when none was made.
    pub image: String,
    pub image_size: u64,
}

enum Kind {
    Own(tempfile::TempDir),
    Shared(&'static SharedCluster),
}

fn script() -> PathBuf {
    ceph::ceph_local_script()
}

impl Cluster {
    /// A pool of this test's own, `pool_size` replicas, in the shared
    /// cluster (three OSDs, cephx), named `PREFIX-PID-N`, with an image
    /// `img` of `image_size` (`rbd pool init` first) if one is given.
    /// With `IOLIFT_CEPH_SHARED=0` a cluster of its own instead (pool
    /// named `prefix`, as many OSDs as replicas, at least one).
    pub fn shared(prefix: &str, pool_size: u32, image_size: Option<&str>) -> Cluster {
        if !ceph::sharing() {
            let (osds, size) = (pool_size.max(1).to_string(), pool_size.to_string());
            return Cluster::start(
                image_size.unwrap_or("16M"),
                &[
                    ("CEPH_LOCAL_AUTH", "cephx"),
                    ("CEPH_LOCAL_POOL", prefix),
                    ("CEPH_LOCAL_POOL_SIZE", &size),
                    ("CEPH_LOCAL_OSDS", &osds),
                    (
                        "CEPH_LOCAL_IMAGE",
                        if image_size.is_some() { "img" } else { "" },
                    ),
                ],
            );
        }
        let sc = ceph::shared_cluster();
        let app = if image_size.is_some() {
            "rbd"
        } else {
            "iolift-test"
        };
        let pool = sc.create_pool(prefix, pool_size, 16, app);
        let mut cl = Cluster {
            kind: Kind::Shared(sc),
            conf: sc.conf.clone(),
            pool,
            image: String::new(),
            image_size: 0,
        };
        if let Some(size) = image_size {
            cl.image = "img".into();
            cl.image_size = iolift_testkit::parse_size(size);
            let img = format!("{}/{}", cl.pool, cl.image);
            cl.rbd(&["create", "--size", size, &img]);
        }
        cl
    }

    /// Starts mon + mgr + 3 memstore OSDs, pool `rbd` (size 3) and image
    /// `img` of `image_size` (e.g. "64M"); `extra` are more env settings.
    pub fn start(image_size: &str, extra: &[(&str, &str)]) -> Cluster {
        ceph::require_ceph_tools();
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
        let setting = |k: &str, default: &str| {
            extra
                .iter()
                .find(|(n, _)| *n == k)
                .map_or(default.to_string(), |(_, v)| v.to_string())
        };
        let cl = Cluster {
            conf: cdir.join("ceph.conf"),
            kind: Kind::Own(dir),
            pool: setting("CEPH_LOCAL_POOL", "rbd"),
            image: setting("CEPH_LOCAL_IMAGE", "img"),
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

    /// The directory of a cluster of the test's own.
    pub fn cdir(&self) -> PathBuf {
        match &self.kind {
            Kind::Own(dir) => dir.path().join("c"),
            Kind::Shared(_) => panic!("a test on the shared cluster has no cluster dir"),
        }
    }

    /// The client.admin keyring (cephx clusters).
    pub fn keyring(&self) -> PathBuf {
        match &self.kind {
            Kind::Own(dir) => dir.path().join("c/keyring"),
            Kind::Shared(sc) => sc.dir.join("keyring"),
        }
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

    /// `ceph -c CONF --connect-timeout 20 ARGS...` with a 90 s limit;
    /// panics on failure, returns stdout and stderr.
    pub fn ceph(&self, args: &[&str]) -> String {
        let mut c = Command::new("ceph");
        c.arg("-c")
            .arg(&self.conf)
            .args(["--connect-timeout", "20"])
            .args(args);
        let (ok, out) = run_limited(&mut c, Duration::from_secs(90));
        assert!(ok, "ceph {args:?} failed:\n{out}");
        out
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
        if let Kind::Shared(sc) = &self.kind {
            sc.remove_pool(&self.pool);
            return;
        }
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
