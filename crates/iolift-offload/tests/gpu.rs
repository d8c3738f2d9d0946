//! GPU tests: GPU == CPU mapper (corpus and random inputs), map uploaded
//! once, pool on CUDA streams; erasure coding GPU == CPU codec on large
//! random batches (staged, device-resident, pool, decode) and its encode
//! GB/s. They need a CUDA GPU, so they are ignored
//! by default (`cargo test` lists them as ignored, with the reason); run
//! them with `cargo test -p iolift-offload --test gpu -- --ignored`
//! (scripts/gpu-check.sh does): without a usable GPU they then fail with
//! the reason, never pass.

mod common;
use common::*;
use iolift_offload::kernels::crush::bench::{first_mismatch, random_inputs};
use iolift_offload::kernels::crush::synth::straw2_map;
use iolift_offload::kernels::crush::{self, CrushKernel};
use iolift_offload::{device, Device, Inputs, IoPool, MapHandle, PoolConfig};
use std::sync::Arc;

fn gpu() -> Arc<dyn Device> {
    device::open("gpu", 4).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -p iolift-offload --test gpu -- --ignored"]
fn gpu_matches_cpu_on_corpus() {
    let g = gpu();
    let cpu = device::cpu(0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let n: usize = std::env::var("IOLIFT_GPU_RANDOM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let have_crushtool = crushtool_ok();
    let mut maps: Vec<(String, iolift_crush::CrushMap)> = vec![
        ("straw2-1000".into(), straw2_map(1000, 10, 10)),
        ("straw2-10000".into(), straw2_map(10000, 10, 10)),
    ];
    if have_crushtool {
        for (name, spec) in corpus_specs() {
            maps.push((
                name.clone(),
                compile_text(dir.path(), &name, &text_map(&spec)),
            ));
        }
    } else {
        eprintln!("crushtool missing: synthetic straw2 maps only");
    }
    for (name, map) in maps {
        let h = MapHandle::new(map, Some(0)).unwrap();
        for w in weight_sets(h.map.max_devices as usize, 5) {
            for rule in 0..h.map.max_rules() {
                for rm in [1usize, 3, 6] {
                    for xs in [
                        (0..1024).collect::<Vec<i32>>(),
                        random_inputs(n, rule as u64),
                        random_inputs(100, 1),
                    ] {
                        // 100 inputs: latency (warp) kernel; larger: throughput kernel
                        let a = crush::map(&*g, &h, rule, Inputs::Xs(&xs), rm, &w).unwrap();
                        let b = crush::map(&*cpu, &h, rule, Inputs::Xs(&xs), rm, &w).unwrap();
                        if let Some(i) = first_mismatch(&a, &b) {
                            panic!(
                                "{name} rule {rule} size {rm} x {}: gpu {:?} cpu {:?}",
                                xs[i],
                                a.row(i),
                                b.row(i)
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -p iolift-offload --test gpu -- --ignored"]
fn gpu_pool_and_whole_pool() {
    let g = gpu();
    let cpu = device::cpu(0).unwrap();
    let h = MapHandle::new(straw2_map(10000, 10, 10), None).unwrap();
    let w = vec![0x10000u32; 10000];
    let p = iolift_osdmap::placement::Pool {
        id: 3,
        pg_num: 1 << 20,
        pgp_num: 1 << 20,
        hashpspool: true,
    };
    for (rule, size) in [(0, 3usize), (1, 6)] {
        let a = crush::map_pool(&*g, &h, &p, rule, size, &w).unwrap();
        let b = crush::map_pool(&*cpu, &h, &p, rule, size, &w).unwrap();
        assert!(first_mismatch(&a, &b).is_none(), "whole pool rule {rule}");
    }
    let pool = IoPool::new(
        g,
        CrushKernel::new(h.clone(), 0, 3, w.clone()).unwrap(),
        PoolConfig::default(),
    )
    .unwrap();
    let xs = random_inputs(10000, 3);
    let b = crush::map(&*cpu, &h, 0, Inputs::Xs(&xs), 3, &w).unwrap();
    for (i, c) in pool.submit_batch(&xs).into_iter().enumerate() {
        assert_eq!(c.wait().unwrap(), b.row(i));
    }
}

mod ec {
    use super::gpu;
    use iolift_ec::{Codec, Profile};
    use iolift_offload::kernels::ec::{bench, EcKernel, Stripes};
    use iolift_offload::kernels::run_batch;
    use iolift_offload::{device, IoPool, PoolConfig};
    use std::sync::Arc;

    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut r = iolift_testkit::rng::Rng::new(seed);
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&r.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }

    /// Matrix-technique profiles and chunk lengths (multiples of 4).
    const PROFILES: &[(&str, usize)] = &[
        ("plugin=jerasure,technique=reed_sol_van,k=8,m=4", 4096),
        ("plugin=jerasure,technique=reed_sol_van,k=12,m=4", 65536),
        ("plugin=jerasure,technique=reed_sol_r6_op,k=6,m=2", 1028),
        ("plugin=isa,technique=reed_sol_van,k=10,m=4", 32768),
        ("plugin=isa,technique=cauchy,k=4,m=2", 32),
        ("plugin=isa,technique=cauchy,k=12,m=9", 4096),
    ];

    /// Random data: about `IOLIFT_GPU_EC_MB` (default 256) MiB per profile.
    fn batch_bytes() -> usize {
        std::env::var("IOLIFT_GPU_EC_MB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256usize)
            << 20
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test -p iolift-offload --test gpu -- --ignored"]
    fn ec_gpu_matches_cpu_on_large_random_batches() {
        let g = gpu();
        let cpu = device::cpu(0).unwrap();
        for (seed, &(profile, len)) in (1u64..).zip(PROFILES) {
            let c = Arc::new(Codec::new(&Profile::parse(profile).unwrap()).unwrap());
            let k = EcKernel::encoder(c.clone(), len).unwrap();
            let sb = k.stripe_bytes();
            let stripes = (batch_bytes() / sb).max(1);
            let data = random_bytes(stripes * sb, seed);
            // one launch over the whole batch, on the GPU and the CPU
            let one: Vec<Stripes> = vec![data.clone().into()];
            let a = run_batch(&*g, 0, &k, &one).unwrap();
            let b = run_batch(&*cpu, 0, &k, &one).unwrap();
            assert!(a == b, "{profile}: GPU parity differs from the CPU's");
            // data already on the device
            let r = bench::resident_round_trip(&*g, &k, &data).unwrap();
            assert!(r == b.bytes, "{profile}: device-resident parity differs");
            // the pool on 4 streams: tasks of 1..=7 stripes in a group
            let pool = IoPool::new(
                g.clone(),
                EcKernel::encoder(c.clone(), len).unwrap(),
                PoolConfig::default(),
            )
            .unwrap();
            let mut tasks: Vec<Stripes> = Vec::new();
            let mut at = 0;
            while at < data.len() && tasks.len() < 4096 {
                let n = (1 + tasks.len() % 7) * sb;
                let end = (at + n).min(data.len());
                tasks.push(data[at..end].to_vec().into());
                at = end;
            }
            let got = pool.submit_group(tasks.clone()).wait().unwrap();
            let want = run_batch(&*cpu, 0, &k, &tasks).unwrap();
            for i in 0..tasks.len() {
                assert!(got.task(i) == want.task(i), "{profile}: pool task {i}");
            }
            // decoding: the first two chunks lost (m >= 2)
            let (kk, m) = (c.profile().k, c.profile().m);
            let have: Vec<usize> = (2..kk + m).take(kk).collect();
            let d = EcKernel::decoder(c.clone(), &have, &[0, 1], len).unwrap();
            let one: Vec<Stripes> = vec![random_bytes(256 * sb, seed + 100).into()];
            let a = run_batch(&*g, 1, &d, &one).unwrap();
            let b = run_batch(&*cpu, 0, &d, &one).unwrap();
            assert!(a == b, "{profile}: GPU decode differs from the CPU's");
            eprintln!("{profile}: {stripes} stripes of {len}-byte chunks identical");
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test -p iolift-offload --test gpu -- --ignored"]
    fn ec_gpu_encode_rate() {
        let g = gpu();
        let c = Arc::new(
            Codec::new(&Profile::parse("plugin=isa,technique=reed_sol_van,k=8,m=4").unwrap())
                .unwrap(),
        );
        for len in [4096usize, 65536, 1 << 20] {
            let k = EcKernel::encoder(c.clone(), len).unwrap();
            let stripes = (256usize << 20) / k.stripe_bytes();
            let r = bench::gpu_encode(&*g, &k, stripes, 300).unwrap();
            eprintln!(
                "ec k=8,m=4 chunk {len}: data on device {:.1} GB/s, from host memory {:.1} GB/s ({})",
                r.resident.gbps, r.host.gbps, r.device
            );
            assert!(
                r.matches_cpu,
                "chunk {len}: GPU parity differs from the CPU's"
            );
        }
    }
}
