//! `crush_do_rule`: rule interpretation, choose_firstn / choose_indep and the
//! five bucket algorithms, bit-exact with Ceph's `mapper.c`.
//!
//! All per-mapping scratch lives in a reusable [`Workspace`]; mapping does
//! not allocate once the workspace is sized.

// The control flow deliberately mirrors mapper.c branch for branch.
#![allow(
    clippy::collapsible_match,
    clippy::collapsible_if,
    clippy::if_same_then_else
)]

use crate::choose::{self, Isa, PermSlot};
use crate::hash::hash32_2;
use crate::map::*;
use rayon::prelude::*;

/// Reusable per-thread scratch for [`do_rule`].
///
/// The permutation cache is a pure function of (x, bucket id, bucket
/// size), so a workspace stays valid across maps: a slot whose length does
/// not match the bucket's size is reset on use. Preparing for a map is
/// therefore O(1) unless the map has more buckets than any before.
#[derive(Debug, Clone, Default)]
pub struct Workspace {
    perm: Vec<PermSlot>,
    a: Vec<i32>,
    b: Vec<i32>,
    c: Vec<i32>,
}

impl Workspace {
    /// A workspace for `map` and results of up to `result_max` items.
    pub fn new(map: &CrushMap, result_max: usize) -> Workspace {
        let mut ws = Workspace::default();
        ws.prepare(map, result_max);
        ws
    }

    /// Grow for `map` / `result_max` if needed (allocates only on growth).
    #[inline]
    pub fn prepare(&mut self, map: &CrushMap, result_max: usize) {
        if self.perm.len() < map.buckets.len() {
            self.perm.resize(map.buckets.len(), PermSlot::default());
        }
        if self.a.len() < result_max {
            self.a = vec![0; result_max];
            self.b = vec![0; result_max];
            self.c = vec![0; result_max];
        }
    }
}

struct Ctx<'a> {
    map: &'a CrushMap,
    weight: &'a [u32],
    x: i32,
    args: Option<&'a [ChooseArg]>,
    isa: Isa,
}

#[inline]
fn bucket_choose(ctx: &Ctx, perm: &mut [PermSlot], b: &Bucket, r: i32, position: i32) -> i32 {
    let arg = match (b.alg, ctx.args) {
        (ALG_STRAW2, Some(a)) => a.get((-1i64 - b.id as i64) as usize),
        _ => None,
    };
    choose::bucket_choose(ctx.isa, perm, b, ctx.x, r, arg, position)
}

#[inline]
fn is_out(ctx: &Ctx, item: i32) -> bool {
    let Some(&w) = ctx.weight.get(item as usize) else {
        return true;
    };
    if w >= 0x10000 {
        return false;
    }
    if w == 0 {
        return true;
    }
    (hash32_2(ctx.x as u32, item as u32) & 0xffff) >= w
}

