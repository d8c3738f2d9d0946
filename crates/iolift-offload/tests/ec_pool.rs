//! The erasure-coding kernel (`EcKernel`) through the I/O pool on the CPU
//! device, against the iolift-ec codec called directly: single stripes and
//! multi-stripe tasks, batches, groups (chunks completing in any order),
//! callbacks, decoding matrices, bad tasks failing alone, and the GPU-only
//! entry points failing with a clear error on the CPU device.

use iolift_ec::{Codec, Profile};
use iolift_offload::kernels::ec::{bench, EcKernel, Stripes};
use iolift_offload::{device, IoPool, OffloadError, PoolConfig};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = iolift_testkit::rng::Rng::new(seed);
    (0..n).map(|_| r.next_u32() as u8).collect()
}

fn codec(profile: &str) -> Arc<Codec> {
    Arc::new(Codec::new(&Profile::parse(profile).unwrap()).unwrap())
}

/// The codec's parity of whole stripes laid out as the kernel takes them.
fn parity_direct(c: &Codec, len: usize, data: &[u8]) -> Vec<u8> {
    let (k, m) = (c.profile().k, c.profile().m);
    let mut out = vec![0u8; data.len() / k * m];
    for (d, o) in data.chunks(k * len).zip(out.chunks_mut(m * len)) {
        let srcs: Vec<&[u8]> = d.chunks(len).collect();
        let mut outs: Vec<&mut [u8]> = o.chunks_mut(len).collect();
        c.encode(&srcs, &mut outs).unwrap();
    }
    out
}

const PROFILES: &[(&str, usize)] = &[
    ("plugin=jerasure,technique=reed_sol_van,k=8,m=4", 4096),
    ("plugin=isa,technique=reed_sol_van,k=4,m=2", 64),
    ("plugin=isa,technique=cauchy,k=10,m=4", 1024),
    ("plugin=jerasure,technique=reed_sol_r6_op,k=6,m=2", 32),
    (
        "plugin=jerasure,technique=cauchy_good,k=4,m=2,packetsize=8",
        256,
    ),
    ("plugin=jerasure,technique=reed_sol_van,k=4,m=2,w=16", 128),
];

fn pool(k: EcKernel, max_batch: usize, pes: usize) -> IoPool<EcKernel> {
    let cfg = PoolConfig {
        max_batch,
        max_wait: Duration::from_millis(2),
        pes,
    };
    IoPool::new(device::cpu(2).unwrap(), k, cfg).unwrap()
}

#[test]
fn single_stripes_and_multi_stripe_tasks_match_the_codec() {
    for (seed, &(profile, len)) in (1u64..).zip(PROFILES) {
        let c = codec(profile);
        let sb = c.profile().k * len;
        let p = pool(EcKernel::encoder(c.clone(), len).unwrap(), 16, 2);
        // 200 tasks of 1..=5 stripes each
        let tasks: Vec<Stripes> = (0..200)
            .map(|i| random_bytes(sb * (1 + i % 5), seed * 1000 + i as u64).into())
            .collect();
        let done = p.submit_batch(&tasks);
        for (t, d) in tasks.iter().zip(done) {
            assert_eq!(d.wait().unwrap(), parity_direct(&c, len, t), "{profile}");
        }
        let st = p.stats();
        let launches = st.launches.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            launches < 200,
            "{profile}: tasks were batched ({launches} launches)"
        );
    }
}

#[test]
fn groups_complete_with_every_task_in_order() {
    let (profile, len) = PROFILES[0];
    let c = codec(profile);
    let sb = c.profile().k * len;
    // small batches and 4 workers: a group's chunks complete out of order
    let p = pool(EcKernel::encoder(c.clone(), len).unwrap(), 3, 4);
    let tasks: Vec<Stripes> = (0..100)
        .map(|i| random_bytes(sb * (1 + i % 3), 77 + i as u64).into())
        .collect();
    let g = p.submit_group(tasks.clone()).wait().unwrap();
    assert_eq!(g.len(), tasks.len());
    for (i, t) in tasks.iter().enumerate() {
        assert_eq!(g.task(i), parity_direct(&c, len, t).as_slice(), "task {i}");
    }
    assert!(p.submit_group(Vec::new()).wait().unwrap().is_empty());
}

