//! One local Ceph cluster (scripts/ceph-local.sh) shared by the test
//! binaries of a suite run, so that the tests that only need a healthy
//! cluster and a pool of their own do not each start one (a start costs
//! tens of seconds of two cores).
//!
//! How it is shared:
//! - The cluster lives in [`SHARED_DIR`] (on disk: memstore OSDs keep
//!   objects in RAM, but logs and the mon store are files): a monitor, a
//!   manager and three memstore OSDs with cephx, and no pool; each test
//!   makes its own pool ([`SharedCluster::create_pool`]) and removes it
//!   when done, so tests never see each other's objects.
//! - Every process that uses it holds a shared `flock` on
//!   `SHARED_DIR.users` for as long as it lives (the kernel drops it when
//!   the process ends, however it ends). Starting, checking and
//!   restarting happen under an exclusive `flock` on `SHARED_DIR.start`,
//!   so two binaries never start it twice.
//! - Whoever starts it also starts a reaper (a small bash loop, in its own
//!   session, pid in `SHARED_DIR.reaper`): every 5 s it tries the users
//!   lock exclusively; once nobody has held it for
//!   `$IOLIFT_CEPH_SHARED_IDLE_S` seconds (default 120, at most 3600) it
//!   stops the cluster (`ceph-local.sh stop`, which deletes its files)
//!   while still holding that lock, and exits. A binary that comes later
//!   finds no reaper and starts a fresh cluster. So a run of single test
//!   binaries leaves nothing behind two minutes after its last Ceph test;
//!   `bash scripts/ceph-local.sh stop /var/tmp/iolift-ceph-shared` stops
//!   it at once. scripts/test.sh sets the idle time to 30 minutes, so
//!   that the suite's Ceph binaries (fs_kv, then rbd_* many binaries
//!   later) share one cluster start, and stops the cluster itself when
//!   the suite ends.
//! - A cluster that is not healthy when a binary arrives (a daemon gone,
//!   `ceph -s` not answering, no reaper) is stopped and started again.
//!
//! Tests that change the cluster itself (kill an OSD, reweight OSDs, need
//! another number of OSDs) must not use it: they start their own.
//! `IOLIFT_CEPH_SHARED=0` tells callers ([`sharing`]) to start a private
//! cluster everywhere, as before.

use crate::process::{find_tool, run_capture};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the shared cluster lives (short: admin socket paths are limited).
pub const SHARED_DIR: &str = "/var/tmp/iolift-ceph-shared";

/// How long a start may take in all (ceph-local.sh's own limit is less).
const START_LIMIT: Duration = Duration::from_secs(200);

/// scripts/ceph-local.sh of this repository.
pub fn ceph_local_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-local.sh")
}

/// Whether tests should use the shared cluster (`$IOLIFT_CEPH_SHARED`
/// unset or not `0`).
pub fn sharing() -> bool {
    std::env::var("IOLIFT_CEPH_SHARED").map_or(true, |v| v != "0")
}

/// A missing Ceph tool fails the test (never a skip).
pub fn require_ceph_tools() {
    for t in ["ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd", "rados"] {
        assert!(
            find_tool(t).is_some(),
            "missing {t}: run scripts/test.sh, which installs the Ceph packages"
        );
    }
}

/// The shared cluster, as this process sees it.
pub struct SharedCluster {
    /// [`SHARED_DIR`].
    pub dir: PathBuf,
    /// Its ceph.conf (names the admin keyring: clients need nothing else).
    pub conf: PathBuf,
    /// The shared lock on the users file, held for the life of the process.
    _users: File,
}

/// The shared cluster, started if no healthy one runs; the first call in
/// a process takes the users lock for the rest of its life.
pub fn shared_cluster() -> &'static SharedCluster {
    static S: OnceLock<SharedCluster> = OnceLock::new();
    S.get_or_init(|| {
        require_ceph_tools();
        let dir = PathBuf::from(SHARED_DIR);
        let users = lock_file(&format!("{SHARED_DIR}.users"), libc::LOCK_SH, START_LIMIT);
        let start = lock_file(&format!("{SHARED_DIR}.start"), libc::LOCK_EX, START_LIMIT);
        if !healthy(&dir) {
            restart(&dir);
        }
        drop(start);
        SharedCluster {
            conf: dir.join("ceph.conf"),
            dir,
            _users: users,
        }
    })
}

