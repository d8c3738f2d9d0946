//! Generated CRUSH text maps (the input of `crushtool -c`) for comparing
//! iolift's CRUSH code with crushtool and the GPU kernels with the CPU.
//!
//! [`text_map`] turns a [`Spec`] into a map of this shape:
//!
//! ```text
//! root default (algs[0])
//!   rack r0 .. r{racks-1} (algs[1])
//!     host r{r}h0 .. r{r}h{hosts-1} (algs[2])
//!       osd.N ... (osds per host; device ids 0.. in order)
//! ```
//!
//! * Tunables: one of [`PROFILES`] ([`tunables_lines`]).
//! * Device weights (`Spec::weights`): 0 = every device 1.000; 1 = varied,
//!   0.5 to 3.0 in steps of 0.5; 2 = varied with zeros: a device is 0 with
//!   probability 1/5, else 0.25 to 3.0 in steps of 0.25. Every weight is a
//!   multiple of 1/4, so it is exact in CRUSH's 16.16 fixed point.
//! * Uniform buckets: crushtool requires every item of a uniform bucket to
//!   carry the same weight, so a device under a uniform host is always
//!   1.000 and an item of a uniform rack or root weighs what its subtree
//!   would weigh with every device at 1.000 (devices below it x 1.000).
//!   That weight is never 0, so the parent keeps choosing the subtree even
//!   when its devices' own weights vary or are all 0 (the mapper then has
//!   to retry). Every other bucket's item weight is the real sum of the
//!   weights below it.
//! * Device classes (`Spec::classes`): every third device (id % 3 == 2) is
//!   `ssd`, the rest `hdd` (so even a one-device map has an `hdd`, which
//!   crushtool requires of a rule that takes class hdd); rules 0 and 1 then
//!   take `default class hdd`, which makes crushtool build shadow trees.
//!   Classes need buckets that are not uniform: crushtool 16.2 builds no
//!   shadow tree through a uniform bucket and then rejects the class rules
//!   ("has no class information"); [`text_map`] panics on that
//!   combination.
//! * choose_args (`Spec::choose_args`, only if some bucket is straw2): two
//!   sets, id 0 and id 2^64-1 (-1, the "default" set); each set covers
//!   every other straw2 bucket (the two sets cover different halves), with
//!   a weight_set of two positions (random weights 0.25..2.0, 0 where the
//!   item's own weight is 0) and, for every third bucket, an `ids` list of
//!   unique replacement ids.
//! * Rules: the [`RULES`] below, ids 0.. in that order, all with min_size 1
//!   and max_size 10. Rule 0 is a replicated `chooseleaf firstn 0 type
//!   host`, rule 1 an erasure `chooseleaf indep 0 type host` (with retry
//!   tunings), as in a Ceph pool's default rules; the others cover nested
//!   choose, negative and fixed numrep, several take/emit blocks, a take of
//!   a rack and of a host, and every `set_*` step.
//!
//! The random choices (weights, choose_args) come from an [`Rng`] seeded
//! with `Spec::seed`: the same spec always gives the same text.

use crate::rng::Rng;
use std::fmt::Write as _;

/// The tunables profiles [`tunables_lines`] knows.
pub const PROFILES: [&str; 6] = [
    "argonaut", "bobtail", "firefly", "hammer", "jewel", "vary_r3",
];

/// The bucket algorithms of the text format.
pub const ALGS: [&str; 5] = ["uniform", "list", "tree", "straw", "straw2"];

/// Shape of a generated map; see the module docs for what each field does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// One of [`PROFILES`].
    pub tunables: &'static str,
    /// Bucket algorithms (from [`ALGS`]) of the root, rack and host levels.
    pub algs: [&'static str; 3],
    pub racks: usize,
    /// Hosts per rack.
    pub hosts: usize,
    /// Devices per host.
    pub osds: usize,
    /// Weight pattern: 0 = all 1.0, 1 = varied, 2 = varied with zeros.
    pub weights: u32,
    /// `ssd` / `hdd` device classes and class-taking rules 0 and 1.
    pub classes: bool,
    /// Two choose_args sets for the straw2 buckets.
    pub choose_args: bool,
    /// Seed of the weights and choose_args.
    pub seed: u64,
}

