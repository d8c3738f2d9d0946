//! Binary crush map decoding (`CrushWrapper::decode`), with validation so the
//! mapper can never index out of bounds.

use crate::map::*;
use crate::{CrushError, Result};
use std::collections::BTreeMap;

pub(crate) const MAGIC: u32 = 0x0001_0000;

/// Largest `max_devices` accepted: the tester and the mapper's callers size
/// per-device vectors by it, so a corrupt header must not ask for gigabytes.
pub const MAX_DEVICES: i32 = 1 << 22;
/// Largest replica count a choose step may ask for (crushtool's `--num-rep`
/// limit too). `choose firstn N` runs N attempts even when results are full
/// of failures, so N bounds the mapper's work.
pub const MAX_STEP_NUMREP: i32 = 1024;
/// Largest retry count in the tunables or a `set_*_tries` step. Ceph uses
/// 2..100; a corrupt value of 2^31 would make a mapping run for hours.
pub const MAX_TRIES: u32 = 1000;
/// Largest number of choose_args slots (sets x max_buckets) decoded: each
/// set is indexed by bucket, so a few bytes of input per set must not cost
/// max_buckets allocations each without bound.
pub const MAX_CHOOSE_ARGS_SLOTS: usize = 1 << 22;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// What is being decoded ("bucket -3", "rule 2"), prefixed to errors.
    ctx: String,
    /// Also refuse what the mapper cannot run (see [`decode`]).
    strict: bool,
}

