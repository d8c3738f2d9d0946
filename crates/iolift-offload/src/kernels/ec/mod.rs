//! Reed-Solomon encoding, the second kernel: batches of stripes (k data
//! chunks each) -> their parity chunks (or, with a recovery matrix, the
//! chunks they rebuild), bit-exact with the `iolift-ec` CPU codec for the
//! matrix techniques (jerasure reed_sol_van, reed_sol_r6_op; isa
//! reed_sol_van, cauchy). The CUDA side is
//! `crates/iolift-offload/kernels/ec.cu`; its host build is checked against
//! `iolift_ec::Codec` in tests/ec_host.rs.
//!
//! `EcKernel` is the I/O pool's kernel: one task = one stripe or several
//! stripes of one profile and chunk length, laid out as the kernel reads
//! them (chunk j of stripe s at `(s * k + j) * len`); its item is the
//! task's output chunks (row r of stripe s at `(s * rows + r) * len`). On
//! the CPU the codec's plan runs stripe by stripe; on a GPU (`cuda.rs`) the
//! coefficient tables are uploaded once per kernel and device and a batch
//! is one launch, staged through page-locked buffers. `encode_resident`
//! runs on data already in device memory; `bench.rs` times both.

pub mod bench;
mod cuda;

pub use cuda::encode_resident;

use super::{Kernel, KernelSource};
use crate::cpu::CpuDevice;
use crate::cuda::CudaDevice;
use crate::error::{OffloadError, Result};
use iolift_ec::gf;
use iolift_ec::matrix::{self, Matrix};
use iolift_ec::{Codec, Plan, Technique};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// `crates/iolift-offload/kernels/ec.cu`: GF(2^8) table-driven encode.
pub const SOURCE: KernelSource = KernelSource {
    name: "ec",
    file: "ec.cu",
    source: include_str!("../../../kernels/ec.cu"),
    entries: &[KERNEL_ENCODE],
};

/// The encode kernel: one thread per 4-byte word of a stripe's chunks.
pub const KERNEL_ENCODE: &str = "ec_encode";

/// Most parity rows one launch computes (EC_MAX_ROWS in ec.cu).
pub const MAX_ROWS: usize = 16;

/// Threads per block the launch uses.
pub const BLOCK: u32 = 256;

/// The kernel's coefficient tables for a rows x k coding matrix: for each
/// coefficient (row-major) the 256 products c * x.
pub fn tables(m: &Matrix) -> Vec<u8> {
    let mut t = Vec::with_capacity(m.data.len() * 256);
    for &c in &m.data {
        t.extend_from_slice(&gf::MUL[c as usize]);
    }
    t
}

/// Checks a batch's shape for the kernel: chunk length a non-zero
/// multiple of 4, at most MAX_ROWS parity rows, buffer sizes matching.
pub fn check_batch(
    k: usize,
    rows: usize,
    len: usize,
    stripes: usize,
    data_len: usize,
    parity_len: usize,
) -> std::result::Result<(), String> {
    if len == 0 || !len.is_multiple_of(4) {
        return Err(format!(
            "chunk length {len} is not a non-zero multiple of 4"
        ));
    }
    if rows == 0 || rows > MAX_ROWS {
        return Err(format!(
            "{rows} parity rows: the kernel takes 1..={MAX_ROWS}"
        ));
    }
    if data_len != stripes * k * len || parity_len != stripes * rows * len {
        return Err(format!(
            "buffers of {data_len} and {parity_len} bytes for {stripes} stripes of k={k}, rows={rows}, len={len}"
        ));
    }
    if (stripes * len / 4) as u64 > u32::MAX as u64 * BLOCK as u64 {
        return Err("batch too large for one launch".into());
    }
    Ok(())
}

/// Blocks for a launch over `stripes` stripes of chunks of `len` bytes
/// (the kernel loops when there are fewer threads than words).
pub fn grid(len: usize, stripes: usize, max_blocks: u32) -> u32 {
    let words = (len / 4 * stripes) as u64;
    words
        .div_ceil(BLOCK as u64)
        .clamp(1, max_blocks.max(1) as u64) as u32
}

/// One task: whole stripes (`k * len` bytes each, at least one), in the
/// kernel's layout. Shared, so submitting copies nothing.
pub type Stripes = Arc<[u8]>;

