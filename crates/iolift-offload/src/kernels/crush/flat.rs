//! A CRUSH map flattened into one `u32` buffer (plus the straw2 numerator
//! table), the layout `crates/iolift-offload/kernels/crush.cu` reads. Built once per map and
//! uploaded once per device.
//!
//! ```text
//! header (16 words): magic, max_devices, max_buckets, max_rules,
//!   choose_local_tries, choose_local_fallback_tries, choose_total_tries,
//!   chooseleaf_descend_once, chooseleaf_vary_r, chooseleaf_stable,
//!   buckets_off, rules_off, 0...
//! buckets (12 words per slot, slot i = bucket id -1-i; alg 0 = no bucket):
//!   id, alg, type, size, items_off, item_weights_off, aux_off, aux_len,
//!   choose_args_ids_off, choose_args_weight_set_off, weight_set_positions, 0
//!   aux = list: sum_weights, tree: node_weights (aux_len = num_nodes),
//!         straw: straws; choose_args offsets are NO_OFF when absent.
//! rules (2 words per slot): steps_off, nsteps (NO_OFF = no rule)
//! data: items (i32 bit patterns), weights, aux arrays, steps (op, arg1, arg2)
//! ```

use crate::error::{OffloadError, Result};
use iolift_crush::map::*;
use iolift_crush::CrushMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub const MAGIC: u32 = 0x4352_554d;
pub const HEADER_WORDS: usize = 16;
pub const BUCKET_WORDS: usize = 12;
pub const NO_OFF: u32 = u32::MAX;
/// Results longer than this are mapped on the host (kernel bound).
pub const MAX_RESULT: usize = 32;
/// Length the kernel writes for an input it hands back to the host.
pub const LEN_FALLBACK: u32 = u32::MAX;

/// `crush_ln(u) - 2^48` for every 16-bit `u`: the straw2 draw numerators.
pub fn ln_table() -> Arc<Vec<i64>> {
    static T: OnceLock<Arc<Vec<i64>>> = OnceLock::new();
    T.get_or_init(|| {
        Arc::new(
            (0..0x10000u32)
                .map(iolift_crush::ln::ln_minus_one)
                .collect(),
        )
    })
    .clone()
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The flattened map. `id` is unique per flattening: devices cache their
/// uploaded copy under it.
#[derive(Debug, Clone)]
pub struct FlatMap {
    pub id: u64,
    pub words: Vec<u32>,
    pub ln: Arc<Vec<i64>>,
}

fn push_i32(words: &mut Vec<u32>, v: &[i32]) -> u32 {
    let off = words.len() as u32;
    words.extend(v.iter().map(|&x| x as u32));
    off
}

fn push_u32(words: &mut Vec<u32>, v: &[u32]) -> u32 {
    let off = words.len() as u32;
    words.extend_from_slice(v);
    off
}

impl FlatMap {
    /// Flatten `map` with the choose_args set `choose_args` (the one the
    /// CPU mapper would be given).
    pub fn new(map: &CrushMap, choose_args: Option<&ChooseArgMap>) -> Result<FlatMap> {
        let nb = map.buckets.len();
        let nr = map.rules.len();
        let t = &map.tunables;
        let mut w = vec![0u32; HEADER_WORDS];
        w[0] = MAGIC;
        w[1] = map.max_devices as u32;
        w[2] = nb as u32;
        w[3] = nr as u32;
        w[4] = t.choose_local_tries;
        w[5] = t.choose_local_fallback_tries;
        w[6] = t.choose_total_tries;
        w[7] = t.chooseleaf_descend_once;
        w[8] = t.chooseleaf_vary_r as u32;
        w[9] = t.chooseleaf_stable as u32;
        let boff = w.len();
        w[10] = boff as u32;
        w.resize(boff + nb * BUCKET_WORDS, 0);
        let roff = w.len();
        w[11] = roff as u32;
        w.resize(roff + nr * 2, 0);
        for (i, b) in map.buckets.iter().enumerate() {
            let Some(b) = b else { continue };
            let size = b.items.len();
            if b.item_weights.len() < size {
                return Err(OffloadError::Unsupported(format!(
                    "bucket {} has {} items but {} weights",
                    b.id,
                    size,
                    b.item_weights.len()
                )));
            }
            let mut rec = [0u32; BUCKET_WORDS];
            rec[0] = b.id as u32;
            rec[1] = b.alg as u32;
            rec[2] = b.type_id as u32;
            rec[3] = size as u32;
            rec[4] = push_i32(&mut w, &b.items);
            rec[5] = push_u32(&mut w, &b.item_weights[..size]);
            let (aux, need): (&[u32], usize) = match b.alg {
                ALG_LIST => (&b.sum_weights, size),
                ALG_TREE => (&b.node_weights, 0),
                ALG_STRAW => (&b.straws, size),
                ALG_UNIFORM | ALG_STRAW2 => (&[], 0),
                a => {
                    return Err(OffloadError::Unsupported(format!(
                        "bucket {} has unknown algorithm {a}",
                        b.id
                    )))
                }
            };
            if aux.len() < need {
                return Err(OffloadError::Unsupported(format!(
                    "bucket {} ({}) lacks its per-item array",
                    b.id,
                    alg_name(b.alg)
                )));
            }
            rec[6] = push_u32(&mut w, aux);
            rec[7] = aux.len() as u32;
            rec[8] = NO_OFF;
            rec[9] = NO_OFF;
            if b.alg == ALG_STRAW2 {
                if let Some(arg) = choose_args.and_then(|c| c.args.get(i)) {
                    if !arg.ids.is_empty() {
                        if arg.ids.len() != size {
                            return Err(OffloadError::Unsupported(format!(
                                "choose_args ids of bucket {} have {} entries, bucket has {size}",
                                b.id,
                                arg.ids.len()
                            )));
                        }
                        rec[8] = push_i32(&mut w, &arg.ids);
                    }
                    if !arg.weight_set.is_empty() {
                        let off = w.len() as u32;
                        for ws in &arg.weight_set {
                            if ws.len() != size {
                                return Err(OffloadError::Unsupported(format!(
                                    "choose_args weight_set of bucket {} has {} entries, bucket has {size}",
                                    b.id,
                                    ws.len()
                                )));
                            }
                            w.extend_from_slice(ws);
                        }
                        rec[9] = off;
                        rec[10] = arg.weight_set.len() as u32;
                    }
                }
            }
            let at = boff + i * BUCKET_WORDS;
            w[at..at + BUCKET_WORDS].copy_from_slice(&rec);
        }
        for (i, r) in map.rules.iter().enumerate() {
            let at = roff + 2 * i;
            match r {
                None => {
                    w[at] = 0;
                    w[at + 1] = NO_OFF;
                }
                Some(r) => {
                    let off = w.len() as u32;
                    for s in &r.steps {
                        w.extend_from_slice(&[s.op, s.arg1 as u32, s.arg2 as u32]);
                    }
                    w[at] = off;
                    w[at + 1] = r.steps.len() as u32;
                }
            }
        }
        if w.len() > u32::MAX as usize / 2 {
            return Err(OffloadError::Unsupported("map too large".into()));
        }
        Ok(FlatMap {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            words: w,
            ln: ln_table(),
        })
    }

    /// Bytes uploaded to a device for this map (words + ln table).
    pub fn device_bytes(&self) -> usize {
        self.words.len() * 4 + self.ln.len() * 8
    }
}
