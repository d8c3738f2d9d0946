//! The five bucket algorithms of Ceph's `mapper.c` (`crush_bucket_choose`
//! and `bucket_perm_choose`), bit-exact, computing many hashes at once.
//!
//! Hashing is most of a mapping's work, and in the tree and uniform
//! choosers it is also a chain of dependent hashes whose latency, not the
//! CPU's throughput, sets the speed. So every chooser hashes what it can
//! side by side (the `hash32_*_n` lane functions):
//!
//! * straw2, straw, list: every item, `W` at a time (all use the same
//!   (x, r)); the selection that follows is branch-free over the lanes.
//! * tree: the walk from a node down `d` levels can only visit the
//!   `2^d - 1` nodes of that subtree, so they are hashed together and the
//!   walk then reads the hashes it needs (`T` lanes: 3 levels per batch
//!   with 8 lanes, 4 with 16).
//! * uniform: the hashes of a permutation's steps depend on (x, bucket,
//!   step) only, not on the permutation, so the first `P` are computed
//!   together when a bucket's slot starts a new x and kept in the slot; the
//!   later draws of the same x (replicas 2, 3, retries) find them there.
//!
//! Each chooser is written once, generic over its lane counts, and compiled
//! twice: for the baseline target, and on x86-64 with AVX2 enabled (a
//! 256-bit register holds 8 lanes), picked at run time by [`Isa`]. Both give
//! the same results (tested against each other here and against crushtool
//! in the integration tests).

use crate::hash::{hash32_3, hash32_3_n, hash32_4_n};
use crate::ln::crush_ln;
use crate::map::*;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which compiled version of the choosers runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Isa {
    avx2: bool,
}

/// 0: not decided yet, 1: portable, 2: AVX2.
static ISA: AtomicU8 = AtomicU8::new(0);

impl Isa {
    /// The portable version: any target, baseline instructions only.
    pub(crate) const PORTABLE: Isa = Isa { avx2: false };

    /// The fastest version this CPU runs, unless the environment variable
    /// `IOLIFT_CRUSH_SIMD=portable` asks for the portable one (to compare
    /// the two). Decided once per process.
    #[inline]
    pub(crate) fn get() -> Isa {
        match ISA.load(Ordering::Relaxed) {
            1 => Isa::PORTABLE,
            2 => Isa { avx2: true },
            _ => {
                let isa = Isa::detect();
                ISA.store(if isa.avx2 { 2 } else { 1 }, Ordering::Relaxed);
                isa
            }
        }
    }

    fn detect() -> Isa {
        if std::env::var_os("IOLIFT_CRUSH_SIMD").is_some_and(|v| v == "portable") {
            return Isa::PORTABLE;
        }
        Isa::best()
    }

    /// The AVX2 version where the CPU has AVX2, else the portable one.
    pub(crate) fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            Isa {
                avx2: std::is_x86_feature_detected!("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Isa::PORTABLE
        }
    }

    /// Name of the version, for reports.
    pub(crate) fn name(self) -> &'static str {
        if self.avx2 {
            "avx2"
        } else {
            "portable"
        }
    }
}

/// Hashes of a permutation's first steps kept per slot (the most any
/// version computes ahead).
const PERM_AHEAD_MAX: usize = 8;

/// Permutation state of one bucket (`crush_work_bucket`): the permutation
/// of `0..size` for input `x`, of which the first `n` entries are final
/// (0xffff: only entry 0, the r = 0 shortcut), and the hashes of steps
/// `0..ahead_n` for `x`.
#[derive(Debug, Clone, Default)]
pub(crate) struct PermSlot {
    x: u32,
    n: u32,
    p: Vec<u32>,
    ahead_n: u32,
    ahead: [u32; PERM_AHEAD_MAX],
}

#[inline]
fn bidx(b: &Bucket) -> usize {
    (-1i64 - b.id as i64) as usize
}

/// `crush_bucket_choose`: item `r` of bucket `b` for input `x`. `perm` has
/// a slot for every bucket of the map (the uniform algorithm's cache);
/// `arg` is the bucket's choose_args entry (used by straw2 only).
#[inline]
pub(crate) fn bucket_choose(
    isa: Isa,
    perm: &mut [PermSlot],
    b: &Bucket,
    x: i32,
    r: i32,
    arg: Option<&ChooseArg>,
    position: i32,
) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2 {
        return bucket_choose_avx2(perm, b, x, r, arg, position);
    }
    let _ = isa;
    bucket_choose_portable(perm, b, x, r, arg, position)
}

/// `bucket_perm_choose` for any bucket (the local fallback of
/// choose_firstn uses it whatever the bucket's algorithm).
#[inline]
pub(crate) fn perm_choose(isa: Isa, perm: &mut [PermSlot], b: &Bucket, x: i32, r: i32) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2 {
        // SAFETY: `isa.avx2` is only set when the CPU reports AVX2.
        return unsafe { perm_choose_avx2(perm, b, x, r) };
    }
    let _ = isa;
    perm_choose_portable(perm, b, x, r)
}

