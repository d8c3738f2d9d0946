//! Shared helpers: build kernels/crush.cu with the host C++ compiler and
//! load it; compile CRUSH maps with crushtool (a real peer). The text-map
//! generator ([`text_map`], [`Spec`]) and the random numbers come from
//! iolift-testkit.
#![allow(dead_code)]

use iolift_crush::CrushMap;
use iolift_offload::kernels::crush::flat::FlatMap;
pub mod host;

pub use iolift_testkit::crushmap::{text_map, Spec};
use iolift_testkit::Rng;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

type ThreadFn = unsafe extern "C" fn(
    *const u32,
    *const i64,
    *const u32,
    u32,
    i32,
    *const i32,
    i32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut i32,
    *mut u32,
);
type WarpFn = unsafe extern "C" fn(
    *const u32,
    *const i64,
    *const u32,
    u32,
    i32,
    *const i32,
    u32,
    u32,
    u32,
    *mut i32,
    *mut u32,
);

/// kernels/crush.cu compiled by g++ as a shared library (the device code
/// with host shims) and loaded.
pub struct HostKernel {
    _lib: libloading::Library,
    thread: ThreadFn,
    warp_grid: ThreadFn,
    warp: WarpFn,
    _dir: tempfile::TempDir,
}

pub fn host_kernel() -> &'static HostKernel {
    static K: OnceLock<HostKernel> = OnceLock::new();
    K.get_or_init(|| {
        let (dir, lib) = host::build("crush.cu");
        // SAFETY: symbol types match crush.cu.
        unsafe {
            let thread = *lib.get::<ThreadFn>(b"crush_host_thread\0").unwrap();
            let warp = *lib.get::<WarpFn>(b"crush_host_warp\0").unwrap();
            let warp_grid = *lib.get::<ThreadFn>(b"crush_host_warp_grid\0").unwrap();
            HostKernel {
                _lib: lib,
                thread,
                warp_grid,
                warp,
                _dir: dir,
            }
        }
    })
}

/// Pool-mode parameters for the kernel (flags bit 1 = pool mode).
#[derive(Clone, Copy, Default)]
pub struct PoolArgs {
    pub pgp_num: u32,
    pub pgp_mask: u32,
    pub pool_id: u32,
    pub hashpspool: bool,
}

impl HostKernel {
    /// Throughput kernel over `xs` (or, with `pool`, over PG seeds 0..n).
    #[allow(clippy::too_many_arguments)]
    pub fn run_thread(
        &self,
        f: &FlatMap,
        weights: &[u32],
        rule: i32,
        xs: Option<&[i32]>,
        n: usize,
        result_max: usize,
        pool: Option<PoolArgs>,
    ) -> (Vec<i32>, Vec<u32>) {
        Self::grid(self.thread, f, weights, rule, xs, n, result_max, pool)
    }

    /// The latency kernel's entry point run as its grid (32 threads per input).
    pub fn run_warp_grid(
        &self,
        f: &FlatMap,
        weights: &[u32],
        rule: i32,
        xs: &[i32],
        result_max: usize,
    ) -> (Vec<i32>, Vec<u32>) {
        Self::grid(
            self.warp_grid,
            f,
            weights,
            rule,
            Some(xs),
            xs.len(),
            result_max,
            None,
        )
    }

    /// Runs entry point `k` (the thread kernel's signature) over `n` inputs.
    #[allow(clippy::too_many_arguments)]
    fn grid(
        k: ThreadFn,
        f: &FlatMap,
        weights: &[u32],
        rule: i32,
        xs: Option<&[i32]>,
        n: usize,
        result_max: usize,
        pool: Option<PoolArgs>,
    ) -> (Vec<i32>, Vec<u32>) {
        let mut out = vec![0i32; n * result_max];
        let mut lens = vec![0u32; n];
        let p = pool.unwrap_or_default();
        let flags = if pool.is_some() {
            2 | p.hashpspool as u32
        } else {
            0
        };
        // SAFETY: buffers sized as the kernel expects.
        unsafe {
            k(
                f.words.as_ptr(),
                f.ln.as_ptr(),
                weights.as_ptr(),
                weights.len() as u32,
                rule,
                xs.map_or(std::ptr::null(), |x| x.as_ptr()),
                0,
                n as u32,
                result_max as u32,
                p.pgp_num,
                p.pgp_mask,
                p.pool_id,
                flags,
                out.as_mut_ptr(),
                lens.as_mut_ptr(),
            )
        };
        (out, lens)
    }

