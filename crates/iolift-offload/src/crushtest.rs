//! `iolift crush test --device gpu`: the inputs `crushtool --test` would map
//! (same rule / ruleset / numrep / x / pool-id selection as
//! `iolift_crush::tester::run_test`) are mapped on the device and compared
//! with the CPU mapper; the report is then printed by the tester, so the
//! output is crushtool's, from results the device reproduced bit for bit.

use crate::device::{Device, Inputs, MapHandle};
use crate::error::{OffloadError, Result};
use iolift_crush::hash::hash32_2;
use iolift_crush::tester::{test_weights, TestOptions};
use iolift_crush::CrushMap;

/// Map every (rule, numrep, x) of `o` on `dev` and on the CPU mapper;
/// Ok(number of mappings compared) or an error naming the first difference.
pub fn verify_test_range(dev: &Device, map: &CrushMap, o: &TestOptions) -> Result<u64> {
    let (mut min_rule, mut max_rule) = (o.min_rule, o.max_rule);
    if min_rule < 0 || max_rule < 0 {
        min_rule = 0;
        max_rule = map.max_rules() - 1;
    }
    let (mut min_x, mut max_x) = (o.min_x, o.max_x);
    if min_x < 0 || max_x < 0 {
        min_x = 0;
        max_x = 1023;
    }
    let weight = test_weights(map, &o.weights);
    let h = MapHandle::new(map.clone(), Some(0))?;
    let cpu = Device::cpu(0)?;
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
                let a = dev.map(&h, r, Inputs::Xs(&xs), nru, &weight)?;
                let b = cpu.map(&h, r, Inputs::Xs(&xs), nru, &weight)?;
                if let Some(i) = crate::bench::first_mismatch(&a, &b) {
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
