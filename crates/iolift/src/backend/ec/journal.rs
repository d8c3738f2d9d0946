//! Replay after a crash (at open, before any request).
//!
//! Journal slot j of every child holds the last update of some stripe
//! `s` with `s % slots == j` that the child took part in. A slot is
//! reused only once the update before it is fully in place, so the entry
//! with the highest sequence number in a slot is the only one that may
//! not be in place. It is *committed* when every child it names that is
//! not failed has that entry with its payload intact: then it is written
//! in place again unless the crc table shows it is there already. If one
//! is missing, the writer never started writing in place (it waits for
//! every journal write), so the stripe is as it was before. Entries below
//! the bitmap's floor are in place and skipped.

use super::join::{join_all, Fut};
use super::layout::{crcs, JHeader, BLOCK};
use super::Inner;
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// What replay found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// Committed updates written in place again.
    pub replayed: u64,
    /// Updates found incomplete (dropped: those stripes keep their old data).
    pub dropped: u64,
    /// The highest sequence number seen.
    pub max_seq: u64,
}

impl Inner {
    /// One child's entry in slot `j`: header and payload, if intact.
    async fn entry(&self, c: usize, j: u64, uuid: u64) -> Option<(JHeader, Bytes)> {
        if !self.readable(c) {
            return None;
        }
        let off = self.geo.slot_off(j);
        let hb = self.child_read(c, off, BLOCK).await.ok()?;
        let h = JHeader::decode(&hb, uuid)?;
        if h.seq < self.intent.floor.load(Ordering::Acquire) {
            return None;
        }
        if h.hi > self.geo.chunk || h.stripe >= self.geo.stripes {
            return None;
        }
        let payload = self.child_read(c, off + BLOCK, h.hi - h.lo).await.ok()?;
        if crcs(&payload) != h.crcs {
            return None;
        }
        Some((h, payload))
    }

    /// Replays every slot (see the module doc).
    pub async fn replay(&self) -> Replay {
        let uuid = self.sb.lock().await.uuid;
        let mut r = Replay::default();
        for j in 0..self.geo.slots {
            let futs: Vec<Fut<'_, Option<(JHeader, Bytes)>>> = (0..self.n())
                .map(|c| Box::pin(self.entry(c, j, uuid)) as Fut<'_, _>)
                .collect();
            let entries = join_all(futs).await;
            let Some(top) = entries.iter().flatten().map(|(h, _)| h.seq).max() else {
                continue;
            };
            r.max_seq = r.max_seq.max(top);
            let latest: Vec<Option<&(JHeader, Bytes)>> = entries
                .iter()
                .map(|e| e.as_ref().filter(|(h, _)| h.seq == top))
                .collect();
            let h = latest.iter().flatten().next().expect("top").0.clone();
            let committed = (0..self.n())
                .filter(|&c| h.parts & (1 << c) != 0 && self.readable(c))
                .all(|c| {
                    latest[c]
                        .is_some_and(|(o, _)| o.stripe == h.stripe && o.lo == h.lo && o.hi == h.hi)
                });
            if !committed {
                r.dropped += 1;
                continue;
            }
            // in place already (the crcs are written after the data)
            let applied = latest.iter().enumerate().all(|(c, e)| match e {
                Some((eh, _)) if self.writable(c) => (0..eh.crcs.len() as u64)
                    .all(|i| self.crc(c, eh.stripe, eh.lo / BLOCK + i) == eh.crcs[i as usize]),
                _ => true,
            });
            if applied {
                continue;
            }
            for (c, e) in latest.iter().enumerate() {
                let Some((eh, payload)) = e else { continue };
                if !self.writable(c) {
                    continue;
                }
                let at = self.geo.chunk_off(eh.stripe) + eh.lo;
                if self.child_write(c, at, payload.clone()).await.is_ok() {
                    self.write_meta(c, eh.stripe, eh.lo, &eh.crcs).await;
                }
            }
            r.replayed += 1;
        }
        let floor = self.intent.floor.load(Ordering::Acquire);
        self.seq
            .store((r.max_seq + 1).max(floor), Ordering::Relaxed);
        self.metrics
            .replayed
            .fetch_add(r.replayed, Ordering::Relaxed);
        r
    }
}
