//! The write-intent bitmap (`consistency=bitmap`, the default while no
//! child is failed or being rebuilt).
//!
//! A stripe update writes data and parity in place without the journal,
//! but only after the bit of its region (`region` stripes) is set in the
//! bitmap block of every child that takes writes. Bits are set in batches
//! (writers that arrive while a bitmap write is going on share the next
//! one) and cleared lazily: at a flush, after the children are flushed,
//! for regions that had no update in flight and none started since the
//! flush began. At open, every stripe of a region whose bit is set on any
//! child is *resynced*: its data chunks are taken as they are on disk,
//! their crcs recomputed, the parity recomputed from them and written
//! where it differs. See docs/ec-device.md for why this keeps the crash
//! rule.
//!
//! `floor` (kept in the same block): journal entries with a lower
//! sequence number are in place and never replayed; it is raised each time
//! the device goes back from the journal to the bitmap.

use super::join::{join_all, Fut};
use super::layout::{crcs, Bitmap, BLOCK, BM_BITS};
use super::Inner;
use crate::block::Errno;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// In-memory state of the bitmap.
pub struct Intent {
    /// Stripes per bit.
    pub region: u64,
    pub floor: AtomicU64,
    state: Mutex<State>,
    /// Serialises bitmap writes.
    io: tokio::sync::Mutex<()>,
}

struct State {
    /// Bits that must be on disk (regions with updates, not yet cleared).
    want: Vec<u64>,
    /// Bits as last written to the children.
    ondisk: Vec<u64>,
    /// Updates in flight per region.
    inflight: Vec<u32>,
    /// Regions an update started in since the last flush began.
    touched: Vec<u64>,
}

fn has(v: &[u64], r: u64) -> bool {
    v[(r / 64) as usize] & (1 << (r % 64)) != 0
}

fn set(v: &mut [u64], r: u64) {
    v[(r / 64) as usize] |= 1 << (r % 64);
}

fn clear(v: &mut [u64], r: u64) {
    v[(r / 64) as usize] &= !(1 << (r % 64));
}

