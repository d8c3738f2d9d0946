//! Reed-Solomon encoding, the second kernel: batches of stripes (k data
//! chunks each) -> their parity chunks, bit-exact with the `iolift-ec` CPU
//! codec for the matrix techniques (jerasure reed_sol_van, reed_sol_r6_op;
//! isa reed_sol_van, cauchy). The CUDA side is
//! `crates/iolift-offload/kernels/ec.cu`; its host build is checked against
//! `iolift_ec::Codec` in tests/ec_host.rs.
//!
//! So far this module holds the source registration and the host-side
//! preparation of a launch (coefficient tables, batch layout, grid shape);
//! the I/O-pool `Kernel` (CUDA launches through `CudaDevice`) is not written
//! yet.

use super::KernelSource;
use iolift_ec::gf;
use iolift_ec::matrix::Matrix;

/// `crates/iolift-offload/kernels/ec.cu`: GF(2^8) table-driven encode.
pub const SOURCE: KernelSource = KernelSource {
    name: "ec",
    file: "ec.cu",
    source: include_str!("../../kernels/ec.cu"),
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
) -> Result<(), String> {
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
