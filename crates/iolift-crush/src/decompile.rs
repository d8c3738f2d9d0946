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

/// `crushtool -d` text, byte for byte what Ceph 16.2's decompiler prints for
/// the same binary map. Where that decompiler gives up part way (a bucket
/// cycle, a `take` step whose item has no usable name), this is the text it
/// printed up to that point; [`decompile_partial`] also says why.
pub fn decompile(map: &CrushMap) -> String {
    decompile_partial(map).0
}

/// [`decompile`] plus the reason, when crushtool's decompiler would stop
/// early (its output is then cut where crushtool's is).
pub fn decompile_partial(map: &CrushMap) -> (String, Option<String>) {
    let mut out = String::with_capacity(256 + 64 * map.buckets.len());
    let err = Decompiler::new(map).run(&mut out).err();
    (out, err)
}

/// `CrushWrapper::is_valid_crush_name`: non-empty, `[A-Za-z0-9_.-]` only.
/// Shadow buckets (`host~ssd`) fail it and are not printed.
pub fn is_valid_crush_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// Print a 16.16 fixed-point weight the way `printf("%.3f", (float)v /
/// 0x10000)` does: the integer goes through `float` (round to nearest even),
/// the division by 2^16 is exact, and the decimal rounding of the exact value
/// is round-half-even (glibc), so 0.0625 prints as 0.062.
pub fn fixed_point_text(v: i32) -> String {
    let mut s = String::new();
    push_fixed(&mut s, v);
    s
}

fn push_fixed(out: &mut String, v: i32) {
    let exact = (v as f32) as i64; // integral, |exact| <= 2^31
    let scaled = exact.unsigned_abs() as u128 * 1000;
    let mut q = scaled >> 16;
    let r = scaled & 0xffff;
    if r > 0x8000 || (r == 0x8000 && q & 1 == 1) {
        q += 1;
    }
    if exact < 0 {
        out.push('-');
    }
    let _ = write!(out, "{}.{:03}", q / 1000, q % 1000);
}

const BUCKET_NEW: u8 = 0;
const BUCKET_IN_PROGRESS: u8 = 1;
const BUCKET_DONE: u8 = 2;

struct Decompiler<'a> {
    map: &'a CrushMap,
}

impl<'a> Decompiler<'a> {
    fn new(map: &'a CrushMap) -> Self {
        Decompiler { map }
    }

    fn run(&self, out: &mut String) -> Result<(), String> {
        out.push_str("# begin crush map\n");
        self.tunables(out);
        out.push_str("\n# devices\n");
        self.devices(out);
        out.push_str("\n# types\n");
        self.types(out);
        out.push_str("\n# buckets\n");
        self.buckets(out)?;
        out.push_str("\n# rules\n");
        self.rules(out)?;
        if !self.map.choose_args.is_empty() {
            out.push_str("\n# choose_args\n");
            self.choose_args(out);
        }
        out.push_str("\n# end crush map\n");
        Ok(())
    }

    /// Only the tunables that differ from the legacy (argonaut) values. The
    /// three `*_tries` and `chooseleaf_descend_once` go through `int`
    /// getters, `allowed_bucket_algs` through an unsigned one.
    fn tunables(&self, out: &mut String) {
        let t = &self.map.tunables;
        let signed = [
            ("choose_local_tries", t.choose_local_tries, 2),
            (
                "choose_local_fallback_tries",
                t.choose_local_fallback_tries,
                5,
            ),
            ("choose_total_tries", t.choose_total_tries, 19),
            ("chooseleaf_descend_once", t.chooseleaf_descend_once, 0),
        ];
        for (name, v, legacy) in signed {
            if v != legacy {
                let _ = writeln!(out, "tunable {name} {}", v as i32);
            }
        }
        let bytes = [
            ("chooseleaf_vary_r", t.chooseleaf_vary_r),
            ("chooseleaf_stable", t.chooseleaf_stable),
            ("straw_calc_version", t.straw_calc_version),
        ];
        for (name, v) in bytes {
            if v != 0 {
                let _ = writeln!(out, "tunable {name} {v}");
            }
        }
        if t.allowed_bucket_algs != Tunables::LEGACY.allowed_bucket_algs {
            let _ = writeln!(out, "tunable allowed_bucket_algs {}", t.allowed_bucket_algs);
        }
    }

