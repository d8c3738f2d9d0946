//! Erasure coding on the CUDA device: `ec_encode` loaded once per device,
//! each kernel's coefficient tables uploaded once and reused, per-stream
//! page-locked and device buffers grown on demand; a batch is one copy in,
//! one launch, one copy out and one synchronisation.

use super::{grid, EcKernel, Stripes, BLOCK, KERNEL_ENCODE, SOURCE};
use crate::cuda::mem::{ensure, ensure_pinned, par_copy, Pinned};
use crate::cuda::{cuda_err, CudaDevice};
use crate::error::{OffloadError, Result};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Per-stream buffers, reused by every launch on the stream.
#[derive(Default)]
struct Scratch {
    data_h: Option<Pinned<u8>>,
    out_h: Option<Pinned<u8>>,
    data: Option<CudaSlice<u32>>,
    out: Option<CudaSlice<u32>>,
}

/// What erasure coding keeps on one CUDA device (`CudaDevice::state`).
struct EcCuda {
    func: CudaFunction,
    /// Blocks one launch uses at most (the kernel loops over the rest).
    max_blocks: u32,
    tables: Mutex<HashMap<u64, Arc<CudaSlice<u8>>>>,
    scratch: Vec<Mutex<Scratch>>,
}

impl EcCuda {
    fn new(gpu: &CudaDevice) -> Result<EcCuda> {
        let module = gpu.module(&SOURCE)?;
        let sms = gpu
            .context()
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .unwrap_or(80)
            .max(1) as u32;
        Ok(EcCuda {
            func: module.load_function(KERNEL_ENCODE).map_err(cuda_err)?,
            max_blocks: sms * 32,
            tables: Mutex::new(HashMap::new()),
            scratch: (0..gpu.streams())
                .map(|_| Mutex::new(Scratch::default()))
                .collect(),
        })
    }

    /// Upload (once per kernel) and return the device copy of `k`'s tables.
    fn tables(&self, gpu: &CudaDevice, k: &EcKernel) -> Result<Arc<CudaSlice<u8>>> {
        let mut t = self.tables.lock().expect("ec tables lock");
        if let Some(d) = t.get(&k.id) {
            return Ok(d.clone());
        }
        let s = gpu.stream(0);
        let d = Arc::new(s.clone_htod(&k.tables).map_err(cuda_err)?);
        s.synchronize().map_err(cuda_err)?;
        t.insert(k.id, d.clone());
        Ok(d)
    }

