//! What-if edits applied to a map in memory, written as short specs:
//!
//! * `out:OSD[,OSD...]`: mark OSDs out (reweight 0, `ceph osd out`);
//! * `in:OSD[,OSD...]`: mark OSDs in (reweight 1);
//! * `reweight:OSD:W`: reweight in 0..=1 (`ceph osd reweight`);
//! * `crush-weight:OSD:W`: CRUSH weight (`ceph osd crush reweight`,
//!   straw2 buckets only);
//! * `rule:POOL:RULE`: the pool's crush rule (id or name);
//! * `add-host:NAME:N:W:PARENT`: a straw2 host bucket NAME under the
//!   bucket PARENT holding N OSDs of CRUSH weight W, up and in (ids: the
//!   lowest not in the crush map; they are created in the map if needed).
//!
//! Every spec is checked before anything changes; errors name the spec
//! and the bad part.

use crate::crush_edit::adjust_item_weight;
use crate::types::{OsdMap, DEFAULT_PRIMARY_AFFINITY, OSD_EXISTS, OSD_IN, OSD_UP};
use crate::{OsdMapError, Result};
use iolift_crush::map::{Bucket, ALG_STRAW2};

/// Most OSDs one `add-host` may add (bounds the memory of an edit).
pub const MAX_NEW_OSDS: u32 = 100_000;

/// One parsed edit.
#[derive(Debug, Clone, PartialEq)]
pub enum Edit {
    Out(Vec<i32>),
    In(Vec<i32>),
    Reweight(i32, f64),
    CrushWeight(i32, f64),
    Rule(i64, String),
    AddHost {
        name: String,
        count: u32,
        weight: f64,
        parent: String,
    },
}

fn bad(spec: &str, what: &str) -> OsdMapError {
    OsdMapError::Invalid(format!("--what-if '{spec}': {what}"))
}

fn osd(spec: &str, s: &str) -> Result<i32> {
    let s = s.strip_prefix("osd.").unwrap_or(s);
    s.parse::<i32>()
        .ok()
        .filter(|&o| o >= 0)
        .ok_or_else(|| bad(spec, &format!("bad OSD id '{s}'")))
}

fn weight(spec: &str, s: &str, max: f64) -> Result<f64> {
    s.parse::<f64>()
        .ok()
        .filter(|w| w.is_finite() && (0.0..=max).contains(w))
        .ok_or_else(|| bad(spec, &format!("bad weight '{s}' (0..={max})")))
}

/// An OSD reweight (0..=1) in 16.16 fixed point.
fn fixed(w: f64) -> u32 {
    (w * 65536.0) as u32
}

/// A CRUSH weight in 16.16 fixed point as Ceph's CRUSH edits convert it
/// (`ceph osd crush reweight`/`add`, `crushtool --reweight-item` and
/// `--add-item`): the weight as a single-precision float times 0x10000,
/// truncated. This differs from the double-precision product for many
/// weights (4.097: 268501, not 268500).
fn crush_fixed(w: f64) -> u32 {
    ((w as f32) * 65536.0f32) as u32
}

impl Edit {
    pub fn parse(spec: &str) -> Result<Edit> {
        let parts: Vec<&str> = spec.split(':').collect();
        let n = |want: usize| -> Result<()> {
            if parts.len() != want {
                return Err(bad(spec, &format!("expected {} ':'-separated parts", want)));
            }
            Ok(())
        };
        let list = |s: &str| -> Result<Vec<i32>> { s.split(',').map(|o| osd(spec, o)).collect() };
        match parts[0] {
            "out" => {
                n(2)?;
                Ok(Edit::Out(list(parts[1])?))
            }
            "in" => {
                n(2)?;
                Ok(Edit::In(list(parts[1])?))
            }
            "reweight" => {
                n(3)?;
                Ok(Edit::Reweight(
                    osd(spec, parts[1])?,
                    weight(spec, parts[2], 1.0)?,
                ))
            }
            "crush-weight" => {
                n(3)?;
                Ok(Edit::CrushWeight(
                    osd(spec, parts[1])?,
                    weight(spec, parts[2], 65535.0)?,
                ))
            }
            "rule" => {
                n(3)?;
                let pool = parts[1]
                    .parse()
                    .map_err(|_| bad(spec, &format!("bad pool id '{}'", parts[1])))?;
                Ok(Edit::Rule(pool, parts[2].to_string()))
            }
            "add-host" => {
                n(5)?;
                let count = parts[2]
                    .parse::<u32>()
                    .ok()
                    .filter(|&c| (1..=MAX_NEW_OSDS).contains(&c))
                    .ok_or_else(|| {
                        bad(
                            spec,
                            &format!("bad OSD count '{}' (1..={MAX_NEW_OSDS})", parts[2]),
                        )
                    })?;
                if parts[1].is_empty() {
                    return Err(bad(spec, "empty host name"));
                }
                Ok(Edit::AddHost {
                    name: parts[1].to_string(),
                    count,
                    weight: weight(spec, parts[3], 65535.0)?,
                    parent: parts[4].to_string(),
                })
            }
            k => Err(bad(
                spec,
                &format!("unknown edit '{k}' (out, in, reweight, crush-weight, rule, add-host)"),
            )),
        }
    }
}

impl OsdMap {
    fn existing(&self, spec: &str, o: i32) -> Result<usize> {
        if !self.exists(o) {
            return Err(bad(spec, &format!("osd.{o} does not exist")));
        }
        Ok(o as usize)
    }

