//! Unit tests of the choosers: straw2's floating-point division against
//! the integer one, every compiled version (portable, AVX2) against a
//! plain one-hash-at-a-time reference, and the permutation versions
//! against each other.

use super::*;
use crate::hash::hash32_4;

/// The chooser as it was first written: one item, one hash at a time,
/// integer arithmetic, straight from `mapper.c`.
fn reference(b: &Bucket, x: u32, r: u32, arg: Option<&ChooseArg>, pos: i32) -> i32 {
    match b.alg {
        ALG_LIST => {
            for i in (0..b.items.len()).rev() {
                let h = hash32_4(x, b.items[i] as u32, r, b.id as u32) as u64 & 0xffff;
                if (h * b.sum_weights[i] as u64) >> 16 < b.item_weights[i] as u64 {
                    return b.items[i];
                }
            }
            b.items[0]
        }
        ALG_TREE => {
            let nw = &b.node_weights;
            let mut n = nw.len() >> 1;
            while n & 1 == 0 && n != 0 {
                let w = nw[n] as u64;
                let t = (hash32_4(x, n as u32, r, b.id as u32) as u64 * w) >> 32;
                let l = n - (1 << (n.trailing_zeros() - 1));
                n = if t < nw[l] as u64 { l } else { n + (n - l) };
            }
            b.items.get(n >> 1).copied().unwrap_or(b.items[0])
        }
        ALG_STRAW => {
            let (mut hi, mut hd) = (0, 0u64);
            for i in 0..b.items.len() {
                let d = (crate::hash::hash32_3(x, b.items[i] as u32, r) as u64 & 0xffff)
                    * b.straws[i] as u64;
                if i == 0 || d > hd {
                    (hi, hd) = (i, d);
                }
            }
            b.items[hi]
        }
        ALG_STRAW2 => {
            let mut wts = &b.item_weights;
            let mut ids = &b.items;
            if let Some(a) = arg {
                if !a.weight_set.is_empty() {
                    wts = &a.weight_set[(pos as usize).min(a.weight_set.len() - 1)];
                }
                if !a.ids.is_empty() {
                    ids = &a.ids;
                }
            }
            let (mut hi, mut hd) = (0, i64::MIN);
            for i in 0..b.items.len() {
                let u = crate::hash::hash32_3(x, ids[i] as u32, r) & 0xffff;
                let d = if wts[i] != 0 {
                    crate::ln::ln_minus_one(u) / wts[i] as i64
                } else {
                    i64::MIN
                };
                if i == 0 || d > hd {
                    (hi, hd) = (i, d);
                }
            }
            b.items[hi]
        }
        _ => unreachable!(),
    }
}

fn random_bucket(rng: &mut iolift_testkit::Rng, alg: u8, size: usize) -> Bucket {
    let mut v = || rng.next_u64();
    let items: Vec<i32> = (0..size).map(|i| i as i32 * 3 + 1).collect();
    // Weights: small, large (to 2^32 - 1), zero and equal ones.
    let w = |s: u64| -> u32 {
        match s % 5 {
            0 => 0,
            1 => 0x10000,
            2 => (s >> 8) as u32,
            _ => ((s >> 8) % 0x40000) as u32,
        }
    };
    let item_weights: Vec<u32> = (0..size).map(|_| w(v())).collect();
    let mut b = Bucket {
        id: -((v() % 1000) as i32) - 1,
        alg,
        hash: 0,
        items,
        item_weights: item_weights.clone(),
        ..Default::default()
    };
    match alg {
        ALG_LIST => {
            let mut s = 0u32;
            b.sum_weights = item_weights
                .iter()
                .map(|&w| {
                    s = s.wrapping_add(w >> 4);
                    s
                })
                .collect();
        }
        ALG_TREE => {
            let mut leaves = 1;
            while leaves < size {
                leaves *= 2;
            }
            let mut nw = vec![0u32; 2 * leaves];
            for (i, &w) in item_weights.iter().enumerate() {
                nw[2 * i + 1] = w >> 8;
            }
            // Internal node weights: sums of their children (wrapping).
            let mut h = 1;
            while (1usize << h) <= leaves {
                let mut n = 1 << h;
                while n < 2 * leaves {
                    let half = 1 << (h - 1);
                    nw[n] = nw[n - half].wrapping_add(nw[n + half]);
                    n += 2 << h;
                }
                h += 1;
            }
            b.node_weights = nw;
        }
        ALG_STRAW => {
            b.straws = item_weights
                .iter()
                .map(|&w| w ^ (v() as u32 >> 4))
                .collect()
        }
        _ => {}
    }
    b
}