    /// Decoding finalizes the map: max_devices becomes one past the largest
    /// device item in any bucket, raised to one past the largest named id.
    /// The encoded max_devices plays no part. Unnamed ids (holes) print
    /// nothing.
    fn devices(&self, out: &mut String) {
        let map = self.map;
        let mut max_devices: i32 = 0;
        for b in map.buckets.iter().flatten() {
            for &it in &b.items {
                if it >= max_devices {
                    max_devices = it.wrapping_add(1);
                }
            }
        }
        if let Some((&last, _)) = map.names.last_key_value() {
            if last >= max_devices {
                max_devices = last.wrapping_add(1);
            }
        }
        if max_devices <= 0 {
            return;
        }
        for (&id, name) in map.names.range(0..max_devices) {
            let _ = write!(out, "device {id} {name}");
            if let Some(c) = self.item_class(id) {
                let _ = write!(out, " class {c}");
            }
            out.push('\n');
        }
    }

    /// Type ids upward from 0 until every name is printed; a missing type 0
    /// prints as `osd`. Negative ids come last (crushtool's counter only
    /// reaches them after wrapping around).
    fn types(&self, out: &mut String) {
        let names = &self.map.type_names;
        if names.is_empty() {
            return;
        }
        if !names.contains_key(&0) {
            out.push_str("type 0 osd\n");
        }
        let (neg, nonneg): (Vec<_>, Vec<_>) = names.iter().partition(|(&k, _)| k < 0);
        for (k, name) in nonneg.into_iter().chain(neg) {
            let _ = writeln!(out, "type {k} {name}");
        }
    }

