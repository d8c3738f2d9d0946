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

/// Where libnvrtc may be: `IOLIFT_NVRTC` (a file), CUDA install dirs, and
/// pip's `nvidia-cuda-nvrtc-cu12` wheel (needs no GPU or driver).
pub fn nvrtc_candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(p) = std::env::var("IOLIFT_NVRTC") {
        v.push(PathBuf::from(p));
    }
    for dir in [
        "/usr/local/cuda/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/local/cuda/targets/x86_64-linux/lib",
    ] {
        for name in ["libnvrtc.so", "libnvrtc.so.12", "libnvrtc.so.13"] {
            v.push(Path::new(dir).join(name));
        }
    }
    if let Ok(out) = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0])",
        ])
        .output()
    {
        if out.status.success() {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !dir.is_empty() {
                v.push(Path::new(&dir).join("lib/libnvrtc.so.12"));
                v.push(Path::new(&dir).join("lib/libnvrtc.so.13"));
            }
        }
    }
    v
}

impl Nvrtc {
    /// Load the first libnvrtc found; a clear error listing where it looked
    /// otherwise.
    pub fn load() -> Result<Nvrtc> {
        let cands = nvrtc_candidates();
        for p in &cands {
            if !p.exists() {
                continue;
            }
            // SAFETY: loading a shared library runs its initialisers; libnvrtc's are benign.
            if let Ok(lib) = unsafe { libloading::Library::new(p) } {
                let n = Nvrtc {
                    lib,
                    path: p.clone(),
                };
                if n.version().is_ok() {
                    return Ok(n);
                }
            }
        }
        Err(OffloadError::NoNvrtc(format!(
            "libnvrtc not found (looked at {}); install the CUDA toolkit or `pip install nvidia-cuda-nvrtc-cu12`, or set IOLIFT_NVRTC=/path/libnvrtc.so.12",
            cands.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )))
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