impl Intent {
    /// `region_bytes` of logical data per bit (at least one stripe; more
    /// when the device has more regions than one block holds).
    pub fn new(stripes: u64, stripe_bytes: u64, region_bytes: u64) -> Intent {
        let mut region = (region_bytes / stripe_bytes).max(1);
        region = region.max(stripes.div_ceil(BM_BITS));
        let regions = stripes.div_ceil(region).max(1);
        let words = regions.div_ceil(64) as usize;
        Intent {
            region,
            floor: AtomicU64::new(0),
            state: Mutex::new(State {
                want: vec![0; words],
                ondisk: vec![0; words],
                inflight: vec![0; regions as usize],
                touched: vec![0; words],
            }),
            io: tokio::sync::Mutex::new(()),
        }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// Writes the bitmap (bits `want` as now, the floor) to every child
    /// that takes writes; then those bits are what is on disk.
    async fn intent_write(&self) {
        let _io = self.intent.io.lock().await;
        let snap = self.intent.st().want.clone();
        let uuid = self.sb.lock().await.uuid;
        let block = Bytes::from(
            Bitmap {
                uuid,
                floor: self.intent.floor.load(Ordering::Acquire),
                region: self.intent.region,
                bits: snap.clone(),
            }
            .encode(),
        );
        let at = self.geo.bitmap_off();
        let futs: Vec<Fut<'_, Result<(), Errno>>> = (0..self.n())
            .filter(|&c| self.writable(c))
            .map(|c| Box::pin(self.child_write(c, at, block.clone())) as Fut<'_, _>)
            .collect();
        join_all(futs).await;
        if self.barrier {
            let futs: Vec<Fut<'_, Result<(), Errno>>> = (0..self.n())
                .filter(|&c| self.writable(c))
                .map(|c| Box::pin(self.child_flush(c)) as Fut<'_, _>)
                .collect();
            join_all(futs).await;
        }
        self.intent.st().ondisk = snap;
    }

    /// Sets the floor to the next sequence number and writes the bitmap
    /// (with the bits wanted now). With every slot's lock held, no journal
    /// update is half done, so every entry below the floor is in place.
    pub async fn intent_set_floor(&self) {
        let _all = self.lock_all().await;
        self.intent
            .floor
            .store(self.seq.load(Ordering::Acquire), Ordering::Release);
        self.intent_write().await;
    }

    /// Every slot's lock, exclusively, in order.
    async fn lock_all(&self) -> Vec<tokio::sync::RwLockWriteGuard<'_, ()>> {
        let mut v = Vec::with_capacity(self.locks.len());
        for l in &self.locks {
            v.push(l.write().await);
        }
        v
    }

    /// After a rebuild: with no child failed, updates go back from the
    /// journal to the bitmap, behind a new floor.
    pub async fn bitmap_resume(&self) {
        if self.journal_only || self.degraded() > 0 || self.bitmap_ok.load(Ordering::Acquire) {
            return;
        }
        self.intent_set_floor().await;
        if self.degraded() == 0 {
            self.bitmap_ok.store(true, Ordering::Release);
            tracing::info!("ec: no child failed: stripe updates use the write-intent bitmap again");
        }
    }

    /// Before stripe `s` is written in place: its region's bit is on disk
    /// when this returns. Pair with [`Inner::intent_end`].
    pub async fn intent_begin(&self, s: u64) {
        let r = s / self.intent.region;
        {
            let mut st = self.intent.st();
            st.inflight[r as usize] += 1;
            set(&mut st.touched, r);
            set(&mut st.want, r);
            if has(&st.ondisk, r) {
                return;
            }
        }
        loop {
            self.intent_write().await;
            if has(&self.intent.st().ondisk, r) {
                return;
            }
        }
    }

    /// Stripe `s`'s update is in place (or given up).
    pub fn intent_end(&self, s: u64) {
        let r = (s / self.intent.region) as usize;
        let mut st = self.intent.st();
        st.inflight[r] = st.inflight[r].saturating_sub(1);
    }

    /// Starts a flush: forgets which regions were touched. Returns the
    /// regions that may be cleared once the children are flushed.
    pub fn intent_flush_start(&self) -> Vec<u64> {
        let mut st = self.intent.st();
        st.touched.iter_mut().for_each(|w| *w = 0);
        (0..st.inflight.len() as u64)
            .filter(|&r| has(&st.want, r) && st.inflight[r as usize] == 0)
            .collect()
    }

    /// After the children are flushed: clears the bits of `regions` that
    /// no update touched meanwhile, and writes the bitmap if it changed.
    pub async fn intent_flush_end(&self, regions: &[u64]) {
        let changed = {
            let mut st = self.intent.st();
            for &r in regions {
                if !has(&st.touched, r) && st.inflight[r as usize] == 0 {
                    clear(&mut st.want, r);
                }
            }
            st.want != st.ondisk
        };
        if changed {
            self.intent_write().await;
        }
    }

    /// The newest bitmap state found on the children: the union of the
    /// bits of every intact copy (as stripe ranges) and the highest floor;
    /// `None` when no child holds an intact one.
    pub async fn intent_load(&self) -> Option<(Vec<(u64, u64)>, u64)> {
        let uuid = self.sb.lock().await.uuid;
        let mut ranges = Vec::new();
        let mut floor = None;
        for c in 0..self.n() {
            if !self.readable(c) {
                continue;
            }
            let Ok(b) = self.child_read(c, self.geo.bitmap_off(), BLOCK).await else {
                continue;
            };
            let Some(bm) = Bitmap::decode(&b, uuid) else {
                tracing::warn!("ec: child {c}: no intact write-intent bitmap");
                continue;
            };
            floor = Some(floor.unwrap_or(0).max(bm.floor));
            for r in 0..bm.bits.len() as u64 * 64 {
                if has(&bm.bits, r) {
                    let a = r * bm.region;
                    if a < self.geo.stripes {
                        ranges.push((a, (a + bm.region).min(self.geo.stripes)));
                    }
                }
            }
        }
        ranges.sort_unstable();
        ranges.dedup();
        floor.map(|f| (ranges, f))
    }

    /// Resyncs stripes `[a, b)` (see the module doc): returns (stripes
    /// whose parity or crcs were rewritten, stripes that could not be
    /// checked because a data chunk is not readable).
    pub async fn resync(&self, a: u64, b: u64) -> (u64, u64) {
        let (k, m, chunk) = (self.geo.k, self.geo.m, self.geo.chunk);
        let (mut fixed, mut lost) = (0, 0);
        for s in a..b {
            let _g = self.locks[(s % self.geo.slots) as usize].write().await;
            let futs: Vec<Fut<'_, Option<Bytes>>> = (0..k + m)
                .map(|c| {
                    Box::pin(async move {
                        if !self.readable(c) {
                            return None;
                        }
                        self.child_read(c, self.geo.chunk_off(s), chunk).await.ok()
                    }) as Fut<'_, _>
                })
                .collect();
            let got = join_all(futs).await;
            if got[..k].iter().any(|g| g.is_none()) {
                tracing::error!(
                    "ec: stripe {s}: a data chunk is not readable, its parity cannot be checked after the unclean stop"
                );
                lost += 1;
                continue;
            }
            let srcs: Vec<&[u8]> = got[..k]
                .iter()
                .map(|g| &g.as_ref().expect("read")[..])
                .collect();
            let mut parity = vec![vec![0u8; chunk as usize]; m];
            {
                let mut outs: Vec<&mut [u8]> =
                    parity.iter_mut().map(|p| p.as_mut_slice()).collect();
                if self.codec.encode(&srcs, &mut outs).is_err() {
                    lost += 1;
                    continue;
                }
            }
            let mut changed = false;
            for (c, g) in got.iter().enumerate() {
                if !self.writable(c) {
                    continue;
                }
                let new: Bytes = if c < k {
                    g.clone().expect("read")
                } else {
                    let p = Bytes::from(std::mem::take(&mut parity[c - k]));
                    if g.as_deref() != Some(&p[..]) {
                        changed = true;
                        if self
                            .child_write(c, self.geo.chunk_off(s), p.clone())
                            .await
                            .is_err()
                        {
                            continue;
                        }
                    }
                    p
                };
                let sums = crcs(&new);
                let stale = (0..sums.len() as u64).any(|i| self.crc(c, s, i) != sums[i as usize]);
                if stale {
                    changed = true;
                    self.write_meta(c, s, 0, &sums).await;
                }
            }
            if changed {
                fixed += 1;
            }
        }
        (fixed, lost)
    }
}
