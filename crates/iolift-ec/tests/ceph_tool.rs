//! Byte-for-byte comparison with Ceph's `ceph-erasure-code-tool` (Debian
//! package ceph-osd): the same random objects encoded with the same
//! profiles by both, every shard compared; decodes with every erasure
//! pattern of up to m shards compared with the original and with Ceph's
//! decode.

use iolift_ec::{stripe, Codec, Engine, Profile};
use iolift_testkit::random_bytes as random;
use std::path::Path;
use std::process::Command;

const TOOL: &str = "ceph-erasure-code-tool";

fn tool_path() -> String {
    let p = std::env::var("CEPH_EC_TOOL").unwrap_or_else(|_| TOOL.to_string());
    // A missing tool fails the test (the Debian package is ceph-osd).
    iolift_testkit::require_tool(&p).display().to_string()
}

fn run_tool(tool: &str, args: &[&str]) {
    let out = Command::new(tool).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every engine: auto (iolift's AVX2 kernel on an AVX2 CPU), native,
/// scalar, and iolift's matrices on ISA-L's kernels.
const ENGINES: [Engine; 4] = [Engine::Auto, Engine::Native, Engine::Scalar, Engine::Isal];

fn engine_codec(p: &Profile, e: Engine) -> Codec {
    Codec::with_engine(p, e)
        .unwrap_or_else(|err| panic!("{err} (engine {e:?}: scripts/test.sh installs libisal2)"))
}

fn all_ids(n: usize) -> String {
    (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// Encodes `len` random bytes with both; returns our shards.
fn compare_encode(
    tool: &str,
    dir: &Path,
    profile: &str,
    su: usize,
    len: usize,
    seed: u64,
) -> Vec<Vec<u8>> {
    let p = Profile::parse(profile).unwrap();
    let input = random(len, seed);
    let fname = dir.join(format!("obj{seed}"));
    std::fs::write(&fname, &input).unwrap();
    let n = p.chunk_count();
    run_tool(
        tool,
        &[
            "encode",
            profile,
            &su.to_string(),
            &all_ids(n),
            fname.to_str().unwrap(),
        ],
    );
    let ours = ENGINES.map(|e| {
        let codec = engine_codec(&p, e);
        stripe::encode_object(&codec, su, &input).unwrap()
    });
    for (i, shard) in ours[0].iter().enumerate() {
        let theirs = std::fs::read(format!("{}.{i}", fname.display())).unwrap();
        assert_eq!(
            theirs.len(),
            shard.len(),
            "{profile} su={su} len={len}: shard {i} size"
        );
        if let Some(at) = theirs.iter().zip(shard).position(|(a, b)| a != b) {
            panic!("{profile} su={su} len={len}: shard {i} differs from Ceph's at byte {at}");
        }
        for (e, o) in ours.iter().enumerate().skip(1) {
            assert!(
                o[i] == *shard,
                "{profile}: engine #{e} differs on shard {i}"
            );
        }
    }
    ours.into_iter().next().unwrap()
}

#[test]
fn encode_matches_ceph_for_every_technique() {
    let tool = tool_path();
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 1;
    let mut cases = 0;
    for (k, m) in [
        (2, 1),
        (3, 2),
        (4, 2),
        (6, 3),
        (6, 4),
        (8, 4),
        (10, 4),
        (12, 4),
    ] {
        let mut profiles = vec![
            (format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m}"), 32usize),
            (format!("plugin=isa,technique=reed_sol_van,k={k},m={m}"), 32),
            (format!("plugin=isa,technique=cauchy,k={k},m={m}"), 32),
            (format!("plugin=jerasure,technique=cauchy_orig,k={k},m={m},packetsize=8"), 256),
            (format!("plugin=jerasure,technique=cauchy_good,k={k},m={m},packetsize=8"), 256),
            (format!("plugin=jerasure,technique=cauchy_good,k={k},m={m},packetsize=32"), 1024),
            (
                format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m},jerasure-per-chunk-alignment=true"),
                128,
            ),
            (format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m},w=16"), 64),
            (format!("plugin=jerasure,technique=reed_sol_van,k={k},m={m},w=32"), 128),
        ];
        if m == 2 {
            profiles.push((
                format!("plugin=jerasure,technique=reed_sol_r6_op,k={k},m=2"),
                32,
            ));
            profiles.push((
                format!("plugin=jerasure,technique=reed_sol_r6_op,k={k},m=2,w=32"),
                128,
            ));
        }
        for (profile, unit) in profiles {
            for (mult, extra) in [(1usize, 0usize), (4, 1), (32, 0)] {
                let su = unit * mult;
                // Object sizes that are not multiples of the stripe width.
                let len = k * su * 3 + su / 2 + 7 + extra;
                compare_encode(&tool, dir.path(), &profile, su, len, seed);
                seed += 1;
                cases += 1;
            }
        }
    }
    assert!(cases > 200);
}

#[test]
fn chunk_size_matches_ceph() {
    let tool = tool_path();
    for profile in [
        "plugin=isa,k=3,m=2",
        "plugin=isa,technique=cauchy,k=5,m=3",
        "plugin=jerasure,technique=reed_sol_van,k=3,m=2",
        "plugin=jerasure,technique=reed_sol_van,k=6,m=3,jerasure-per-chunk-alignment=true",
        "plugin=jerasure,technique=reed_sol_r6_op,k=7,m=2",
        "plugin=jerasure,technique=reed_sol_van,k=5,m=2,w=16",
        "plugin=jerasure,technique=reed_sol_r6_op,k=4,m=2,jerasure-per-chunk-alignment=true",
        "plugin=jerasure,technique=reed_sol_r6_op,k=6,m=2,w=32,jerasure-per-chunk-alignment=true",
        "plugin=jerasure,technique=cauchy_good,k=4,m=2,packetsize=8",
        "plugin=jerasure,technique=cauchy_orig,k=5,m=3,packetsize=24",
        "plugin=jerasure,technique=cauchy_good,k=5,m=3,packetsize=2048,jerasure-per-chunk-alignment=true",
    ] {
        let p = Profile::parse(profile).unwrap();
        for size in [1usize, 100, 4096, 10000, 65536, 1 << 20, 4_000_001] {
            if p.per_chunk_alignment && size.div_ceil(p.k) < p.alignment() {
                // Ceph asserts alignment <= chunk size here and aborts.
                continue;
            }
            let out = Command::new(&tool)
                .args(["calc-chunk-size", profile, &size.to_string()])
                .output()
                .unwrap();
            assert!(out.status.success(), "{profile} {size}");
            let theirs: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
            assert_eq!(p.chunk_size(size), theirs, "{profile} object size {size}");
        }
    }
}

/// Every erasure pattern of 1..=m shards: our decode and Ceph's decode of
/// the same surviving shards both give back the (padded) object.
#[test]
fn decode_every_erasure_pattern() {
    let tool = tool_path();
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 1000u64;
    for (profile, su) in [
        ("plugin=jerasure,technique=reed_sol_van,k=4,m=3", 64usize),
        ("plugin=isa,technique=reed_sol_van,k=6,m=4", 96),
        ("plugin=isa,technique=cauchy,k=5,m=3", 32),
        (
            "plugin=jerasure,technique=cauchy_good,k=4,m=3,packetsize=8",
            256,
        ),
        ("plugin=jerasure,technique=reed_sol_r6_op,k=5,m=2", 32),
        ("plugin=jerasure,technique=reed_sol_van,k=5,m=3,w=16", 64),
        ("plugin=jerasure,technique=reed_sol_van,k=4,m=3,w=32", 128),
        ("plugin=jerasure,technique=reed_sol_van,k=8,m=4", 128),
    ] {
        let p = Profile::parse(profile).unwrap();
        let (k, n) = (p.k, p.chunk_count());
        let len = k * su * 2 + 5;
        let shards = compare_encode(&tool, dir.path(), profile, su, len, seed);
        let fname = dir.path().join(format!("obj{seed}"));
        let original = random(len, seed);
        let codec = Codec::new(&p).unwrap();
        // The other engines, each with a plan cache smaller than the
        // number of patterns, so plans are evicted and made again.
        let others: Vec<Codec> = ENGINES[1..]
            .iter()
            .map(|&e| engine_codec(&p, e).with_plan_cache(3))
            .collect();
        // Ceph's tool is slow: compare its decode on every third pattern
        // (every ninth for the larger profiles).
        let every = if n > 10 { 9 } else { 3 };
        let mut patterns = 0;
        for mask in 1u32..(1 << n) {
            let lost = mask.count_ones() as usize;
            if lost > p.m {
                continue;
            }
            let avail: Vec<Option<Vec<u8>>> = (0..n)
                .map(|i| (mask & (1 << i) == 0).then(|| shards[i].clone()))
                .collect();
            let ours = stripe::decode_object(&codec, su, &avail).unwrap();
            assert_eq!(&ours[..len], &original[..], "{profile} lost {mask:b}");
            assert!(ours[len..].iter().all(|&b| b == 0));
            // The full decode (missing parity too) agrees with the shards.
            let mut chunks = avail.clone();
            codec.decode(&mut chunks).unwrap();
            for i in 0..n {
                assert!(
                    chunks[i].as_ref() == Some(&shards[i]),
                    "{profile} lost {mask:b}: chunk {i}"
                );
            }
            // reconstruct (the allocation-free path) with every engine:
            // the lost chunks from the first k survivors, stripe by stripe.
            let have: Vec<usize> = (0..n).filter(|i| mask & (1 << i) == 0).take(k).collect();
            let lost_ids: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            for c in &others {
                let mut outs = vec![vec![0u8; su]; lost_ids.len()];
                for s in 0..shards[0].len() / su {
                    let r = s * su..(s + 1) * su;
                    let srcs: Vec<&[u8]> = have.iter().map(|&i| &shards[i][r.clone()]).collect();
                    let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                    c.reconstruct(&have, &srcs, &lost_ids, &mut o).unwrap();
                    for (v, &i) in outs.iter().zip(&lost_ids) {
                        assert!(
                            v[..] == shards[i][r.clone()],
                            "{profile} lost {mask:b}: {} chunk {i} stripe {s}",
                            c.kernel()
                        );
                    }
                }
                assert!(c.cached_plans() <= 3);
            }
            // Ceph's decode of the same survivors (fewer patterns: it is slow).
            if patterns % every == 0 {
                let want: Vec<String> = (0..n)
                    .filter(|i| mask & (1 << i) == 0)
                    .map(|i| i.to_string())
                    .collect();
                let out = dir.path().join("dec");
                for i in 0..n {
                    let _ = std::fs::remove_file(format!("{}.{i}", out.display()));
                    if mask & (1 << i) == 0 {
                        std::fs::copy(
                            format!("{}.{i}", fname.display()),
                            format!("{}.{i}", out.display()),
                        )
                        .unwrap();
                    }
                }
                run_tool(
                    &tool,
                    &[
                        "decode",
                        profile,
                        &su.to_string(),
                        &want.join(","),
                        out.to_str().unwrap(),
                    ],
                );
                let theirs = std::fs::read(&out).unwrap();
                assert!(
                    theirs == ours,
                    "{profile} lost {mask:b}: Ceph's decode differs"
                );
            }
            patterns += 1;
        }
        assert!(patterns >= n, "{profile}");
        seed += 1;
    }
}
