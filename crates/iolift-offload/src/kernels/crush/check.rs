//! Device == CPU mapper checks.
//!
//! `verify_test_range` (`iolift crush test --device gpu`): the inputs
//! `crushtool --test` would map (same rule / ruleset / numrep / x / pool-id
//! selection as `iolift_crush::tester::run_test`) are mapped on the device
//! and compared with the CPU mapper; the report is then printed by the
//! tester, so the output is crushtool's, from results the device reproduced
//! bit for bit.
//!
//! `check_maps` (`iolift crush check`, scripts/gpu-check.sh): every rule of
//! every map at sizes 1, 3 and 6, on the crushtool x range and on random x.

use super::bench::{first_mismatch, random_inputs};
use super::{map, Inputs, MapHandle};
use crate::device::{self, Device};
use crate::error::{OffloadError, Result};
use iolift_crush::hash::hash32_2;
use iolift_crush::tester::{test_weights, TestOptions};
use iolift_crush::CrushMap;
use std::time::Instant;

/// Map every (rule, numrep, x) of `o` on `dev` and on the CPU mapper;
/// Ok(number of mappings compared) or an error naming the first difference.
pub fn verify_test_range(dev: &dyn Device, map: &CrushMap, o: &TestOptions) -> Result<u64> {
    let (min_rule, max_rule) = o.rule_range(map);
    let (min_x, max_x) = o.x_range();
    let weight = test_weights(map, &o.weights);
    let h = MapHandle::new(map.clone(), Some(0))?;
    let cpu = device::cpu(0)?;
    let mut compared = 0u64;
    const CHUNK: i64 = 1 << 20;
    let mut r = min_rule;
    while r < map.max_rules() && r <= max_rule {
        let Some(rule) = map.rule(r) else {
            r += 1;
            continue;
        };
        if o.ruleset >= 0 && rule.ruleset as i32 != o.ruleset {
            r += 1;
            continue;
        }
        let (mut minr, mut maxr) = (o.min_rep, o.max_rep);
        if minr < 0 || maxr < 0 {
            minr = rule.min_size as i32;
            maxr = rule.max_size as i32;
        }
        for nr in minr..=maxr {
            let nru = nr.max(0) as usize;
            let mut start = min_x as i64;
            while start <= max_x as i64 {
                let end = (start + CHUNK - 1).min(max_x as i64);
                let xs: Vec<i32> = (start..=end)
                    .map(|x| {
                        if o.pool_id != -1 {
                            hash32_2(x as u32, o.pool_id as u32) as i32
                        } else {
                            x as i32
                        }
                    })
                    .collect();
                let a = super::map(dev, &h, r, Inputs::Xs(&xs), nru, &weight)?;
                let b = super::map(&*cpu, &h, r, Inputs::Xs(&xs), nru, &weight)?;
                if let Some(i) = first_mismatch(&a, &b) {
                    return Err(OffloadError::Invalid(format!(
                        "{} differs from the CPU mapper: rule {r} numrep {nr} x {}: {:?} vs {:?}",
                        dev.name(),
                        start + i as i64,
                        a.row(i),
                        b.row(i)
                    )));
                }
                compared += xs.len() as u64;
                start = end + 1;
            }
        }
        r += 1;
    }
    Ok(compared)
}

/// Device vs CPU mapper on every rule of every map: x = 0..1023 (the
/// crushtool range) for sizes 1, 3 and 6, plus `random` random inputs per
/// map, split evenly over its (rule, size) pairs. Prints one line per map
/// and a summary; an error when any comparison differs.
pub fn check_maps(
    dev: &dyn Device,
    maps: Vec<(String, iolift_crush::CrushMap)>,
    random: usize,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    let io = |e: std::io::Error| OffloadError::Invalid(format!("write: {e}"));
    let cpu = device::cpu(0)?;
    let mut bad = 0usize;
    let mut total = 0usize;
    let mut fallbacks = 0usize;
    if dev.is_gpu() {
        writeln!(out, "crush thread kernel: {}", super::thread_kernel_name()).map_err(io)?;
    }
    for (name, m) in maps {
        let weights = vec![0x10000u32; m.max_devices.max(0) as usize];
        let h = MapHandle::new(m, Some(0))?;
        let rules: Vec<i32> = (0..h.map.max_rules())
            .filter(|&r| h.map.rule(r).is_some())
            .collect();
        let sizes = [1usize, 3, 6];
        let per = random / (rules.len() * sizes.len()).max(1);
        let mut map_n = 0usize;
        let mut map_t = 0f64;
        for &rule in &rules {
            for size in sizes {
                let seed = (rule as u64) << 8 | size as u64;
                for xs in [(0..1024).collect::<Vec<i32>>(), random_inputs(per, seed)] {
                    let t = Instant::now();
                    let g = map(dev, &h, rule, Inputs::Xs(&xs), size, &weights)?;
                    map_t += t.elapsed().as_secs_f64();
                    map_n += xs.len();
                    fallbacks += g.fallbacks;
                    let c = map(&*cpu, &h, rule, Inputs::Xs(&xs), size, &weights)?;
                    if let Some(i) = first_mismatch(&g, &c) {
                        bad += 1;
                        writeln!(
                            out,
                            "MISMATCH {name} rule {rule} size {size} x={}: device {:?} cpu {:?}",
                            xs[i],
                            g.row(i),
                            c.row(i)
                        )
                        .map_err(io)?;
                    }
                }
            }
        }
        total += map_n;
        writeln!(
            out,
            "{name}: {} rules x sizes {sizes:?}, {map_n} inputs: {} ({:.3e} mappings/s on {})",
            rules.len(),
            if bad == 0 {
                "identical so far"
            } else {
                "MISMATCHES"
            },
            map_n as f64 / map_t,
            dev.name()
        )
        .map_err(io)?;
    }
    writeln!(
        out,
        "{total} inputs compared, {fallbacks} mapped by the host fallback"
    )
    .map_err(io)?;
    if bad > 0 {
        return Err(OffloadError::Invalid(format!("{bad} comparisons differ")));
    }
    writeln!(out, "all comparisons identical").map_err(io)?;
    Ok(())
}