/// straw2's f64 floor division equals the integer one on the edges of
/// its domain (numerators 0..=2^48, 32-bit weights) and on random points.
#[test]
fn f64_floor_division_is_exact() {
    let mut rng = iolift_testkit::Rng::new(1);
    let mut next = move || rng.next_u64();
    let edge_n = [0u64, 1, 2, (1 << 48) - 1, 1 << 48, 0xffff_ffff, 1 << 32];
    let edge_w = [1u64, 2, 3, 0xffff, 0x10000, 0xffff_ffff, 0xffff_fffe, 7919];
    let check = |n: u64, w: u64| {
        let q = floor_small(f64_of(n) / f64_of(w));
        assert_eq!(q, (n / w) as f64, "n={n} w={w}");
    };
    for &n in &edge_n {
        for &w in &edge_w {
            check(n, w);
        }
    }
    for _ in 0..2_000_000 {
        let w = ((next() >> (next() % 32)) & 0xffff_ffff).max(1);
        let n = next() % ((1 << 48) + 1);
        check(n, w);
        // Exact multiples and their neighbours.
        let m = (n / w) * w;
        for v in [m, m.saturating_sub(1), m + 1] {
            if v <= 1 << 48 {
                check(v, w);
            }
        }
    }
    assert_eq!(floor_small(f64::INFINITY), f64::INFINITY);
}

/// Both compiled versions equal the one-item-at-a-time reference on
/// random buckets of every algorithm and every size to 70 (all lane
/// boundaries, trees 1 to 7 levels deep).
#[test]
fn versions_equal_reference() {
    let mut rng = iolift_testkit::Rng::new(7);
    let mut isas = vec![Isa::PORTABLE];
    if Isa::best() != Isa::PORTABLE {
        isas.push(Isa::best());
    }
    for alg in [ALG_LIST, ALG_TREE, ALG_STRAW, ALG_STRAW2] {
        for size in 1..=70 {
            let b = random_bucket(&mut rng, alg, size);
            let arg = ChooseArg {
                ids: (0..size as i32).map(|i| i * 7 + 5).collect(),
                weight_set: vec![b.item_weights.iter().rev().copied().collect()],
            };
            for k in 0..300u32 {
                let x = rng.next_u64() as u32;
                let r = k % 7;
                let a = (alg == ALG_STRAW2 && k % 3 == 0).then_some(&arg);
                let want = reference(&b, x, r, a, 0);
                for &isa in &isas {
                    let got = bucket_choose(isa, &mut [], &b, x as i32, r as i32, a, 0);
                    assert_eq!(
                        got,
                        want,
                        "{} alg {alg} size {size} x {x} r {r}",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// The uniform permutation is the same whichever version fills it and
/// in whatever order the draws come (slots shared across versions).
#[test]
fn perm_versions_agree() {
    let mut rng = iolift_testkit::Rng::new(3);
    let isas = [Isa::PORTABLE, Isa::best()];
    for size in 1..=40usize {
        let b = Bucket {
            id: -1,
            alg: ALG_UNIFORM,
            items: (0..size as i32).map(|i| 100 + i).collect(),
            ..Default::default()
        };
        for _ in 0..50 {
            let x = rng.next_u64() as i32;
            let mut fresh = vec![PermSlot::default()];
            let mut shared = vec![PermSlot::default()];
            // All draws of a full permutation, from fresh slots (one
            // draw each) and from one slot used in a random order.
            for step in 0..2 * size as u32 {
                let r = (rng.next_u64() % (3 * size as u64)) as i32;
                let isa = isas[step as usize % 2];
                fresh[0] = PermSlot::default();
                let want = perm_choose(Isa::PORTABLE, &mut fresh, &b, x, r);
                let got = perm_choose(isa, &mut shared, &b, x, r);
                assert_eq!(got, want, "size {size} x {x} r {r}");
            }
        }
    }
}
