//! In-memory CRUSH map: flat vectors of buckets and rules, easy to upload
//! to an accelerator (see docs/crush.md for the layout).

use std::collections::BTreeMap;

pub const ITEM_NONE: i32 = 0x7fff_ffff;
pub const ITEM_UNDEF: i32 = 0x7fff_fffe;

pub const ALG_UNIFORM: u8 = 1;
pub const ALG_LIST: u8 = 2;
pub const ALG_TREE: u8 = 3;
pub const ALG_STRAW: u8 = 4;
pub const ALG_STRAW2: u8 = 5;

pub const OP_NOOP: u32 = 0;
pub const OP_TAKE: u32 = 1;
pub const OP_CHOOSE_FIRSTN: u32 = 2;
pub const OP_CHOOSE_INDEP: u32 = 3;
pub const OP_EMIT: u32 = 4;
pub const OP_CHOOSELEAF_FIRSTN: u32 = 6;
pub const OP_CHOOSELEAF_INDEP: u32 = 7;
pub const OP_SET_CHOOSE_TRIES: u32 = 8;
pub const OP_SET_CHOOSELEAF_TRIES: u32 = 9;
pub const OP_SET_CHOOSE_LOCAL_TRIES: u32 = 10;
pub const OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES: u32 = 11;
pub const OP_SET_CHOOSELEAF_VARY_R: u32 = 12;
pub const OP_SET_CHOOSELEAF_STABLE: u32 = 13;

/// Name of a bucket algorithm as the text format spells it.
pub fn alg_name(alg: u8) -> &'static str {
    match alg {
        ALG_UNIFORM => "uniform",
        ALG_LIST => "list",
        ALG_TREE => "tree",
        ALG_STRAW => "straw",
        ALG_STRAW2 => "straw2",
        _ => "unknown",
    }
}

/// One bucket. `item_weights` is always filled (for tree buckets from the
/// leaf nodes, for uniform buckets repeated); the algorithm-specific arrays
/// are what the binary encoding carries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bucket {
    pub id: i32,
    pub type_id: u16,
    pub alg: u8,
    pub hash: u8,
    pub weight: u32,
    pub items: Vec<i32>,
    pub item_weights: Vec<u32>,
    /// list: running sums of item weights.
    pub sum_weights: Vec<u32>,
    /// tree: implicit binary tree, `num_nodes = node_weights.len()`.
    pub node_weights: Vec<u32>,
    /// straw: per-item straw lengths.
    pub straws: Vec<u32>,
    /// uniform: the common item weight.
    pub uniform_weight: u32,
}

impl Bucket {
    /// A straw2 bucket (rjenkins1 hash) of `items` with their `weights`
    /// (16.16); its own weight is their sum.
    pub fn straw2(id: i32, type_id: u16, items: Vec<i32>, weights: Vec<u32>) -> Bucket {
        Bucket {
            id,
            type_id,
            alg: ALG_STRAW2,
            hash: 0,
            weight: weights.iter().sum(),
            items,
            item_weights: weights,
            ..Bucket::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub op: u32,
    pub arg1: i32,
    pub arg2: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub ruleset: u8,
    pub rule_type: u8,
    pub min_size: u8,
    pub max_size: u8,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    pub choose_local_tries: u32,
    pub choose_local_fallback_tries: u32,
    pub choose_total_tries: u32,
    pub chooseleaf_descend_once: u32,
    pub chooseleaf_vary_r: u8,
    pub straw_calc_version: u8,
    pub allowed_bucket_algs: u32,
    pub chooseleaf_stable: u8,
}

impl Tunables {
    /// What a decoder assumes for fields absent from the encoding.
    pub const LEGACY: Tunables = Tunables {
        choose_local_tries: 2,
        choose_local_fallback_tries: 5,
        choose_total_tries: 19,
        chooseleaf_descend_once: 0,
        chooseleaf_vary_r: 0,
        straw_calc_version: 0,
        allowed_bucket_algs: 22,
        chooseleaf_stable: 0,
    };

    /// Apply a named profile (argonaut, bobtail, firefly, hammer, jewel,
    /// optimal, default, legacy) the way `CrushWrapper::set_tunables_*` does.
    pub fn set_profile(&mut self, name: &str) -> crate::Result<()> {
        let (l, f, t, d, v, s, a) = match name {
            "argonaut" | "legacy" => (2, 5, 19, 0, 0, 0, 22),
            "bobtail" => (0, 0, 50, 1, 0, 0, 22),
            "firefly" => (0, 0, 50, 1, 1, 0, 22),
            "hammer" => (0, 0, 50, 1, 1, 0, 54),
            "jewel" | "optimal" | "default" => (0, 0, 50, 1, 1, 1, 54),
            _ => {
                return Err(crate::CrushError::Invalid(format!(
                    "unknown tunables profile '{name}'"
                )))
            }
        };
        self.choose_local_tries = l;
        self.choose_local_fallback_tries = f;
        self.choose_total_tries = t;
        self.chooseleaf_descend_once = d;
        self.chooseleaf_vary_r = v;
        self.chooseleaf_stable = s;
        self.allowed_bucket_algs = a;
        if name == "legacy" {
            self.straw_calc_version = 0;
        } else if matches!(name, "optimal" | "default") {
            self.straw_calc_version = 1;
        }
        Ok(())
    }
}

/// Per-bucket choose_args entry (straw2 only): replacement hash ids and
/// per-position weight sets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChooseArg {
    pub ids: Vec<i32>,
    pub weight_set: Vec<Vec<u32>>,
}

/// One choose_args set: indexed by bucket index (`-1 - id`), `max_buckets` long.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChooseArgMap {
    pub args: Vec<ChooseArg>,
}

