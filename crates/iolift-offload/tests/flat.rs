//! The flat map layout kernels/crush.cu reads, and maps it refuses.

use iolift_crush::map::{ChooseArg, ChooseArgMap, ALG_STRAW2};
use iolift_offload::kernels::crush::flat::{ln_table, FlatMap, BUCKET_WORDS, MAGIC, NO_OFF};
use iolift_offload::kernels::crush::synth::straw2_map;
use iolift_offload::{MapHandle, OffloadError};

#[test]
fn layout_matches_the_map() {
    let map = straw2_map(100, 5, 4);
    let f = FlatMap::new(&map, None).unwrap();
    let w = &f.words;
    assert_eq!(w[0], MAGIC);
    assert_eq!(w[1] as i32, map.max_devices);
    assert_eq!(w[2] as usize, map.buckets.len());
    assert_eq!(w[3] as usize, map.rules.len());
    assert_eq!(w[6], map.tunables.choose_total_tries);
    assert_eq!(w[9], map.tunables.chooseleaf_stable as u32);
    for (i, b) in map.buckets.iter().enumerate() {
        let rec = &w[w[10] as usize + i * BUCKET_WORDS..][..BUCKET_WORDS];
        let Some(b) = b else {
            assert_eq!(rec[1], 0);
            continue;
        };
        assert_eq!(rec[0] as i32, b.id);
        assert_eq!(rec[1], b.alg as u32);
        assert_eq!(rec[2], b.type_id as u32);
        assert_eq!(rec[3] as usize, b.items.len());
        let items: Vec<i32> = w[rec[4] as usize..][..b.items.len()]
            .iter()
            .map(|&v| v as i32)
            .collect();
        assert_eq!(items, b.items);
        assert_eq!(&w[rec[5] as usize..][..b.items.len()], &b.item_weights[..]);
        assert_eq!((rec[8], rec[9]), (NO_OFF, NO_OFF));
    }
    for (i, r) in map.rules.iter().enumerate() {
        let r = r.as_ref().unwrap();
        let (off, n) = (
            w[w[11] as usize + 2 * i] as usize,
            w[w[11] as usize + 2 * i + 1] as usize,
        );
        assert_eq!(n, r.steps.len());
        for (k, s) in r.steps.iter().enumerate() {
            assert_eq!(
                &w[off + 3 * k..off + 3 * k + 3],
                &[s.op, s.arg1 as u32, s.arg2 as u32]
            );
        }
    }
    let ln = ln_table();
    assert_eq!(ln.len(), 65536);
    assert_eq!(ln[0xffff], iolift_crush::ln::ln_minus_one(0xffff));
    assert_eq!(ln[0], -0x1_0000_0000_0000);
}

#[test]
fn choose_args_are_flattened_and_checked() {
    let map = straw2_map(20, 5, 2);
    let host = map
        .buckets
        .iter()
        .flatten()
        .find(|b| b.type_id == 1 && b.alg == ALG_STRAW2)
        .unwrap()
        .clone();
    let slot = (-1 - host.id) as usize;
    let n = host.items.len();
    let mut args = vec![ChooseArg::default(); map.buckets.len()];
    args[slot] = ChooseArg {
        ids: (0..n as i32).map(|k| 1000 + k).collect(),
        weight_set: vec![vec![0x10000; n], vec![0x8000; n]],
    };
    let ca = ChooseArgMap { args: args.clone() };
    let f = FlatMap::new(&map, Some(&ca)).unwrap();
    let rec = &f.words[f.words[10] as usize + slot * BUCKET_WORDS..][..BUCKET_WORDS];
    assert_eq!(rec[10], 2);
    assert_eq!(f.words[rec[8] as usize] as i32, 1000);
    assert_eq!(f.words[rec[9] as usize + n], 0x8000);
    // a weight set of the wrong length is refused, not read out of bounds
    args[slot].weight_set[1].pop();
    let e = FlatMap::new(&map, Some(&ChooseArgMap { args })).unwrap_err();
    assert!(matches!(e, OffloadError::Unsupported(_)), "{e}");
}

#[test]
fn bad_maps_are_refused() {
    let mut map = straw2_map(20, 5, 2);
    map.buckets[0].as_mut().unwrap().alg = 9;
    assert!(matches!(
        FlatMap::new(&map, None),
        Err(OffloadError::Unsupported(_))
    ));
    let mut map = straw2_map(20, 5, 2);
    map.buckets[1].as_mut().unwrap().item_weights.pop();
    assert!(matches!(
        FlatMap::new(&map, None),
        Err(OffloadError::Unsupported(_))
    ));
    // every handle gets its own id (the device upload cache key)
    let a = MapHandle::new(straw2_map(20, 5, 2), None).unwrap();
    let b = MapHandle::new(straw2_map(20, 5, 2), None).unwrap();
    assert_ne!(a.flat.id, b.flat.id);
}
