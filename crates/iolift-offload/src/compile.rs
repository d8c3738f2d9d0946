//! Kernel sources and their compilation: a `KernelSource` is one CUDA file
//! of `crates/iolift-offload/kernels/`, embedded at build time; `cached_ptx`
//! compiles it with NVRTC for a GPU architecture once per machine (PTX
//! cached in memory and on disk, keyed by source hash and architecture).

use crate::error::Result;
use crate::nvrtc::Nvrtc;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// One CUDA source file and the kernels (entry points) it defines.
#[derive(Debug)]
pub struct KernelSource {
    /// Short name: the PTX cache file prefix and the key of compiled modules.
    pub name: &'static str,
    /// File name under `crates/iolift-offload/kernels/`.
    pub file: &'static str,
    /// The file's text (`include_str!`).
    pub source: &'static str,
    /// `extern "C" __global__` functions every build must contain.
    pub entries: &'static [&'static str],
}

impl KernelSource {
    /// PTX for `arch` (e.g. "compute_90"), compiled or cached.
    pub fn ptx(&self, arch: &str) -> Result<(Arc<String>, CacheHit)> {
        cached_ptx(self.source, self.name, arch)
    }
}

/// FNV-1a 64 of the source: the cache key.
pub fn source_hash(src: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in src.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Directory of the on-disk PTX cache: `IOLIFT_KERNEL_CACHE`, else
/// `$XDG_CACHE_HOME/iolift/kernels` or `~/.cache/iolift/kernels`.
pub fn cache_dir() -> PathBuf {
    if let Ok(p) = std::env::var("IOLIFT_KERNEL_CACHE") {
        return PathBuf::from(p);
    }
    let base = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|_| std::env::temp_dir());
    base.join("iolift").join("kernels")
}

/// How a PTX was obtained (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHit {
    Memory,
    Disk,
    Compiled,
}

/// Compile `src` for `arch`, or return the cached PTX (memory, then disk).
pub fn cached_ptx(src: &str, name: &str, arch: &str) -> Result<(Arc<String>, CacheHit)> {
    type PtxCache = Mutex<HashMap<(u64, String), Arc<String>>>;
    static MEM: OnceLock<PtxCache> = OnceLock::new();
    let key = (source_hash(src), arch.to_string());
    let mem = MEM.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(p) = mem.lock().expect("ptx cache lock").get(&key) {
        return Ok((p.clone(), CacheHit::Memory));
    }
    let file = cache_dir().join(format!("{name}-{:016x}-{arch}.ptx", key.0));
    if let Ok(p) = std::fs::read_to_string(&file) {
        if p.contains(".entry") {
            let p = Arc::new(p);
            mem.lock().expect("ptx cache lock").insert(key, p.clone());
            return Ok((p, CacheHit::Disk));
        }
    }
    let nvrtc = Nvrtc::load()?;
    let (ptx, _log) = nvrtc.compile(src, name, arch)?;
    let ptx = Arc::new(ptx);
    if std::fs::create_dir_all(cache_dir()).is_ok() {
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, ptx.as_bytes()).is_ok() {
            let _ = std::fs::rename(&tmp, &file);
        }
    }
    mem.lock().expect("ptx cache lock").insert(key, ptx.clone());
    Ok((ptx, CacheHit::Compiled))
}