/// Opens (creating) `path` and takes `op` (LOCK_SH / LOCK_EX) on it,
/// waiting at most `limit`.
fn lock_file(path: &str, op: libc::c_int, limit: Duration) -> File {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
    let deadline = Instant::now() + limit;
    loop {
        // SAFETY: flock(2) on a file descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return f;
        }
        assert!(
            Instant::now() < deadline,
            "{path} stayed locked for {limit:?} (a shared Ceph cluster starting or stopping?)"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The reaper's pid if it runs.
fn reaper_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(format!("{}.reaper", dir.display()))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains("iolift-ceph-reaper")
        .then_some(pid)
}

fn script(args: &[&str], limit: Duration) -> (bool, String) {
    let mut c = Command::new("bash");
    c.arg(ceph_local_script()).args(args);
    let o = run_capture(&mut c, limit);
    (o.status.success() && !o.timed_out, o.report())
}

/// A reaper runs and `ceph-local.sh status` finds every daemon up and
/// `ceph -s` answering.
fn healthy(dir: &Path) -> bool {
    reaper_pid(dir).is_some()
        && script(&["status", dir.to_str().unwrap()], Duration::from_secs(40)).0
}

/// Stops whatever is there (and its reaper), starts a fresh cluster and
/// a reaper for it.
fn restart(dir: &Path) {
    let d = dir.to_str().unwrap();
    if let Some(pid) = reaper_pid(dir) {
        // SAFETY: kill(2); the pid was checked to be a reaper above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = std::fs::remove_file(format!("{d}.reaper"));
    let (ok, out) = script(&["stop", d], Duration::from_secs(60));
    assert!(ok, "ceph-local.sh stop {d} failed:\n{out}");
    let mut c = Command::new("bash");
    c.arg(ceph_local_script()).args(["start", d]);
    for (k, v) in [
        ("CEPH_LOCAL_AUTH", "cephx"),
        ("CEPH_LOCAL_OSDS", "3"),
        ("CEPH_LOCAL_POOL", ""),
        ("CEPH_LOCAL_IMAGE", ""),
        ("CEPH_LOCAL_TIMEOUT", "150"),
    ] {
        c.env(k, v);
    }
    let o = run_capture(&mut c, START_LIMIT);
    assert!(
        o.status.success() && !o.timed_out,
        "ceph-local.sh start {d} failed:\n{}",
        o.report()
    );
    spawn_reaper(dir);
}

/// The longest idle time `IOLIFT_CEPH_SHARED_IDLE_S` may ask for: a
/// cluster nobody uses never outlives its last user by more than an hour.
const MAX_IDLE_S: u32 = 3600;

/// The reaper: see the module's doc. `$0` names it in its command line.
const REAPER: &str = r#"
dir=$1 users=$2 script=$3 grace=$4
echo $$ >"$dir.reaper"
idle=0
while sleep 5; do
    [ -f "$dir/ceph-local.state" ] || exit 0
    [ "$(cat "$dir.reaper" 2>/dev/null)" = $$ ] || exit 0
    exec 9>>"$users"
    if flock -n -x 9; then
        idle=$((idle + 5))
        if [ "$idle" -ge "$grace" ]; then
            bash "$script" stop "$dir" >/dev/null 2>&1
            rm -f "$dir.reaper"
            exit 0
        fi
    else
        idle=0
    fi
    exec 9>&-
done
"#;

fn spawn_reaper(dir: &Path) {
    let grace = std::env::var("IOLIFT_CEPH_SHARED_IDLE_S")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(120)
        .clamp(5, MAX_IDLE_S);
    let d = dir.to_str().unwrap();
    // setsid -f: the reaper runs in a session of its own, a child of
    // init rather than of this test binary, which it outlives; the setsid
    // that forked it exits at once.
    let mut c = Command::new("setsid");
    c.args(["-f", "bash", "-c", REAPER, "iolift-ceph-reaper", d])
        .arg(format!("{d}.users"))
        .arg(ceph_local_script())
        .arg(grace.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let st = c
        .status()
        .expect("run setsid for the shared cluster's reaper");
    assert!(st.success(), "setsid -f bash (the reaper): {st}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while reaper_pid(dir).is_none() {
        assert!(Instant::now() < deadline, "the reaper did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl SharedCluster {
    /// `ceph -c CONF ARGS...` with a time limit: (success, output).
    pub fn ceph(&self, args: &[&str], limit: Duration) -> (bool, String) {
        let mut c = Command::new("ceph");
        c.arg("-c")
            .arg(&self.conf)
            .args(["--connect-timeout", "30"])
            .args(args);
        let o = run_capture(&mut c, limit);
        (o.status.success() && !o.timed_out, o.report())
    }

    /// Makes a replicated pool of its own for one test: `PREFIX-PID-N`,
    /// `size` replicas, `pgs` placement groups, tagged with application
    /// `app` (`rbd` runs `rbd pool init`), and waits until an object can
    /// be written and read back. Returns its name.
    pub fn create_pool(&self, prefix: &str, size: u32, pgs: u32, app: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let t = Duration::from_secs(60);
        let pg = pgs.to_string();
        let sz = size.to_string();
        for args in [
            &["osd", "pool", "create", &name, &pg, &pg, "replicated"][..],
            &[
                "osd",
                "pool",
                "set",
                &name,
                "size",
                &sz,
                "--yes-i-really-mean-it",
            ],
        ] {
            let (ok, out) = self.ceph(args, t);
            assert!(ok, "ceph {args:?} on the shared cluster failed:\n{out}");
        }
        if app == "rbd" {
            let mut c = Command::new("rbd");
            c.arg("-c").arg(&self.conf).args(["pool", "init", &name]);
            let o = run_capture(&mut c, t);
            assert!(
                o.status.success() && !o.timed_out,
                "rbd pool init {name}:\n{}",
                o.report()
            );
        } else {
            let (ok, out) = self.ceph(&["osd", "pool", "application", "enable", &name, app], t);
            assert!(ok, "application enable {name} {app}:\n{out}");
        }
        self.wait_io(&name);
        name
    }

    /// Waits (60 s at most) until an object of `pool` can be written,
    /// read back and removed with `rados`.
    fn wait_io(&self, pool: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let tmp = std::env::temp_dir().join(format!("iolift-probe-{pool}"));
        std::fs::write(&tmp, b"probe").unwrap();
        let rados = |args: &[&str]| {
            let mut c = Command::new("rados");
            c.arg("-c").arg(&self.conf).args(["-p", pool]).args(args);
            run_capture(&mut c, Duration::from_secs(20))
        };
        loop {
            let put = rados(&["put", "probe", tmp.to_str().unwrap()]);
            let get = rados(&["get", "probe", "-"]);
            if put.status.success()
                && get.stdout == "probe"
                && rados(&["rm", "probe"]).status.success()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no I/O on pool {pool} within 60 s:\n{}\n{}",
                put.report(),
                get.report()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let _ = std::fs::remove_file(tmp);
    }

    /// Removes a pool made by [`SharedCluster::create_pool`] with
    /// everything in it; a failure is printed, not raised (this runs when
    /// a test ends, also when it failed).
    pub fn remove_pool(&self, name: &str) {
        let (ok, out) = self.ceph(
            &[
                "osd",
                "pool",
                "rm",
                name,
                name,
                "--yes-i-really-really-mean-it",
            ],
            Duration::from_secs(60),
        );
        if !ok {
            eprintln!("removing pool {name} from the shared cluster failed:\n{out}");
        }
    }
}