    /// Apply one edit (`spec` is only used in error messages).
    pub fn apply_edit(&mut self, spec: &str, e: &Edit) -> Result<()> {
        match e {
            Edit::Out(v) | Edit::In(v) => {
                let w = if matches!(e, Edit::Out(_)) { 0 } else { OSD_IN };
                for &o in v {
                    self.existing(spec, o)?;
                }
                for &o in v {
                    self.osd_weight[o as usize] = w;
                }
            }
            Edit::Reweight(o, w) => {
                let i = self.existing(spec, *o)?;
                self.osd_weight[i] = fixed(*w).min(OSD_IN);
            }
            Edit::CrushWeight(o, w) => {
                if !self.crush.item_present(*o) {
                    return Err(bad(spec, &format!("osd.{o} is not in the crush map")));
                }
                let mut c = self.crush.clone();
                adjust_item_weight(&mut c, *o, crush_fixed(*w))
                    .map_err(|x| bad(spec, &x.to_string()))?;
                self.set_crush(c);
            }
            Edit::Rule(pool, rule) => {
                let id = match rule.parse::<i32>() {
                    Ok(r) => r,
                    Err(_) => {
                        *self
                            .crush
                            .rule_names
                            .iter()
                            .find(|(_, n)| *n == rule)
                            .ok_or_else(|| bad(spec, &format!("no crush rule named '{rule}'")))?
                            .0
                    }
                };
                let r = self
                    .crush
                    .rule(id)
                    .ok_or_else(|| bad(spec, &format!("crush rule {id} does not exist")))?;
                let ruleset = r.ruleset;
                let p = self
                    .pools
                    .get_mut(pool)
                    .ok_or_else(|| bad(spec, &format!("there is no pool {pool}")))?;
                p.crush_rule = ruleset;
            }
            Edit::AddHost {
                name,
                count,
                weight,
                parent,
            } => self.add_host(spec, name, *count, crush_fixed(*weight), parent)?,
        }
        Ok(())
    }

    fn add_host(&mut self, spec: &str, name: &str, count: u32, w: u32, parent: &str) -> Result<()> {
        let c = &self.crush;
        if !c.choose_args.is_empty() || !c.class_bucket.is_empty() {
            return Err(bad(
                spec,
                "add-host on a crush map with device classes or choose_args is not supported",
            ));
        }
        if c.names.values().any(|n| n == name) {
            return Err(bad(spec, &format!("an item named '{name}' exists")));
        }
        let pid = *c
            .names
            .iter()
            .find(|(id, n)| **id < 0 && *n == parent)
            .ok_or_else(|| bad(spec, &format!("no bucket named '{parent}'")))?
            .0;
        let host_type = *c
            .type_names
            .iter()
            .find(|(_, n)| *n == "host")
            .ok_or_else(|| bad(spec, "the crush map has no type 'host'"))?
            .0;
        let total = (w as u64) * count as u64;
        if total > u32::MAX as u64 / 2 {
            return Err(bad(spec, "total weight overflows 16.16"));
        }
        let mut crush = self.crush.clone();
        // OSD ids: the lowest not in the crush map
        let mut ids = Vec::with_capacity(count as usize);
        let present = crush.present_devices();
        let mut o = 0i32;
        while ids.len() < count as usize {
            if !present.get(o as usize).copied().unwrap_or(false) {
                ids.push(o);
            }
            o += 1;
        }
        let slot = crush
            .buckets
            .iter()
            .position(|b| b.is_none())
            .unwrap_or(crush.buckets.len());
        let hid = -1 - slot as i32;
        // Its weight is the sum of its items' (`total`, checked above not
        // to overflow), as crushtool's --add-item makes it.
        let host = Bucket::straw2(hid, host_type as u16, ids.clone(), vec![w; ids.len()]);
        if slot == crush.buckets.len() {
            crush.buckets.push(Some(host));
        } else {
            crush.buckets[slot] = Some(host);
        }
        crush.names.insert(hid, name.to_string());
        for &o in &ids {
            crush.names.insert(o, format!("osd.{o}"));
        }
        let max = ids.last().map_or(0, |&o| o + 1);
        crush.max_devices = crush.max_devices.max(max);
        let pslot = (-1 - pid) as usize;
        let new_parent_weight = {
            let pb = crush.buckets[pslot].as_mut().expect("parent bucket");
            if pb.alg != ALG_STRAW2 {
                return Err(bad(spec, &format!("bucket '{parent}' is not straw2")));
            }
            pb.items.push(hid);
            pb.item_weights.push(total as u32);
            pb.weight = pb.weight.wrapping_add(total as u32);
            pb.weight
        };
        adjust_item_weight(&mut crush, pid, new_parent_weight)
            .map_err(|x| bad(spec, &x.to_string()))?;
        if max > self.max_osd {
            let n = max as usize;
            self.max_osd = max;
            self.osd_state.resize(n, 0);
            self.osd_weight.resize(n, 0);
            if !self.primary_affinity.is_empty() {
                self.primary_affinity.resize(n, DEFAULT_PRIMARY_AFFINITY);
            }
        }
        for &o in &ids {
            self.osd_state[o as usize] = OSD_EXISTS | OSD_UP;
            self.osd_weight[o as usize] = OSD_IN;
        }
        self.set_crush(crush);
        Ok(())
    }
}
