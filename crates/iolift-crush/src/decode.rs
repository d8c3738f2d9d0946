//! Binary crush map decoding (`CrushWrapper::decode`), with validation so the
//! mapper can never index out of bounds.

use crate::map::*;
use crate::{CrushError, Result};
use std::collections::BTreeMap;

pub(crate) const MAGIC: u32 = 0x0001_0000;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(CrushError::Truncated {
                offset: self.pos,
                what: what.to_string(),
                needed: n,
                left,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(self.u32(what)? as i32)
    }
    fn i64(&mut self, what: &str) -> Result<i64> {
        let s = self.take(8, what)?;
        Ok(i64::from_le_bytes(s.try_into().unwrap()))
    }
    fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// A count of elements of `elem` bytes each that must fit in the input.
    fn count(&mut self, elem: usize, what: &str) -> Result<usize> {
        let at = self.pos;
        let n = self.u32(what)? as usize;
        if n.saturating_mul(elem) > self.left() {
            return Err(CrushError::Truncated {
                offset: at,
                what: format!("{what} ({n} entries)"),
                needed: n.saturating_mul(elem),
                left: self.left(),
            });
        }
        Ok(n)
    }
    fn corrupt<T>(&self, msg: String) -> Result<T> {
        Err(CrushError::Corrupt {
            offset: self.pos,
            msg,
        })
    }
    fn u32s(&mut self, n: usize, what: &str) -> Result<Vec<u32>> {
        let b = self.take(n * 4, what)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    /// `decode_32_or_64_string_map`.
    fn string_map(&mut self, what: &str) -> Result<BTreeMap<i32, String>> {
        let n = self.count(8, what)?;
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let k = self.i32(what)?;
            let mut len = self.u32(what)? as usize;
            if len == 0 {
                // 64-bit key: the high half read as the length; reread.
                len = self.u32(what)? as usize;
            }
            let b = self.take(len, what)?;
            m.insert(k, String::from_utf8_lossy(b).into_owned());
        }
        Ok(m)
    }
}

/// Decode a binary crush map as written by `crushtool -c` / `ceph osd getcrushmap`.
pub fn decode(buf: &[u8]) -> Result<CrushMap> {
    let mut r = Reader { buf, pos: 0 };
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        return Err(CrushError::BadMagic(magic));
    }
    let max_buckets = r.i32("max_buckets")?;
    let max_rules = r.u32("max_rules")?;
    let max_devices = r.i32("max_devices")?;
    if max_buckets < 0 || max_buckets as usize > r.left() / 4 {
        return r.corrupt(format!("max_buckets {max_buckets} out of range"));
    }
    if max_rules as usize > r.left() / 4 || max_rules > 256 {
        return r.corrupt(format!("max_rules {max_rules} out of range"));
    }
    if max_devices < 0 {
        return r.corrupt(format!("max_devices {max_devices} is negative"));
    }
    let mut buckets = Vec::with_capacity(max_buckets as usize);
    for slot in 0..max_buckets {
        let alg = r.u32("bucket alg")?;
        if alg == 0 {
            buckets.push(None);
            continue;
        }
        buckets.push(Some(decode_bucket(&mut r, slot, alg)?));
    }
    let mut rules = Vec::with_capacity(max_rules as usize);
    for ruleno in 0..max_rules {
        let yes = r.u32("rule exists flag")?;
        if yes == 0 {
            rules.push(None);
            continue;
        }
        let len = r.count(12, "rule length")?;
        let ruleset = r.u8("rule ruleset")?;
        let rule_type = r.u8("rule type")?;
        let min_size = r.u8("rule min_size")?;
        let max_size = r.u8("rule max_size")?;
        let mut steps = Vec::with_capacity(len);
        for _ in 0..len {
            let op = r.u32("rule step op")?;
            let arg1 = r.i32("rule step arg1")?;
            let arg2 = r.i32("rule step arg2")?;
            steps.push(Step { op, arg1, arg2 });
        }
        let _ = ruleno;
        rules.push(Some(Rule {
            ruleset,
            rule_type,
            min_size,
            max_size,
            steps,
        }));
    }
    let type_names = r.string_map("type names")?;
    let names = r.string_map("item names")?;
    let rule_names = r.string_map("rule names")?;
    let mut map = CrushMap {
        max_devices,
        buckets,
        rules,
        type_names,
        names,
        rule_names,
        tunables: Tunables::LEGACY,
        class_map: BTreeMap::new(),
        class_names: BTreeMap::new(),
        class_bucket: BTreeMap::new(),
        choose_args: BTreeMap::new(),
        optional_groups: 0,
    };
    let t = &mut map.tunables;
    if !r.at_end() {
        t.choose_local_tries = r.u32("choose_local_tries")?;
        t.choose_local_fallback_tries = r.u32("choose_local_fallback_tries")?;
        t.choose_total_tries = r.u32("choose_total_tries")?;
        map.optional_groups = 1;
    }
    if !r.at_end() {
        t.chooseleaf_descend_once = r.u32("chooseleaf_descend_once")?;
        map.optional_groups = 2;
    }
    if !r.at_end() {
        t.chooseleaf_vary_r = r.u8("chooseleaf_vary_r")?;
        map.optional_groups = 3;
    }
    if !r.at_end() {
        t.straw_calc_version = r.u8("straw_calc_version")?;
        map.optional_groups = 4;
    }
    if !r.at_end() {
        t.allowed_bucket_algs = r.u32("allowed_bucket_algs")?;
        map.optional_groups = 5;
    }
    if !r.at_end() {
        t.chooseleaf_stable = r.u8("chooseleaf_stable")?;
        map.optional_groups = 6;
    }
    if !r.at_end() {
        let n = r.count(8, "class map")?;
        for _ in 0..n {
            let k = r.i32("class map")?;
            let v = r.i32("class map")?;
            map.class_map.insert(k, v);
        }
        map.class_names = r.string_map("class names")?;
        let n = r.count(8, "class buckets")?;
        for _ in 0..n {
            let k = r.i32("class buckets")?;
            let m = r.count(8, "class buckets")?;
            let mut inner = BTreeMap::new();
            for _ in 0..m {
                let a = r.i32("class buckets")?;
                let b = r.i32("class buckets")?;
                inner.insert(a, b);
            }
            map.class_bucket.insert(k, inner);
        }
        map.optional_groups = 7;
    }
    if !r.at_end() {
        let n = r.count(12, "choose_args")?;
        for _ in 0..n {
            let idx = r.i64("choose_args index")?;
            let nargs = r.count(12, "choose_args entries")?;
            let mut cam = ChooseArgMap {
                args: vec![ChooseArg::default(); map.buckets.len()],
            };
            for _ in 0..nargs {
                let bidx = r.u32("choose_args bucket index")? as usize;
                let Some(Some(b)) = map.buckets.get(bidx) else {
                    return r.corrupt(format!(
                        "choose_args {idx} names missing bucket index {bidx}"
                    ));
                };
                let size = b.items.len();
                let positions = r.count(4, "choose_args weight_set positions")?;
                let mut ws = Vec::with_capacity(positions);
                for _ in 0..positions {
                    let n = r.count(4, "choose_args weight_set")?;
                    if n != size {
                        return r.corrupt(format!(
                            "choose_args {idx} weight_set for bucket {} has {n} weights, bucket has {size} items",
                            -1 - bidx as i64
                        ));
                    }
                    ws.push(r.u32s(n, "choose_args weights")?);
                }
                let nids = r.count(4, "choose_args ids")?;
                if nids != 0 && nids != size {
                    return r.corrupt(format!(
                        "choose_args {idx} ids for bucket {} has {nids} ids, bucket has {size} items",
                        -1 - bidx as i64
                    ));
                }
                let ids = r
                    .u32s(nids, "choose_args ids")?
                    .into_iter()
                    .map(|v| v as i32)
                    .collect();
                cam.args[bidx] = ChooseArg {
                    ids,
                    weight_set: ws,
                };
            }
            map.choose_args.insert(idx, cam);
        }
        map.optional_groups = 8;
    }
    if !r.at_end() {
        // Squid adds msr tunables; 16.2 does not write them.
        return r.corrupt(format!("{} unexpected trailing bytes", r.left()));
    }
    Ok(map)
}