#[test]
fn callbacks_deliver_each_result_once() {
    let (profile, len) = PROFILES[2];
    let c = codec(profile);
    let sb = c.profile().k * len;
    let p = pool(EcKernel::encoder(c.clone(), len).unwrap(), 8, 2);
    let (tx, rx) = mpsc::channel();
    let tasks: Vec<Vec<u8>> = (0..50).map(|i| random_bytes(sb, 500 + i)).collect();
    for (i, t) in tasks.iter().enumerate() {
        let tx = tx.clone();
        p.submit_with(t.clone().into(), move |r| tx.send((i, r)).unwrap());
    }
    drop(tx);
    let mut seen = vec![false; tasks.len()];
    for (i, r) in rx.iter() {
        assert!(!seen[i], "task {i} completed twice");
        seen[i] = true;
        assert_eq!(r.unwrap(), parity_direct(&c, len, &tasks[i]));
    }
    assert!(seen.iter().all(|&s| s));
}

#[test]
fn decoder_rebuilds_lost_chunks() {
    for &(profile, len) in &PROFILES[..4] {
        let c = codec(profile);
        let (k, m) = (c.profile().k, c.profile().m);
        let data = random_bytes(k * len * 7, 9);
        let parity = parity_direct(&c, len, &data);
        // lose data chunks 0 and 1 (m >= 2): decode from the rest
        let have: Vec<usize> = (2..k + m).take(k).collect();
        let want = [0usize, 1];
        let chunk = |s: usize, i: usize| -> &[u8] {
            if i < k {
                &data[(s * k + i) * len..(s * k + i + 1) * len]
            } else {
                &parity[(s * m + i - k) * len..(s * m + i - k + 1) * len]
            }
        };
        let input: Vec<u8> = (0..7)
            .flat_map(|s| have.iter().flat_map(move |&i| chunk(s, i).to_vec()))
            .collect();
        let kern = EcKernel::decoder(c.clone(), &have, &want, len).unwrap();
        assert_eq!(kern.rows(), 2);
        let p = pool(kern, 4, 2);
        let out = p.submit(input.into()).wait().unwrap();
        for s in 0..7 {
            for (r, &w) in want.iter().enumerate() {
                assert_eq!(
                    &out[(s * 2 + r) * len..(s * 2 + r + 1) * len],
                    chunk(s, w),
                    "{profile} stripe {s} chunk {w}"
                );
            }
        }
    }
}

#[test]
fn a_bad_task_fails_alone_and_gpu_only_calls_say_so() {
    let (profile, len) = PROFILES[1];
    let c = codec(profile);
    let sb = c.profile().k * len;
    let k = EcKernel::encoder(c.clone(), len).unwrap();
    assert!(k.gpu_supported().is_ok());
    assert!(bench::gpu_encode(&*device::cpu(1).unwrap(), &k, 4, 1).is_err());
    let e = bench::resident_round_trip(&*device::cpu(1).unwrap(), &k, &vec![0; sb]).unwrap_err();
    assert!(matches!(e, OffloadError::NoGpu(_)), "{e}");
    // one launch per task: the bad one fails, the good ones complete
    let p = pool(k, 1, 1);
    let good = random_bytes(sb, 3);
    let a = p.submit(good.clone().into());
    let b = p.submit(vec![0u8; sb + 1].into());
    let e = b.wait().unwrap_err();
    assert!(e.to_string().contains("not whole stripes"), "{e}");
    assert_eq!(a.wait().unwrap(), parity_direct(&c, len, &good));
    assert!(EcKernel::encoder(c.clone(), 0).is_err());
    // lengths the codec refuses are refused when the kernel is made
    let bits = codec(PROFILES[4].0);
    assert!(EcKernel::encoder(bits.clone(), 100).is_err());
    assert!(EcKernel::decoder(bits, &[2, 3, 4, 5], &[0, 1], 100).is_err());
    assert!(EcKernel::decoder(c, &[0, 1, 2, 2], &[3], len).is_err());
    // profiles the GPU kernel does not take say so (the CPU runs them)
    let bits = EcKernel::encoder(codec(PROFILES[4].0), 256).unwrap();
    assert!(matches!(
        bits.gpu_supported(),
        Err(OffloadError::Invalid(_))
    ));
    let odd = EcKernel::encoder(codec(PROFILES[0].0), 6).unwrap();
    assert!(odd.gpu_supported().is_err());
}