#[allow(clippy::too_many_arguments)]
fn choose_firstn(
    ctx: &Ctx,
    perm: &mut [PermSlot],
    bucket: &Bucket,
    numrep: i32,
    type_: i32,
    out: &mut [i32],
    mut outpos: usize,
    out_size: i32,
    tries: u32,
    recurse_tries: u32,
    local_retries: u32,
    local_fallback: u32,
    recurse_to_leaf: bool,
    vary_r: u32,
    stable: u32,
    mut out2: Option<&mut [i32]>,
    parent_r: i32,
) -> usize {
    let map = ctx.map;
    let mut count = out_size;
    let mut rep: i32 = if stable != 0 { 0 } else { outpos as i32 };
    while rep < numrep && count > 0 {
        let mut ftotal: u32 = 0;
        let mut skip_rep = false;
        let mut item: i32 = 0;
        loop {
            let mut retry_descent = false;
            let mut in_b = bucket;
            let mut flocal: u32 = 0;
            loop {
                let mut retry_bucket = false;
                let mut collide = false;
                let r = rep.wrapping_add(parent_r).wrapping_add(ftotal as i32);
                let size = in_b.items.len() as u32;
                let reject;
                if size == 0 {
                    reject = true;
                } else {
                    item = if local_fallback > 0 && flocal >= (size >> 1) && flocal > local_fallback
                    {
                        choose::perm_choose(ctx.isa, perm, in_b, ctx.x, r)
                    } else {
                        bucket_choose(ctx, perm, in_b, r, outpos as i32)
                    };
                    if item >= map.max_devices {
                        skip_rep = true;
                        break;
                    }
                    let itemtype = if item < 0 {
                        match map.bucket(item) {
                            Some(b) => b.type_id as i32,
                            None => {
                                skip_rep = true;
                                break;
                            }
                        }
                    } else {
                        0
                    };
                    if itemtype != type_ {
                        match map.bucket(item) {
                            Some(b) => {
                                in_b = b;
                                continue;
                            }
                            None => {
                                skip_rep = true;
                                break;
                            }
                        }
                    }
                    collide = out[..outpos].contains(&item);
                    let mut rej = false;
                    if !collide && recurse_to_leaf {
                        if let Some(o2) = out2.as_deref_mut() {
                            if item < 0 {
                                let sub_r = if vary_r != 0 {
                                    r.wrapping_shr(vary_r - 1)
                                } else {
                                    0
                                };
                                let sub = map.bucket(item).expect("checked above");
                                let got = choose_firstn(
                                    ctx,
                                    perm,
                                    sub,
                                    if stable != 0 { 1 } else { outpos as i32 + 1 },
                                    0,
                                    o2,
                                    outpos,
                                    count,
                                    recurse_tries,
                                    0,
                                    local_retries,
                                    local_fallback,
                                    false,
                                    vary_r,
                                    stable,
                                    None,
                                    sub_r,
                                );
                                if got <= outpos {
                                    rej = true;
                                }
                            } else {
                                o2[outpos] = item;
                            }
                        }
                    }
                    if !rej && !collide && itemtype == 0 {
                        rej = is_out(ctx, item);
                    }
                    reject = rej;
                }
                if reject || collide {
                    ftotal += 1;
                    flocal += 1;
                    if collide && flocal <= local_retries {
                        retry_bucket = true;
                    } else if local_fallback > 0 && flocal <= size.wrapping_add(local_fallback) {
                        retry_bucket = true;
                    } else if ftotal < tries {
                        retry_descent = true;
                    } else {
                        skip_rep = true;
                    }
                }
                if !retry_bucket {
                    break;
                }
            }
            if !retry_descent {
                break;
            }
        }
        if !skip_rep {
            out[outpos] = item;
            outpos += 1;
            count -= 1;
        }
        rep += 1;
    }
    outpos
}

#[allow(clippy::too_many_arguments)]
fn choose_indep(
    ctx: &Ctx,
    perm: &mut [PermSlot],
    bucket: &Bucket,
    mut left: i32,
    numrep: i32,
    type_: i32,
    out: &mut [i32],
    outpos: usize,
    tries: u32,
    recurse_tries: u32,
    recurse_to_leaf: bool,
    mut out2: Option<&mut [i32]>,
    parent_r: i32,
) {
    let map = ctx.map;
    let endpos = outpos + left.max(0) as usize;
    for rep in outpos..endpos {
        out[rep] = ITEM_UNDEF;
        if let Some(o2) = out2.as_deref_mut() {
            o2[rep] = ITEM_UNDEF;
        }
    }
    let nrep = numrep as u32;
    let mut ftotal: u32 = 0;
    while left > 0 && ftotal < tries {
        for rep in outpos..endpos {
            if out[rep] != ITEM_UNDEF {
                continue;
            }
            let mut in_b = bucket;
            loop {
                let size = in_b.items.len() as u32;
                let mut r = (rep as i32).wrapping_add(parent_r) as u32;
                if in_b.alg == ALG_UNIFORM && nrep != 0 && size.is_multiple_of(nrep) {
                    r = r.wrapping_add(nrep.wrapping_add(1).wrapping_mul(ftotal));
                } else {
                    r = r.wrapping_add(nrep.wrapping_mul(ftotal));
                }
                let r = r as i32;
                if size == 0 {
                    break;
                }
                let item = bucket_choose(ctx, perm, in_b, r, outpos as i32);
                let mut none = item >= map.max_devices;
                let mut itemtype = 0;
                if !none && item < 0 {
                    match map.bucket(item) {
                        Some(b) => itemtype = b.type_id as i32,
                        None => none = true,
                    }
                }
                if !none && itemtype != type_ {
                    if item >= 0 {
                        none = true;
                    } else {
                        in_b = map.bucket(item).expect("checked above");
                        continue;
                    }
                }
                if none {
                    out[rep] = ITEM_NONE;
                    if let Some(o2) = out2.as_deref_mut() {
                        o2[rep] = ITEM_NONE;
                    }
                    left -= 1;
                    break;
                }
                if out[outpos..endpos].contains(&item) {
                    break;
                }
                if recurse_to_leaf {
                    if let Some(o2) = out2.as_deref_mut() {
                        if item < 0 {
                            let sub = map.bucket(item).expect("checked above");
                            choose_indep(
                                ctx,
                                perm,
                                sub,
                                1,
                                numrep,
                                0,
                                o2,
                                rep,
                                recurse_tries,
                                0,
                                false,
                                None,
                                r,
                            );
                            if o2[rep] == ITEM_NONE {
                                break;
                            }
                        } else {
                            o2[rep] = item;
                        }
                    }
                }
                if itemtype == 0 && is_out(ctx, item) {
                    break;
                }
                out[rep] = item;
                left -= 1;
                break;
            }
        }
        ftotal += 1;
    }
    for rep in outpos..endpos {
        if out[rep] == ITEM_UNDEF {
            out[rep] = ITEM_NONE;
        }
        if let Some(o2) = out2.as_deref_mut() {
            if o2[rep] == ITEM_UNDEF {
                o2[rep] = ITEM_NONE;
            }
        }
    }
}