/// A decoded crush map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrushMap {
    pub max_devices: i32,
    /// Slot `i` holds bucket id `-1 - i`.
    pub buckets: Vec<Option<Bucket>>,
    pub rules: Vec<Option<Rule>>,
    pub type_names: BTreeMap<i32, String>,
    pub names: BTreeMap<i32, String>,
    pub rule_names: BTreeMap<i32, String>,
    pub tunables: Tunables,
    pub class_map: BTreeMap<i32, i32>,
    pub class_names: BTreeMap<i32, String>,
    pub class_bucket: BTreeMap<i32, BTreeMap<i32, i32>>,
    pub choose_args: BTreeMap<i64, ChooseArgMap>,
    /// How many optional trailing groups the encoding carried (0..=8); the
    /// encoder writes the same number so re-encoding is byte-identical.
    pub optional_groups: u8,
}

/// choose_args set id used when no per-pool set exists.
pub const DEFAULT_CHOOSE_ARGS: i64 = -1;

impl CrushMap {
    #[inline]
    pub fn bucket(&self, id: i32) -> Option<&Bucket> {
        if id >= 0 {
            return None;
        }
        let idx = (-1i64 - id as i64) as usize;
        self.buckets.get(idx).and_then(|b| b.as_ref())
    }

    pub fn rule(&self, ruleno: i32) -> Option<&Rule> {
        if ruleno < 0 {
            return None;
        }
        self.rules.get(ruleno as usize).and_then(|r| r.as_ref())
    }

    pub fn max_buckets(&self) -> i32 {
        self.buckets.len() as i32
    }

    pub fn max_rules(&self) -> i32 {
        self.rules.len() as i32
    }

    /// `choose_args_get_with_fallback`: set `index`, else the compat set -1.
    pub fn choose_args_for(&self, index: i64) -> Option<&ChooseArgMap> {
        self.choose_args
            .get(&index)
            .or_else(|| self.choose_args.get(&DEFAULT_CHOOSE_ARGS))
    }

    /// Whether device/bucket `id` appears as an item of any bucket.
    pub fn item_present(&self, id: i32) -> bool {
        self.buckets.iter().flatten().any(|b| b.items.contains(&id))
    }

    /// Devices that appear in some bucket, as a bitmap over 0..max_devices.
    pub fn present_devices(&self) -> Vec<bool> {
        let n = self.max_devices.max(0) as usize;
        let mut v = vec![false; n];
        for b in self.buckets.iter().flatten() {
            for &it in &b.items {
                if it >= 0 && (it as usize) < n {
                    v[it as usize] = true;
                }
            }
        }
        v
    }

    /// `CrushWrapper::get_bucket_type`: the bucket's type, -ENOENT (-2) otherwise.
    pub fn bucket_type(&self, id: i32) -> i32 {
        self.bucket(id).map(|b| b.type_id as i32).unwrap_or(-2)
    }
}
