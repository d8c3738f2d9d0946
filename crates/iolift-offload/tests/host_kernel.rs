//! kernels/crush.cu, compiled by the host C++ compiler with its CUDA shims,
//! against the Rust CPU mapper (iolift-crush) on a crushtool-generated
//! corpus: every bucket algorithm, tunables profile, rule shape, reweight
//! pattern, choose_args; x = 0..N and random x. The throughput kernel runs
//! exactly as its grid would (block/thread indices emulated), the latency
//! kernel with its warp emulated (32 lanes and 4 lanes).

mod common;
use common::*;
use iolift_crush::{do_rule, Workspace};
use iolift_offload::kernels::crush::bench::random_inputs;
use iolift_offload::kernels::crush::flat::{FlatMap, LEN_FALLBACK};
use iolift_offload::kernels::crush::synth::straw2_map;
use iolift_osdmap::placement::{pg_mask, pg_to_pps, Pool};

fn inputs() -> Vec<i32> {
    let n: usize = std::env::var("IOLIFT_OFFLOAD_CHECK_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut xs: Vec<i32> = (0..n as i32).collect();
    xs.extend(random_inputs(n, 42));
    xs.extend([i32::MAX, i32::MIN, -1, 2147483646]);
    xs
}

struct Tally {
    rows: usize,
    fallbacks: usize,
}

/// Compare kernel output rows with do_rule; fallback rows are counted.
#[allow(clippy::too_many_arguments)]
fn compare(
    what: &str,
    map: &iolift_crush::CrushMap,
    ca: Option<&iolift_crush::map::ChooseArgMap>,
    rule: i32,
    xs: &[i32],
    rm: usize,
    w: &[u32],
    out: &[i32],
    lens: &[u32],
    t: &mut Tally,
) {
    let mut ws = Workspace::new(map, rm);
    let mut row = vec![0i32; rm];
    for (i, &x) in xs.iter().enumerate() {
        t.rows += 1;
        if lens[i] == LEN_FALLBACK {
            t.fallbacks += 1;
            continue;
        }
        let n = do_rule(map, rule, x, &mut row, w, &mut ws, ca);
        let got = &out[i * rm..i * rm + lens[i] as usize];
        assert_eq!(
            got,
            &row[..n],
            "{what}: rule {rule} result_max {rm} x {x} (weights len {})",
            w.len()
        );
    }
}

#[test]
fn host_kernel_matches_cpu_mapper_on_corpus() {
    let k = host_kernel();
    let dir = tempfile::tempdir().unwrap();
    let xs = inputs();
    let mut t = Tally {
        rows: 0,
        fallbacks: 0,
    };
    let mut maps = 0;
    for (name, spec) in corpus_specs() {
        let map = compile_text(dir.path(), &name, &text_map(&spec));
        maps += 1;
        // crushtool --test uses choose_args set 0 (then -1).
        let ca = map.choose_args_for(0).cloned();
        assert_eq!(
            spec.choose_args,
            ca.is_some(),
            "{name}: choose_args decoded"
        );
        let flat = FlatMap::new(&map, ca.as_ref()).unwrap();
        for (wi, w) in weight_sets(map.max_devices as usize, spec.seed)
            .iter()
            .enumerate()
        {
            for rule in 0..map.max_rules() {
                for rm in [1usize, 3, 5] {
                    // keep the debug-build run short: full inputs on one weight set
                    let xs = if wi == 0 {
                        &xs[..]
                    } else {
                        &xs[..xs.len() / 4]
                    };
                    let (out, lens) = k.run_thread(&flat, w, rule, Some(xs), xs.len(), rm, None);
                    compare(
                        &format!("{name} thread"),
                        &map,
                        ca.as_ref(),
                        rule,
                        xs,
                        rm,
                        w,
                        &out,
                        &lens,
                        &mut t,
                    );
                    let sub = &xs[..xs.len() / 3];
                    for lanes in [32, 4] {
                        let (out, lens) = k.run_warp(&flat, w, rule, sub, rm, lanes);
                        compare(
                            &format!("{name} warp{lanes}"),
                            &map,
                            ca.as_ref(),
                            rule,
                            sub,
                            rm,
                            w,
                            &out,
                            &lens,
                            &mut t,
                        );
                    }
                    let g = &sub[..sub.len().min(20)];
                    let (out, lens) = k.run_warp_grid(&flat, w, rule, g, rm);
                    compare(
                        &format!("{name} warp grid"),
                        &map,
                        ca.as_ref(),
                        rule,
                        g,
                        rm,
                        w,
                        &out,
                        &lens,
                        &mut t,
                    );
                }
            }
        }
    }
    eprintln!(
        "host kernel == CPU mapper: {maps} maps, {} rows, {} handed back to the host",
        t.rows, t.fallbacks
    );
    assert!(maps >= 15);
    // Hand-backs exist only for long uniform-bucket permutations; they must stay rare.
    assert!(
        t.fallbacks * 100 <= t.rows,
        "{} of {} rows fell back",
        t.fallbacks,
        t.rows
    );
}

#[test]
fn host_kernel_matches_cpu_mapper_on_straw2_1000() {
    let k = host_kernel();
    let map = straw2_map(1000, 10, 10);
    let flat = FlatMap::new(&map, None).unwrap();
    let xs = random_inputs(2000, 7);
    let mut t = Tally {
        rows: 0,
        fallbacks: 0,
    };
    for w in weight_sets(1000, 3) {
        for rule in [0, 1] {
            for rm in [3usize, 6] {
                let (out, lens) = k.run_thread(&flat, &w, rule, Some(&xs), xs.len(), rm, None);
                compare(
                    "straw2-1000 thread",
                    &map,
                    None,
                    rule,
                    &xs,
                    rm,
                    &w,
                    &out,
                    &lens,
                    &mut t,
                );
                let (out, lens) = k.run_warp(&flat, &w, rule, &xs[..300], rm, 32);
                compare(
                    "straw2-1000 warp",
                    &map,
                    None,
                    rule,
                    &xs[..300],
                    rm,
                    &w,
                    &out,
                    &lens,
                    &mut t,
                );
                let (out, lens) = k.run_warp_grid(&flat, &w, rule, &xs[..40], rm);
                compare(
                    "straw2-1000 warp grid",
                    &map,
                    None,
                    rule,
                    &xs[..40],
                    rm,
                    &w,
                    &out,
                    &lens,
                    &mut t,
                );
            }
        }
    }
    assert_eq!(t.fallbacks, 0, "straw2 maps never need the host");
}

/// Pool mode: the kernel derives x = pps(ps) itself; compare with
/// iolift-osdmap's placement functions.
#[test]
fn host_kernel_pool_mode_matches_placement() {
    let k = host_kernel();
    let map = straw2_map(200, 5, 4);
    let flat = FlatMap::new(&map, None).unwrap();
    let w = vec![0x10000u32; 200];
    for (pg_num, pgp_num, hashpspool, id) in [
        (1000u32, 1000u32, true, 3i64),
        (4096, 2000, false, 7),
        (777, 512, true, 1),
    ] {
        let pool = Pool {
            id,
            pg_num,
            pgp_num,
            hashpspool,
        };
        let pa = PoolArgs {
            pgp_num,
            pgp_mask: pg_mask(pgp_num),
            pool_id: id as u32,
            hashpspool,
        };
        for (rule, rm) in [(0, 3usize), (1, 6)] {
            let (out, lens) = k.run_thread(&flat, &w, rule, None, pg_num as usize, rm, Some(pa));
            let mut ws = Workspace::new(&map, rm);
            let mut row = vec![0; rm];
            for ps in 0..pg_num {
                let x = pg_to_pps(&pool, ps) as i32;
                let n = do_rule(&map, rule, x, &mut row, &w, &mut ws, None);
                let i = ps as usize;
                assert_eq!(
                    &out[i * rm..i * rm + lens[i] as usize],
                    &row[..n],
                    "pool {id} ps {ps}"
                );
            }
        }
    }
}

/// Bad input to the kernel: a rule that does not exist maps to nothing
/// (like Ceph), a result size past the kernel bound is handed back.
#[test]
fn host_kernel_edge_cases() {
    let k = host_kernel();
    let map = straw2_map(50, 5, 2);
    let flat = FlatMap::new(&map, None).unwrap();
    let w = vec![0x10000u32; 50];
    let xs: Vec<i32> = (0..10).collect();
    let (_, lens) = k.run_thread(&flat, &w, 99, Some(&xs), xs.len(), 3, None);
    assert!(lens.iter().all(|&l| l == 0));
    let (_, lens) = k.run_thread(&flat, &w, -1, Some(&xs), xs.len(), 3, None);
    assert!(lens.iter().all(|&l| l == 0));
    let (_, lens) = k.run_thread(&flat, &w, 0, Some(&xs), xs.len(), 33, None);
    assert!(lens.iter().all(|&l| l == LEN_FALLBACK));
    // empty reweight vector: every device is out
    let (_, lens) = k.run_thread(&flat, &[], 0, Some(&xs), xs.len(), 3, None);
    let mut ws = Workspace::new(&map, 3);
    let mut row = [0; 3];
    for (i, &x) in xs.iter().enumerate() {
        assert_eq!(
            lens[i] as usize,
            do_rule(&map, 0, x, &mut row, &[], &mut ws, None)
        );
    }
}

/// Writes the corpus as binary maps (crushtool -c output) to
/// `IOLIFT_CORPUS_OUT` (default tests/maps) for scripts/gpu-check.sh on
/// machines without crushtool. Run: cargo test --test host_kernel write_corpus -- --ignored
#[test]
#[ignore]
fn write_corpus() {
    let out = std::env::var("IOLIFT_CORPUS_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/maps"));
    std::fs::create_dir_all(&out).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, spec) in corpus_specs() {
        let map = compile_text(dir.path(), &name, &text_map(&spec));
        std::fs::copy(
            dir.path().join(format!("{name}.bin")),
            out.join(format!("{name}.bin")),
        )
        .unwrap();
        assert_eq!(
            iolift_crush::decode(&std::fs::read(out.join(format!("{name}.bin"))).unwrap()).unwrap(),
            map
        );
    }
}

/// The committed corpus (tests/maps, used by scripts/gpu-check.sh where
/// crushtool is missing) still decodes and maps identically.
#[test]
fn committed_corpus_maps_match() {
    let k = host_kernel();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/maps");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let map = iolift_crush::decode(&std::fs::read(&p).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let ca = map.choose_args_for(0).cloned();
        let flat = FlatMap::new(&map, ca.as_ref()).unwrap();
        let w = vec![0x10000u32; map.max_devices as usize];
        let xs: Vec<i32> = (0..100).collect();
        let mut t = Tally {
            rows: 0,
            fallbacks: 0,
        };
        for rule in 0..map.max_rules() {
            let (out, lens) = k.run_thread(&flat, &w, rule, Some(&xs), xs.len(), 3, None);
            compare(
                &p.display().to_string(),
                &map,
                ca.as_ref(),
                rule,
                &xs,
                3,
                &w,
                &out,
                &lens,
                &mut t,
            );
        }
        n += 1;
    }
    assert!(n >= 15, "only {n} maps in {}", dir.display());
}
