//! Shared helpers: run crushtool, generate text maps, compare outputs.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Path to crushtool; panics (test failure, not a skip) when missing.
pub fn crushtool() -> &'static str {
    let ok = Command::new("crushtool").arg("--version").output().is_ok();
    assert!(
        ok,
        "crushtool not found: install ceph-common (the test script does)"
    );
    "crushtool"
}

pub fn run_crushtool(args: &[&str]) -> Vec<u8> {
    let out = Command::new(crushtool())
        .args(args)
        .output()
        .expect("run crushtool");
    assert!(
        out.status.success(),
        "crushtool {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    // crushtool --test writes its report to stdout in 16.2; keep stderr too.
    let mut v = out.stdout;
    v.extend_from_slice(&out.stderr);
    v
}

pub fn compile(dir: &Path, name: &str, text: &str) -> PathBuf {
    let src = dir.join(format!("{name}.txt"));
    let bin = dir.join(name);
    std::fs::write(&src, text).unwrap();
    let out = Command::new(crushtool())
        .args(["-c", src.to_str().unwrap(), "-o", bin.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "crushtool -c {name} failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

pub fn build(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let bin = dir.join(name);
    let mut a = vec!["--build"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", bin.to_str().unwrap()]);
    let out = Command::new(crushtool()).args(&a).output().unwrap();
    assert!(
        out.status.success(),
        "crushtool --build {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// Tiny deterministic PRNG for map shapes and weights.
pub struct Lcg(pub u64);
impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    pub fn below(&mut self, n: u32) -> u32 {
        self.next() % n
    }
}

#[derive(Clone)]
pub struct Spec {
    pub tunables: &'static str,
    /// Algorithms for root, rack, host levels.
    pub algs: [&'static str; 3],
    pub racks: usize,
    pub hosts: usize,
    pub osds: usize,
    /// Weight pattern: 0 = all 1.0, 1 = varied, 2 = varied with zeros.
    pub weights: u32,
    pub classes: bool,
    pub choose_args: bool,
    pub seed: u64,
}

pub fn tunables_lines(profile: &str) -> &'static str {
    match profile {
        "argonaut" => "",
        "bobtail" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\n",
        "firefly" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\n",
        "hammer" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\ntunable straw_calc_version 1\ntunable allowed_bucket_algs 54\n",
        "jewel" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\ntunable chooseleaf_stable 1\ntunable straw_calc_version 1\ntunable allowed_bucket_algs 54\n",
        "vary_r3" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 3\ntunable straw_calc_version 0\ntunable allowed_bucket_algs 54\n",
        _ => panic!("unknown profile {profile}"),
    }
}

fn weight_text(w: u32) -> String {
    format!("{}.{:03}", w / 1000, w % 1000)
}

/// Text crush map for `spec`: root -> racks -> hosts -> osds and a set of
/// rules covering firstn/indep, chooseleaf, nested choose and set_* steps.
pub fn text_map(s: &Spec) -> String {
    let mut rng = Lcg(s.seed);
    let mut t = String::new();
    t.push_str(tunables_lines(s.tunables));
    let ndev = s.racks * s.hosts * s.osds;
    for d in 0..ndev {
        if s.classes {
            let _ = writeln!(
                t,
                "device {d} osd.{d} class {}",
                if d % 3 == 0 { "ssd" } else { "hdd" }
            );
        } else {
            let _ = writeln!(t, "device {d} osd.{d}");
        }
    }
    t.push_str("type 0 osd\ntype 1 host\ntype 2 rack\ntype 3 root\n");
    let mut next_id = -1;
    let mut rack_items = Vec::new();
    let mut straw2_buckets = Vec::new();
    let mut dev = 0;
    for r in 0..s.racks {
        let mut host_items = Vec::new();
        for h in 0..s.hosts {
            let alg = s.algs[2];
            let id = next_id;
            next_id -= 1;
            let _ = writeln!(t, "host r{r}h{h} {{\n\tid {id}\n\talg {alg}\n\thash 0");
            let mut total = 0;
            let mut ws = Vec::new();
            for _ in 0..s.osds {
                let w = match (s.weights, alg) {
                    (_, "uniform") | (0, _) => 1000,
                    (1, _) => 500 * (1 + rng.below(6)),
                    _ => {
                        if rng.below(5) == 0 {
                            0
                        } else {
                            250 * (1 + rng.below(12))
                        }
                    }
                };
                total += w;
                ws.push(w);
                let _ = writeln!(t, "\titem osd.{dev} weight {}", weight_text(w));
                dev += 1;
            }
            t.push_str("}\n");
            if alg == "straw2" {
                straw2_buckets.push((id, ws));
            }
            host_items.push((format!("r{r}h{h}"), total));
        }
        let alg = s.algs[1];
        let id = next_id;
        next_id -= 1;
        let _ = writeln!(t, "rack r{r} {{\n\tid {id}\n\talg {alg}\n\thash 0");
        let mut total = 0;
        let mut ws = Vec::new();
        for (n, w) in &host_items {
            let w = if alg == "uniform" {
                s.osds as u32 * 1000
            } else {
                *w
            };
            total += w;
            ws.push(w);
            let _ = writeln!(t, "\titem {n} weight {}", weight_text(w));
        }
        t.push_str("}\n");
        if alg == "straw2" {
            straw2_buckets.push((id, ws));
        }
        rack_items.push((format!("r{r}"), total));
    }
    let alg = s.algs[0];
    let root_id = next_id;
    let _ = writeln!(t, "root default {{\n\tid {root_id}\n\talg {alg}\n\thash 0");
    for (n, w) in &rack_items {
        let w = if alg == "uniform" {
            (s.hosts * s.osds) as u32 * 1000
        } else {
            *w
        };
        let _ = writeln!(t, "\titem {n} weight {}", weight_text(w));
    }
    t.push_str("}\n");
    let take = if s.classes {
        "step take default class hdd"
    } else {
        "step take default"
    };
    let _ = write!(
        t,
        "rule rep_host {{\n\tid 0\n\ttype replicated\n\tmin_size 1\n\tmax_size 10\n\t{take}\n\tstep chooseleaf firstn 0 type host\n\tstep emit\n}}\n\
rule ec_host {{\n\tid 1\n\ttype erasure\n\tmin_size 1\n\tmax_size 10\n\tstep set_chooseleaf_tries 5\n\tstep set_choose_tries 100\n\t{take}\n\tstep chooseleaf indep 0 type host\n\tstep emit\n}}\n\
rule rack_then_host {{\n\tid 2\n\ttype replicated\n\tmin_size 1\n\tmax_size 10\n\tstep take default\n\tstep choose firstn 0 type rack\n\tstep chooseleaf firstn 2 type host\n\tstep emit\n}}\n\
rule indep_nested {{\n\tid 3\n\ttype erasure\n\tmin_size 1\n\tmax_size 10\n\tstep take default\n\tstep choose indep 0 type host\n\tstep choose indep 1 type osd\n\tstep emit\n}}\n\
rule osd_direct {{\n\tid 4\n\ttype replicated\n\tmin_size 1\n\tmax_size 10\n\tstep take default\n\tstep choose firstn 0 type osd\n\tstep emit\n}}\n\
rule set_steps {{\n\tid 5\n\ttype replicated\n\tmin_size 1\n\tmax_size 10\n\tstep set_choose_local_tries 1\n\tstep set_choose_local_fallback_tries 2\n\tstep set_chooseleaf_vary_r 2\n\tstep set_chooseleaf_stable 0\n\tstep take default\n\tstep chooseleaf firstn 0 type host\n\tstep emit\n}}\n\
rule two_takes {{\n\tid 6\n\ttype replicated\n\tmin_size 1\n\tmax_size 10\n\tstep take r0\n\tstep chooseleaf firstn 2 type host\n\tstep emit\n\tstep take default\n\tstep chooseleaf firstn -2 type host\n\tstep emit\n}}\n"
    );
    if s.choose_args && !straw2_buckets.is_empty() {
        for set in ["0", "18446744073709551615"] {
            let _ = writeln!(t, "choose_args {set} {{");
            for (i, (id, ws)) in straw2_buckets.iter().enumerate() {
                if (i + set.len()) % 2 == 0 {
                    continue;
                }
                let _ = writeln!(t, "  {{\n    bucket_id {id}\n    weight_set [");
                for _pos in 0..2 {
                    let row: Vec<String> = ws
                        .iter()
                        .map(|&w| weight_text(if w == 0 { 0 } else { 250 * (1 + rng.below(8)) }))
                        .collect();
                    let _ = writeln!(t, "      [ {} ]", row.join(" "));
                }
                t.push_str("    ]\n");
                if i % 3 == 0 {
                    let ids: Vec<String> = ws
                        .iter()
                        .map(|_| format!("{}", -1000 - rng.below(100000) as i32))
                        .collect();
                    let _ = writeln!(t, "    ids [ {} ]", ids.join(" "));
                }
                t.push_str("  }\n");
            }
            t.push_str("}\n");
        }
    }
    t
}
