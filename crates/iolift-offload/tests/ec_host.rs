//! kernels/ec.cu built by the host C++ compiler (its CUDA shims emulate the
//! grid block by block, thread by thread) against the iolift-ec CPU codec:
//! large random batches of stripes, several profiles and grid shapes, every
//! parity byte compared; and decoding (recovery rows on the kernel) of
//! every pattern of two lost chunks.

use iolift_ec::matrix;
use iolift_ec::{Codec, Profile};
use iolift_offload::kernels::ec::{check_batch, grid, tables, BLOCK};

#[path = "common/host.rs"]
mod host;

type EncodeFn = unsafe extern "C" fn(
    tables: *const u8,
    data: *const u32,
    parity: *mut u32,
    k: u32,
    rows: u32,
    len: u32,
    stripes: u32,
    grid_dim: u32,
    block_dim: u32,
);

struct Host {
    encode: EncodeFn,
    _lib: libloading::Library,
    _dir: tempfile::TempDir,
}

fn host() -> Host {
    let (dir, lib) = host::build("ec.cu");
    // SAFETY: the type matches ec_host_encode.
    unsafe {
        let encode = *lib.get::<EncodeFn>(b"ec_host_encode\0").unwrap();
        Host {
            encode,
            _lib: lib,
            _dir: dir,
        }
    }
}

fn random_words(n: usize, seed: u64) -> Vec<u32> {
    let mut r = iolift_testkit::rng::Rng::new(seed);
    (0..n).map(|_| r.next_u32()).collect()
}

fn bytes(w: &[u32]) -> &[u8] {
    // SAFETY: u32 has no padding; the length is in bytes of the same memory.
    unsafe { std::slice::from_raw_parts(w.as_ptr() as *const u8, w.len() * 4) }
}

#[test]
fn host_kernel_matches_cpu_codec() {
    let h = host();
    for (seed, (profile, len, stripes)) in (1u64..).zip([
        (
            "plugin=jerasure,technique=reed_sol_van,k=8,m=4",
            4096usize,
            96usize,
        ),
        ("plugin=jerasure,technique=reed_sol_van,k=12,m=4", 1024, 40),
        ("plugin=jerasure,technique=reed_sol_r6_op,k=6,m=2", 4100, 17),
        ("plugin=isa,technique=reed_sol_van,k=10,m=4", 65536, 6),
        ("plugin=isa,technique=cauchy,k=4,m=2", 32, 501),
        ("plugin=isa,technique=cauchy,k=12,m=9", 256, 33),
    ]) {
        let p = Profile::parse(profile).unwrap();
        let codec = Codec::new(&p).unwrap();
        let (k, rows) = (p.k, p.m);
        let t = tables(&codec.parity_matrix());
        let data = random_words(stripes * k * len / 4, seed);
        // CPU reference, stripe by stripe.
        let db = bytes(&data);
        let mut want = vec![0u8; stripes * rows * len];
        for s in 0..stripes {
            let srcs: Vec<&[u8]> = (0..k)
                .map(|j| &db[(s * k + j) * len..(s * k + j + 1) * len])
                .collect();
            let mut outs: Vec<&mut [u8]> = want[s * rows * len..(s + 1) * rows * len]
                .chunks_mut(len)
                .collect();
            codec.encode(&srcs, &mut outs).unwrap();
        }
        check_batch(k, rows, len, stripes, data.len() * 4, want.len()).unwrap();
        // The full grid, and small grids that make threads loop.
        for blocks in [grid(len, stripes, 65535), 3, 1] {
            for block in [BLOCK, 32] {
                let mut parity = vec![0xdeadbeefu32; stripes * rows * len / 4];
                // SAFETY: buffers sized as ec.cu expects (checked above).
                unsafe {
                    (h.encode)(
                        t.as_ptr(),
                        data.as_ptr(),
                        parity.as_mut_ptr(),
                        k as u32,
                        rows as u32,
                        len as u32,
                        stripes as u32,
                        blocks,
                        block,
                    )
                };
                let got = bytes(&parity);
                if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
                    panic!("{profile} len={len} stripes={stripes} grid {blocks}x{block}: byte {at} differs");
                }
            }
        }
    }
}

