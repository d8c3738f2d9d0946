// iolift: Reed-Solomon encoding over GF(2^8) for batches of stripes,
// bit-exact with crates/iolift-ec (and so with Ceph's jerasure and isa
// plugins for the matrix techniques: reed_sol_van, reed_sol_r6_op, isa
// reed_sol_van and cauchy).
//
// This file is compiled three ways, like crush.cu:
//   * by NVRTC at run time (the CUDA device); ec_encode is the entry point;
//   * by NVRTC in CPU-only CI (crates/iolift-offload/tests/nvrtc.rs) to PTX;
//   * by the host C++ compiler (g++) as a shared library with the shims
//     below, so the same code runs on the CPU and is compared with the Rust
//     codec byte for byte (crates/iolift-offload/tests/ec_host.rs).
//
// Inputs:
//   tables  rows * k * 256 bytes: tables[(r * k + j) * 256 + x] is the
//           product of coefficient (r, j) of the coding matrix and x (one
//           multiplication table per coefficient, built by the host);
//   data    stripes * k * len bytes: chunk j of stripe s at (s * k + j) * len;
//   parity  stripes * rows * len bytes: chunk r of stripe s at
//           (s * rows + r) * len.
// len must be a multiple of 4 and rows at most EC_MAX_ROWS. One thread
// computes one 4-byte word of every parity chunk of one stripe: it reads
// the word of each data chunk once and adds its products into rows
// accumulators; threads of a warp read consecutive words (coalesced).

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define EC_FN __device__ __forceinline__
#define EC_EXTERN extern "C"
#define EC_LDG(p) __ldg(p)
#else
#define EC_FN static inline
#define EC_EXTERN extern "C"
#define __global__
#define EC_LDG(p) (*(p))
// Host shims for the CUDA built-ins used below. Thread-local so several
// host threads can emulate blocks at once.
struct ec_dim3 {
    u32 x, y, z;
};
static thread_local ec_dim3 threadIdx, blockIdx, blockDim, gridDim;
#endif

#define EC_MAX_ROWS 16

// Products of the four bytes of `word` by the coefficient whose table is t.
EC_FN u32 ec_mul_word(const u8 *t, u32 word)
{
    return (u32)EC_LDG(t + (word & 0xff)) | ((u32)EC_LDG(t + ((word >> 8) & 0xff)) << 8) |
           ((u32)EC_LDG(t + ((word >> 16) & 0xff)) << 16) | ((u32)EC_LDG(t + (word >> 24)) << 24);
}

EC_EXTERN __global__ void ec_encode(const u8 *tables, const u32 *data, u32 *parity, u32 k, u32 rows,
                                    u32 len, u32 stripes)
{
    const u64 words = (u64)(len / 4);
    const u64 total = words * stripes;
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const u64 s = i / words;
        const u64 w = i % words;
        u32 acc[EC_MAX_ROWS];
        for (u32 r = 0; r < rows && r < EC_MAX_ROWS; r++)
            acc[r] = 0;
        for (u32 j = 0; j < k; j++) {
            const u32 word = EC_LDG(data + (s * k + j) * words + w);
            for (u32 r = 0; r < rows && r < EC_MAX_ROWS; r++)
                acc[r] ^= ec_mul_word(tables + ((u64)r * k + j) * 256, word);
        }
        for (u32 r = 0; r < rows && r < EC_MAX_ROWS; r++)
            parity[(s * rows + r) * words + w] = acc[r];
    }
}

#if !(defined(__CUDACC__) || defined(__CUDACC_RTC__))
// Host entry: runs the grid block by block, thread by thread, exactly as
// the launch would (grid_dim blocks of block_dim threads).
EC_EXTERN void ec_host_encode(const u8 *tables, const u32 *data, u32 *parity, u32 k, u32 rows,
                              u32 len, u32 stripes, u32 grid_dim, u32 block_dim)
{
    gridDim = ec_dim3{grid_dim, 1, 1};
    blockDim = ec_dim3{block_dim, 1, 1};
    for (u32 b = 0; b < grid_dim; b++) {
        blockIdx = ec_dim3{b, 0, 0};
        for (u32 t = 0; t < block_dim; t++) {
            threadIdx = ec_dim3{t, 0, 0};
            ec_encode(tables, data, parity, k, rows, len, stripes);
        }
    }
}
#endif