/// The results of a batch or group: task i's output chunks are
/// `bytes[spans[i].0..spans[i].0 + spans[i].1]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunks {
    pub bytes: Vec<u8>,
    pub spans: Vec<(usize, usize)>,
}

impl Chunks {
    /// Task i's output (stripes x rows chunks).
    pub fn task(&self, i: usize) -> &[u8] {
        let (at, n) = self.spans[i];
        &self.bytes[at..at + n]
    }
    pub fn len(&self) -> usize {
        self.spans.len()
    }
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The I/O pool's erasure-coding kernel: a `rows x k` matrix over GF(2^8)
/// applied to stripes of k chunks of `len` bytes (encode: the parity rows;
/// decode: the rows rebuilding the wanted chunks from k chunks at hand).
pub struct EcKernel {
    codec: Arc<Codec>,
    /// Decoding's plan; encoding runs `Codec::encode`.
    plan: Option<Plan>,
    coef: Matrix,
    /// `tables(&coef)`, uploaded once per GPU (keyed by `id`).
    tables: Vec<u8>,
    id: u64,
    rows: usize,
    len: usize,
}

impl EcKernel {
    /// Encoding: each stripe's m parity chunks.
    pub fn encoder(codec: Arc<Codec>, len: usize) -> Result<EcKernel> {
        let p = codec.profile();
        let coef = if gpu_profile(p).is_ok() {
            codec.parity_matrix()
        } else {
            Matrix::zero(0, p.k)
        };
        let m = p.m;
        let plan = None;
        EcKernel::build(codec, plan, coef, m, len)
    }

    /// Decoding: from the k chunks `have` (ids, in the order their chunks
    /// are laid out in a stripe) to the chunks `want`.
    pub fn decoder(
        codec: Arc<Codec>,
        have: &[usize],
        want: &[usize],
        len: usize,
    ) -> Result<EcKernel> {
        let plan = Some(codec.recovery_plan(have, want).map_err(ec_err)?);
        let coef = if gpu_profile(codec.profile()).is_ok() {
            let gen = matrix::generator(&codec.parity_matrix());
            matrix::recovery_rows(&gen, have, want)
                .ok_or_else(|| OffloadError::Invalid(format!("chunks {have:?} cannot decode")))?
        } else {
            Matrix::zero(0, codec.profile().k)
        };
        EcKernel::build(codec, plan, coef, want.len(), len)
    }

    fn build(
        codec: Arc<Codec>,
        plan: Option<Plan>,
        coef: Matrix,
        rows: usize,
        len: usize,
    ) -> Result<EcKernel> {
        if len == 0 {
            return Err(OffloadError::Invalid("chunk length 0".into()));
        }
        // the codec's own length rules (word size, w * packetsize): one
        // stripe of zeros, so a bad length fails here and not in a worker
        let (k, m) = (codec.profile().k, codec.profile().m);
        let zero = vec![0u8; len];
        let mut out = vec![vec![0u8; len]; m];
        let srcs: Vec<&[u8]> = (0..k).map(|_| zero.as_slice()).collect();
        let mut outs: Vec<&mut [u8]> = out.iter_mut().map(|o| o.as_mut_slice()).collect();
        codec.encode(&srcs, &mut outs).map_err(ec_err)?;
        let tables = tables(&coef);
        Ok(EcKernel {
            codec,
            plan,
            coef,
            tables,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            rows,
            len,
        })
    }

    /// The `rows x k` matrix the GPU applies (empty for profiles the GPU
    /// kernel does not take).
    pub fn coefficients(&self) -> &Matrix {
        &self.coef
    }
    pub fn codec(&self) -> &Codec {
        &self.codec
    }
    /// Data chunks per stripe.
    pub fn k(&self) -> usize {
        self.codec.profile().k
    }
    /// Output chunks per stripe.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Chunk length in bytes.
    pub fn chunk_len(&self) -> usize {
        self.len
    }
    /// Bytes of one stripe's input.
    pub fn stripe_bytes(&self) -> usize {
        self.k() * self.len
    }
    /// Whether the GPU kernel can run this profile and chunk length (w = 8
    /// matrix techniques, len a multiple of 4, at most MAX_ROWS rows).
    pub fn gpu_supported(&self) -> Result<()> {
        gpu_profile(self.codec.profile())?;
        check_batch(
            self.k(),
            self.rows(),
            self.len,
            1,
            self.stripe_bytes(),
            self.rows() * self.len,
        )
        .map_err(OffloadError::Invalid)
    }