impl<'a> Reader<'a> {
    fn what(&self, what: &str) -> String {
        if self.ctx.is_empty() {
            what.to_string()
        } else {
            format!("{} {what}", self.ctx)
        }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(CrushError::Truncated {
                offset: self.pos,
                what: self.what(what),
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
                what: format!("{} ({n} entries)", self.what(what)),
                needed: n.saturating_mul(elem),
                left: self.left(),
            });
        }
        Ok(n)
    }
    fn corrupt<T>(&self, msg: String) -> Result<T> {
        self.corrupt_at(self.pos, msg)
    }
    fn corrupt_at<T>(&self, offset: usize, msg: String) -> Result<T> {
        Err(CrushError::Corrupt {
            offset,
            msg: if self.ctx.is_empty() {
                msg
            } else {
                format!("{}: {msg}", self.ctx)
            },
        })
    }
    fn u32s(&mut self, n: usize, what: &str) -> Result<Vec<u32>> {
        let b = self.take(n.saturating_mul(4), what)?;
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
///
/// Besides the format, the decoder checks what the mapper relies on, so any
/// map it returns can be mapped without a panic or an endless loop: bucket
/// ids match their slots, algorithm-specific arrays match the item count,
/// tree buckets hold their items, the bucket hierarchy has no cycle, only the
/// rjenkins1 hash is used, and counts (devices, replicas, retries,
/// choose_args) are within the limits above. Errors name the byte offset
/// and the part being read.
pub fn decode(buf: &[u8]) -> Result<CrushMap> {
    decode_with(buf, true)
}

/// Decode a map that Ceph accepts but that may not be mappable: retry
/// tunables and `set_*_tries` above [`MAX_TRIES`], choose steps above
/// [`MAX_STEP_NUMREP`] replicas, bucket cycles and hash types other than
/// rjenkins1 are kept as they are (crushtool decompiles such maps, and so
/// must `iolift crush decompile` / `info`). The format and allocation
/// checks still apply. Never pass the result to the mapper without
/// [`decode`]'s checks.
pub fn decode_for_text(buf: &[u8]) -> Result<CrushMap> {
    decode_with(buf, false)
}

fn decode_with(buf: &[u8], strict: bool) -> Result<CrushMap> {
    let mut r = Reader {
        buf,
        pos: 0,
        ctx: String::new(),
        strict,
    };
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        return Err(CrushError::BadMagic(magic));
    }
    let at = r.pos;
    let max_buckets = r.i32("max_buckets")?;
    let max_rules = r.u32("max_rules")?;
    let max_devices = r.i32("max_devices")?;
    // Every bucket slot and rule slot takes at least 4 bytes.
    if max_buckets < 0 || max_buckets as usize > r.left() / 4 {
        return r.corrupt_at(
            at,
            format!(
                "max_buckets {max_buckets} out of range (the {} bytes left hold at most {})",
                r.left(),
                r.left() / 4
            ),
        );
    }
    if max_rules as usize > r.left() / 4 || max_rules > 256 {
        return r.corrupt_at(
            at + 4,
            format!("max_rules {max_rules} out of range (at most 256)"),
        );
    }
    if !(0..=MAX_DEVICES).contains(&max_devices) {
        return r.corrupt_at(
            at + 8,
            format!("max_devices {max_devices} out of range 0..={MAX_DEVICES}"),
        );
    }
    let mut buckets = Vec::with_capacity(max_buckets as usize);
    for slot in 0..max_buckets {
        r.ctx = format!("bucket {} (slot {slot})", -1 - slot);
        let alg = r.u32("alg")?;
        if alg == 0 {
            buckets.push(None);
            continue;
        }
        buckets.push(Some(decode_bucket(&mut r, slot, alg)?));
    }
    r.ctx.clear();
    if r.strict {
        check_acyclic(&buckets).or_else(|msg| r.corrupt(msg))?;
    }
    let mut rules = Vec::with_capacity(max_rules as usize);
    for ruleno in 0..max_rules {
        r.ctx = format!("rule {ruleno}");
        let yes = r.u32("exists flag")?;
        if yes == 0 {
            rules.push(None);
            continue;
        }
        let len = r.count(12, "step count")?;
        let ruleset = r.u8("ruleset")?;
        let rule_type = r.u8("type")?;
        let min_size = r.u8("min_size")?;
        let max_size = r.u8("max_size")?;
        let mut steps = Vec::with_capacity(len);
        for i in 0..len {
            let at = r.pos;
            let op = r.u32("step op")?;
            let arg1 = r.i32("step arg1")?;
            let arg2 = r.i32("step arg2")?;
            let bad = match op {
                OP_CHOOSE_FIRSTN | OP_CHOOSE_INDEP | OP_CHOOSELEAF_FIRSTN | OP_CHOOSELEAF_INDEP => {
                    arg1 > MAX_STEP_NUMREP
                }
                OP_SET_CHOOSE_TRIES
                | OP_SET_CHOOSELEAF_TRIES
                | OP_SET_CHOOSE_LOCAL_TRIES
                | OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES => arg1 > MAX_TRIES as i32,
                _ => false,
            };
            if bad && r.strict {
                return r.corrupt_at(
                    at,
                    format!(
                        "step {i} (op {op}) argument {arg1} out of range (replicas at most {MAX_STEP_NUMREP}, tries at most {MAX_TRIES})"
                    ),
                );
            }
            steps.push(Step { op, arg1, arg2 });
        }
        rules.push(Some(Rule {
            ruleset,
            rule_type,
            min_size,
            max_size,
            steps,
        }));
    }
    r.ctx.clear();
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
        let at = r.pos;
        t.choose_local_tries = r.u32("choose_local_tries")?;
        t.choose_local_fallback_tries = r.u32("choose_local_fallback_tries")?;
        t.choose_total_tries = r.u32("choose_total_tries")?;
        for (i, (name, v)) in [
            ("choose_local_tries", t.choose_local_tries),
            ("choose_local_fallback_tries", t.choose_local_fallback_tries),
            ("choose_total_tries", t.choose_total_tries),
        ]
        .into_iter()
        .enumerate()
        {
            if v > MAX_TRIES && r.strict {
                return r.corrupt_at(
                    at + 4 * i,
                    format!("tunable {name} {v} out of range (at most {MAX_TRIES})"),
                );
            }
        }
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
        let at = r.pos;
        let n = r.count(12, "choose_args")?;
        if n.saturating_mul(map.buckets.len()) > MAX_CHOOSE_ARGS_SLOTS {
            return r.corrupt_at(
                at,
                format!(
                    "{n} choose_args sets x {} buckets exceed {MAX_CHOOSE_ARGS_SLOTS} slots",
                    map.buckets.len()
                ),
            );
        }
        for _ in 0..n {
            r.ctx.clear();
            let idx = r.i64("choose_args index")?;
            r.ctx = format!("choose_args {idx}");
            let nargs = r.count(12, "entry count")?;
            let mut cam = ChooseArgMap {
                args: vec![ChooseArg::default(); map.buckets.len()],
            };
            for _ in 0..nargs {
                let at = r.pos;
                let bidx = r.u32("bucket index")? as usize;
                let Some(Some(b)) = map.buckets.get(bidx) else {
                    return r.corrupt_at(
                        at,
                        format!(
                            "bucket index {bidx} names no bucket (max_buckets {})",
                            map.buckets.len()
                        ),
                    );
                };
                let size = b.items.len();
                let bid = b.id;
                let positions = r.count(4, "weight_set positions")?;
                let mut ws = Vec::with_capacity(positions);
                for _ in 0..positions {
                    let at = r.pos;
                    let n = r.count(4, "weight_set")?;
                    if n != size {
                        return r.corrupt_at(
                            at,
                            format!("weight_set for bucket {bid} has {n} weights, the bucket has {size} items"),
                        );
                    }
                    ws.push(r.u32s(n, "weights")?);
                }
                let at = r.pos;
                let nids = r.count(4, "ids")?;
                if nids != 0 && nids != size {
                    return r.corrupt_at(
                        at,
                        format!("ids for bucket {bid} has {nids} ids, the bucket has {size} items"),
                    );
                }
                let ids = r.u32s(nids, "ids")?.into_iter().map(|v| v as i32).collect();
                cam.args[bidx] = ChooseArg {
                    ids,
                    weight_set: ws,
                };
            }
            map.choose_args.insert(idx, cam);
        }
        r.ctx.clear();
        map.optional_groups = 8;
    }
    if !r.at_end() {
        // Squid adds msr tunables; 16.2 does not write them.
        return r.corrupt(format!("{} unexpected trailing bytes", r.left()));
    }
    Ok(map)
}

