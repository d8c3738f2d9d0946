//! `crushtool --test` re-implementation: same inputs, same text. crushtool
//! prints the report on stdout and the device weights line of
//! `--show-utilization-all` on stderr; [`run_test`] takes a writer for each.

use crate::map::*;
use crate::mapper::map_batch;
use crate::{CrushError, Result};
use std::collections::BTreeMap;
use std::io::Write;

/// Options mirroring crushtool's `--test` flags.
#[derive(Debug, Clone)]
pub struct TestOptions {
    pub min_x: i32,
    pub max_x: i32,
    pub min_rule: i32,
    pub max_rule: i32,
    pub ruleset: i32,
    pub min_rep: i32,
    pub max_rep: i32,
    pub pool_id: i32,
    /// `--weight DEV W` in command-line order.
    pub weights: Vec<(i32, f32)>,
    pub show_mappings: bool,
    pub show_bad_mappings: bool,
    pub show_statistics: bool,
    pub show_utilization: bool,
    pub show_utilization_all: bool,
}

impl TestOptions {
    /// The rules to test, as crushtool takes them: every rule of `map`
    /// unless both bounds are given.
    pub fn rule_range(&self, map: &CrushMap) -> (i32, i32) {
        if self.min_rule < 0 || self.max_rule < 0 {
            (0, map.max_rules() - 1)
        } else {
            (self.min_rule, self.max_rule)
        }
    }

    /// The inputs to test: 0..=1023 unless both bounds are given.
    pub fn x_range(&self) -> (i32, i32) {
        if self.min_x < 0 || self.max_x < 0 {
            (0, 1023)
        } else {
            (self.min_x, self.max_x)
        }
    }
}

impl Default for TestOptions {
    fn default() -> Self {
        TestOptions {
            min_x: -1,
            max_x: -1,
            min_rule: -1,
            max_rule: -1,
            ruleset: -1,
            min_rep: -1,
            max_rep: -1,
            pool_id: -1,
            weights: Vec::new(),
            show_mappings: false,
            show_bad_mappings: false,
            show_statistics: false,
            show_utilization: false,
            show_utilization_all: false,
        }
    }
}

/// Format like C++ `ostream << double` with default flags (`%g`, precision 6).
pub fn fmt_g(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    if !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let e = format!("{:.5e}", v);
    let (mant, exp) = e.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("exponent");
    if !(-4..6).contains(&exp) {
        let mut m = mant.to_string();
        if m.contains('.') {
            m = m.trim_end_matches('0').trim_end_matches('.').to_string();
        }
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        let mut s = format!("{:.*}", decimals, v);
        if s.contains('.') {
            s = s.trim_end_matches('0').trim_end_matches('.').to_string();
        }
        s
    }
}

fn fmt_vec(out: &mut Vec<u8>, v: &[i32]) {
    out.push(b'[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = write!(out, "{x}");
    }
    out.push(b']');
}

/// `CrushTester::get_maximum_affected_by_rule`.
fn max_affected_by_rule(map: &CrushMap, rule: &Rule) -> i32 {
    let mut affected = Vec::new();
    let mut repl: BTreeMap<i32, i32> = BTreeMap::new();
    for s in &rule.steps {
        if s.op >= 2 && s.op != 4 {
            affected.push(s.arg2);
            repl.insert(s.arg2, s.arg1);
        }
    }
    let mut max_of_type: BTreeMap<i32, i32> = BTreeMap::new();
    for &t in &affected {
        for &id in map.names.keys() {
            if map.bucket_type(id) == t {
                *max_of_type.entry(t).or_insert(0) += 1;
            }
        }
    }
    for &t in &affected {
        let r = repl.get(&t).copied().unwrap_or(0);
        let m = max_of_type.entry(t).or_insert(0);
        if r > 0 && r < *m {
            *m = r;
        }
    }
    let mut max_affected = map.max_buckets().max(map.max_devices);
    for &t in &affected {
        let m = max_of_type.get(&t).copied().unwrap_or(0);
        if m > 0 && m < max_affected {
            max_affected = m;
        }
    }
    max_affected
}

/// Device reweight vector as crushtool builds it.
pub fn test_weights(map: &CrushMap, opts: &[(i32, f32)]) -> Vec<u32> {
    let mut dw: BTreeMap<i32, u32> = BTreeMap::new();
    for &(dev, f) in opts {
        let w = (f * 65536.0) as i32;
        dw.insert(dev, w.clamp(0, 0x10000) as u32);
    }
    let present = map.present_devices();
    (0..map.max_devices.max(0))
        .map(|o| match dw.get(&o) {
            Some(&w) => w,
            None if present[o as usize] => 0x10000,
            None => 0,
        })
        .collect()
}

