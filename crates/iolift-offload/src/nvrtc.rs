//! NVRTC, the CUDA run-time compiler, loaded with libloading (nothing
//! links against CUDA): compiles a kernel source to PTX, or through ptxas
//! to a CUBIN; neither needs a GPU or a driver.

use crate::error::{OffloadError, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

type CreateFn = unsafe extern "C" fn(
    *mut *mut c_void,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// A loaded libnvrtc.
pub struct Nvrtc {
    lib: libloading::Library,
    pub path: PathBuf,
}

/// Where libnvrtc is looked for, in order, as patterns (`*` matches
/// within one path component; matches are tried highest version first; a
/// bare file name goes through the dynamic loader's own search):
///
/// 1. `IOLIFT_NVRTC` (a file);
/// 2. the loader's search path (`LD_LIBRARY_PATH`, ld.so.cache):
///    `libnvrtc.so.12`, `libnvrtc.so.13`, `libnvrtc.so`;
/// 3. CUDA toolkits: `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`,
///    `/usr/local/cuda-*` (`lib64`, `targets/x86_64-linux/lib`,
///    `targets/sbsa-linux/lib`), `/usr/lib/x86_64-linux-gnu`, `/usr/lib64`;
/// 4. pip's NVRTC wheels (`nvidia-cuda-nvrtc-cu12`: `nvidia/cuda_nvrtc/lib`,
///    CUDA 13 wheels: `nvidia/cu13/lib`) in the site-packages /
///    dist-packages of `/usr/local/lib/python3*`, `/usr/lib/python3*`,
///    `~/.local/lib/python3*`, `$VIRTUAL_ENV`, `$CONDA_PREFIX`,
///    `/opt/conda`, `~/.pyenv/versions/*`.
///
/// No program is run to find it.
pub fn search_patterns() -> Vec<String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut v = Vec::new();
    if let Some(p) = env("IOLIFT_NVRTC") {
        v.push(p);
    }
    const NAMES: [&str; 3] = ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"];
    v.extend(NAMES.iter().map(|n| n.to_string()));
    let mut roots: Vec<String> = Vec::new();
    roots.extend(env("CUDA_HOME"));
    roots.extend(env("CUDA_PATH"));
    roots.push("/usr/local/cuda".into());
    roots.push("/usr/local/cuda-*".into());
    for r in &roots {
        for sub in [
            "lib64",
            "targets/x86_64-linux/lib",
            "targets/sbsa-linux/lib",
        ] {
            for n in NAMES {
                v.push(format!("{r}/{sub}/{n}"));
            }
        }
    }
    for dir in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64"] {
        for n in NAMES {
            v.push(format!("{dir}/{n}"));
        }
    }
    let home = env("HOME");
    let mut pythons: Vec<String> =
        vec!["/usr/local/lib/python3*".into(), "/usr/lib/python3*".into()];
    if let Some(h) = &home {
        pythons.push(format!("{h}/.local/lib/python3*"));
    }
    for prefix in [
        env("VIRTUAL_ENV"),
        env("CONDA_PREFIX"),
        Some("/opt/conda".into()),
    ]
    .into_iter()
    .flatten()
    {
        pythons.push(format!("{prefix}/lib/python3*"));
    }
    if let Some(h) = &home {
        pythons.push(format!("{h}/.pyenv/versions/*/lib/python3*"));
    }
    for py in &pythons {
        for pkgs in ["site-packages", "dist-packages"] {
            v.push(format!("{py}/{pkgs}/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
            v.push(format!("{py}/{pkgs}/nvidia/cuda_nvrtc/lib/libnvrtc.so.13"));
            v.push(format!("{py}/{pkgs}/nvidia/cu13/lib/libnvrtc.so.13"));
        }
    }
    v
}

/// The existing paths `pattern` matches: `*` in a component matches any
/// run of characters in one directory entry's name (no `/`); several
/// matches come in descending name order (cuda-12.4 before cuda-12.0). A pattern
/// without `*` gives itself when it exists.
pub fn expand_glob(pattern: &str) -> Vec<PathBuf> {
    let mut cur: Vec<PathBuf> = vec![if pattern.starts_with('/') {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    }];
    for comp in pattern.split('/').filter(|c| !c.is_empty()) {
        let mut next = Vec::new();
        for base in &cur {
            match comp.split_once('*') {
                None => next.push(base.join(comp)),
                Some((pre, post)) => {
                    let Ok(rd) = std::fs::read_dir(if base.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        base
                    }) else {
                        continue;
                    };
                    let mut names: Vec<String> = rd
                        .filter_map(|e| e.ok())
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|n| {
                            n.len() >= pre.len() + post.len()
                                && n.starts_with(pre)
                                && n[pre.len()..].ends_with(post)
                        })
                        .collect();
                    names.sort_unstable_by(|a, b| b.cmp(a));
                    next.extend(names.into_iter().map(|n| base.join(n)));
                }
            }
        }
        cur = next;
    }
    cur.retain(|p| p.exists());
    cur
}

