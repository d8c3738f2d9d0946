//! Property tests: decode(encode(x)) == x for random profiles, sizes and
//! erasure patterns, on every engine.

use iolift_ec::{stripe, Codec, Engine, Profile};
use proptest::prelude::*;

fn profile_text(tech: usize, k: usize, m: usize) -> String {
    match tech {
        0 => format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m}"),
        1 => format!("plugin=jerasure,technique=reed_sol_r6_op,k={k},m=2"),
        2 => format!("plugin=jerasure,technique=cauchy_orig,k={k},m={m},packetsize=8"),
        3 => format!("plugin=jerasure,technique=cauchy_good,k={k},m={m},packetsize=16"),
        4 => format!("plugin=isa,technique=reed_sol_van,k={k},m={}", m.min(4)),
        6 => format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m},w=16"),
        7 => format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m},w=32"),
        5 => format!("plugin=isa,technique=cauchy,k={k},m={m}"),
        _ => format!("plugin=jerasure,technique=reed_sol_r6_op,k={k},m=2,w=16"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn decode_inverts_encode(
        tech in 0usize..9,
        k in 2usize..=16,
        m in 1usize..=6,
        mult in 1usize..=4,
        extra in 0usize..5000,
        seed in any::<u64>(),
        erase_seed in any::<u64>(),
        engine in 0usize..4,
    ) {
        let p = Profile::parse(&profile_text(tech, k, m)).unwrap();
        let engine = [Engine::Auto, Engine::Native, Engine::Scalar, Engine::Isal][engine];
        let codec = Codec::with_engine(&p, engine)
            .unwrap_or_else(|e| panic!("{e} (scripts/test.sh installs libisal2)"));
        let su = p.stripe_unit_multiple() * mult;
        let len = extra + 1;
        let input = noise(seed, len);
        let shards = stripe::encode_object(&codec, su, &input).unwrap();
        let n = p.chunk_count();
        // Erase up to m shards picked by erase_seed.
        let mut avail: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
        let mut e = erase_seed;
        let lost = (e % (p.m as u64 + 1)) as usize;
        let mut erased = 0;
        while erased < lost {
            e = e.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let i = (e >> 33) as usize % n;
            if avail[i].is_some() {
                avail[i] = None;
                erased += 1;
            }
        }
        let out = stripe::decode_object(&codec, su, &avail).unwrap();
        prop_assert_eq!(&out[..len], &input[..]);
        prop_assert!(out[len..].iter().all(|&b| b == 0));
        let mut chunks = avail;
        codec.decode(&mut chunks).unwrap();
        for i in 0..n {
            prop_assert!(chunks[i].as_ref() == Some(&shards[i]));
        }
    }
}

#[test]
fn too_many_erasures_and_mismatched_sizes_are_errors() {
    let p = Profile::parse("plugin=isa,k=4,m=2").unwrap();
    let codec = Codec::new(&p).unwrap();
    let shards = stripe::encode_object(&codec, 64, &[7u8; 1000]).unwrap();
    let mut avail: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
    avail[0] = None;
    avail[1] = None;
    avail[5] = None;
    let e = stripe::decode_object(&codec, 64, &avail)
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least k=4"), "{e}");
    let mut avail: Vec<Option<Vec<u8>>> = shards.iter().cloned().map(Some).collect();
    avail[3].as_mut().unwrap().push(0);
    let e = stripe::decode_object(&codec, 64, &avail)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard 3") && e.contains("differ in size"), "{e}");
    let e = stripe::encode_object(&codec, 48, &[1u8; 10])
        .unwrap_err()
        .to_string();
    assert!(e.contains("stripe_unit=48"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A codec with a tiny plan cache decodes a stream of random erasure
    /// patterns (patterns repeat, plans are evicted and made again) to the
    /// same bytes as a codec that caches nothing, and never holds more
    /// plans than its budget.
    #[test]
    fn cached_plans_decode_like_fresh_ones(
        k in 2usize..=12,
        m in 1usize..=4,
        seed in any::<u64>(),
    ) {
        let p = Profile::parse(&format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m}")).unwrap();
        let n = k + m;
        let cached = Codec::new(&p).unwrap().with_plan_cache(2);
        let fresh = Codec::new(&p).unwrap().with_plan_cache(0);
        let len = 96;
        let data: Vec<Vec<u8>> = (0..k).map(|j| iolift_testkit::random_bytes(len, seed ^ j as u64)).collect();
        let mut parity = vec![vec![0u8; len]; m];
        {
            let d: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
            let mut o: Vec<&mut [u8]> = parity.iter_mut().map(|v| v.as_mut_slice()).collect();
            cached.encode(&d, &mut o).unwrap();
        }
        let all: Vec<Vec<u8>> = data.into_iter().chain(parity).collect();
        let mut x = seed | 1;
        for _ in 0..12 {
            // One of a few patterns: the first `lost` chunks from a start.
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            let lost = 1 + (x % m as u64) as usize;
            let start = ((x >> 8) % 3) as usize % n;
            let gone: Vec<usize> = (0..lost).map(|i| (start + i) % n).collect();
            let mut a: Vec<Option<Vec<u8>>> = (0..n).map(|i| (!gone.contains(&i)).then(|| all[i].clone())).collect();
            let mut b = a.clone();
            cached.decode(&mut a).unwrap();
            fresh.decode(&mut b).unwrap();
            prop_assert_eq!(&a, &b);
            for i in 0..n {
                prop_assert!(a[i].as_ref() == Some(&all[i]));
            }
            prop_assert!(cached.cached_plans() <= 2);
            prop_assert_eq!(fresh.cached_plans(), 0);
        }
    }
}

/// `xor_rows` says which parity chunks are the XOR of the data: checked
/// against the encoder's output for every technique, and the default
/// profiles (isa and jerasure reed_sol_van) have their first row so.
#[test]
fn xor_rows_are_the_xor_of_the_data() {
    for tech in 0..9 {
        for (k, m) in [(4, 2), (3, 1), (6, 3), (2, 2)] {
            let p = Profile::parse(&profile_text(tech, k, m)).unwrap();
            let codec = Codec::new(&p).unwrap();
            let len = 8 * p.stripe_unit_multiple().max(64);
            let seed = 0x2545_f491_4f6c_dd1du64 ^ (tech * 131 + k) as u64;
            let data: Vec<Vec<u8>> = (0..p.k).map(|i| noise(seed + i as u64, len)).collect();
            let mut parity = vec![vec![0u8; len]; p.m];
            {
                let srcs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
                let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|q| &mut q[..]).collect();
                codec.encode(&srcs, &mut outs).unwrap();
            }
            let xor: Vec<u8> = (0..len)
                .map(|i| data.iter().fold(0, |a, d| a ^ d[i]))
                .collect();
            let rows = codec.xor_rows();
            assert_eq!(rows.len(), p.m);
            for (j, &is) in rows.iter().enumerate() {
                if is {
                    assert_eq!(parity[j], xor, "tech {tech} k {k} m {m} row {j}");
                }
            }
            if tech == 0 || tech == 4 {
                assert!(
                    rows[0],
                    "tech {tech}: the first Vandermonde row is all ones"
                );
            }
        }
    }
}

/// `len` xorshift bytes from `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