fn decode_bucket(r: &mut Reader, slot: i32, alg32: u32) -> Result<Bucket> {
    let id = r.i32("bucket id")?;
    let type_id = r.u16("bucket type")?;
    let alg = r.u8("bucket alg")?;
    let hash = r.u8("bucket hash")?;
    let weight = r.u32("bucket weight")?;
    let size = r.count(4, "bucket size")?;
    if alg as u32 != alg32 || !(ALG_UNIFORM..=ALG_STRAW2).contains(&alg) {
        return r.corrupt(format!(
            "bucket slot {slot}: unknown bucket algorithm {alg32}/{alg}"
        ));
    }
    if id != -1 - slot {
        return r.corrupt(format!(
            "bucket slot {slot} holds id {id} (expected {})",
            -1 - slot
        ));
    }
    let items: Vec<i32> = r
        .u32s(size, "bucket items")?
        .into_iter()
        .map(|v| v as i32)
        .collect();
    let mut b = Bucket {
        id,
        type_id,
        alg,
        hash,
        weight,
        items,
        ..Default::default()
    };
    match alg {
        ALG_UNIFORM => {
            b.uniform_weight = r.u32("uniform item weight")?;
            b.item_weights = vec![b.uniform_weight; size];
        }
        ALG_LIST => {
            let v = r.u32s(2 * size, "list weights")?;
            b.item_weights = v.iter().step_by(2).copied().collect();
            b.sum_weights = v.iter().skip(1).step_by(2).copied().collect();
        }
        ALG_TREE => {
            let n = r.u8("tree num_nodes")? as usize;
            b.node_weights = r.u32s(n, "tree node weights")?;
            // The mapper walks from n/2 down to leaves 2i+1; require a full
            // power-of-two tree that holds every item.
            if size > 0 && (n < 2 || !n.is_power_of_two() || 2 * size > n) {
                return r.corrupt(format!(
                    "tree bucket {id}: {n} nodes cannot hold {size} items"
                ));
            }
            b.item_weights = (0..size).map(|i| b.node_weights[2 * i + 1]).collect();
        }
        ALG_STRAW => {
            let v = r.u32s(2 * size, "straw weights")?;
            b.item_weights = v.iter().step_by(2).copied().collect();
            b.straws = v.iter().skip(1).step_by(2).copied().collect();
        }
        _ => {
            b.item_weights = r.u32s(size, "straw2 weights")?;
        }
    }
    Ok(b)
}
