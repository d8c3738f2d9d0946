//! `iolift attach` / `iolift detach`: a kernel block device without the nbd
//! module: the device is served as one file on a FUSE mount and a loop
//! device (direct I/O) is bound to that file.
//!
//! ```text
//! iolift attach memory:1G            # prints /dev/loopN, serves until SIGTERM
//! iolift attach --daemon file:/var/tmp/d.img,size=4G --name d
//! iolift detach /dev/loopN           # or the FUSE file, its mount dir, or d
//! ```
//!
//! Layout: the FUSE file is `/run/iolift/NAME/disk.img` (or `--file`); its
//! parent directory is the FUSE mount point and `<mount dir>.pid` holds the
//! server's pid, which is how `detach` finds it (`detach NAME` looks at
//! `/run/iolift/NAME`). The server locks its
//! memory (mlockall) so that reclaim writing back pages of the loop device
//! can never wait on a server page being swapped in.

use crate::config::{DEFAULT_FUSE_THREADS, DEFAULT_THREADS};
use crate::export::ExportPlan;
use crate::frontend::{self, fuse::LoopFile, Running, StopOn};
use crate::fuse::{self, loopdev};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where attach puts its mounts by default.
pub const RUN_DIR: &str = "/run/iolift";

#[derive(Args, Debug, Clone)]
pub struct AttachArgs {
    /// Backend, e.g. memory:1G or file:/var/tmp/disk.img,size=1G.
    pub backend: String,
    /// Stack a stage on the device (repeatable; first given = top).
    #[arg(long = "stage", value_name = "SPEC")]
    pub stages: Vec<String>,
    /// Name of the attachment: the FUSE file is /run/iolift/NAME/disk.img.
    #[arg(long, default_value = "disk")]
    pub name: String,
    /// Put the FUSE file here instead (its directory becomes the mount point).
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Read-only device (loop device and FUSE file).
    #[arg(short, long)]
    pub read_only: bool,
    /// FUSE reader threads.
    #[arg(long, default_value_t = DEFAULT_FUSE_THREADS, value_name = "N")]
    pub fuse_threads: usize,
    /// Tokio worker threads for completions.
    #[arg(long, default_value_t = DEFAULT_THREADS, value_name = "N")]
    pub threads: usize,
    /// Only mount the FUSE file, bind no loop device.
    #[arg(long)]
    pub no_loop: bool,
    /// Go to the background once the device is ready (prints it first).
    #[arg(short, long)]
    pub daemon: bool,
    /// Do not lock the server's memory (mlockall); unsafe under memory
    /// pressure when the device holds a mounted file system.
    #[arg(long)]
    pub no_mlock: bool,
}

#[derive(Args, Debug, Clone)]
pub struct DetachArgs {
    /// /dev/loopN, the FUSE file, its mount directory, or the NAME given
    /// to `attach --name`.
    pub target: PathBuf,
    /// How long to wait for the server to flush and exit.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub timeout: u64,
}

fn check_name(n: &str) -> Result<()> {
    if n.is_empty()
        || n.starts_with('.')
        || !n
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    {
        bail!("bad --name {n:?}: letters, digits, _ - . only");
    }
    Ok(())
}

/// The pidfile of the server whose mount point is `dir`.
pub fn pidfile_for(dir: &Path) -> PathBuf {
    let mut s = dir.as_os_str().to_os_string();
    s.push(".pid");
    PathBuf::from(s)
}

pub fn run_attach(a: AttachArgs) -> Result<ExitCode> {
    check_name(&a.name)?;
    let file = match &a.file {
        Some(f) => f.clone(),
        None => Path::new(RUN_DIR).join(&a.name).join("disk.img"),
    };
    // Fail early, before forking, with the one-line reasons.
    drop(fuse::open_dev_fuse()?);
    if a.daemon {
        return daemonize(a, file);
    }
    serve(a, file, &mut None)
}

/// Forks; the child serves and reports "/dev/loopN" or an error through a
/// pipe; the parent prints it and exits.
fn daemonize(a: AttachArgs, file: PathBuf) -> Result<ExitCode> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: both fds are fresh and owned by us from here on.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: no other threads exist yet (no runtime has been started).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid > 0 {
        drop(w);
        let mut msg = String::new();
        std::fs::File::from(r).read_to_string(&mut msg)?;
        return match msg.strip_prefix("OK ") {
            Some(dev) => {
                println!("{}", dev.trim());
                Ok(ExitCode::SUCCESS)
            }
            None if msg.is_empty() => bail!("attach: background server exited during setup"),
            None => bail!("{}", msg.strip_prefix("ERR ").unwrap_or(&msg).trim()),
        };
    }
    drop(r);
    // SAFETY: setsid in the fresh child.
    unsafe { libc::setsid() };
    let mut report = Some(std::fs::File::from(w));
    match serve(a, file, &mut report) {
        Ok(c) => Ok(c),
        Err(e) => {
            if let Some(mut w) = report.take() {
                let _ = write!(w, "ERR {e:#}");
            }
            std::process::exit(1);
        }
    }
}