/// Which compiled version of the bucket choosers this process runs:
/// `"avx2"` (x86-64 CPUs with AVX2) or `"portable"` (any other CPU, or the
/// environment variable `IOLIFT_CRUSH_SIMD=portable`). Both give the same
/// mappings.
pub fn simd() -> &'static str {
    Isa::get().name()
}

/// `crush_do_rule`: map input `x` through rule `ruleno`, writing up to
/// `result.len()` items (CRUSH_ITEM_NONE holes for indep). `weight` is the
/// device reweight vector (16.16, 0x10000 = in). Returns the result length;
/// a missing rule yields 0 like Ceph.
pub fn do_rule(
    map: &CrushMap,
    ruleno: i32,
    x: i32,
    result: &mut [i32],
    weight: &[u32],
    ws: &mut Workspace,
    choose_args: Option<&ChooseArgMap>,
) -> usize {
    let Some(rule) = map.rule(ruleno) else {
        return 0;
    };
    let result_max = result.len();
    ws.prepare(map, result_max);
    let ctx = Ctx {
        map,
        weight,
        x,
        args: choose_args.map(|c| c.args.as_slice()),
        isa: Isa::get(),
    };
    let t = &map.tunables;
    let mut choose_tries = t.choose_total_tries.wrapping_add(1);
    let mut choose_leaf_tries: u32 = 0;
    let mut local_retries = t.choose_local_tries;
    let mut local_fallback = t.choose_local_fallback_tries;
    let mut vary_r = t.chooseleaf_vary_r as u32;
    let mut stable = t.chooseleaf_stable as u32;
    let Workspace { perm, a, b, c } = ws;
    let mut w: &mut Vec<i32> = a;
    let mut o: &mut Vec<i32> = b;
    let mut wsize = 0usize;
    let mut result_len = 0usize;
    let rmax = result_max as i32;
    for step in &rule.steps {
        match step.op {
            OP_TAKE => {
                let a1 = step.arg1;
                if (a1 >= 0 && a1 < map.max_devices) || map.bucket(a1).is_some() {
                    if result_max > 0 {
                        w[0] = a1;
                        wsize = 1;
                    }
                }
            }
            OP_SET_CHOOSE_TRIES => {
                if step.arg1 > 0 {
                    choose_tries = step.arg1 as u32;
                }
            }
            OP_SET_CHOOSELEAF_TRIES => {
                if step.arg1 > 0 {
                    choose_leaf_tries = step.arg1 as u32;
                }
            }
            OP_SET_CHOOSE_LOCAL_TRIES => {
                if step.arg1 >= 0 {
                    local_retries = step.arg1 as u32;
                }
            }
            OP_SET_CHOOSE_LOCAL_FALLBACK_TRIES => {
                if step.arg1 >= 0 {
                    local_fallback = step.arg1 as u32;
                }
            }
            OP_SET_CHOOSELEAF_VARY_R => {
                if step.arg1 >= 0 {
                    vary_r = step.arg1 as u32;
                }
            }
            OP_SET_CHOOSELEAF_STABLE => {
                if step.arg1 >= 0 {
                    stable = step.arg1 as u32;
                }
            }
            OP_CHOOSE_FIRSTN | OP_CHOOSELEAF_FIRSTN | OP_CHOOSE_INDEP | OP_CHOOSELEAF_INDEP => {
                if wsize == 0 {
                    continue;
                }
                let firstn = matches!(step.op, OP_CHOOSE_FIRSTN | OP_CHOOSELEAF_FIRSTN);
                let leaf = matches!(step.op, OP_CHOOSELEAF_FIRSTN | OP_CHOOSELEAF_INDEP);
                let mut osize = 0usize;
                for &wi in &w[..wsize] {
                    let mut numrep = step.arg1;
                    if numrep <= 0 {
                        numrep = numrep.wrapping_add(rmax);
                        if numrep <= 0 {
                            continue;
                        }
                    }
                    let Some(bk) = map.bucket(wi) else {
                        continue;
                    };
                    if firstn {
                        let recurse_tries = if choose_leaf_tries != 0 {
                            choose_leaf_tries
                        } else if t.chooseleaf_descend_once != 0 {
                            1
                        } else {
                            choose_tries
                        };
                        osize += choose_firstn(
                            &ctx,
                            perm,
                            bk,
                            numrep,
                            step.arg2,
                            &mut o[osize..result_max],
                            0,
                            rmax - osize as i32,
                            choose_tries,
                            recurse_tries,
                            local_retries,
                            local_fallback,
                            leaf,
                            vary_r,
                            stable,
                            Some(&mut c[osize..result_max]),
                            0,
                        );
                    } else {
                        let out_size = numrep.min(rmax - osize as i32);
                        choose_indep(
                            &ctx,
                            perm,
                            bk,
                            out_size,
                            numrep,
                            step.arg2,
                            &mut o[osize..result_max],
                            0,
                            choose_tries,
                            if choose_leaf_tries != 0 {
                                choose_leaf_tries
                            } else {
                                1
                            },
                            leaf,
                            Some(&mut c[osize..result_max]),
                            0,
                        );
                        osize += out_size.max(0) as usize;
                    }
                }
                if leaf {
                    o[..osize].copy_from_slice(&c[..osize]);
                }
                std::mem::swap(&mut w, &mut o);
                wsize = osize;
            }
            OP_EMIT => {
                let mut i = 0;
                while i < wsize && result_len < result_max {
                    result[result_len] = w[i];
                    result_len += 1;
                    i += 1;
                }
                wsize = 0;
            }
            _ => {}
        }
    }
    result_len
}

