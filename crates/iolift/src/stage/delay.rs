//! `delay`: adds latency to each request, fixed or random.
//!
//! `delay:read=50us,write=500us`, `delay:all=50us,jitter=20us,seed=7`;
//! options in [`OPTIONS`]. The request is passed down after the delay.

use super::{timer, Kind, OptHelp, Opts, Rng};
use crate::block::{BlockDev, DevInfo, DevRef, IoFuture, OpKind, Request};
use anyhow::Result;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct DelayDev {
    below: DevRef,
    per_op: [Duration; 7],
    jitter: Duration,
    rng: Mutex<Rng>,
    label: String,
}

fn idx(k: OpKind) -> usize {
    OpKind::ALL.iter().position(|&x| x == k).unwrap_or(0)
}

const fn dur(name: &'static str, help: &'static str) -> OptHelp {
    OptHelp {
        name,
        kind: Kind::Duration,
        default: "all",
        help,
    }
}

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "all",
        kind: Kind::Duration,
        default: "0",
        help: "delay of every request (the default of the keys below)",
    },
    dur("read", "delay of reads"),
    dur("write", "delay of writes"),
    dur("flush", "delay of flushes"),
    dur("trim", "delay of trims"),
    dur("zero", "delay of write-zeroes"),
    OptHelp {
        name: "jitter",
        kind: Kind::Duration,
        default: "0",
        help: "adds a uniform random [-jitter, +jitter] to each delay (clamped at 0)",
    },
    OptHelp {
        name: "seed",
        kind: Kind::Count,
        default: "1",
        help: "seed of the jitter's random numbers",
    },
];

/// The checked options of one delay stage.
pub struct DelayConfig {
    per_op: [Duration; 7],
    jitter: Duration,
    seed: u64,
}

pub fn parse(o: &Opts) -> Result<DelayConfig> {
    let all = o.duration("all", Duration::ZERO)?;
    let mut per_op = [all; 7];
    for (key, kind) in [
        ("read", OpKind::Read),
        ("write", OpKind::Write),
        ("flush", OpKind::Flush),
        ("trim", OpKind::Trim),
        ("zero", OpKind::WriteZeroes),
    ] {
        per_op[idx(kind)] = o.duration(key, all)?;
    }
    Ok(DelayConfig {
        per_op,
        jitter: o.duration("jitter", Duration::ZERO)?,
        seed: o.u64("seed", 1)?,
    })
}

pub fn build(o: Opts, below: DevRef) -> Result<DevRef> {
    let DelayConfig {
        per_op,
        jitter,
        seed,
    } = parse(&o)?;
    let label = format!(
        "delay(r={:?},w={:?},jitter={:?})",
        per_op[idx(OpKind::Read)],
        per_op[idx(OpKind::Write)],
        jitter
    );
    Ok(Arc::new(DelayDev {
        below,
        per_op,
        jitter,
        rng: Mutex::new(Rng::new(seed)),
        label,
    }))
}

impl BlockDev for DelayDev {
    fn info(&self) -> DevInfo {
        self.below.info()
    }

    fn submit(&self, req: Request) -> IoFuture {
        let mut d = self.per_op[idx(req.kind())];
        if !self.jitter.is_zero() {
            let r = self
                .rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next_f64();
            let j = self.jitter.as_secs_f64() * (2.0 * r - 1.0);
            d = Duration::from_secs_f64((d.as_secs_f64() + j).max(0.0));
        }
        if d.is_zero() {
            return self.below.submit(req);
        }
        let below = self.below.clone();
        Box::pin(async move {
            timer::sleep(d).await;
            below.submit(req).await
        })
    }

    fn name(&self) -> String {
        self.label.clone()
    }

    fn close(&self) -> IoFuture {
        self.below.close()
    }
}
