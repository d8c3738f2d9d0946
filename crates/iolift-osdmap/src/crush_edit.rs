//! Changing a device's CRUSH weight in place, as
//! `CrushWrapper::adjust_item_weight` does for straw2 buckets: the item's
//! weight in every bucket holding it, the bucket weights up to the root,
//! and the choose_args weight sets at the item's position.

use crate::{OsdMapError, Result};
use iolift_crush::map::ALG_STRAW2;
use iolift_crush::CrushMap;

/// Set `id`'s weight to `weight` (16.16) in every bucket holding it and
/// carry the difference up to the root. Only straw2 buckets on the way can
/// be changed (other algorithms keep derived arrays this does not rebuild).
pub fn adjust_item_weight(map: &mut CrushMap, id: i32, weight: u32) -> Result<()> {
    let holders: Vec<usize> = map
        .buckets
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.as_ref().filter(|b| b.items.contains(&id)).map(|_| i))
        .collect();
    for slot in holders {
        let (bid, new_weight) = {
            let b = map.buckets[slot].as_mut().expect("bucket");
            if b.alg != ALG_STRAW2 {
                return Err(OsdMapError::Invalid(format!(
                    "changing the crush weight of {id} in bucket {} ({}) is not supported: \
                     only straw2 buckets",
                    b.id,
                    iolift_crush::map::alg_name(b.alg)
                )));
            }
            let pos = b.items.iter().position(|&x| x == id).expect("holder");
            let diff = weight as i64 - b.item_weights[pos] as i64;
            b.item_weights[pos] = weight;
            b.weight = (b.weight as i64 + diff) as u32;
            (b.id, b.weight)
        };
        for set in map.choose_args.values_mut() {
            if let Some(arg) = set.args.get_mut(slot) {
                let pos = map.buckets[slot]
                    .as_ref()
                    .and_then(|b| b.items.iter().position(|&x| x == id));
                if let Some(pos) = pos {
                    for ws in arg.weight_set.iter_mut() {
                        if let Some(w) = ws.get_mut(pos) {
                            *w = weight;
                        }
                    }
                }
            }
        }
        adjust_item_weight(map, bid, new_weight)?;
    }
    Ok(())
}