    /// Stripes in one task (an error for a length that is not whole stripes).
    fn stripes_of(&self, t: &[u8]) -> Result<usize> {
        let sb = self.stripe_bytes();
        if t.is_empty() || !t.len().is_multiple_of(sb) {
            return Err(OffloadError::Invalid(format!(
                "a task of {} bytes is not whole stripes of {sb} bytes",
                t.len()
            )));
        }
        Ok(t.len() / sb)
    }

    /// Spans of each task's output, back to back, and the total bytes.
    fn spans(&self, inputs: &[Stripes]) -> Result<(Vec<(usize, usize)>, usize)> {
        let per = self.rows() * self.len;
        let mut spans = Vec::with_capacity(inputs.len());
        let mut at = 0;
        for t in inputs {
            let n = self.stripes_of(t)? * per;
            spans.push((at, n));
            at += n;
        }
        Ok((spans, at))
    }

    /// One stripe through the codec's plan on this thread.
    fn stripe_cpu(&self, data: &[u8], out: &mut [u8]) -> Result<()> {
        let len = self.len;
        let srcs: Vec<&[u8]> = data.chunks_exact(len).collect();
        let mut outs: Vec<&mut [u8]> = out.chunks_exact_mut(len).collect();
        match &self.plan {
            Some(p) => p.run(&srcs, &mut outs),
            None => self.codec.encode(&srcs, &mut outs).map_err(ec_err)?,
        }
        Ok(())
    }
}

/// An `iolift_ec::Error` as an offload error.
fn ec_err(e: iolift_ec::Error) -> OffloadError {
    OffloadError::Invalid(e.to_string())
}

/// Profiles the GPU kernel computes: GF(2^8) matrix techniques.
fn gpu_profile(p: &iolift_ec::Profile) -> Result<()> {
    if p.w != 8 || p.technique.is_bitmatrix() {
        let t: Technique = p.technique;
        return Err(OffloadError::Invalid(format!(
            "the GPU erasure-coding kernel takes w=8 matrix techniques, not {} with w={}",
            t.name(),
            p.w
        )));
    }
    Ok(())
}

impl Kernel for EcKernel {
    type Input = Stripes;
    type Output = Chunks;
    type Item = Vec<u8>;

    fn run_cpu(&self, _cpu: &CpuDevice, inputs: &[Stripes]) -> Result<Chunks> {
        let (spans, total) = self.spans(inputs)?;
        let mut bytes = vec![0u8; total];
        let (sb, ob) = (self.stripe_bytes(), self.rows() * self.len);
        for (t, &(at, n)) in inputs.iter().zip(&spans) {
            for (d, o) in t
                .chunks_exact(sb)
                .zip(bytes[at..at + n].chunks_exact_mut(ob))
            {
                self.stripe_cpu(d, o)?;
            }
        }
        Ok(Chunks { bytes, spans })
    }

    fn run_cuda(&self, gpu: &CudaDevice, pe: usize, inputs: &[Stripes]) -> Result<Chunks> {
        self.gpu_supported()?;
        let (spans, total) = self.spans(inputs)?;
        let bytes = cuda::encode_staged(gpu, pe, self, inputs, total)?;
        Ok(Chunks { bytes, spans })
    }

    fn item(&self, out: &Chunks, i: usize) -> Vec<u8> {
        out.task(i).to_vec()
    }

    /// A group's buffer: spans filled in as chunks of the group complete
    /// (in any order), their bytes appended.
    fn alloc(&self, n: usize) -> Chunks {
        Chunks {
            bytes: Vec::new(),
            spans: vec![(0, 0); n],
        }
    }

    fn copy_rows(&self, dst: &mut Chunks, at: usize, src: &Chunks, from: usize, len: usize) {
        for i in 0..len {
            let t = src.task(from + i);
            dst.spans[at + i] = (dst.bytes.len(), t.len());
            dst.bytes.extend_from_slice(t);
        }
    }
}