impl Default for Spec {
    /// jewel, straw2 everywhere, 2 racks x 2 hosts x 2 devices, all
    /// weights 1.0, no classes, no choose_args, seed 1.
    fn default() -> Spec {
        Spec {
            tunables: "jewel",
            algs: ["straw2"; 3],
            racks: 2,
            hosts: 2,
            osds: 2,
            weights: 0,
            classes: false,
            choose_args: false,
            seed: 1,
        }
    }
}

impl Spec {
    /// Number of devices (racks x hosts x osds).
    pub fn devices(&self) -> usize {
        self.racks * self.hosts * self.osds
    }
}

/// The `tunable ...` lines of a profile (empty for argonaut, crushtool's
/// legacy defaults). Panics on a name not in [`PROFILES`].
pub fn tunables_lines(profile: &str) -> &'static str {
    match profile {
        "argonaut" => "",
        "bobtail" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\n",
        "firefly" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\n",
        "hammer" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\ntunable straw_calc_version 1\ntunable allowed_bucket_algs 54\n",
        "jewel" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 1\ntunable chooseleaf_stable 1\ntunable straw_calc_version 1\ntunable allowed_bucket_algs 54\n",
        "vary_r3" => "tunable choose_local_tries 0\ntunable choose_local_fallback_tries 0\ntunable choose_total_tries 50\ntunable chooseleaf_descend_once 1\ntunable chooseleaf_vary_r 3\ntunable straw_calc_version 0\ntunable allowed_bucket_algs 54\n",
        _ => panic!("unknown tunables profile {profile}"),
    }
}

/// The rules of every generated map: (name, steps). `TAKE` stands for
/// `step take default`, or `step take default class hdd` with classes.
pub const RULES: [(&str, &str); 13] = [
    ("rep_host", "TAKE\n\tstep chooseleaf firstn 0 type host\n\tstep emit"),
    ("ec_host", "step set_chooseleaf_tries 5\n\tstep set_choose_tries 100\n\tTAKE\n\tstep chooseleaf indep 0 type host\n\tstep emit"),
    ("rack_then_host", "step take default\n\tstep choose firstn 0 type rack\n\tstep chooseleaf firstn 2 type host\n\tstep emit"),
    ("indep_nested", "step take default\n\tstep choose indep 0 type host\n\tstep choose indep 1 type osd\n\tstep emit"),
    ("osd_direct", "step take default\n\tstep choose firstn 0 type osd\n\tstep emit"),
    ("set_steps", "step set_choose_local_tries 1\n\tstep set_choose_local_fallback_tries 2\n\tstep set_chooseleaf_vary_r 2\n\tstep set_chooseleaf_stable 0\n\tstep take default\n\tstep chooseleaf firstn 0 type host\n\tstep emit"),
    ("two_takes", "step take r0\n\tstep chooseleaf firstn 2 type host\n\tstep emit\n\tstep take default\n\tstep chooseleaf firstn -2 type host\n\tstep emit"),
    ("indep_host", "step take default\n\tstep chooseleaf indep 0 type host\n\tstep emit"),
    ("two_racks", "step take default\n\tstep choose firstn 2 type rack\n\tstep chooseleaf firstn 2 type host\n\tstep emit"),
    ("set_steps_rack", "step set_chooseleaf_vary_r 2\n\tstep set_chooseleaf_stable 0\n\tstep set_choose_local_tries 2\n\tstep set_choose_local_fallback_tries 3\n\tstep take default\n\tstep chooseleaf firstn 0 type rack\n\tstep emit"),
    ("host_then_rest", "step take r0h0\n\tstep choose firstn 2 type osd\n\tstep emit\n\tstep take default\n\tstep chooseleaf firstn -1 type host\n\tstep emit"),
    ("hosts_minus_one", "step take default\n\tstep choose firstn -1 type host\n\tstep choose firstn 1 type osd\n\tstep emit"),
    ("stable_racks", "step set_chooseleaf_stable 1\n\tstep take default\n\tstep choose firstn 0 type rack\n\tstep chooseleaf firstn 1 type osd\n\tstep emit"),
];

