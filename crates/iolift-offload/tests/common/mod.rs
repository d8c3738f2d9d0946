//! Shared helpers: build kernels/crush.cu with the host C++ compiler and
//! load it, generate CRUSH maps with crushtool (a real peer), compare.
#![allow(dead_code)]

use iolift_crush::CrushMap;
use iolift_offload::kernels::crush::flat::FlatMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

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
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("libcrush_host.so");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/crush.cu");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        let out = Command::new(&cxx)
            .args([
                "-std=c++17",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fPIC",
                "-shared",
                "-x",
                "c++",
            ])
            .arg(&src)
            .arg("-o")
            .arg(&so)
            .output()
            .unwrap_or_else(|e| panic!("{cxx} not runnable ({e}): install g++ (build-essential)"));
        assert!(
            out.status.success(),
            "{cxx} failed on kernels/crush.cu:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: our own freshly built library; symbol types match crush.cu.
        unsafe {
            let lib = libloading::Library::new(&so).unwrap();
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
            (self.thread)(
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

    /// The latency kernel's entry point run as its grid (32 threads per input).
    pub fn run_warp_grid(
        &self,
        f: &FlatMap,
        weights: &[u32],
        rule: i32,
        xs: &[i32],
        result_max: usize,
    ) -> (Vec<i32>, Vec<u32>) {
        let n = xs.len();
        let mut out = vec![0i32; n * result_max];
        let mut lens = vec![0u32; n];
        // SAFETY: buffers sized as the kernel expects.
        unsafe {
            (self.warp_grid)(
                f.words.as_ptr(),
                f.ln.as_ptr(),
                weights.as_ptr(),
                weights.len() as u32,
                rule,
                xs.as_ptr(),
                0,
                n as u32,
                result_max as u32,
                0,
                0,
                0,
                0,
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

pub fn crushtool_ok() -> bool {
    // crushtool has no --version; `-h` prints its usage (exit status 0 or 1).
    Command::new("crushtool")
        .arg("-h")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).contains("crushtool")
                || String::from_utf8_lossy(&o.stderr).contains("crushtool")
        })
        .unwrap_or(false)
}

/// Compile a text map with crushtool and decode it with iolift-crush.
pub fn compile_text(dir: &Path, name: &str, text: &str) -> CrushMap {
    assert!(
        crushtool_ok(),
        "crushtool not found: install ceph-common (scripts/test.sh does)"
    );
    let src = dir.join(format!("{name}.txt"));
    let bin = dir.join(format!("{name}.bin"));
    std::fs::write(&src, text).unwrap();
    let out = Command::new("crushtool")
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "crushtool -c {name}: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    iolift_crush::decode(&std::fs::read(&bin).unwrap())
        .unwrap_or_else(|e| panic!("decode {name}: {e}"))
}

pub struct Lcg(pub u64);
impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    pub fn below(&mut self, n: u32) -> u32 {
        self.next() % n
    }
}

fn tunables(profile: &str) -> &'static str {
    match profile {
        "argonaut" => "",
        "bobtail" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\n",
        "firefly" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\n",
        "jewel" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\ntunable chooseleaf_stable 1\ntunable straw_calc_version 1\ntunable allowed_bucket_algs 54\n",
        "vary_r3" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 3\ntunable allowed_bucket_algs 54\n",
        _ => panic!("unknown profile {profile}"),
    }
}

/// One corpus map: tunables profile, algorithms for root/rack/host levels,
/// shape, weight pattern, whether to add a choose_args set.
#[derive(Clone, Copy)]
pub struct Spec {
    pub tunables: &'static str,
    pub algs: [&'static str; 3],
    pub racks: usize,
    pub hosts: usize,
    pub osds: usize,
    /// 0: all 1.0; 1: varied; 2: varied with zeros.
    pub weights: u32,
    pub choose_args: bool,
    pub seed: u64,
}

fn wt(w: u32) -> String {
    format!("{}.{:03}", w / 1000, w % 1000)
}

/// Text map for `s` with rules covering firstn/indep, chooseleaf, nested
/// choose, several take/emit blocks, negative numrep and every set_* step.
pub fn text_map(s: &Spec) -> String {
    let mut rng = Lcg(s.seed);
    let mut t = String::new();
    t.push_str(tunables(s.tunables));
    let ndev = s.racks * s.hosts * s.osds;
    for d in 0..ndev {
        let _ = writeln!(t, "device {d} osd.{d}");
    }
    t.push_str("type 0 osd\ntype 1 host\ntype 2 rack\ntype 3 root\n");
    let mut next_id = -1;
    let mut dev = 0;
    let mut racks = Vec::new();
    let mut straw2 = Vec::new();
    for r in 0..s.racks {
        let mut hosts = Vec::new();
        for h in 0..s.hosts {
            let alg = s.algs[2];
            let id = next_id;
            next_id -= 1;
            let _ = writeln!(t, "host r{r}h{h} {{\n\tid {id}\n\talg {alg}\n\thash 0");
            let mut total = 0;
            let mut n = 0;
            for _ in 0..s.osds {
                let w = match (s.weights, alg) {
                    (_, "uniform") | (0, _) => 1000,
                    (1, _) => 500 * (1 + rng.below(6)),
                    _ => {
                        if rng.below(5) == 0 {
                            0
                        } else {
                            250 * (1 + rng.below(12))
                        }
                    }
                };
                total += w;
                n += 1;
                let _ = writeln!(t, "\titem osd.{dev} weight {}", wt(w));
                dev += 1;
            }
            t.push_str("}\n");
            if alg == "straw2" {
                straw2.push((id, n));
            }
            hosts.push((format!("r{r}h{h}"), total));
        }
        let alg = s.algs[1];
        let id = next_id;
        next_id -= 1;
        let _ = writeln!(t, "rack r{r} {{\n\tid {id}\n\talg {alg}\n\thash 0");
        let mut total = 0;
        let uw = hosts.first().map(|h| h.1).unwrap_or(1000);
        for (name, w) in &hosts {
            let w = if alg == "uniform" { uw } else { *w };
            total += w;
            let _ = writeln!(t, "\titem {name} weight {}", wt(w));
        }
        t.push_str("}\n");
        if alg == "straw2" {
            straw2.push((id, hosts.len()));
        }
        racks.push((format!("r{r}"), total));
    }
    let alg = s.algs[0];
    let id = next_id;
    let _ = writeln!(t, "root default {{\n\tid {id}\n\talg {alg}\n\thash 0");
    let uw = racks.first().map(|r| r.1).unwrap_or(1000);
    for (name, w) in &racks {
        let w = if alg == "uniform" { uw } else { *w };
        let _ = writeln!(t, "\titem {name} weight {}", wt(w));
    }
    t.push_str("}\n");
    if alg == "straw2" {
        straw2.push((id, racks.len()));
    }
    let rules: [&str; 9] = [
        "step take default\n\tstep chooseleaf firstn 0 type host\n\tstep emit",
        "step take default\n\tstep chooseleaf indep 0 type host\n\tstep emit",
        "step take default\n\tstep choose firstn 2 type rack\n\tstep chooseleaf firstn 2 type host\n\tstep emit",
        "step take default\n\tstep choose indep 0 type host\n\tstep choose indep 1 type osd\n\tstep emit",
        "step set_choose_tries 100\n\tstep set_chooseleaf_tries 5\n\tstep take default\n\tstep chooseleaf indep 0 type host\n\tstep emit",
        "step set_chooseleaf_vary_r 2\n\tstep set_chooseleaf_stable 0\n\tstep set_choose_local_tries 2\n\tstep set_choose_local_fallback_tries 3\n\tstep take default\n\tstep chooseleaf firstn 0 type rack\n\tstep emit",
        "step take r0h0\n\tstep choose firstn 2 type osd\n\tstep emit\n\tstep take default\n\tstep chooseleaf firstn -1 type host\n\tstep emit",
        "step take default\n\tstep choose firstn -1 type host\n\tstep choose firstn 1 type osd\n\tstep emit",
        "step set_chooseleaf_stable 1\n\tstep take default\n\tstep choose firstn 0 type rack\n\tstep chooseleaf firstn 1 type osd\n\tstep emit",
    ];
    for (i, body) in rules.iter().enumerate() {
        let ty = if body.contains("indep") {
            "erasure"
        } else {
            "replicated"
        };
        let _ = writeln!(
            t,
            "rule r{i} {{\n\tid {i}\n\ttype {ty}\n\tmin_size 1\n\tmax_size 20\n\t{body}\n}}"
        );
    }
    if s.choose_args && !straw2.is_empty() {
        t.push_str("choose_args 0 {\n");
        for (id, n) in &straw2 {
            let _ = writeln!(t, "  {{\n    bucket_id {id}\n    weight_set [");
            for _ in 0..2 {
                let ws: Vec<String> = (0..*n).map(|_| wt(250 * (1 + rng.below(8)))).collect();
                let _ = writeln!(t, "      [ {} ]", ws.join(" "));
            }
            t.push_str("    ]\n");
            if rng.below(2) == 0 {
                let ids: Vec<String> = (0..*n)
                    .map(|k| format!("{}", -1000 - 10 * (-id) - k as i32))
                    .collect();
                let _ = writeln!(t, "    ids [ {} ]", ids.join(" "));
            }
            t.push_str("  }\n");
        }
        t.push_str("}\n");
    }
    t
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
            choose_args: false,
            seed: 7,
        },
    ));
    v
}

/// Reweight vectors: all in; mixed (out, partial, in) and one short
/// vector (devices past its end are out).
pub fn weight_sets(ndev: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Lcg(seed);
    let all = vec![0x10000u32; ndev];
    let mixed: Vec<u32> = (0..ndev)
        .map(|_| match rng.below(6) {
            0 => 0,
            1 => 0x8000,
            2 => 0x4000 + rng.below(0xc000),
            _ => 0x10000,
        })
        .collect();
    let short = vec![0x10000u32; ndev.saturating_sub(3)];
    vec![all, mixed, short]
}
