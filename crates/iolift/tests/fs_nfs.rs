//! `iolift fs mount nfs://...`: the nfs backend (a user-space NFS client
//! through libnfs, NFSv3 by default) against nfs-ganesha serving a
//! temporary directory with its VFS backend on loopback, through the
//! kernel's FUSE client. Real
//! workloads (fio verify, tar in and out, git, sqlite3, rsync -c), each
//! checked byte for byte in the exported directory itself; renames of open
//! files and directories; clear errors for a missing server or export; EIO,
//! not a hang, when the server goes away. One ganesha serves the whole test
//! binary (each test its own subdirectory); the server-loss test starts its
//! own. Needs root (FUSE mount), libnfs13, nfs-ganesha-vfs and rpcbind
//! (ganesha registers NFSv3 there; started if not running).

mod common;
#[path = "common/fs_mount.rs"]
mod fs_mount;
#[path = "common/fs_workloads.rs"]
mod fs_workloads;
use common::*;
use fs_mount::FsMount;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One nfs-ganesha process exporting `dir/exp` (NFSv3 and NFSv4 over TCP
/// on 127.0.0.1:`port`, its MOUNT service on `mnt_port`; no NLM or
/// rquota). Ganesha serving NFSv3 must register with rpcbind, so one is
/// started if none runs (and left running: it is a system service).
struct Ganesha {
    child: Child,
    dir: PathBuf,
    port: u16,
    mnt_port: u16,
}

fn ensure_rpcbind() {
    if TcpStream::connect(("127.0.0.1", 111)).is_ok() {
        return;
    }
    require_tool("rpcbind");
    run_ok(cmd("rpcbind").arg("-w"));
    let deadline = Instant::now() + START_TIMEOUT;
    while TcpStream::connect(("127.0.0.1", 111)).is_err() {
        assert!(Instant::now() < deadline, "rpcbind did not listen on 111");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Ganesha {
    fn start(dir: &Path) -> Ganesha {
        require_root("ganesha and the FUSE mount need root");
        require_tool("ganesha.nfsd");
        assert!(
            Path::new("/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so").exists()
                || Path::new("/usr/lib/ganesha/libfsalvfs.so").exists(),
            "missing ganesha's VFS backend: run scripts/test.sh, which installs nfs-ganesha-vfs"
        );
        let exp = dir.join("exp");
        let rec = dir.join("recovery");
        fs::create_dir_all(&exp).unwrap();
        fs::create_dir_all(&rec).unwrap();
        ensure_rpcbind();
        let port = free_port();
        let mnt_port = free_port();
        let conf = format!(
            "NFS_CORE_PARAM {{ Protocols = 3, 4; NFS_Port = {port}; MNT_Port = {mnt_port}; \
             Bind_addr = 127.0.0.1; \
             Enable_NLM = false; Enable_RQUOTA = false; }}\n\
             NFSv4 {{ Graceless = true; Allow_Numeric_Owners = true; Only_Numeric_Owners = true; \
             RecoveryRoot = {rec}; }}\n\
             EXPORT {{ Export_Id = 1; Path = {exp}; Pseudo = /exp; Access_Type = RW; \
             Squash = No_Root_Squash; Protocols = 3, 4; Transports = TCP; SecType = sys; \
             FSAL {{ Name = VFS; }} }}\n",
            rec = rec.display(),
            exp = exp.display()
        );
        fs::write(dir.join("ganesha.conf"), conf).unwrap();
        let mut c = Command::new("ganesha.nfsd");
        c.arg("-F")
            .arg("-f")
            .arg(dir.join("ganesha.conf"))
            .arg("-L")
            .arg(dir.join("ganesha.log"))
            .arg("-p")
            .arg(dir.join("ganesha.pid"))
            .args(["-N", "NIV_EVENT"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl in the child before exec; it dies with the thread
        // that started it.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = c.spawn().expect("spawn ganesha.nfsd");
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "ganesha.nfsd exited ({st}); log:\n{}",
                    fs::read_to_string(dir.join("ganesha.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "ganesha did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ganesha {
            child,
            dir: dir.to_path_buf(),
            port,
            mnt_port,
        }
    }

    fn export(&self) -> PathBuf {
        self.dir.join("exp")
    }

    /// The spec of `sub` (a directory under the export), made here first.
    fn spec(&self, sub: &str, extra: &str) -> String {
        let d = self.export().join(sub);
        fs::create_dir_all(&d).unwrap();
        format!(
            "nfs://127.0.0.1{}?nfsport={}&mountport={}{extra}",
            d.display(),
            self.port,
            self.mnt_port
        )
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the atexit handler cleans up: the shared ganesha's pid and dir.
static SHARED_AT_EXIT: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);

extern "C" fn stop_shared() {
    if let Some((pid, dir)) = SHARED_AT_EXIT.lock().ok().and_then(|mut g| g.take()) {
        // SAFETY: signalling and reaping our own child.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
            libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
        }
        let _ = fs::remove_dir_all(dir);
    }
}

/// The ganesha this test binary shares: (export dir on the host, spec
/// builder). Started on a thread that never ends (so the PDEATHSIG only
/// fires when the process goes) and stopped at exit.
fn shared() -> &'static SharedInfo {
    static S: OnceLock<SharedInfo> = OnceLock::new();
    S.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let dir = tempfile::Builder::new()
                .prefix("iolift-ganesha")
                .tempdir()
                .unwrap()
                .keep();
            let g = Ganesha::start(&dir);
            *SHARED_AT_EXIT.lock().unwrap() = Some((g.child.id(), dir.clone()));
            // SAFETY: registering a plain extern "C" function.
            unsafe { libc::atexit(stop_shared) };
            tx.send(SharedInfo {
                dir: g.dir.clone(),
                port: g.port,
                mnt_port: g.mnt_port,
            })
            .unwrap();
            std::mem::forget(g);
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("shared ganesha started")
    })
}

struct SharedInfo {
    dir: PathBuf,
    port: u16,
    mnt_port: u16,
}

impl SharedInfo {
    fn export(&self) -> PathBuf {
        self.dir.join("exp")
    }
    fn spec(&self, sub: &str) -> String {
        let d = self.export().join(sub);
        fs::create_dir_all(&d).unwrap();
        format!(
            "nfs://127.0.0.1{}?nfsport={}&mountport={}",
            d.display(),
            self.port,
            self.mnt_port
        )
    }
}

/// A mount of the shared export's subdirectory `sub`: (mount, the same
/// directory on the host, a scratch dir).
fn mount(sub: &str, extra: &[&str]) -> (FsMount, PathBuf, tempfile::TempDir) {
    let g = shared();
    let tmp = tempfile::tempdir().unwrap();
    let m = FsMount::start(&g.spec(sub), &tmp.path().join("mnt"), extra);
    (m, g.export().join(sub), tmp)
}

#[test]
fn fio_verify_writes_every_byte_to_the_export() {
    let _h = heavy();
    let (m, host, _tmp) = mount("fio", &[]);
    fs_workloads::fio_verify(&m.mnt, 16, Some(&host));
}

#[test]
fn tar_in_and_out_keeps_every_byte() {
    let _h = heavy();
    let (m, host, tmp) = mount("tar", &["--threads", "3"]);
    fs_workloads::tar_round_trip(tmp.path(), &m.mnt, &host);
}

#[test]
fn git_clone_checkout_and_status() {
    let (m, host, _tmp) = mount("git", &[]);
    fs_workloads::git_history(&m.mnt, Some(&host), 12, 5, 4);
}

#[test]
fn sqlite_database_passes_integrity_check() {
    let (m, host, _tmp) = mount("sqlite", &[]);
    fs_workloads::sqlite_rows(&m.mnt, &host, 8, false);
}

#[test]
fn rsync_checksums_match_the_source() {
    let (m, host, tmp) = mount("rsync", &[]);
    fs_workloads::rsync_tree(tmp.path(), &m.mnt, &host);
}

#[test]
fn renames_keep_open_files_and_nodes_right() {
    let (m, host, _tmp) = mount("rename", &[]);
    let a = m.mnt.join("a");
    fs::create_dir_all(a.join("b")).unwrap();
    fs::write(a.join("b/f"), b"hello").unwrap();
    let ino = fs::metadata(a.join("b/f")).unwrap().ino();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(a.join("b/f"))
        .unwrap();
    // Rename the directory above the open file, then the file itself.
    fs::rename(&a, m.mnt.join("c")).unwrap();
    fs::rename(m.mnt.join("c/b/f"), m.mnt.join("c/g")).unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b" world").unwrap();
    f.sync_all().unwrap();
    let md = fs::metadata(m.mnt.join("c/g")).unwrap();
    assert_eq!((md.ino(), md.len()), (ino, 11));
    assert_eq!(fs::read(host.join("c/g")).unwrap(), b"hello world");
    assert!(!host.join("a").exists() && !host.join("c/b/f").exists());
    // A file renamed over another: the name now leads to the moved file.
    fs::write(m.mnt.join("c/h"), b"old").unwrap();
    fs::rename(m.mnt.join("c/g"), m.mnt.join("c/h")).unwrap();
    let mut s = String::new();
    fs::File::open(m.mnt.join("c/h"))
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "hello world");
    assert_eq!(fs::metadata(m.mnt.join("c/h")).unwrap().ino(), ino);
    // Errors come back as the server gives them.
    let e = fs::remove_dir(m.mnt.join("c")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    let e = fs::metadata(m.mnt.join("nope")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = fs::create_dir(m.mnt.join("c")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    let e = fs::write(m.mnt.join("x".repeat(256)), b"").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
    // Symlinks, modes, truncate and times reach the server.
    std::os::unix::fs::symlink("c/h", m.mnt.join("l")).unwrap();
    assert_eq!(fs::read_link(host.join("l")).unwrap(), Path::new("c/h"));
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(m.mnt.join("c/h"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        fs::metadata(host.join("c/h")).unwrap().mode() & 0o7777,
        0o640
    );
    fs::OpenOptions::new()
        .write(true)
        .open(m.mnt.join("c/h"))
        .unwrap()
        .set_len(3)
        .unwrap();
    assert_eq!(fs::read(host.join("c/h")).unwrap(), b"hel");
    run_ok(
        cmd("touch")
            .args(["-m", "-d", "2001-02-03 04:05:06 UTC"])
            .arg(m.mnt.join("c/h")),
    );
    assert_eq!(fs::metadata(host.join("c/h")).unwrap().mtime(), 981173106);
}

#[test]
fn a_missing_server_or_export_fails_the_mount_clearly() {
    require_root("mounting needs root");
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let port = free_port();
    let out = run_fail(
        Command::new(iolift_bin())
            .args(["fs", "mount"])
            .arg(format!(
                "nfs://127.0.0.1/exp?nfsport={port}&timeout_ms=5000"
            ))
            .arg(&mnt),
    );
    assert!(
        out.stderr.contains("127.0.0.1") && out.stderr.contains("nfs"),
        "{}",
        out.report()
    );
    assert!(!is_mounted(&mnt));
    let g = shared();
    let out = run_fail(
        Command::new(iolift_bin())
            .args(["fs", "mount"])
            .arg(format!(
                "nfs://127.0.0.1/no-such-export?nfsport={}&mountport={}",
                g.port, g.mnt_port
            ))
            .arg(&mnt),
    );
    assert!(out.stderr.contains("/no-such-export"), "{}", out.report());
    assert!(!is_mounted(&mnt));
    let out = run_fail(
        Command::new(iolift_bin())
            .args(["fs", "mount", "nfs://127.0.0.1"])
            .arg(&mnt),
    );
    assert!(out.stderr.contains("nfs://HOST/EXPORT"), "{}", out.report());
}

#[test]
fn the_server_going_away_gives_eio_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Ganesha::start(tmp.path());
    let spec = g.spec("gone", "&timeout_ms=3000");
    fs::write(g.export().join("gone/f"), vec![7u8; 1 << 20]).unwrap();
    let mut m = FsMount::start(&spec, &tmp.path().join("mnt"), &["--ttl-ms", "0"]);
    assert_eq!(fs::read(m.mnt.join("f")).unwrap().len(), 1 << 20);
    let _ = g.child.kill();
    let _ = g.child.wait();
    // Reads of a file not yet opened, and a new file: both must fail
    // within a bounded time, with EIO.
    let t = Instant::now();
    let out = run_capture(
        Command::new("sh").arg("-c").arg(format!(
            "cat {0}/f > /dev/null; echo x > {0}/new",
            m.mnt.display()
        )),
        Duration::from_secs(60),
    );
    assert!(!out.timed_out, "hung: {}", out.report());
    assert!(!out.status.success(), "{}", out.report());
    assert!(
        out.stderr.contains("Input/output error"),
        "{}",
        out.report()
    );
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
    m.kill();
}
