//! CRUSH placement, the first kernel: input x -> the OSDs of a rule,
//! bit-exact with the `iolift-crush` CPU mapper. The CPU side is that
//! mapper; the CUDA side runs `crates/iolift-offload/kernels/crush.cu` on a
//! flattened copy of the map (`flat.rs`) uploaded once per device
//! (`cuda.rs`).
//!
//! `CrushKernel` is the I/O pool's kernel (one task = one x through one
//! rule); `map`, `map_on` and `map_pool` map a batch, a batch on one
//! processing element, or every PG of a pool, on any device.

pub mod bench;
pub mod check;
mod cuda;
pub mod flat;
pub mod synth;

pub use cuda::{thread_kernel_name, warp_kernel_max, zero_copy_max};

use super::{Kernel, KernelSource};
use crate::cpu::CpuDevice;
use crate::cuda::CudaDevice;
use crate::device::{Device, Launch};
use crate::error::{OffloadError, Result};
use flat::{FlatMap, LEN_FALLBACK, MAX_RESULT};
use iolift_crush::map::ChooseArgMap;
use iolift_crush::{do_rule, CrushMap, Workspace};
use iolift_osdmap::placement::{pg_mask, pg_to_pps, Pool};
use std::sync::Arc;

/// `crates/iolift-offload/kernels/crush.cu`: CRUSH do_rule (throughput +
/// latency kernels).
pub const SOURCE: KernelSource = KernelSource {
    name: "crush",
    file: "crush.cu",
    source: include_str!("../../../kernels/crush.cu"),
    entries: &[
        KERNEL_THREAD,
        KERNEL_WARP,
        "crush_map_thread_lb6",
        "crush_map_thread_lb8",
    ],
};

/// The throughput kernel (one thread per input).
pub const KERNEL_THREAD: &str = "crush_map_thread";
/// The latency kernel (one warp per input).
pub const KERNEL_WARP: &str = "crush_map_warp";

/// A CRUSH map prepared for offload: the map (CPU mapper), the chosen
/// choose_args set and the flattened copy (uploaded once per device).
#[derive(Debug)]
pub struct MapHandle {
    pub map: Arc<CrushMap>,
    pub choose_args: Option<ChooseArgMap>,
    pub flat: FlatMap,
}

impl MapHandle {
    /// `choose_args_index`: the set to use (crushtool: 0 then -1, OSDMap:
    /// pool id then -1), None for none.
    pub fn new(map: CrushMap, choose_args_index: Option<i64>) -> Result<Arc<MapHandle>> {
        let choose_args = choose_args_index.and_then(|i| map.choose_args_for(i).cloned());
        let flat = FlatMap::new(&map, choose_args.as_ref())?;
        Ok(Arc::new(MapHandle {
            map: Arc::new(map),
            choose_args,
            flat,
        }))
    }
}

/// Results of a batch: row i (`result_max` slots) holds `lens[i]` items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub result_max: usize,
    pub out: Vec<i32>,
    pub lens: Vec<u32>,
    /// Inputs the kernel handed back to the host mapper (bounds exceeded).
    pub fallbacks: usize,
}

