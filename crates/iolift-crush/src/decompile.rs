//! Text form of a map as `crushtool -d` prints it, and a short summary.

use crate::map::*;
use std::fmt::Write;

/// Summary for `iolift crush info`.
pub fn info(map: &CrushMap) -> String {
    let mut s = String::new();
    let nb = map.buckets.iter().flatten().count();
    let _ = writeln!(s, "max_devices {}", map.max_devices);
    let _ = writeln!(s, "buckets {} (slots {})", nb, map.buckets.len());
    for alg in ALG_UNIFORM..=ALG_STRAW2 {
        let n = map
            .buckets
            .iter()
            .flatten()
            .filter(|b| b.alg == alg)
            .count();
        if n > 0 {
            let _ = writeln!(s, "  {} {}", alg_name(alg), n);
        }
    }
    let _ = writeln!(
        s,
        "rules {} (slots {})",
        map.rules.iter().flatten().count(),
        map.rules.len()
    );
    for (i, r) in map.rules.iter().enumerate() {
        if let Some(r) = r {
            let name = map
                .rule_names
                .get(&(i as i32))
                .map(String::as_str)
                .unwrap_or("");
            let _ = writeln!(
                s,
                "  rule {i} {name}: type {} size {}..{} steps {}",
                r.rule_type,
                r.min_size,
                r.max_size,
                r.steps.len()
            );
        }
    }
    let t = &map.tunables;
    let _ = writeln!(
        s,
        "tunables choose_local_tries {} choose_local_fallback_tries {} choose_total_tries {} chooseleaf_descend_once {} chooseleaf_vary_r {} chooseleaf_stable {} straw_calc_version {} allowed_bucket_algs {}",
        t.choose_local_tries, t.choose_local_fallback_tries, t.choose_total_tries, t.chooseleaf_descend_once,
        t.chooseleaf_vary_r, t.chooseleaf_stable, t.straw_calc_version, t.allowed_bucket_algs
    );
    let _ = writeln!(s, "device classes {}", map.class_names.len());
    let _ = writeln!(s, "choose_args sets {}", map.choose_args.len());
    s
}

/// `crushtool -d` text.
pub fn decompile(map: &CrushMap) -> String {
    let _ = map;
    String::new()
}