fn redirect_stdio_to_null() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard fds.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// How long the device may take to flush at exit.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves until a signal. `report`: the daemon's pipe to its parent, taken
/// (and closed) once the device is ready.
fn serve(a: AttachArgs, file: PathBuf, report: &mut Option<std::fs::File>) -> Result<ExitCode> {
    if !a.no_mlock {
        frontend::fuse::mlock_all();
    }
    let rt = frontend::runtime(a.threads.clamp(1, 64), "iolift-io")?;
    let export = Arc::new(
        ExportPlan {
            name: a.name.clone(),
            backend: a.backend.clone(),
            stages: a.stages.clone(),
            read_only: a.read_only,
            description: None,
        }
        .build()?,
    );
    let lf = LoopFile::start(
        &export,
        &file,
        rt.handle().clone(),
        a.fuse_threads,
        !a.no_loop,
    )?;
    let (dir, fuse_file, shown) = (
        lf.dir().to_path_buf(),
        lf.file().to_path_buf(),
        lf.device().display().to_string(),
    );
    let mut running = Running::new(vec![Box::new(lf)]);
    running.write_pidfile(&pidfile_for(&dir))?;
    tracing::info!(
        "attached {} ({}) as {shown}, pid {}",
        export.dev.name(),
        fuse_file.display(),
        std::process::id()
    );
    match report.take() {
        Some(mut w) => {
            write!(w, "OK {shown}")?;
            drop(w);
            redirect_stdio_to_null();
        }
        None => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{shown}")?;
            out.flush()?;
        }
    }
    let code = rt.block_on(async {
        let sig = frontend::wait_for_signal(StopOn::IntTermHup).await;
        tracing::info!("{sig}: detaching {shown}");
        // Unbind the loop device (the kernel finishes its I/O first),
        // unmount, flush the device.
        running.close(&[export], FLUSH_TIMEOUT).await
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    Ok(code)
}

/// Whether `pid` runs (a zombie waiting for its parent counts as gone).
fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(s) => !matches!(
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next()),
            Some(Some('Z' | 'X'))
        ),
        Err(_) => false,
    }
}

/// Whether `dev` is open exclusively (mounted, or held by another user).
fn in_use(dev: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    matches!(
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(dev),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY)
    )
}

/// What `detach` was given, with the name of `attach --name NAME` turned
/// into its mount dir `/run/iolift/NAME` (where attach records its pid,
/// as `/run/iolift/NAME.pid`). A bare word is taken as such a name only
/// when that mount or pidfile exists; otherwise it stays a path.
fn resolve_target(t: &Path) -> PathBuf {
    if let Some(n) = t.to_str().filter(|n| check_name(n).is_ok()) {
        let dir = Path::new(RUN_DIR).join(n);
        if fuse::is_our_mount(&dir) || pidfile_for(&dir).exists() {
            return dir;
        }
    }
    t.to_path_buf()
}

pub fn run_detach(a: DetachArgs) -> Result<ExitCode> {
    let t = &resolve_target(&a.target);
    // Resolve the FUSE file and its mount dir from what we were given.
    let (file, dir) = if t.starts_with("/dev") {
        let f = loopdev::backing_file(t)
            .with_context(|| format!("{} is not a bound loop device", t.display()))?;
        let d = f.parent().map(Path::to_path_buf).unwrap_or_default();
        (Some(f), d)
    } else if fuse::is_our_mount(t) {
        (None, t.clone())
    } else {
        let d = t.parent().map(Path::to_path_buf).unwrap_or_default();
        if !fuse::is_our_mount(&d) && !pidfile_for(&d).exists() {
            bail!(
                "{} is neither a loop device, an iolift FUSE file, its mount dir nor the name of an attachment",
                t.display()
            );
        }
        (Some(t.clone()), d)
    };
    let loops: Vec<PathBuf> = match &file {
        Some(f) => loopdev::find(f),
        None => std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .flat_map(|e| loopdev::find(&e.path()))
                    .collect()
            })
            .unwrap_or_default(),
    };
    for l in &loops {
        if in_use(l) {
            bail!(
                "{} is in use (a mounted file system?): unmount it first",
                l.display()
            );
        }
    }
    let pidfile = pidfile_for(&dir);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if pid_alive(pid) {
        // The server unbinds the loop device, flushes and unmounts itself.
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while pid_alive(pid) {
            if t0.elapsed() > Duration::from_secs(a.timeout) {
                bail!("server pid {pid} did not exit within {} s", a.timeout);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for l in &loops {
            if !loopdev::wait_free(l, Duration::from_secs(5)) {
                bail!("{} still bound after the server exited", l.display());
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    // No live server (killed): clean up what it left behind.
    for l in &loops {
        loopdev::detach(l)?;
        loopdev::wait_free(l, Duration::from_secs(10));
    }
    if fuse::is_our_mount(&dir) && fuse::umount(&dir, false).is_err() {
        fuse::umount(&dir, true)?;
    }
    let _ = std::fs::remove_file(&pidfile);
    Ok(ExitCode::SUCCESS)
}