impl Mapping {
    /// `n` empty rows.
    pub fn zeroed(n: usize, result_max: usize) -> Mapping {
        Mapping {
            result_max,
            out: vec![0; n * result_max],
            lens: vec![0; n],
            fallbacks: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.lens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
    pub fn row(&self, i: usize) -> &[i32] {
        &self.out[i * self.result_max..i * self.result_max + self.lens[i] as usize]
    }
}

/// What to map: explicit inputs, or every PG of a pool (x = pps of PG ps).
#[derive(Debug, Clone, Copy)]
pub enum Inputs<'a> {
    Xs(&'a [i32]),
    Pool(&'a Pool),
}

impl Inputs<'_> {
    pub fn len(&self) -> usize {
        match self {
            Inputs::Xs(x) => x.len(),
            Inputs::Pool(p) => p.pg_num as usize,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn get(&self, i: usize) -> i32 {
        match self {
            Inputs::Xs(x) => x[i],
            Inputs::Pool(p) => pg_to_pps(p, i as u32) as i32,
        }
    }
}

/// One mapping call: `inputs` through `rule` of `h`, up to `result_max`
/// OSDs each, with device reweights `weights`.
#[derive(Clone, Copy)]
struct Batch<'a> {
    h: &'a MapHandle,
    rule: i32,
    inputs: Inputs<'a>,
    result_max: usize,
    weights: &'a [u32],
}

impl Batch<'_> {
    /// Input `i` mapped by the CPU mapper into `row`; returns its length.
    fn map_cpu(&self, i: usize, ws: &mut Workspace, row: &mut [i32]) -> u32 {
        map_one_cpu(self.h, self.rule, self.inputs.get(i), self.weights, ws, row)
    }
}

/// The I/O pool's CRUSH kernel: each task maps one x through `rule` of
/// `map` (`result_max` OSDs, device reweights `weights`).
pub struct CrushKernel {
    pub map: Arc<MapHandle>,
    pub rule: i32,
    pub result_max: usize,
    pub weights: Vec<u32>,
}

impl CrushKernel {
    /// An error for a rule the map lacks or a result size out of bounds.
    pub fn new(
        map: Arc<MapHandle>,
        rule: i32,
        result_max: usize,
        weights: Vec<u32>,
    ) -> Result<CrushKernel> {
        check_args(&map, rule, result_max)?;
        Ok(CrushKernel {
            map,
            rule,
            result_max,
            weights,
        })
    }

    fn batch<'a>(&'a self, xs: &'a [i32]) -> Batch<'a> {
        Batch {
            h: &self.map,
            rule: self.rule,
            inputs: Inputs::Xs(xs),
            result_max: self.result_max,
            weights: &self.weights,
        }
    }
}

impl Kernel for CrushKernel {
    type Input = i32;
    type Output = Mapping;
    type Item = Vec<i32>;

    fn run_cpu(&self, _cpu: &CpuDevice, xs: &[i32]) -> Result<Mapping> {
        Ok(map_inline(&self.batch(xs)))
    }

    fn run_cuda(&self, gpu: &CudaDevice, pe: usize, xs: &[i32]) -> Result<Mapping> {
        cuda::map(gpu, pe, &self.batch(xs))
    }

    fn item(&self, m: &Mapping, i: usize) -> Vec<i32> {
        m.row(i).to_vec()
    }

    /// A group's buffer; its `fallbacks` stays 0 (per-launch counts stay
    /// with the launches).
    fn alloc(&self, n: usize) -> Mapping {
        Mapping::zeroed(n, self.result_max)
    }

    fn copy_rows(&self, dst: &mut Mapping, at: usize, src: &Mapping, from: usize, len: usize) {
        let rm = self.result_max;
        dst.out[at * rm..(at + len) * rm].copy_from_slice(&src.out[from * rm..(from + len) * rm]);
        dst.lens[at..at + len].copy_from_slice(&src.lens[from..from + len]);
    }
}

/// Map one input with the CPU mapper.
pub fn map_one_cpu(
    h: &MapHandle,
    rule: i32,
    x: i32,
    weights: &[u32],
    ws: &mut Workspace,
    row: &mut [i32],
) -> u32 {
    do_rule(&h.map, rule, x, row, weights, ws, h.choose_args.as_ref()) as u32
}

/// Map on the calling thread (one processing element).
fn map_inline(b: &Batch) -> Mapping {
    let (n, rm) = (b.inputs.len(), b.result_max);
    let mut m = Mapping::zeroed(n, rm);
    if rm > 0 {
        let mut ws = Workspace::new(&b.h.map, rm);
        for i in 0..n {
            let row = &mut m.out[i * rm..(i + 1) * rm];
            m.lens[i] = b.map_cpu(i, &mut ws, row);
        }
    }
    m
}

/// Map on all workers of the CPU device.
fn map_parallel(cpu: &CpuDevice, b: &Batch) -> Mapping {
    let n = b.inputs.len();
    let xs: Vec<i32>;
    let xs_ref = match b.inputs {
        Inputs::Xs(x) => x,
        Inputs::Pool(_) => {
            xs = cpu.install(|| {
                use rayon::prelude::*;
                (0..n).into_par_iter().map(|i| b.inputs.get(i)).collect()
            });
            &xs
        }
    };
    let mut m = Mapping::zeroed(n, b.result_max);
    cpu.install(|| {
        iolift_crush::map_batch(
            &b.h.map,
            b.rule,
            xs_ref,
            b.result_max,
            b.weights,
            b.h.choose_args.as_ref(),
            &mut m.out,
            &mut m.lens,
        )
    });
    m
}

/// A direct mapping call: on one processing element (`pe`) or on the
/// whole device (`None`: all CPU workers, or the GPU from stream 0).
struct MapJob<'a> {
    batch: Batch<'a>,
    pe: Option<usize>,
    out: Option<Result<Mapping>>,
}

impl Launch for MapJob<'_> {
    fn on_cpu(&mut self, cpu: &CpuDevice) {
        self.out = Some(Ok(match self.pe {
            Some(_) => map_inline(&self.batch),
            None => map_parallel(cpu, &self.batch),
        }));
    }
    fn on_cuda(&mut self, gpu: &CudaDevice) {
        let pe = self.pe.unwrap_or(0);
        self.out = Some(cuda::map(gpu, pe, &self.batch));
    }
}