/// Run the test and write crushtool's text to `out`. `progress` is called
/// with the number of mappings done so far (for a progress bar).
pub fn run_test(
    map: &CrushMap,
    o: &TestOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    let io = |e: std::io::Error| CrushError::Invalid(format!("write failed: {e}"));
    let (min_rule, max_rule) = o.rule_range(map);
    let (min_x, max_x) = o.x_range();
    // crushtool: either utilization flag turns the statistics on.
    let stats = o.show_statistics || o.show_utilization || o.show_utilization_all;
    let weight = test_weights(map, &o.weights);
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    if o.show_utilization_all {
        // crushtool writes this one line to stderr.
        let mut line = Vec::with_capacity(8 * weight.len() + 32);
        line.extend_from_slice(b"devices weights (hex): [");
        for (i, w) in weight.iter().enumerate() {
            if i > 0 {
                line.push(b',');
            }
            let _ = write!(line, "{w:x}");
        }
        line.extend_from_slice(b"]\n");
        err.write_all(&line).map_err(io)?;
    }
    let cargs = map.choose_args_for(0);
    let ndev = weight.len();
    let mut done: u64 = 0;
    let mut r = min_rule;
    while r < map.max_rules() && r <= max_rule {
        let Some(rule) = map.rule(r) else {
            if stats {
                let _ = writeln!(buf, "rule {r} dne");
            }
            r += 1;
            continue;
        };
        if o.ruleset >= 0 && rule.ruleset as i32 != o.ruleset {
            r += 1;
            continue;
        }
        let rname = map.rule_names.get(&r).map(String::as_str).unwrap_or("");
        let (mut minr, mut maxr) = (o.min_rep, o.max_rep);
        if minr < 0 || maxr < 0 {
            minr = rule.min_size as i32;
            maxr = rule.max_size as i32;
        }
        if stats {
            let _ = writeln!(
                buf,
                "rule {r} ({rname}), x = {min_x}..{max_x}, numrep = {minr}..{maxr}"
            );
        }
        for nr in minr..=maxr {
            let mut per = vec![0i64; ndev];
            let mut sizes: BTreeMap<usize, i64> = BTreeMap::new();
            let num_objects = (max_x as i64 - min_x as i64) + 1;
            let total_weight: i32 = weight.iter().fold(0i32, |a, &w| a.wrapping_add(w as i32));
            if total_weight == 0 {
                continue;
            }
            let maxaff = max_affected_by_rule(map, rule);
            let expected_objects = (nr.min(maxaff) as i64 * num_objects) as i32 as f32;
            let expected: Vec<f32> = weight
                .iter()
                .map(|&w| (w as f32 / total_weight as f32) * expected_objects)
                .collect();
            let nru = nr.max(0) as usize;
            // Mapped in chunks; no bigger than the range (small runs).
            let chunk: i64 = (1i64 << 16).min(num_objects.max(1));
            let mut xs: Vec<i32> = Vec::with_capacity(chunk as usize);
            let mut res = vec![0i32; chunk as usize * nru];
            let mut lens = vec![0u32; chunk as usize];
            let mut start = min_x as i64;
            while start <= max_x as i64 {
                let end = (start + chunk - 1).min(max_x as i64);
                let n = (end - start + 1) as usize;
                xs.clear();
                xs.extend((start..=end).map(|x| {
                    if o.pool_id != -1 {
                        crate::hash::hash32_2(x as u32, o.pool_id as u32) as i32
                    } else {
                        x as i32
                    }
                }));
                map_batch(
                    map,
                    r,
                    &xs,
                    nru,
                    &weight,
                    cargs,
                    &mut res[..n * nru],
                    &mut lens[..n],
                );
                for i in 0..n {
                    let x = start + i as i64;
                    let row = &res[i * nru..i * nru + lens[i] as usize];
                    if o.show_mappings {
                        let _ = write!(buf, "CRUSH rule {r} x {x} ");
                        fmt_vec(&mut buf, row);
                        buf.push(b'\n');
                    }
                    let mut has_none = false;
                    for &it in row {
                        if it != ITEM_NONE {
                            if it >= 0 && (it as usize) < ndev {
                                per[it as usize] += 1;
                            }
                        } else {
                            has_none = true;
                        }
                    }
                    *sizes.entry(row.len()).or_insert(0) += 1;
                    if o.show_bad_mappings && (row.len() != nr as usize || has_none) {
                        let _ = write!(buf, "bad mapping rule {r} x {x} num_rep {nr} result ");
                        fmt_vec(&mut buf, row);
                        buf.push(b'\n');
                    }
                    if buf.len() > (1 << 20) {
                        out.write_all(&buf).map_err(io)?;
                        buf.clear();
                    }
                }
                done += n as u64;
                progress(done);
                start = end + 1;
            }
            if o.show_utilization && !stats {
                for (i, p) in per.iter().enumerate() {
                    let _ = writeln!(buf, "  device {i}:\t{p}");
                }
            }
            if stats {
                for (sz, cnt) in &sizes {
                    let _ = writeln!(
                        buf,
                        "rule {r} ({rname}) num_rep {nr} result size == {sz}:\t{cnt}/{}",
                        max_x as i64 - min_x as i64 + 1
                    );
                }
                for i in 0..ndev {
                    let e = fmt_g(expected[i] as f64);
                    if o.show_utilization {
                        if expected[i] > 0.0 && per[i] > 0 {
                            let _ = writeln!(
                                buf,
                                "  device {i}:\t\t stored : {}\t expected : {e}",
                                per[i]
                            );
                        }
                    } else if o.show_utilization_all {
                        let _ = writeln!(
                            buf,
                            "  device {i}:\t\t stored : {}\t expected : {e}",
                            per[i]
                        );
                    }
                }
            }
        }
        r += 1;
    }
    out.write_all(&buf).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fmt_g;

    #[test]
    fn g_format() {
        assert_eq!(fmt_g(1.5), "1.5");
        assert_eq!(fmt_g(256.0), "256");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(0.0001), "0.0001");
        assert_eq!(fmt_g(0.00001), "1e-05");
        assert_eq!(fmt_g(85.33333), "85.3333");
        assert_eq!(fmt_g(100000.0), "100000");
    }
}