impl Nvrtc {
    /// Load the first working libnvrtc of `search_patterns()`; otherwise an
    /// error listing every place tried.
    pub fn load() -> Result<Nvrtc> {
        Nvrtc::load_from(&search_patterns())
    }

    /// Load the first working libnvrtc `patterns` name (see
    /// `search_patterns`); the error lists the patterns and, for files that
    /// exist but would not load, why.
    pub fn load_from(patterns: &[String]) -> Result<Nvrtc> {
        let mut failures = Vec::new();
        for pat in patterns {
            let paths = if pat.contains('/') {
                expand_glob(pat)
            } else {
                vec![PathBuf::from(pat)]
            };
            for p in paths {
                // SAFETY: loading a shared library runs its initialisers; libnvrtc's are benign.
                match unsafe { libloading::Library::new(&p) } {
                    Ok(lib) => {
                        let n = Nvrtc { lib, path: p };
                        match n.version() {
                            Ok(_) => return Ok(n),
                            Err(e) => failures.push(format!("{}: {e}", n.path.display())),
                        }
                    }
                    // a bare name the loader does not know is not worth a line
                    Err(_) if !pat.contains('/') => {}
                    Err(e) => failures.push(format!("{}: {e}", p.display())),
                }
            }
        }
        let mut msg = format!(
            "libnvrtc not found; tried, in order: {}",
            patterns.join(", ")
        );
        if !failures.is_empty() {
            msg.push_str(&format!("; found but unusable: {}", failures.join("; ")));
        }
        msg.push_str(
            ". Install the CUDA toolkit or `pip install nvidia-cuda-nvrtc-cu12`, or set IOLIFT_NVRTC=/path/libnvrtc.so.12",
        );
        Err(OffloadError::NoNvrtc(msg))
    }

    fn sym<T: Copy>(&self, name: &[u8]) -> Result<T> {
        // SAFETY: the symbol types above match NVRTC's C API.
        unsafe {
            self.lib
                .get::<T>(name)
                .map(|s| *s)
                .map_err(|e| OffloadError::NoNvrtc(format!("{}: {e}", self.path.display())))
        }
    }

    pub fn version(&self) -> Result<(i32, i32)> {
        let f: VersionFn = self.sym(b"nvrtcVersion\0")?;
        let (mut a, mut b) = (0, 0);
        // SAFETY: two valid out pointers.
        let rc = unsafe { f(&mut a, &mut b) };
        if rc != 0 {
            return Err(OffloadError::NoNvrtc(format!("nvrtcVersion failed ({rc})")));
        }
        Ok((a, b))
    }

    /// Compile `src` to PTX for `arch` (e.g. "compute_90"). Errors carry the
    /// program log; warnings are returned next to the PTX.
    pub fn compile(&self, src: &str, name: &str, arch: &str) -> Result<(String, String)> {
        let opts = [format!("--gpu-architecture={arch}"), "-std=c++17".into()];
        let (out, log) = self.compile_opts(src, name, &opts, true)?;
        Ok((out.ptx, log))
    }