    /// Depth first from bucket -1 downwards: children before parents, each
    /// bucket once. Iterative, so a deep or cyclic map cannot overflow the
    /// stack; a cycle ends the output as it ends crushtool's.
    fn buckets(&self, out: &mut String) -> Result<(), String> {
        let map = self.map;
        let mut state = vec![BUCKET_NEW; map.buckets.len()];
        // (bucket, slot, next item index)
        let mut stack: Vec<(&Bucket, usize, usize)> = Vec::new();
        for top in 0..map.buckets.len() {
            let Some(root) = map.buckets[top].as_ref() else {
                continue;
            };
            if state[top] == BUCKET_DONE {
                continue;
            }
            state[top] = BUCKET_IN_PROGRESS;
            stack.push((root, top, 0));
            while let Some(&mut (b, s, ref mut next)) = stack.last_mut() {
                let Some(&item) = b.items.get(*next) else {
                    self.bucket(out, b);
                    state[s] = BUCKET_DONE;
                    stack.pop();
                    continue;
                };
                *next += 1;
                let Some(child) = map.bucket(item) else {
                    continue; // a device, or no such bucket
                };
                let cs = (-1i64 - item as i64) as usize;
                match state[cs] {
                    BUCKET_NEW => {
                        state[cs] = BUCKET_IN_PROGRESS;
                        stack.push((child, cs, 0));
                    }
                    BUCKET_IN_PROGRESS => {
                        return Err(format!(
                            "decompile_crush_bucket: error: while trying to output bucket {}, \
                             we found out that it contains one of the buckets that contain it. \
                             This is not allowed. The buckets must form a directed acyclic graph.",
                            b.id
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn bucket(&self, out: &mut String, b: &Bucket) {
        let map = self.map;
        let id = b.id;
        if let Some(name) = map.names.get(&id) {
            if !is_valid_crush_name(name) {
                return; // shadow bucket of a device class
            }
        }
        self.type_name(out, b.type_id as i32);
        out.push(' ');
        self.item_name(out, id);
        let _ = writeln!(out, " {{\n\tid {id}\t\t# do not change unnecessarily");
        if let Some(classes) = map.class_bucket.get(&id) {
            for (c, shadow) in classes {
                let cname = map.class_names.get(c).map(String::as_str).unwrap_or("");
                let _ = writeln!(
                    out,
                    "\tid {shadow} class {cname}\t\t# do not change unnecessarily"
                );
            }
        }
        out.push_str("\t# weight ");
        push_fixed(out, b.weight as i32);
        let n = b.items.len();
        let _ = write!(out, "\n\talg {}", alg_name(b.alg));
        let with_pos = match b.alg {
            ALG_UNIFORM => {
                let _ = write!(out, "\t# do not change bucket size ({n}) unnecessarily");
                true
            }
            ALG_LIST => {
                out.push_str("\t# add new items at the end; do not change order unnecessarily");
                false
            }
            ALG_TREE => {
                out.push_str("\t# do not change pos for existing items unnecessarily");
                true
            }
            _ => false,
        };
        let hash_name = if b.hash == 0 { "rjenkins1" } else { "unknown" };
        let _ = writeln!(out, "\n\thash {}\t# {hash_name}", b.hash);
        for (j, &item) in b.items.iter().enumerate() {
            out.push_str("\titem ");
            self.item_name(out, item);
            out.push_str(" weight ");
            push_fixed(out, item_weight(b, j) as i32);
            if with_pos {
                let _ = write!(out, " pos {j}");
            }
            out.push('\n');
        }
        out.push_str("}\n");
    }

    fn rules(&self, out: &mut String) -> Result<(), String> {
        let map = self.map;
        for (i, r) in map.rules.iter().enumerate() {
            let Some(r) = r else { continue };
            let i = i as i32;
            out.push_str("rule ");
            if let Some(name) = map.rule_names.get(&i) {
                out.push_str(name);
            }
            let _ = writeln!(out, " {{\n\tid {i}");
            if i != r.ruleset as i32 {
                let _ = writeln!(
                    out,
                    "\t# WARNING: ruleset {} != id {i}; this will not recompile to the same map",
                    r.ruleset
                );
            }
            match r.rule_type {
                1 => out.push_str("\ttype replicated\n"),
                3 => out.push_str("\ttype erasure\n"),
                t => {
                    let _ = writeln!(out, "\ttype {t}");
                }
            }
            let _ = writeln!(out, "\tmin_size {}\n\tmax_size {}", r.min_size, r.max_size);
            for s in &r.steps {
                self.step(out, s)?;
            }
            out.push_str("}\n");
        }
        Ok(())
    }

    fn step(&self, out: &mut String, s: &Step) -> Result<(), String> {
        let set = |out: &mut String, what: &str| {
            let _ = writeln!(out, "\tstep {what} {}", s.arg1);
        };
        let choose = |out: &mut String, what: &str| {
            let _ = write!(out, "\tstep {what} {} type ", s.arg1);
            self.type_name(out, s.arg2);
            out.push('\n');
        };
        match s.op {
            OP_NOOP => out.push_str("\tstep noop\n"),
            OP_TAKE => {
                out.push_str("\tstep take ");
                let (item, class) = self.split_id_class(s.arg1)?;
                self.item_name(out, item);
                if let Some(c) = class {
                    match self.map.class_names.get(&c) {
                        Some(name) => {
                            let _ = write!(out, " class {name}");
                        }
                        None => {
                            let _ = write!(out, " # unexpected class {c}");
                        }
                    }
                }
                out.push('\n');
            }
            OP_EMIT => out.push_str("\tstep emit\n"),
            OP_SET_CHOOSE_TRIES => set(out, "set_choose_tries"),
            OP_SET_CHOOSE_LOCAL_TRIES => set(out, "set_choose_local_tries"),
            OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES => set(out, "set_choose_local_fallback_tries"),
            OP_SET_CHOOSELEAF_TRIES => set(out, "set_chooseleaf_tries"),
            OP_SET_CHOOSELEAF_VARY_R => set(out, "set_chooseleaf_vary_r"),
            OP_SET_CHOOSELEAF_STABLE => set(out, "set_chooseleaf_stable"),
            OP_CHOOSE_FIRSTN => choose(out, "choose firstn"),
            OP_CHOOSE_INDEP => choose(out, "choose indep"),
            OP_CHOOSELEAF_FIRSTN => choose(out, "chooseleaf firstn"),
            OP_CHOOSELEAF_INDEP => choose(out, "chooseleaf indep"),
            _ => {} // unknown opcodes print nothing
        }
        Ok(())
    }

    /// `CrushWrapper::split_id_class`, which works on names: an item named
    /// `NAME~CLASS` is the shadow of the item named NAME for class CLASS.
    /// Returns the item to print and the class id, if any.
    fn split_id_class(&self, item: i32) -> Result<(i32, Option<i32>), String> {
        let map = self.map;
        let Some(name) = map.names.get(&item) else {
            return Err(format!("take step item {item} has no name"));
        };
        let Some((base, class)) = name.split_once('~') else {
            return Ok((item, None));
        };
        // Reverse maps as build_rmaps makes them: on duplicate names the
        // largest id wins.
        let Some(base_id) = map
            .names
            .iter()
            .rev()
            .find(|(_, n)| *n == base)
            .map(|(&k, _)| k)
        else {
            return Err(format!(
                "take step item {item} ({name}): no item named {base}"
            ));
        };
        let Some(class_id) = map
            .class_names
            .iter()
            .rev()
            .find(|(_, n)| *n == class)
            .map(|(&k, _)| k)
        else {
            return Err(format!(
                "take step item {item} ({name}): no class named {class}"
            ));
        };
        if class_id >= 0 {
            Ok((base_id, Some(class_id)))
        } else {
            Ok((item, None))
        }
    }

    /// After decoding, choose_args entries of buckets that are missing or
    /// not straw2 are dropped (`update_choose_args`), then every bucket with
    /// a weight set or ids prints. Set ids print as unsigned 64-bit.
    fn choose_args(&self, out: &mut String) {
        let map = self.map;
        for (&key, cam) in &map.choose_args {
            let _ = writeln!(out, "choose_args {} {{", key as u64);
            for (i, arg) in cam.args.iter().enumerate() {
                let straw2 = matches!(map.buckets.get(i), Some(Some(b)) if b.alg == ALG_STRAW2);
                if !straw2 || (arg.ids.is_empty() && arg.weight_set.is_empty()) {
                    continue;
                }
                let _ = writeln!(out, "  {{\n    bucket_id {}", -1 - i as i64);
                if !arg.weight_set.is_empty() {
                    out.push_str("    weight_set [\n");
                    for ws in &arg.weight_set {
                        out.push_str("      [ ");
                        for &w in ws {
                            push_fixed(out, w as i32);
                            out.push(' ');
                        }
                        out.push_str("]\n");
                    }
                    out.push_str("    ]\n");
                }
                if !arg.ids.is_empty() {
                    out.push_str("    ids [ ");
                    for id in &arg.ids {
                        let _ = write!(out, "{id} ");
                    }
                    out.push_str("]\n");
                }
                out.push_str("  }\n");
            }
            out.push_str("}\n");
        }
    }

    fn item_class(&self, id: i32) -> Option<&'a str> {
        let c = self.map.class_map.get(&id)?;
        self.map.class_names.get(c).map(String::as_str)
    }

    fn type_name(&self, out: &mut String, t: i32) {
        match self.map.type_names.get(&t) {
            Some(n) => out.push_str(n),
            None if t == 0 => out.push_str("device"),
            None => {
                let _ = write!(out, "type{t}");
            }
        }
    }

    fn item_name(&self, out: &mut String, id: i32) {
        match self.map.names.get(&id) {
            Some(n) => out.push_str(n),
            None if id >= 0 => {
                let _ = write!(out, "device{id}");
            }
            None => {
                let _ = write!(out, "bucket{}", -1 - id as i64);
            }
        }
    }
}

/// `crush_get_bucket_item_weight`: what the algorithm's own arrays hold.
fn item_weight(b: &Bucket, j: usize) -> u32 {
    match b.alg {
        ALG_UNIFORM => b.uniform_weight,
        ALG_TREE => b.node_weights.get(2 * j + 1).copied().unwrap_or(0),
        _ => b.item_weights.get(j).copied().unwrap_or(0),
    }
}