/// Map on processing element `pe`, or on the whole device (`None`).
#[allow(clippy::too_many_arguments)]
fn run_map(
    dev: &dyn Device,
    pe: Option<usize>,
    h: &MapHandle,
    rule: i32,
    inputs: Inputs,
    result_max: usize,
    weights: &[u32],
) -> Result<Mapping> {
    check_args(h, rule, result_max)?;
    let mut job = MapJob {
        batch: Batch {
            h,
            rule,
            inputs,
            result_max,
            weights,
        },
        pe,
        out: None,
    };
    dev.launch(&mut job);
    job.out
        .unwrap_or_else(|| Err(crate::device::no_launch(dev)))
}

/// Map a batch on processing element `pe` (the batch runs there as one
/// launch).
pub fn map_on(
    dev: &dyn Device,
    pe: usize,
    h: &MapHandle,
    rule: i32,
    inputs: Inputs,
    result_max: usize,
    weights: &[u32],
) -> Result<Mapping> {
    run_map(dev, Some(pe), h, rule, inputs, result_max, weights)
}

/// Map a batch using the whole device (all workers / the GPU).
pub fn map(
    dev: &dyn Device,
    h: &MapHandle,
    rule: i32,
    inputs: Inputs,
    result_max: usize,
    weights: &[u32],
) -> Result<Mapping> {
    run_map(dev, None, h, rule, inputs, result_max, weights)
}

/// Whole-pool mapping: every PG 0..pg_num of `pool` through `rule`,
/// `size` replicas (firstn) or shards (indep), in one call.
pub fn map_pool(
    dev: &dyn Device,
    h: &MapHandle,
    pool: &Pool,
    rule: i32,
    size: usize,
    weights: &[u32],
) -> Result<Mapping> {
    if pool.pg_num == 0 || pool.pgp_num == 0 {
        return Err(OffloadError::Invalid(
            "pg_num and pgp_num must be > 0".into(),
        ));
    }
    map(dev, h, rule, Inputs::Pool(pool), size, weights)
}

fn check_args(h: &MapHandle, rule: i32, result_max: usize) -> Result<()> {
    if h.map.rule(rule).is_none() {
        return Err(OffloadError::Invalid(format!("no rule {rule} in the map")));
    }
    if result_max > 1 << 16 {
        return Err(OffloadError::Invalid(format!(
            "result size {result_max} too large"
        )));
    }
    Ok(())
}

/// Pool parameters the kernel needs to compute pps itself.
fn pool_kernel_params(p: &Pool) -> (u32, u32, u32, u32) {
    (
        p.pgp_num,
        pg_mask(p.pgp_num),
        p.id as u32,
        p.hashpspool as u32,
    )
}

/// Recompute on the host the inputs a kernel handed back.
fn fix_fallbacks(b: &Batch, m: &mut Mapping) {
    let rm = m.result_max;
    let mut ws: Option<Workspace> = None;
    for i in 0..m.lens.len() {
        if m.lens[i] == LEN_FALLBACK {
            let ws = ws.get_or_insert_with(|| Workspace::new(&b.h.map, rm));
            let row = &mut m.out[i * rm..(i + 1) * rm];
            m.lens[i] = b.map_cpu(i, ws, row);
            m.fallbacks += 1;
        }
    }
}

/// Whether a result size fits the kernels (else the host maps everything).
fn kernel_fits(result_max: usize) -> bool {
    result_max <= MAX_RESULT
}
