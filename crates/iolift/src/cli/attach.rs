//! `iolift attach` / `iolift detach`: a kernel block device without the nbd
//! module: the device is served as one file on a FUSE mount and a loop
//! device (direct I/O) is bound to that file.
//!
//! ```text
//! iolift attach memory:1G            # prints /dev/loopN, serves until SIGTERM
//! iolift attach --daemon file:/var/tmp/d.img,size=4G --name d
//! iolift detach /dev/loopN           # or the FUSE file, or its mount dir
//! ```
//!
//! Layout: the FUSE file is `/run/iolift/NAME/disk.img` (or `--file`); its
//! parent directory is the FUSE mount point and `<mount dir>.pid` holds the
//! server's pid, which is how `detach` finds it. The server locks its
//! memory (mlockall) so that reclaim writing back pages of the loop device
//! can never wait on a server page being swapped in.

use crate::block::DevRef;
use crate::fuse::{self, loopdev, FuseOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
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
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub fuse_threads: usize,
    /// Tokio worker threads for completions.
    #[arg(long, default_value_t = 2, value_name = "N")]
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
    /// /dev/loopN, the FUSE file, or its mount directory.
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

fn mlock_all() {
    // SAFETY: mlockall takes flags only.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        tracing::warn!(
            "mlockall failed ({}): the server may deadlock under memory pressure",
            std::io::Error::last_os_error()
        );
    }
}

/// Serves until a signal. `report`: the daemon's pipe to its parent, taken
/// (and closed) once the device is ready.
fn serve(a: AttachArgs, file: PathBuf, report: &mut Option<std::fs::File>) -> Result<ExitCode> {
    if !a.no_mlock {
        mlock_all();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads.clamp(1, 64))
        .thread_name("iolift-io")
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let backend = crate::backend::open(&a.backend)?;
    let dev: DevRef = crate::stage::build_stack(&a.stages, backend)?;
    let read_only = a.read_only || dev.info().read_only;
    let opts = FuseOptions {
        threads: a.fuse_threads,
        read_only,
    };
    let mount = fuse::mount(dev.clone(), &file, rt.handle().clone(), &opts)?;
    let pidfile = pidfile_for(mount.dir());
    std::fs::write(&pidfile, format!("{}\n", std::process::id()))
        .with_context(|| format!("cannot write {}", pidfile.display()))?;
    let _rm_pid = RemoveOnDrop(pidfile.clone());
    let loop_dev = if a.no_loop {
        None
    } else {
        Some(loopdev::attach(mount.file(), read_only)?)
    };
    let shown = match &loop_dev {
        Some(d) => d.display().to_string(),
        None => mount.file().display().to_string(),
    };
    tracing::info!(
        "attached {} ({}) as {shown}, pid {}",
        dev.name(),
        mount.file().display(),
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
    // Serve until asked to stop.
    let sig = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let s = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = hup.recv() => "SIGHUP",
        };
        Ok::<_, std::io::Error>(s)
    })?;
    tracing::info!("{sig}: detaching {shown}");
    // Teardown: unbind the loop device (the kernel finishes its I/O first),
    // flush the device, unmount.
    if let Some(d) = &loop_dev {
        if let Err(e) = loopdev::detach(d) {
            tracing::warn!("{e:#}");
        }
        if !loopdev::wait_free(d, Duration::from_secs(10)) {
            tracing::warn!("{} is still in use (a mounted file system?)", d.display());
        }
    }
    let flushed =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), dev.close()).await });
    let mut code = ExitCode::SUCCESS;
    match flushed {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::error!("final flush of {} failed: {e:?}", dev.name());
            code = ExitCode::from(1);
        }
        Err(_) => {
            tracing::error!("final flush of {} timed out", dev.name());
            code = ExitCode::from(1);
        }
    }
    let dir = mount.dir().to_path_buf();
    if let Err(e) = mount.unmount() {
        tracing::warn!("{e:#}; detaching the mount lazily");
        let _ = fuse::umount(&dir, true);
    }
    rt.shutdown_timeout(Duration::from_secs(5));
    Ok(code)
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
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

pub fn run_detach(a: DetachArgs) -> Result<ExitCode> {
    let t = &a.target;
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
                "{} is neither a loop device, an iolift FUSE file nor its mount dir",
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