// Lane counts: (W) straw2 / straw items per batch, (L) list items per
// batch, (T) tree nodes per batch, (P) permutation steps hashed ahead. Portable: SSE2 registers
// hold 4 lanes; AVX2 registers 8.

fn bucket_choose_portable(
    perm: &mut [PermSlot],
    b: &Bucket,
    x: i32,
    r: i32,
    arg: Option<&ChooseArg>,
    position: i32,
) -> i32 {
    choose::<8, 8, 8, 4>(perm, b, x, r, arg, position)
}

fn perm_choose_portable(perm: &mut [PermSlot], b: &Bucket, x: i32, r: i32) -> i32 {
    perm_choose_n::<4>(&mut perm[bidx(b)], b, x, r)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn bucket_choose_avx2(
    perm: &mut [PermSlot],
    b: &Bucket,
    x: i32,
    r: i32,
    arg: Option<&ChooseArg>,
    position: i32,
) -> i32 {
    // One function per algorithm: each keeps its own small stack frame.
    let (xu, ru) = (x as u32, r as u32);
    // SAFETY (all calls): only reached when the CPU reports AVX2.
    unsafe {
        match b.alg {
            ALG_UNIFORM => perm_choose_avx2(perm, b, x, r),
            ALG_LIST => avx2::list(b, xu, ru),
            ALG_TREE => avx2::tree(b, xu, ru),
            ALG_STRAW => avx2::straw(b, xu, ru),
            ALG_STRAW2 => avx2::straw2(b, xu, ru, arg, position),
            _ => b.items[0],
        }
    }
}

/// The choosers compiled with AVX2 (callers check the CPU has it).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::map::{Bucket, ChooseArg};

    #[target_feature(enable = "avx2")]
    pub(super) fn list(b: &Bucket, x: u32, r: u32) -> i32 {
        super::list::<8>(b, x, r)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn tree(b: &Bucket, x: u32, r: u32) -> i32 {
        super::tree::<16>(b, x, r)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn straw(b: &Bucket, x: u32, r: u32) -> i32 {
        super::straw::<16>(b, x, r)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn straw2(
        b: &Bucket,
        x: u32,
        r: u32,
        arg: Option<&ChooseArg>,
        position: i32,
    ) -> i32 {
        super::straw2::<16>(b, x, r, arg, position)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn perm_choose_avx2(perm: &mut [PermSlot], b: &Bucket, x: i32, r: i32) -> i32 {
    perm_choose_n::<8>(&mut perm[bidx(b)], b, x, r)
}

#[inline(always)]
fn choose<const W: usize, const L: usize, const T: usize, const P: usize>(
    perm: &mut [PermSlot],
    b: &Bucket,
    x: i32,
    r: i32,
    arg: Option<&ChooseArg>,
    position: i32,
) -> i32 {
    let (xu, ru) = (x as u32, r as u32);
    match b.alg {
        ALG_UNIFORM => perm_choose_n::<P>(&mut perm[bidx(b)], b, x, r),
        ALG_LIST => list::<L>(b, xu, ru),
        ALG_TREE => tree::<T>(b, xu, ru),
        ALG_STRAW => straw::<W>(b, xu, ru),
        ALG_STRAW2 => straw2::<W>(b, xu, ru, arg, position),
        _ => b.items[0],
    }
}

/// `bucket_perm_choose`: a pure function of (x, bucket, r % size), cached
/// in `slot`. `b` has at least one item.
#[inline(always)]
fn perm_choose_n<const P: usize>(slot: &mut PermSlot, b: &Bucket, x: i32, r: i32) -> i32 {
    let size = b.items.len() as u32;
    let pr = (r as u32) % size;
    if slot.p.len() != size as usize {
        // First use, or a map of another shape: start afresh.
        slot.p.clear();
        slot.p.resize(size as usize, 0);
        slot.n = 0;
    }
    let id = b.id as u32;
    let xu = x as u32;
    if slot.x != xu || slot.n == 0 {
        slot.x = xu;
        // Step pn hashes (x, id, pn): compute steps 0..P at once.
        let steps: [u32; P] = std::array::from_fn(|i| i as u32);
        let hs = hash32_3_n([xu; P], [id; P], steps);
        let k = P.min(PERM_AHEAD_MAX);
        slot.ahead[..k].copy_from_slice(&hs[..k]);
        slot.ahead_n = k as u32;
        if pr == 0 {
            let s = slot.ahead[0] % size;
            slot.p[0] = s;
            slot.n = 0xffff;
            return b.items[s as usize];
        }
        for (i, v) in slot.p.iter_mut().enumerate() {
            *v = i as u32;
        }
        slot.n = 0;
    } else if slot.n == 0xffff {
        let p = &mut slot.p[..];
        for (i, v) in p.iter_mut().enumerate().skip(1) {
            *v = i as u32;
        }
        let s0 = p[0] as usize;
        p[s0] = 0;
        slot.n = 1;
    }
    while slot.n <= pr {
        let pn = slot.n;
        if pn < size - 1 {
            let h = if pn < slot.ahead_n {
                slot.ahead[pn as usize]
            } else {
                hash32_3(xu, id, pn)
            };
            let i = h % (size - pn);
            if i != 0 {
                slot.p.swap((pn + i) as usize, pn as usize);
            }
        }
        slot.n += 1;
    }
    b.items[slot.p[pr as usize] as usize]
}

/// Items `start..start + N` (fewer at the end: zeros) as hash lanes.
#[inline(always)]
fn lanes<const N: usize>(v: &[i32], start: usize) -> [u32; N] {
    let mut l = [0u32; N];
    for (d, &s) in l.iter_mut().zip(&v[start.min(v.len())..]) {
        *d = s as u32;
    }
    l
}

/// Weights `start..start + N` (fewer at the end: zeros).
#[inline(always)]
fn weights<const N: usize>(v: &[u32], start: usize) -> [u32; N] {
    let mut l = [0u32; N];
    for (d, &s) in l.iter_mut().zip(&v[start.min(v.len())..]) {
        *d = s;
    }
    l
}

/// 2^52: from here up, every f64 is a whole number (its ulp is 1).
const TWO52: f64 = 4_503_599_627_370_496.0;

/// `v` as f64, exactly, for `v < 2^52`: the bits of 2^52 + v, minus 2^52
/// (plain bit operations that vectorise, unlike u64 -> f64 conversion).
#[inline(always)]
fn f64_of(v: u64) -> f64 {
    f64::from_bits(TWO52.to_bits() | v) - TWO52
}

/// `floor(q)` for `0 <= q < 2^52` or `q = inf`, without SSE4.1: round to
/// an integer by adding and subtracting 2^52, step down if that rounded up.
#[inline(always)]
fn floor_small(q: f64) -> f64 {
    let t = (q + TWO52) - TWO52;
    if t > q {
        t - 1.0
    } else {
        t
    }
}

/// Bit `l` set where lane `l` of `v` equals `m`.
#[inline(always)]
fn eq_mask<const N: usize>(v: &[f64; N], m: f64) -> u32 {
    let mut mask = 0u32;
    for (l, &e) in v.iter().enumerate() {
        mask |= ((e == m) as u32) << l;
    }
    mask
}

#[inline(always)]
fn list<const W: usize>(b: &Bucket, x: u32, r: u32) -> i32 {
    // From the last item down: the first whose scaled hash falls below its
    // weight wins. Hashes are computed W at a time from the end
    // (speculatively: a few below the winner are wasted).
    let n = b.items.len();
    let id = b.id as u32;
    let mut end = n;
    while end > 0 {
        let start = end.saturating_sub(W);
        let m = end - start;
        let hs = hash32_4_n([x; W], lanes::<W>(&b.items, start), [r; W], [id; W]);
        let sw = weights::<W>(&b.sum_weights, start);
        let iw = weights::<W>(&b.item_weights, start);
        let mut mask = 0u32;
        for l in 0..W {
            let w = ((hs[l] & 0xffff) as u64 * sw[l] as u64) >> 16;
            mask |= ((l < m && w < iw[l] as u64) as u32) << l;
        }
        if mask != 0 {
            return b.items[start + (31 - mask.leading_zeros()) as usize];
        }
        end = start;
    }
    b.items[0]
}

/// Levels of the tree resolved by one batch of `T` lanes: the largest `d`
/// with `2^d - 1 <= T`.
const fn tree_levels(t: usize) -> u32 {
    usize::BITS - 1 - (t + 1).leading_zeros()
}

#[inline(always)]
fn tree<const T: usize>(b: &Bucket, x: u32, r: u32) -> i32 {
    // Ceph's walk: at internal node n (even; its height h is the number of
    // trailing zeros, its children n -/+ 2^(h-1)), go left if
    // hash(x, n, r, id) * weight(n) >> 32 < weight(left child).
    //
    // A batch takes the subtree of d levels below node `top` (height h):
    // lane i = 2^j - 1 + k holds the k-th node j levels down, node
    // top - 2^h + (2k+1) 2^(h-j), whose children are lanes 2i + 1 and
    // 2i + 2. The batch is hashed at once, then walked without branching
    // on the (random) directions.
    let nw = &b.node_weights;
    let id = b.id as u32;
    let level: [u32; T] = std::array::from_fn(|i| usize::BITS - 1 - (i + 1).leading_zeros());
    let odd: [u32; T] = std::array::from_fn(|i| (2 * (i + 1 - (1 << level[i])) + 1) as u32);
    let mut n = nw.len() >> 1;
    while n & 1 == 0 && n != 0 {
        let h = n.trailing_zeros();
        let d = h.min(tree_levels(T));
        let base = (n - (1 << h)) as u32;
        // One formula for every lane (a vector shift); lanes below the
        // batch (level >= d) get some node number and go unused.
        let nodes: [u32; T] = std::array::from_fn(|i| {
            base.wrapping_add(odd[i].wrapping_shl(h.wrapping_sub(level[i])))
        });
        let hs = hash32_4_n([x; T], nodes, [r; T], [id; T]);
        let mut lane = 0;
        for _ in 0..d {
            let node = nodes[lane] as usize;
            let half = 1 << (node.trailing_zeros() - 1);
            let t = (hs[lane] as u64 * nw[node] as u64) >> 32;
            // Branch-free: the direction is a coin toss to a predictor.
            let right = t >= nw[node - half] as u64;
            n = if right { node + half } else { node - half };
            lane = 2 * lane + 1 + right as usize;
        }
    }
    b.items.get(n >> 1).copied().unwrap_or(b.items[0])
}

#[inline(always)]
fn straw<const W: usize>(b: &Bucket, x: u32, r: u32) -> i32 {
    // The largest (hash & 0xffff) * straw wins, the first on ties. A draw
    // is below 2^48, exact in f64.
    let n = b.items.len().min(b.straws.len());
    let mut best = 0;
    let mut best_draw = -1.0f64;
    let mut start = 0;
    while start < n {
        let m = (n - start).min(W);
        let hs = hash32_3_n([x; W], lanes::<W>(&b.items, start), [r; W]);
        let st = weights::<W>(&b.straws, start);
        let mut draw = [0f64; W];
        for l in 0..W {
            let d = f64_of((hs[l] & 0xffff) as u64 * st[l] as u64);
            draw[l] = if l < m { d } else { -1.0 };
        }
        let max = draw.iter().fold(-1.0f64, |a, &d| if d > a { d } else { a });
        if start == 0 || max > best_draw {
            best = start + eq_mask(&draw, max).trailing_zeros() as usize;
            best_draw = max;
        }
        start += W;
    }
    b.items[best]
}

#[inline(always)]
fn straw2<const W: usize>(
    b: &Bucket,
    x: u32,
    r: u32,
    arg: Option<&ChooseArg>,
    position: i32,
) -> i32 {
    let mut wts: &[u32] = &b.item_weights;
    let mut ids: &[i32] = &b.items;
    if let Some(a) = arg {
        if !a.weight_set.is_empty() {
            let p = (position as u32 as usize).min(a.weight_set.len() - 1);
            wts = &a.weight_set[p];
        }
        if !a.ids.is_empty() {
            ids = &a.ids;
        }
    }
    // Ceph: draw = (crush_ln(u) - 2^48) / w (s64 division, truncating), the
    // largest draw wins, the first on ties; a zero weight draws S64_MIN
    // (it wins only as the first item, or if every weight is zero). With
    // num = 2^48 - crush_ln(u) in 0..=2^48 that is the smallest
    // q = floor(num / w), with q = inf for w = 0. floor(num / w) is
    // computed in f64: num and w are exact, the quotient is correctly
    // rounded, and rounding cannot carry it across an integer (that would
    // need num/w within ulp/2 <= q*2^-53 of one, while a non-integer num/w
    // is at least 1/w >= q*2^-48 from any), so its floor is exact; f64
    // divisions pipeline and vectorise, 64-bit integer ones do not.
    let n = wts.len().min(ids.len());
    let mut best = 0;
    let mut best_q = f64::INFINITY;
    let mut start = 0;
    while start < n {
        let m = (n - start).min(W);
        let hs = hash32_3_n([x; W], lanes::<W>(ids, start), [r; W]);
        let w = weights::<W>(wts, start);
        // crush_ln is table look-ups: scalar, and only for real items.
        let mut num = [0u64; W];
        for (d, &h) in num.iter_mut().zip(&hs[..m]) {
            *d = 0x1_0000_0000_0000 - crush_ln(h & 0xffff);
        }
        let mut q = [0f64; W];
        for l in 0..W {
            let v = floor_small(f64_of(num[l]) / f64_of(w[l] as u64));
            q[l] = if w[l] != 0 && l < m { v } else { f64::INFINITY };
        }
        let min = q
            .iter()
            .fold(f64::INFINITY, |a, &v| if v < a { v } else { a });
        if start == 0 || min < best_q {
            best = start + eq_mask(&q, min).trailing_zeros() as usize;
            best_q = min;
        }
        start += W;
    }
    b.items[best]
}

#[cfg(test)]
mod tests;
