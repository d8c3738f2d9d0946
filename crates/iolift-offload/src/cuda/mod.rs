//! The CUDA device: cudarc with the driver loaded at run time (no link-time
//! CUDA dependency), one stream per processing element, kernel modules
//! compiled by NVRTC (or taken from the PTX cache) and loaded once each,
//! and one state slot per kernel type (its loaded functions, uploaded data
//! and per-stream buffers). Knows no kernel: kernels call in (`module`,
//! `state`, `stream`).

pub mod mem;

use crate::compile::KernelSource;
use crate::error::{OffloadError, Result};
use cudarc::driver::{CudaContext, CudaModule, CudaStream};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

type States = Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>;

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    streams: Vec<Arc<CudaStream>>,
    /// "compute_XY" of the GPU: what kernels are compiled for.
    arch: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    states: States,
    name: String,
}

pub(crate) fn cuda_err<E: std::fmt::Debug>(e: E) -> OffloadError {
    OffloadError::Cuda(format!("{e:?}"))
}

/// Whether libcuda can be loaded, without touching cudarc's panicking loader.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by name.
    catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false)
}

impl CudaDevice {
    /// GPU `ordinal` with `streams` streams (at least one). Without a
    /// driver or GPU: `OffloadError::NoGpu` with the reason, never a panic.
    pub fn new(ordinal: usize, streams: usize) -> Result<CudaDevice> {
        if !driver_present() {
            return Err(OffloadError::NoGpu(
                "the CUDA driver library (libcuda.so) is not installed on this machine; use --device cpu".into(),
            ));
        }
        let r = catch_unwind(AssertUnwindSafe(|| -> Result<CudaDevice> {
            let n = CudaContext::device_count().map_err(cuda_err)?;
            if n <= 0 || ordinal >= n as usize {
                return Err(OffloadError::NoGpu(format!(
                    "GPU {ordinal} requested, {n} CUDA device(s) present"
                )));
            }
            let ctx =
                CudaContext::new(ordinal).map_err(|e| OffloadError::NoGpu(format!("{e:?}")))?;
            // Kernels keep their buffers per stream, or upload and
            // synchronise before any other stream reads them: cudarc's
            // per-buffer events are not needed.
            // SAFETY: see above; no buffer is shared between streams while written.
            unsafe { ctx.disable_event_tracking() };
            let (maj, min) = ctx.compute_capability().map_err(cuda_err)?;
            let mut st = Vec::new();
            for _ in 0..streams.max(1) {
                st.push(ctx.new_stream().map_err(cuda_err)?);
            }
            let name = format!(
                "cuda:{ordinal} {} (sm_{maj}{min}, {} streams)",
                ctx.name().unwrap_or_default(),
                st.len()
            );
            Ok(CudaDevice {
                ctx,
                streams: st,
                arch: format!("compute_{maj}{min}"),
                modules: Mutex::new(HashMap::new()),
                states: Mutex::new(HashMap::new()),
                name,
            })
        }));
        match r {
            Ok(r) => r,
            Err(_) => Err(OffloadError::NoGpu(
                "the CUDA driver could not be initialised (loader panicked)".into(),
            )),
        }
    }

    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// Streams (processing elements).
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// The stream of processing element `pe` (modulo the stream count).
    pub fn stream(&self, pe: usize) -> &Arc<CudaStream> {
        &self.streams[pe % self.streams.len()]
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// "compute_XY": the architecture kernels are compiled for.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// `src` compiled for this GPU (or its cached PTX) and loaded; once per
    /// device and source.
    pub fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        let mut mods = self.modules.lock().expect("module cache lock");
        if let Some(m) = mods.get(src.name) {
            return Ok(m.clone());
        }
        let (ptx, _) = src.ptx(&self.arch)?;
        let m = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.as_str()))
            .map_err(cuda_err)?;
        mods.insert(src.name, m.clone());
        Ok(m)
    }

    /// The state of type `T` kept for a kernel on this device, made by
    /// `init` on first use (the same `Arc` afterwards). A failed `init` is
    /// not remembered: the next call tries again.
    pub fn state<T: Any + Send + Sync>(
        &self,
        init: impl FnOnce(&CudaDevice) -> Result<T>,
    ) -> Result<Arc<T>> {
        let mut states = self.states.lock().expect("kernel state lock");
        if let Some(s) = states.get(&TypeId::of::<T>()) {
            return Ok(s
                .clone()
                .downcast::<T>()
                .expect("state slot keyed by its type"));
        }
        let s = Arc::new(init(self)?);
        states.insert(TypeId::of::<T>(), s.clone());
        Ok(s)
    }
}