    /// `ec_encode` over `stripes` stripes at device addresses `data` and
    /// `out`, queued on `stream`.
    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        tables: &CudaSlice<u8>,
        k: &EcKernel,
        data: u64,
        out: u64,
        stripes: usize,
    ) -> Result<()> {
        let (kk, rows, len) = (k.k(), k.rows(), k.chunk_len());
        super::check_batch(
            kk,
            rows,
            len,
            stripes,
            stripes * kk * len,
            stripes * rows * len,
        )
        .map_err(OffloadError::Invalid)?;
        if stripes > u32::MAX as usize {
            return Err(OffloadError::Invalid("too many stripes".into()));
        }
        let cfg = LaunchConfig {
            grid_dim: (grid(len, stripes, self.max_blocks), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (k32, r32, l32, s32) = (kk as u32, rows as u32, len as u32, stripes as u32);
        let mut lb = stream.launch_builder(&self.func);
        lb.arg(tables)
            .arg(&data)
            .arg(&out)
            .arg(&k32)
            .arg(&r32)
            .arg(&l32)
            .arg(&s32);
        // SAFETY: the arguments match ec_encode in ec.cu; `data` and `out`
        // address stripes * k * len and stripes * rows * len bytes (checked
        // by the callers), the tables rows * k * 256.
        unsafe { lb.launch(cfg) }.map_err(cuda_err)?;
        Ok(())
    }
}

/// A batch of host tasks on processing element `pe`: their stripes copied
/// into the stream's page-locked buffer and on to the device, one launch,
/// the outputs (`total` bytes) copied back.
pub(super) fn encode_staged(
    gpu: &CudaDevice,
    pe: usize,
    k: &EcKernel,
    inputs: &[Stripes],
    total: usize,
) -> Result<Vec<u8>> {
    let st = gpu.state(EcCuda::new)?;
    let in_bytes: usize = inputs.iter().map(|t| t.len()).sum();
    let stripes = in_bytes / k.stripe_bytes();
    if stripes == 0 {
        return Ok(Vec::new());
    }
    let tables = st.tables(gpu, k)?;
    let si = pe % gpu.streams();
    let stream = gpu.stream(si);
    let ctx = gpu.context();
    ctx.bind_to_thread().map_err(cuda_err)?;
    let mut scratch = st.scratch[si].lock().expect("ec scratch lock");
    let sc = &mut *scratch;
    ensure_pinned(ctx, &mut sc.data_h, in_bytes)?;
    ensure_pinned(ctx, &mut sc.out_h, total)?;
    ensure(stream, &mut sc.data, in_bytes / 4)?;
    ensure(stream, &mut sc.out, total / 4)?;
    {
        let h = sc.data_h.as_mut().expect("ensured").slice_mut(in_bytes);
        let mut at = 0;
        for t in inputs {
            par_copy(&mut h[at..at + t.len()], t);
            at += t.len();
        }
    }
    let (data_d, _g1) = sc.data.as_ref().expect("ensured").device_ptr(stream);
    let (out_d, _g2) = sc.out.as_ref().expect("ensured").device_ptr(stream);
    let src = sc.data_h.as_ref().expect("ensured").slice(in_bytes);
    // SAFETY: the device buffer holds >= in_bytes bytes; `src` is
    // page-locked and untouched until the synchronisation below.
    unsafe { cudarc::driver::result::memcpy_htod_async(data_d, src, stream.cu_stream()) }
        .map_err(cuda_err)?;
    st.launch(stream, &tables, k, data_d, out_d, stripes)?;
    let dst = sc.out_h.as_mut().expect("ensured").slice_mut(total);
    // SAFETY: the device buffer holds >= total bytes written by the
    // kernel; `dst` is page-locked and read only after the synchronisation.
    unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, out_d, stream.cu_stream()) }
        .map_err(cuda_err)?;
    stream.synchronize().map_err(cuda_err)?;
    let mut out = vec![0u8; total];
    par_copy(&mut out, sc.out_h.as_ref().expect("ensured").slice(total));
    Ok(out)
}

/// Data already on the device: `k` over the `stripes` stripes of `data`
/// into `out` (row r of stripe s at `(s * rows + r) * len`), one launch on
/// the stream of processing element `pe`, synchronised before returning.
pub fn encode_resident(
    gpu: &CudaDevice,
    pe: usize,
    k: &EcKernel,
    data: &CudaSlice<u8>,
    out: &mut CudaSlice<u8>,
    stripes: usize,
) -> Result<()> {
    k.gpu_supported()?;
    if data.len() < stripes * k.stripe_bytes() || out.len() < stripes * k.rows() * k.chunk_len() {
        return Err(OffloadError::Invalid(format!(
            "device buffers of {} and {} bytes for {stripes} stripes",
            data.len(),
            out.len()
        )));
    }
    if stripes == 0 {
        return Ok(());
    }
    let st = gpu.state(EcCuda::new)?;
    let tables = st.tables(gpu, k)?;
    gpu.context().bind_to_thread().map_err(cuda_err)?;
    let stream = gpu.stream(pe);
    let (data_d, _g1) = data.device_ptr(stream);
    let (out_d, _g2) = out.device_ptr_mut(stream);
    st.launch(stream, &tables, k, data_d, out_d, stripes)?;
    stream.synchronize().map_err(cuda_err)
}
