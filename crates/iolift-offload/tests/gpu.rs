//! GPU tests: GPU == CPU mapper (corpus and random inputs), map uploaded
//! once, pool on CUDA streams. They need a CUDA GPU, so they are ignored
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
