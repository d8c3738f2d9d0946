//! Devices: `Cpu` (a pool of worker threads, one processing element per
//! thread, mapping with the iolift-crush CPU mapper) and `Cuda` (streams of
//! one GPU, kernels from `kernels/crush.cu`). Both map a batch of inputs or a
//! whole pool; results are identical by construction (CPU) and by test (GPU).

use crate::error::{OffloadError, Result};
use crate::flat::{FlatMap, LEN_FALLBACK, MAX_RESULT};
use iolift_crush::map::ChooseArgMap;
use iolift_crush::placement::{pg_mask, pg_to_pps, Pool};
use iolift_crush::{do_rule, CrushMap, Workspace};
use std::sync::Arc;

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

/// The CPU device: `workers` threads (processing elements).
pub struct CpuDevice {
    pool: rayon::ThreadPool,
    workers: usize,
}

impl CpuDevice {
    pub fn new(workers: usize) -> Result<CpuDevice> {
        let workers = workers.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .thread_name(|i| format!("iolift-pe{i}"))
            .build()
            .map_err(|e| OffloadError::Invalid(format!("cpu pool: {e}")))?;
        Ok(CpuDevice { pool, workers })
    }

    /// Map on the calling thread (one processing element).
    pub fn map_inline(
        &self,
        h: &MapHandle,
        rule: i32,
        inputs: Inputs,
        result_max: usize,
        weights: &[u32],
    ) -> Mapping {
        let n = inputs.len();
        let mut out = vec![0i32; n * result_max];
        let mut lens = vec![0u32; n];
        if result_max > 0 {
            let mut ws = Workspace::new(&h.map, result_max);
            for i in 0..n {
                let row = &mut out[i * result_max..(i + 1) * result_max];
                lens[i] = map_one_cpu(h, rule, inputs.get(i), weights, &mut ws, row);
            }
        }
        Mapping {
            result_max,
            out,
            lens,
            fallbacks: 0,
        }
    }

    /// Map on all workers.
    pub fn map_parallel(
        &self,
        h: &MapHandle,
        rule: i32,
        inputs: Inputs,
        result_max: usize,
        weights: &[u32],
    ) -> Mapping {
        let n = inputs.len();
        let xs: Vec<i32>;
        let xs_ref = match inputs {
            Inputs::Xs(x) => x,
            Inputs::Pool(_) => {
                xs = self.pool.install(|| {
                    use rayon::prelude::*;
                    (0..n).into_par_iter().map(|i| inputs.get(i)).collect()
                });
                &xs
            }
        };
        let mut out = vec![0i32; n * result_max];
        let mut lens = vec![0u32; n];
        self.pool.install(|| {
            iolift_crush::map_batch(
                &h.map,
                rule,
                xs_ref,
                result_max,
                weights,
                h.choose_args.as_ref(),
                &mut out,
                &mut lens,
            )
        });
        Mapping {
            result_max,
            out,
            lens,
            fallbacks: 0,
        }
    }
}

/// A device: where batches run.
pub enum Device {
    Cpu(CpuDevice),
    Cuda(crate::cuda::CudaDevice),
}

impl Device {
    /// `workers` CPU threads (0 = number of CPUs).
    pub fn cpu(workers: usize) -> Result<Device> {
        let n = if workers == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            workers
        };
        Ok(Device::Cpu(CpuDevice::new(n)?))
    }

    /// GPU `ordinal` with `streams` processing elements. Without a driver or
    /// GPU: `OffloadError::NoGpu` with the reason.
    pub fn cuda(ordinal: usize, streams: usize) -> Result<Device> {
        Ok(Device::Cuda(crate::cuda::CudaDevice::new(
            ordinal, streams,
        )?))
    }

    /// "cpu", "cpu:N", "gpu", "cuda", "gpu:N" (ordinal).
    pub fn open(spec: &str, pes: usize) -> Result<Device> {
        let (kind, arg) = spec.split_once(':').unwrap_or((spec, ""));
        let num = |d: usize| -> Result<usize> {
            if arg.is_empty() {
                Ok(d)
            } else {
                arg.parse()
                    .map_err(|_| OffloadError::Invalid(format!("bad device '{spec}'")))
            }
        };
        match kind {
            "cpu" => Device::cpu(num(pes)?),
            "gpu" | "cuda" => Device::cuda(num(0)?, pes.max(1)),
            _ => Err(OffloadError::Invalid(format!(
                "unknown device '{spec}' (cpu, cpu:N, gpu, gpu:N)"
            ))),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Device::Cpu(c) => format!("cpu ({} worker threads)", c.workers),
            Device::Cuda(g) => g.name(),
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// Processing elements (CPU workers / CUDA streams).
    pub fn processing_elements(&self) -> usize {
        match self {
            Device::Cpu(c) => c.workers,
            Device::Cuda(g) => g.streams(),
        }
    }

    /// Map a batch on processing element `pe` (the batch runs there as one
    /// launch). Used by the I/O pool.
    pub fn map_on(
        &self,
        pe: usize,
        h: &MapHandle,
        rule: i32,
        inputs: Inputs,
        result_max: usize,
        weights: &[u32],
    ) -> Result<Mapping> {
        check_args(h, rule, result_max)?;
        match self {
            Device::Cpu(c) => Ok(c.map_inline(h, rule, inputs, result_max, weights)),
            Device::Cuda(g) => g.map(pe, h, rule, inputs, result_max, weights),
        }
    }

    /// Map a batch using the whole device (all workers / the GPU).
    pub fn map(
        &self,
        h: &MapHandle,
        rule: i32,
        inputs: Inputs,
        result_max: usize,
        weights: &[u32],
    ) -> Result<Mapping> {
        check_args(h, rule, result_max)?;
        match self {
            Device::Cpu(c) => Ok(c.map_parallel(h, rule, inputs, result_max, weights)),
            Device::Cuda(g) => g.map(0, h, rule, inputs, result_max, weights),
        }
    }

    /// Whole-pool mapping: every PG 0..pg_num of `pool` through `rule`,
    /// `size` replicas (firstn) or shards (indep), in one call.
    pub fn map_pool(
        &self,
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
        self.map(h, rule, Inputs::Pool(pool), size, weights)
    }
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
pub(crate) fn pool_kernel_params(p: &Pool) -> (u32, u32, u32, u32) {
    (
        p.pgp_num,
        pg_mask(p.pgp_num),
        p.id as u32,
        p.hashpspool as u32,
    )
}

/// Recompute on the host the inputs a kernel handed back.
pub(crate) fn fix_fallbacks(
    h: &MapHandle,
    rule: i32,
    inputs: Inputs,
    weights: &[u32],
    m: &mut Mapping,
) {
    let rm = m.result_max;
    let mut ws: Option<Workspace> = None;
    for i in 0..m.lens.len() {
        if m.lens[i] == LEN_FALLBACK {
            let ws = ws.get_or_insert_with(|| Workspace::new(&h.map, rm));
            let row = &mut m.out[i * rm..(i + 1) * rm];
            m.lens[i] = map_one_cpu(h, rule, inputs.get(i), weights, ws, row);
            m.fallbacks += 1;
        }
    }
}

/// Whether a result size fits the kernels (else the host maps everything).
pub(crate) fn kernel_fits(result_max: usize) -> bool {
    result_max <= MAX_RESULT
}