    /// Latency kernel logic with `lanes` emulated warp lanes.
    pub fn run_warp(
        &self,
        f: &FlatMap,
        weights: &[u32],
        rule: i32,
        xs: &[i32],
        result_max: usize,
        lanes: u32,
    ) -> (Vec<i32>, Vec<u32>) {
        let n = xs.len();
        let mut out = vec![0i32; n * result_max];
        let mut lens = vec![0u32; n];
        // SAFETY: buffers sized as the kernel expects.
        unsafe {
            (self.warp)(
                f.words.as_ptr(),
                f.ln.as_ptr(),
                weights.as_ptr(),
                weights.len() as u32,
                rule,
                xs.as_ptr(),
                n as u32,
                result_max as u32,
                lanes,
                out.as_mut_ptr(),
                lens.as_mut_ptr(),
            )
        };
        (out, lens)
    }
}

/// Whether crushtool is installed (the GPU test falls back to the
/// synthetic maps without it, and says so).
pub fn crushtool_ok() -> bool {
    iolift_testkit::process::find_tool("crushtool").is_some()
}

/// Compile a text map with crushtool (a missing crushtool fails the test)
/// and decode it with iolift-crush; the binary map is left at
/// `dir/NAME.bin`.
pub fn compile_text(dir: &Path, name: &str, text: &str) -> CrushMap {
    let src = dir.join(format!("{name}.txt"));
    let bin = dir.join(format!("{name}.bin"));
    std::fs::write(&src, text).unwrap();
    let o = iolift_testkit::run_timeout(
        Command::new(iolift_testkit::require_tool("crushtool"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&bin),
        Duration::from_secs(120),
    );
    assert!(
        o.status.success(),
        "crushtool -c {name}: {}\n{text}",
        o.stderr
    );
    iolift_crush::decode(&std::fs::read(&bin).unwrap())
        .unwrap_or_else(|e| panic!("decode {name}: {e}"))
}

/// The corpus: every bucket algorithm at every level, all tunables
/// profiles, zero weights, choose_args.
pub fn corpus_specs() -> Vec<(String, Spec)> {
    let algs = ["uniform", "list", "tree", "straw", "straw2"];
    let profiles = ["argonaut", "bobtail", "firefly", "jewel", "vary_r3"];
    let mut v = Vec::new();
    let mut seed = 1;
    for (i, a) in algs.iter().enumerate() {
        for (j, p) in profiles.iter().enumerate() {
            if (i + j) % 2 == 1 && *p != "jewel" {
                continue;
            }
            seed += 1;
            let top = algs[(i + j) % algs.len()];
            let s = Spec {
                tunables: p,
                algs: [top, a, a],
                racks: 3,
                hosts: 2 + (j % 3),
                osds: 3 + (i % 3),
                weights: (seed % 3) as u32,
                classes: false,
                choose_args: false,
                seed,
            };
            v.push((format!("{a}-{p}-top{top}"), s));
        }
    }
    for (k, p) in ["jewel", "firefly", "argonaut"].iter().enumerate() {
        v.push((
            format!("straw2-choose_args-{p}"),
            Spec {
                tunables: p,
                algs: ["straw2"; 3],
                racks: 4,
                hosts: 3,
                osds: 4,
                weights: 2,
                classes: false,
                choose_args: true,
                seed: 100 + k as u64,
            },
        ));
    }
    v.push((
        "uniform-big-argonaut".into(),
        Spec {
            tunables: "argonaut",
            algs: ["straw2", "uniform", "uniform"],
            racks: 2,
            hosts: 8,
            osds: 40,
            weights: 0,
            classes: false,
            choose_args: false,
            seed: 7,
        },
    ));
    // device classes: rules 0 and 1 take the shadow tree of class hdd
    v.push((
        "straw2-classes-jewel".into(),
        Spec {
            tunables: "jewel",
            algs: ["straw2", "straw", "straw2"],
            racks: 3,
            hosts: 3,
            osds: 3,
            weights: 1,
            classes: true,
            choose_args: true,
            seed: 11,
        },
    ));
    v
}

/// Reweight vectors: all in; mixed (out, partial, in) and one short
/// vector (devices past its end are out).
pub fn weight_sets(ndev: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(seed);
    let all = vec![0x10000u32; ndev];
    let mixed: Vec<u32> = (0..ndev)
        .map(|_| match rng.below(6) {
            0 => 0,
            1 => 0x8000,
            2 => 0x4000 + rng.below(0xc000) as u32,
            _ => 0x10000,
        })
        .collect();
    let short = vec![0x10000u32; ndev.saturating_sub(3)];
    vec![all, mixed, short]
}