/// Decoding on the host build of the kernel: the recovery rows for an
/// erasure pattern, applied to the k surviving chunks of every stripe of a
/// random batch, give back the lost chunks (data and parity) exactly as
/// the CPU codec's encode made them.
#[test]
fn host_kernel_decodes_every_pattern_of_two_erasures() {
    let h = host();
    for (seed, (profile, len, stripes)) in (100u64..).zip([
        (
            "plugin=jerasure,technique=reed_sol_van,k=8,m=4",
            512usize,
            24usize,
        ),
        ("plugin=isa,technique=reed_sol_van,k=6,m=3", 4096, 8),
        ("plugin=isa,technique=cauchy,k=10,m=4", 64, 40),
    ]) {
        let p = Profile::parse(profile).unwrap();
        let codec = Codec::new(&p).unwrap();
        let (k, n) = (p.k, p.chunk_count());
        // Every chunk of every stripe, as the CPU codec encodes it.
        let data = random_words(stripes * k * len / 4, seed);
        let db = bytes(&data);
        let mut all = vec![vec![0u8; len]; stripes * n];
        for s in 0..stripes {
            for j in 0..k {
                all[s * n + j].copy_from_slice(&db[(s * k + j) * len..(s * k + j + 1) * len]);
            }
            let (d, par) = all[s * n..(s + 1) * n].split_at_mut(k);
            let srcs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
            let mut outs: Vec<&mut [u8]> = par.iter_mut().map(|v| v.as_mut_slice()).collect();
            codec.encode(&srcs, &mut outs).unwrap();
        }
        let gen = matrix::generator(&codec.parity_matrix());
        for a in 0..n {
            for b in a + 1..n {
                let want = [a, b];
                let have: Vec<usize> = (0..n).filter(|i| !want.contains(i)).take(k).collect();
                let rows = matrix::recovery_rows(&gen, &have, &want).unwrap();
                // The survivors, laid out as the kernel reads them, as words.
                let mut src = vec![0u32; stripes * k * len / 4];
                for s in 0..stripes {
                    for (x, &i) in have.iter().enumerate() {
                        let at = (s * k + x) * len / 4;
                        for (w, c) in src[at..at + len / 4]
                            .iter_mut()
                            .zip(all[s * n + i].chunks(4))
                        {
                            *w = u32::from_ne_bytes(c.try_into().unwrap());
                        }
                    }
                }
                let mut out = vec![0xdeadbeefu32; stripes * 2 * len / 4];
                let t = tables(&rows);
                // SAFETY: buffers sized as ec.cu expects for k sources and 2 rows.
                unsafe {
                    (h.encode)(
                        t.as_ptr(),
                        src.as_ptr(),
                        out.as_mut_ptr(),
                        k as u32,
                        2,
                        len as u32,
                        stripes as u32,
                        grid(len, stripes, 65535),
                        BLOCK,
                    )
                };
                let got = bytes(&out);
                for s in 0..stripes {
                    for (r, &i) in want.iter().enumerate() {
                        let at = (s * 2 + r) * len;
                        assert!(
                            got[at..at + len] == all[s * n + i][..],
                            "{profile}: lost {want:?}, chunk {i} of stripe {s} differs"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn batch_shape_checks() {
    assert!(check_batch(4, 2, 30, 1, 120, 60)
        .unwrap_err()
        .contains("multiple of 4"));
    assert!(check_batch(4, 17, 32, 1, 128, 544)
        .unwrap_err()
        .contains("17 parity rows"));
    assert!(check_batch(4, 2, 32, 2, 128, 128)
        .unwrap_err()
        .contains("buffers"));
    assert_eq!(grid(4096, 8, 65535), 32);
    assert_eq!(grid(4096, 8, 4), 4);
}