    /// Compile to a CUBIN for `sm` (e.g. "sm_90") through ptxas with `-v`:
    /// (CUBIN size, log with registers / stack / spills per kernel). Needs
    /// no GPU either.
    pub fn compile_cubin(&self, src: &str, name: &str, sm: &str) -> Result<(usize, String)> {
        let opts = [
            format!("--gpu-architecture={sm}"),
            "-std=c++17".into(),
            "--ptxas-options=-v".into(),
        ];
        let (out, log) = self.compile_opts(src, name, &opts, false)?;
        Ok((out.cubin_size, log))
    }

    /// Compile with `opts`; the PTX when `want_ptx`, else the CUBIN's size.
    fn compile_opts(
        &self,
        src: &str,
        name: &str,
        opts: &[String],
        want_ptx: bool,
    ) -> Result<(Compiled, String)> {
        let create: CreateFn = self.sym(b"nvrtcCreateProgram\0")?;
        let compile: CompileFn = self.sym(b"nvrtcCompileProgram\0")?;
        let log_size: SizeFn = self.sym(b"nvrtcGetProgramLogSize\0")?;
        let get_log: GetFn = self.sym(b"nvrtcGetProgramLog\0")?;
        let ptx_size: SizeFn = self.sym(b"nvrtcGetPTXSize\0")?;
        let get_ptx: GetFn = self.sym(b"nvrtcGetPTX\0")?;
        let destroy: DestroyFn = self.sym(b"nvrtcDestroyProgram\0")?;
        let csrc = CString::new(src).map_err(|_| OffloadError::Invalid("NUL in source".into()))?;
        let cname = CString::new(name).map_err(|_| OffloadError::Invalid("NUL in name".into()))?;
        let opts: Vec<CString> = opts
            .iter()
            .map(|s| CString::new(s.as_str()).expect("no NUL"))
            .collect();
        let optp: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
        let mut prog: *mut c_void = std::ptr::null_mut();
        // SAFETY: NVRTC C API used as documented; all pointers outlive the calls.
        unsafe {
            let rc = create(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if rc != 0 {
                return Err(OffloadError::Compile(format!(
                    "nvrtcCreateProgram failed ({rc})"
                )));
            }
            let rc = compile(prog, optp.len() as c_int, optp.as_ptr());
            let mut n = 0usize;
            let mut log = String::new();
            if log_size(prog, &mut n) == 0 && n > 1 {
                let mut buf = vec![0u8; n];
                get_log(prog, buf.as_mut_ptr() as *mut c_char);
                log = CStr::from_bytes_until_nul(&buf)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default();
            }
            if rc != 0 {
                destroy(&mut prog);
                return Err(OffloadError::Compile(format!(
                    "{name} (nvrtc status {rc}):\n{log}"
                )));
            }
            if !want_ptx {
                let cubin_size: SizeFn = self.sym(b"nvrtcGetCUBINSize\0")?;
                let mut n = 0usize;
                let rc = cubin_size(prog, &mut n);
                destroy(&mut prog);
                if rc != 0 || n == 0 {
                    return Err(OffloadError::Compile(format!(
                        "{name}: no CUBIN (status {rc})\n{log}"
                    )));
                }
                return Ok((
                    Compiled {
                        ptx: String::new(),
                        cubin_size: n,
                    },
                    log,
                ));
            }
            let mut n = 0usize;
            ptx_size(prog, &mut n);
            let mut buf = vec![0u8; n.max(1)];
            get_ptx(prog, buf.as_mut_ptr() as *mut c_char);
            destroy(&mut prog);
            let ptx = CStr::from_bytes_until_nul(&buf)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((Compiled { ptx, cubin_size: 0 }, log))
        }
    }
}

struct Compiled {
    ptx: String,
    cubin_size: usize,
}
