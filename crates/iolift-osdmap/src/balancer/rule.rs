//! What a pool's CRUSH rule allows an upmap to do. The rule is read as one
//! `take` of a bucket, one or more `choose`/`chooseleaf` steps and one
//! `emit`. Every OSD under the taken bucket gets its CRUSH weight and, for
//! each choose step, its ancestor of that step's bucket type. A shard may
//! move from OSD `a` to OSD `b` when `b` is under the taken bucket, has
//! the same ancestors as `a` at every step but the last, and its ancestor
//! at the last step's type (the failure domain) is used by no other shard.

use crate::types::OsdMap;
use iolift_crush::map::{
    OP_CHOOSELEAF_FIRSTN, OP_CHOOSELEAF_INDEP, OP_CHOOSE_FIRSTN, OP_CHOOSE_INDEP, OP_EMIT, OP_NOOP,
    OP_TAKE,
};

/// Ancestor slot of an OSD that is not under the taken bucket.
pub const NOT_UNDER: i32 = i32::MIN;

/// Deepest bucket nesting followed (a crush map with a cycle is rejected).
const MAX_DEPTH: usize = 64;

/// The rule of one pool, resolved against the crush map.
#[derive(Debug, Clone)]
pub struct RuleShape {
    /// CRUSH weight (16.16) of each OSD under the taken bucket, by OSD id;
    /// 0 for the others.
    pub weight: Vec<u32>,
    /// For each choose step but the last: the ancestor of each OSD of
    /// that step's type (the OSD itself for type 0), by OSD id.
    pub keep: Vec<Vec<i32>>,
    /// The failure domain of each OSD: its ancestor of the last step's type.
    pub domain: Vec<i32>,
}

impl RuleShape {
    /// Whether `osd` is under the taken bucket with a weight above 0.
    pub fn eligible(&self, osd: i32) -> bool {
        osd >= 0 && (osd as usize) < self.weight.len() && self.weight[osd as usize] > 0
    }

    /// Whether the shard on `from` may move to `to` in a set whose other
    /// shards are `others` (entries equal to `from` or ITEM_NONE ignored).
    pub fn allows(&self, from: i32, to: i32, set: &[i32]) -> bool {
        if !self.eligible(to) || set.contains(&to) {
            return false;
        }
        let (f, t) = (from as usize, to as usize);
        if from < 0 || f >= self.domain.len() {
            return false;
        }
        if self.keep.iter().any(|k| k[f] != k[t]) {
            return false;
        }
        let d = self.domain[t];
        set.iter().all(|&o| {
            o == from || o < 0 || o as usize >= self.domain.len() || self.domain[o as usize] != d
        })
    }

    /// Whether `set` (an up set of this rule) keeps one shard per failure
    /// domain and every shard under the taken bucket.
    pub fn valid_set(&self, set: &[i32]) -> bool {
        let live: Vec<i32> = set
            .iter()
            .copied()
            .filter(|&o| o >= 0 && o != i32::MAX)
            .collect();
        for (i, &o) in live.iter().enumerate() {
            if !self.eligible(o) {
                return false;
            }
            for &p in &live[..i] {
                if p == o || self.domain[p as usize] == self.domain[o as usize] {
                    return false;
                }
            }
        }
        true
    }
}

/// Resolve rule `ruleno` of `map` for balancing; an error says why a rule
/// of another shape cannot be balanced.
pub fn analyze(map: &OsdMap, ruleno: i32) -> Result<RuleShape, String> {
    let crush = &map.crush;
    let rule = crush
        .rule(ruleno)
        .ok_or_else(|| format!("crush rule {ruleno} does not exist"))?;
    let mut take = None;
    let mut types: Vec<i32> = Vec::new();
    let mut leaf = false;
    let mut emitted = false;
    for s in &rule.steps {
        match s.op {
            OP_NOOP => {}
            OP_TAKE if take.is_none() => take = Some(s.arg1),
            OP_TAKE => return Err("the rule has more than one take step".into()),
            OP_CHOOSE_FIRSTN | OP_CHOOSE_INDEP | OP_CHOOSELEAF_FIRSTN | OP_CHOOSELEAF_INDEP => {
                if take.is_none() || emitted || leaf {
                    return Err("a choose step after chooseleaf, emit or before take".into());
                }
                types.push(s.arg2);
                leaf = s.op == OP_CHOOSELEAF_FIRSTN || s.op == OP_CHOOSELEAF_INDEP;
            }
            OP_EMIT if !emitted => emitted = true,
            OP_EMIT => return Err("the rule has more than one emit step".into()),
            // set_choose_tries and the like change retries, not shape
            op if (8..=13).contains(&op) => {}
            op => return Err(format!("step op {op} is not supported")),
        }
    }
    let root = take.ok_or("the rule has no take step")?;
    if types.is_empty() || !emitted {
        return Err("the rule needs a choose or chooseleaf step and an emit".into());
    }
    let last = *types.last().unwrap_or(&0);
    if !leaf && last != 0 {
        return Err(format!(
            "the last step chooses buckets of type {last}, not OSDs"
        ));
    }
    let n = map.max_osd.max(0) as usize;
    let mut shape = RuleShape {
        weight: vec![0; n],
        keep: vec![vec![NOT_UNDER; n]; types.len() - 1],
        domain: vec![NOT_UNDER; n],
    };
    // Depth-first walk under the taken item; the path holds bucket ids.
    let mut path: Vec<i32> = Vec::new();
    walk(map, root, 0x10000, &mut path, &types, &mut shape)?;
    Ok(shape)
}

fn walk(
    map: &OsdMap,
    item: i32,
    weight: u32,
    path: &mut Vec<i32>,
    types: &[i32],
    shape: &mut RuleShape,
) -> Result<(), String> {
    if item >= 0 {
        let o = item as usize;
        if o >= shape.weight.len() || shape.weight[o] > 0 || weight == 0 {
            return Ok(());
        }
        shape.weight[o] = weight;
        let anc = |t: i32| -> i32 {
            if t == 0 {
                return item;
            }
            path.iter()
                .rev()
                .copied()
                .find(|&b| map.crush.bucket_type(b) == t)
                .unwrap_or(NOT_UNDER)
        };
        for (k, &t) in types[..types.len() - 1].iter().enumerate() {
            shape.keep[k][o] = anc(t);
        }
        shape.domain[o] = anc(types[types.len() - 1]);
        return Ok(());
    }
    if path.len() >= MAX_DEPTH || path.contains(&item) {
        return Err(format!("crush bucket {item} nests too deep or in a cycle"));
    }
    let Some(b) = map.crush.bucket(item) else {
        return Err(format!(
            "the rule takes bucket {item}, which does not exist"
        ));
    };
    path.push(item);
    for (i, &child) in b.items.iter().enumerate() {
        let w = b.item_weights.get(i).copied().unwrap_or(0);
        walk(map, child, w, path, types, shape)?;
    }
    path.pop();
    Ok(())
}