/// Map every x in `xs` through `ruleno` on all rayon threads. Results go to
/// `out` (`xs.len() * result_max` slots, row i for xs[i]) and lengths to
/// `lens`. One workspace per rayon task; no per-mapping allocation.
#[allow(clippy::too_many_arguments)]
pub fn map_batch(
    map: &CrushMap,
    ruleno: i32,
    xs: &[i32],
    result_max: usize,
    weight: &[u32],
    choose_args: Option<&ChooseArgMap>,
    out: &mut [i32],
    lens: &mut [u32],
) {
    assert_eq!(out.len(), xs.len() * result_max);
    assert_eq!(lens.len(), xs.len());
    if result_max == 0 {
        lens.iter_mut().for_each(|l| *l = 0);
        return;
    }
    const CHUNK: usize = 1024;
    out.par_chunks_mut(CHUNK * result_max)
        .zip(lens.par_chunks_mut(CHUNK))
        .zip(xs.par_chunks(CHUNK))
        .for_each_init(
            || Workspace::new(map, result_max),
            |ws, ((o, l), xs)| {
                for (i, &x) in xs.iter().enumerate() {
                    let row = &mut o[i * result_max..(i + 1) * result_max];
                    l[i] = do_rule(map, ruleno, x, row, weight, ws, choose_args) as u32;
                }
            },
        );
}