/// A weight in thousandths as the text format writes it (`1.250`).
pub fn weight_text(w: u32) -> String {
    format!("{}.{:03}", w / 1000, w % 1000)
}

/// One bucket as written: id and the weights of its items (thousandths).
struct Bucket {
    id: i32,
    weights: Vec<u32>,
}

/// Writes one bucket; returns its total weight. `items` are (name, real
/// weight, weight with every device at 1.0).
fn bucket(
    t: &mut String,
    kind: &str,
    name: &str,
    id: i32,
    alg: &str,
    items: &[(String, u32, u32)],
    straw2: &mut Vec<Bucket>,
) -> u32 {
    let _ = writeln!(t, "{kind} {name} {{\n\tid {id}\n\talg {alg}\n\thash 0");
    let mut ws = Vec::new();
    for (item, real, nominal) in items {
        let w = if alg == "uniform" { *nominal } else { *real };
        ws.push(w);
        let _ = writeln!(t, "\titem {item} weight {}", weight_text(w));
    }
    t.push_str("}\n");
    let total = ws.iter().sum();
    if alg == "straw2" {
        straw2.push(Bucket { id, weights: ws });
    }
    total
}

/// The text map of `s`; see the module docs for what it contains.
pub fn text_map(s: &Spec) -> String {
    assert!(
        !(s.classes && s.algs.contains(&"uniform")),
        "device classes need buckets that are not uniform: {s:?}"
    );
    let mut rng = Rng::new(s.seed);
    let mut t = String::new();
    t.push_str(tunables_lines(s.tunables));
    for d in 0..s.devices() {
        if s.classes {
            let class = if d % 3 == 2 { "ssd" } else { "hdd" };
            let _ = writeln!(t, "device {d} osd.{d} class {class}");
        } else {
            let _ = writeln!(t, "device {d} osd.{d}");
        }
    }
    t.push_str("type 0 osd\ntype 1 host\ntype 2 rack\ntype 3 root\n");
    let mut next_id = -1;
    let mut straw2 = Vec::new();
    let mut dev = 0;
    let mut racks = Vec::new();
    for r in 0..s.racks {
        let mut hosts = Vec::new();
        for h in 0..s.hosts {
            let mut osds = Vec::new();
            for _ in 0..s.osds {
                let w = match s.weights {
                    0 => 1000,
                    1 => 500 * (1 + rng.below(6) as u32),
                    _ if rng.chance(1, 5) => 0,
                    _ => 250 * (1 + rng.below(12) as u32),
                };
                osds.push((format!("osd.{dev}"), w, 1000));
                dev += 1;
            }
            let name = format!("r{r}h{h}");
            let w = bucket(
                &mut t,
                "host",
                &name,
                next_id,
                s.algs[2],
                &osds,
                &mut straw2,
            );
            next_id -= 1;
            hosts.push((name, w, s.osds as u32 * 1000));
        }
        let name = format!("r{r}");
        let w = bucket(
            &mut t,
            "rack",
            &name,
            next_id,
            s.algs[1],
            &hosts,
            &mut straw2,
        );
        next_id -= 1;
        racks.push((name, w, (s.hosts * s.osds) as u32 * 1000));
    }
    bucket(
        &mut t,
        "root",
        "default",
        next_id,
        s.algs[0],
        &racks,
        &mut straw2,
    );

    let take = if s.classes {
        "step take default class hdd"
    } else {
        "step take default"
    };
    for (id, (name, steps)) in RULES.iter().enumerate() {
        let ty = if steps.contains(" indep ") {
            "erasure"
        } else {
            "replicated"
        };
        let steps = steps.replace("TAKE", take);
        let _ = writeln!(
            t,
            "rule {name} {{\n\tid {id}\n\ttype {ty}\n\tmin_size 1\n\tmax_size 10\n\t{steps}\n}}"
        );
    }

    if s.choose_args && !straw2.is_empty() {
        for (set, set_id) in ["0", "18446744073709551615"].iter().enumerate() {
            let _ = writeln!(t, "choose_args {set_id} {{");
            for (i, b) in straw2.iter().enumerate() {
                if i % 2 != set % 2 {
                    continue;
                }
                let _ = writeln!(t, "  {{\n    bucket_id {}\n    weight_set [", b.id);
                for _position in 0..2 {
                    let row: Vec<String> = b
                        .weights
                        .iter()
                        .map(|&w| {
                            let v = 250 * (1 + rng.below(8) as u32);
                            weight_text(if w == 0 { 0 } else { v })
                        })
                        .collect();
                    let _ = writeln!(t, "      [ {} ]", row.join(" "));
                }
                t.push_str("    ]\n");
                if i % 3 == 0 {
                    let ids: Vec<String> = (0..b.weights.len())
                        .map(|k| (-1000 - 1000 * (-b.id) - k as i32).to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn items_of(t: &str, bucket: &str) -> Vec<(String, String)> {
        let start = t
            .find(&format!(" {bucket} {{"))
            .unwrap_or_else(|| panic!("no bucket {bucket}"));
        let body = &t[start..t[start..].find("}\n").unwrap() + start];
        body.lines()
            .filter_map(|l| l.trim().strip_prefix("item "))
            .map(|l| {
                let (n, w) = l.split_once(" weight ").unwrap();
                (n.to_string(), w.to_string())
            })
            .collect()
    }

    #[test]
    fn shape_devices_rules_are_as_specified() {
        let s = Spec {
            racks: 3,
            hosts: 2,
            osds: 4,
            weights: 1,
            ..Spec::default()
        };
        let t = text_map(&s);
        assert_eq!(t, text_map(&s), "same spec, same text");
        assert_eq!(t.lines().filter(|l| l.starts_with("device ")).count(), 24);
        assert!(t.contains("device 23 osd.23\n") && !t.contains("osd.24"));
        assert_eq!(t.matches("\nhost ").count(), 6);
        assert_eq!(t.matches("\nrack ").count(), 3);
        assert_eq!(t.matches("\nroot default {").count(), 1);
        assert_eq!(t.matches("\nrule ").count(), RULES.len());
        assert!(t.contains("rule rep_host {\n\tid 0\n\ttype replicated"));
        assert!(t.contains("rule ec_host {\n\tid 1\n\ttype erasure"));
        assert!(!t.contains("class") && !t.contains("choose_args"));
        assert!(t.starts_with(tunables_lines("jewel")));
        // Non-uniform parents carry the real sums of their children.
        let hosts = items_of(&t, "r1");
        for (h, w) in &hosts {
            let sum: f64 = items_of(&t, h)
                .iter()
                .map(|(_, w)| w.parse::<f64>().unwrap())
                .sum();
            assert!(
                (sum - w.parse::<f64>().unwrap()).abs() < 1e-9,
                "{h}: {w} vs {sum}"
            );
        }
        let other = text_map(&Spec { seed: 2, ..s });
        assert_ne!(t, other, "the seed changes the weights");
    }

    #[test]
    fn uniform_buckets_have_one_nonzero_weight() {
        let s = Spec {
            algs: ["uniform", "uniform", "straw2"],
            racks: 3,
            hosts: 4,
            osds: 3,
            weights: 2,
            seed: 9,
            ..Spec::default()
        };
        let t = text_map(&s);
        for r in ["r0", "r1", "r2"] {
            let ws: Vec<String> = items_of(&t, r).into_iter().map(|x| x.1).collect();
            assert_eq!(ws, vec!["3.000"; 4], "rack {r}");
        }
        let ws: Vec<String> = items_of(&t, "default").into_iter().map(|x| x.1).collect();
        assert_eq!(ws, vec!["12.000"; 3]);
        // weights 2 does give zero devices under the straw2 hosts.
        assert!(t.contains(" weight 0.000\n"), "{t}");
        let s = Spec {
            algs: ["straw2", "straw2", "uniform"],
            ..s
        };
        let t = text_map(&s);
        assert!(items_of(&t, "r0h0").iter().all(|(_, w)| w == "1.000"));
    }

    #[test]
    fn classes_and_choose_args() {
        let s = Spec {
            classes: true,
            choose_args: true,
            weights: 2,
            ..Spec::default()
        };
        let t = text_map(&s);
        assert!(t.contains("device 0 osd.0 class hdd\n"));
        assert!(t.contains("device 2 osd.2 class ssd\n"));
        assert_eq!(t.matches("step take default class hdd").count(), 2);
        assert!(t.contains("choose_args 0 {") && t.contains("choose_args 18446744073709551615 {"));
        // 7 straw2 buckets (4 hosts, 2 racks, root): 4 in set 0, 3 in set -1.
        assert_eq!(t.matches("bucket_id ").count(), 7);
        assert!(t.contains("    ids [ "));
        let no_straw2 = Spec {
            algs: ["straw", "list", "tree"],
            ..s
        };
        assert!(!text_map(&no_straw2).contains("choose_args"));
        let uniform_racks = Spec {
            algs: ["straw2", "straw2", "uniform"],
            ..s
        };
        assert!(std::panic::catch_unwind(|| text_map(&uniform_racks)).is_err());
    }

    /// crushtool (the peer) compiles every combination of profile, bucket
    /// algorithm per level, weights, classes and choose_args.
    #[test]
    fn crushtool_compiles_generated_maps() {
        let crushtool = crate::require_tool("crushtool");
        let dir = std::env::temp_dir().join(format!("iolift-testkit-c{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut n = 0u64;
        for (i, p) in PROFILES.iter().enumerate() {
            for (j, a) in ALGS.iter().enumerate() {
                n += 1;
                let s = Spec {
                    tunables: p,
                    algs: [ALGS[(i + j) % 5], a, ALGS[(i + 2 * j) % 5]],
                    racks: 1 + j % 3,
                    hosts: 1 + i % 3,
                    osds: 1 + (i + j) % 4,
                    weights: (n % 3) as u32,
                    classes: false,
                    choose_args: n % 3 != 1,
                    seed: n,
                };
                // Classes wherever no bucket is uniform.
                let s = Spec {
                    classes: n.is_multiple_of(2) && !s.algs.contains(&"uniform"),
                    ..s
                };
                let (src, bin) = (dir.join("m.txt"), dir.join("m.bin"));
                std::fs::write(&src, text_map(&s)).unwrap();
                let o = crate::run_timeout(
                    std::process::Command::new(&crushtool)
                        .arg("-c")
                        .arg(&src)
                        .arg("-o")
                        .arg(&bin),
                    crate::CMD_TIMEOUT,
                );
                assert!(
                    o.status.success() && o.stderr.is_empty(),
                    "{s:?}\n{}\n{}",
                    o.report(),
                    text_map(&s)
                );
                assert!(std::fs::metadata(&bin).unwrap().len() > 0);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_profile_and_alg_is_known() {
        for p in PROFILES {
            let _ = tunables_lines(p);
        }
        assert!(std::panic::catch_unwind(|| tunables_lines("nope")).is_err());
        for a in ALGS {
            let t = text_map(&Spec {
                algs: [a; 3],
                ..Spec::default()
            });
            assert_eq!(t.matches(&format!("\talg {a}\n")).count(), 7, "{a}");
        }
    }
}