/// The mapper descends from a bucket into its bucket items until it finds
/// the wanted type: a cycle would make it loop forever (Ceph's too), so
/// reject one. Iterative depth-first search, O(total items).
fn check_acyclic(buckets: &[Option<Bucket>]) -> std::result::Result<(), String> {
    const NEW: u8 = 0;
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let child = |item: i32| -> Option<usize> {
        if item >= 0 {
            return None;
        }
        let i = (-1i64 - item as i64) as usize;
        matches!(buckets.get(i), Some(Some(_))).then_some(i)
    };
    let mut state = vec![NEW; buckets.len()];
    // (bucket slot, next item index)
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in 0..buckets.len() {
        if state[root] != NEW || buckets[root].is_none() {
            continue;
        }
        state[root] = ON_PATH;
        stack.push((root, 0));
        while let Some(top) = stack.last_mut() {
            let (slot, next) = *top;
            let items = &buckets[slot].as_ref().expect("bucket on stack").items;
            if next == items.len() {
                state[slot] = DONE;
                stack.pop();
                continue;
            }
            top.1 += 1;
            let Some(c) = child(items[next]) else {
                continue;
            };
            match state[c] {
                NEW => {
                    state[c] = ON_PATH;
                    stack.push((c, 0));
                }
                ON_PATH => {
                    let from = stack.iter().position(|&(s, _)| s == c).unwrap_or(0);
                    let path: Vec<String> = stack[from..]
                        .iter()
                        .map(|&(s, _)| (-1 - s as i64).to_string())
                        .chain(std::iter::once((-1 - c as i64).to_string()))
                        .collect();
                    return Err(format!(
                        "bucket hierarchy has a cycle: {}",
                        path.join(" -> ")
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn decode_bucket(r: &mut Reader, slot: i32, alg32: u32) -> Result<Bucket> {
    let at = r.pos;
    let id = r.i32("id")?;
    let type_id = r.u16("type")?;
    let alg = r.u8("alg")?;
    let hash = r.u8("hash")?;
    let weight = r.u32("weight")?;
    let size = r.count(4, "item count")?;
    if alg as u32 != alg32 || !(ALG_UNIFORM..=ALG_STRAW2).contains(&alg) {
        return r.corrupt_at(
            at - 4,
            format!("unknown bucket algorithm {alg32} (header) / {alg} (bucket)"),
        );
    }
    if id != -1 - slot {
        return r.corrupt_at(at, format!("holds id {id}, expected {}", -1 - slot));
    }
    if hash != 0 && r.strict {
        // Ceph's crush_hash32_* return 0 for any other hash type.
        return r.corrupt_at(
            at + 7,
            format!("unsupported hash type {hash} (only 0, rjenkins1)"),
        );
    }
    let items: Vec<i32> = r
        .u32s(size, "items")?
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
            let at = r.pos;
            let n = r.u8("tree num_nodes")? as usize;
            b.node_weights = r.u32s(n, "tree node weights")?;
            // The mapper walks from n/2 down to leaves 2i+1; require a full
            // power-of-two tree that holds every item. (num_nodes is a u8 in
            // Ceph: a tree bucket of more than 64 items wraps to 0 nodes and
            // Ceph's mapper reads out of bounds; refuse it.)
            if size > 0 && (n < 2 || !n.is_power_of_two() || 2 * size > n) {
                return r.corrupt_at(
                    at,
                    format!("tree num_nodes {n} cannot hold {size} items (a tree bucket holds at most 64)"),
                );
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
