//! Rebuild and check.
//!
//! A rebuild gives replaced or failed children (that can be opened) their
//! chunks back: for each stripe, under its exclusive lock, the target
//! chunks are decoded from k others and written with their crcs. Writes
//! that arrive meanwhile also go to the targets (they are `REBUILDING`),
//! reads do not use them until the end, when each target gets its
//! superblock and becomes a member again. Used online (started by the
//! first request when `rebuild=auto`) and by `iolift ec rebuild`.
//!
//! A check reads every stripe: every readable chunk against its crcs,
//! missing data chunks decoded, the parity recomputed and compared.

use super::join::{join_all, Fut};
use super::layout::crcs;
use super::{Inner, FAILED, REBUILDING};
use crate::block::Errno;
use anyhow::{bail, Result};
use bytes::Bytes;
use std::fmt;
use std::sync::atomic::Ordering;

/// Stripes rebuilt at once.
const PARALLEL: u64 = 4;

/// Children a rebuild can restore: failed ones that are open.
pub fn targets(d: &Inner) -> Vec<usize> {
    (0..d.n())
        .filter(|&c| d.children[c].dev.is_some() && d.state(c) == FAILED)
        .collect()
}

/// What a rebuild did.
#[derive(Debug, Clone, Default)]
pub struct Rebuilt {
    pub children: Vec<usize>,
    pub stripes: u64,
    pub bytes: u64,
}

impl fmt::Display for Rebuilt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "children {:?}: {} stripes, {} bytes written",
            self.children, self.stripes, self.bytes
        )
    }
}

/// Rebuilds `targets`; `progress(stripes done)` after each group.
pub async fn rebuild(
    d: &Inner,
    targets: &[usize],
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Rebuilt> {
    if targets.is_empty() {
        return Ok(Rebuilt::default());
    }
    for &c in targets {
        d.children[c].state.store(REBUILDING, Ordering::Release);
    }
    let stripes = d.geo.stripes;
    d.metrics.rebuild_left.store(stripes, Ordering::Relaxed);
    tracing::info!("ec: rebuilding children {targets:?}: {stripes} stripes");
    let mut s = 0;
    while s < stripes {
        if d.stop.load(Ordering::Acquire) {
            bail!("stopped at stripe {s} of {stripes} (the device is closing)");
        }
        let end = (s + PARALLEL).min(stripes);
        let futs: Vec<Fut<'_, Result<(), Errno>>> = (s..end)
            .map(|i| Box::pin(rebuild_stripe(d, i, targets)) as Fut<'_, _>)
            .collect();
        for (i, r) in (s..end).zip(join_all(futs).await) {
            if let Err(e) = r {
                bail!("stripe {i}: {e:?}");
            }
        }
        s = end;
        d.metrics.rebuild_left.store(stripes - s, Ordering::Relaxed);
        progress(s);
    }
    let mut done = Vec::new();
    for &c in targets {
        if d.state(c) == REBUILDING && d.admit(c).await.is_ok() {
            done.push(c);
        }
    }
    if done.len() != targets.len() {
        bail!("children {targets:?}: only {done:?} were rebuilt (the others failed again)");
    }
    Ok(Rebuilt {
        bytes: stripes * d.geo.chunk * done.len() as u64,
        children: done,
        stripes,
    })
}

async fn rebuild_stripe(d: &Inner, s: u64, targets: &[usize]) -> Result<(), Errno> {
    let _g = d.locks[(s % d.geo.slots) as usize].write().await;
    let live: Vec<usize> = targets
        .iter()
        .copied()
        .filter(|&c| d.state(c) == REBUILDING)
        .collect();
    if live.is_empty() {
        return Err(Errno::EIO);
    }
    let cols = d.read_cols(s, 0, d.geo.chunk, &live).await?;
    for (&c, b) in live.iter().zip(cols) {
        let sums = crcs(&b);
        let len = b.len() as u64;
        if d.child_write(c, d.geo.chunk_off(s), b).await.is_ok() {
            d.write_meta(c, s, 0, &sums).await;
            d.metrics.rebuilt_bytes.fetch_add(len, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// What a check found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    pub stripes: u64,
    /// Stripes that could not be decoded.
    pub unreadable: u64,
    /// Stripes whose parity does not match their data.
    pub inconsistent: u64,
    /// Readable chunks that failed their crc (repaired by the check).
    pub crc_errors: u64,
}

impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} stripes: {} unreadable, {} with parity not matching data, {} chunk crc errors (repaired)",
            self.stripes, self.unreadable, self.inconsistent, self.crc_errors
        )
    }
}

/// Checks every stripe (see the module doc).
pub async fn check(d: &Inner, progress: &(dyn Fn(u64) + Sync)) -> Checked {
    let mut r = Checked {
        stripes: d.geo.stripes,
        ..Checked::default()
    };
    let (k, m, chunk) = (d.geo.k, d.geo.m, d.geo.chunk);
    let before = d.metrics.crc_errors.load(Ordering::Relaxed);
    let all: Vec<usize> = (0..k + m).collect();
    for s in 0..d.geo.stripes {
        let _g = d.locks[(s % d.geo.slots) as usize].read().await;
        let Ok(cols) = d.read_cols(s, 0, chunk, &all).await else {
            r.unreadable += 1;
            continue;
        };
        // read_cols decoded what was missing from k chunks; with more
        // than k readable, the parity recomputed from the data must be
        // what the parity chunks hold.
        let srcs: Vec<&[u8]> = cols[..k].iter().map(|b| &b[..]).collect();
        let mut parity = vec![vec![0u8; chunk as usize]; m];
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        if d.codec.encode(&srcs, &mut outs).is_err() {
            r.unreadable += 1;
            continue;
        }
        if parity
            .iter()
            .zip(&cols[k..])
            .any(|(p, c): (&Vec<u8>, &Bytes)| p[..] != c[..])
        {
            tracing::warn!("ec: check: stripe {s}: parity does not match the data");
            r.inconsistent += 1;
        }
        if s % 64 == 63 {
            progress(s + 1);
        }
    }
    progress(d.geo.stripes);
    r.crc_errors = d.metrics.crc_errors.load(Ordering::Relaxed) - before;
    r
}
