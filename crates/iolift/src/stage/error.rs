//! `error`: injects failures, reproducibly.
//!
//! `error:rate=0.01,ops=read|write,errno=EIO,seed=1` fails each matching
//! request with probability `rate`; `error:after=N` fails every matching
//! request from the Nth one on (1-based, counted in submission order).
//! Give `rate`, `after` or both; options in [`OPTIONS`].

use super::{Kind, OptHelp, Opts, Rng};
use crate::block::{ready, BlockDev, DevInfo, DevRef, Errno, IoFuture, OpKind, Request};
use anyhow::{bail, Result};
use std::sync::{Arc, Mutex};

pub struct ErrorDev {
    below: DevRef,
    ops: Vec<OpKind>,
    rate: f64,
    after: Option<u64>,
    errno: Errno,
    state: Mutex<(Rng, u64)>,
}

fn parse_errno(s: &str) -> Option<Errno> {
    let n = match s {
        "EIO" => libc::EIO,
        "ENOSPC" => libc::ENOSPC,
        "EPERM" => libc::EPERM,
        "ENOMEM" => libc::ENOMEM,
        "EINVAL" => libc::EINVAL,
        "ENOTSUP" => libc::ENOTSUP,
        "ESHUTDOWN" => libc::ESHUTDOWN,
        "ETIMEDOUT" => libc::ETIMEDOUT,
        "EAGAIN" => libc::EAGAIN,
        "EROFS" => libc::EROFS,
        _ => match s.parse::<i32>() {
            Ok(n) if (1..4096).contains(&n) => n,
            _ => return None,
        },
    };
    Some(Errno(n))
}

pub const OPTIONS: &[OptHelp] = &[
    OptHelp {
        name: "rate",
        kind: Kind::Number,
        default: "0",
        help: "probability (0..1) that a matching request fails",
    },
    OptHelp {
        name: "after",
        kind: Kind::Count,
        default: "off",
        help: "fail every matching request from the Nth on (1-based)",
    },
    OptHelp {
        name: "ops",
        kind: Kind::Text("OP|OP..."),
        default: "all",
        help: "requests that may fail: read, write, flush, trim, zero, cache, block_status, all",
    },
    OptHelp {
        name: "errno",
        kind: Kind::Text("ERRNO"),
        default: "EIO",
        help: "the error: EIO, ENOSPC, EPERM, ENOMEM, EINVAL, ENOTSUP, ESHUTDOWN, ETIMEDOUT, EAGAIN, EROFS or a number",
    },
    OptHelp {
        name: "seed",
        kind: Kind::Count,
        default: "1",
        help: "seed of the random numbers (same seed, same failures)",
    },
];

/// The checked options of one error stage.
pub struct ErrorConfig {
    ops: Vec<OpKind>,
    rate: f64,
    after: Option<u64>,
    errno: Errno,
    seed: u64,
}

pub fn parse(o: &Opts) -> Result<ErrorConfig> {
    let rate = o.f64("rate", 0.0)?;
    if !(0.0..=1.0).contains(&rate) {
        return Err(o.err("rate", format_args!("{rate} is not between 0 and 1")));
    }
    let after = match o.get("after") {
        None => None,
        Some(_) => match o.u64("after", 1)? {
            0 => return Err(o.err("after", "counts from 1")),
            n => Some(n),
        },
    };
    let ops = match o.get("ops") {
        None | Some("all") => OpKind::ALL.to_vec(),
        Some(s) => {
            let mut v = Vec::new();
            for w in s.split('|') {
                let k = match w {
                    "zero" => OpKind::WriteZeroes,
                    _ => match OpKind::ALL.iter().find(|k| k.name() == w) {
                        Some(k) => *k,
                        None => return Err(o.err("ops", format_args!("unknown op {w:?} (read, write, flush, trim, zero, cache, block_status, all)"))),
                    },
                };
                v.push(k);
            }
            v
        }
    };
    let errno = match o.get("errno") {
        None => Errno::EIO,
        Some(s) => match parse_errno(s) {
            Some(e) => e,
            None => {
                return Err(o.err(
                    "errno",
                    format_args!("unknown errno {s:?} (EIO, ENOSPC, EPERM, ... or a number)"),
                ))
            }
        },
    };
    if after.is_none() && o.get("rate").is_none() {
        bail!("stage error: give rate=P or after=N");
    }
    Ok(ErrorConfig {
        ops,
        rate,
        after,
        errno,
        seed: o.u64("seed", 1)?,
    })
}

pub fn build(o: Opts, below: DevRef) -> Result<DevRef> {
    let c = parse(&o)?;
    Ok(Arc::new(ErrorDev {
        below,
        ops: c.ops,
        rate: c.rate,
        after: c.after,
        errno: c.errno,
        state: Mutex::new((Rng::new(c.seed), 0)),
    }))
}

impl BlockDev for ErrorDev {
    fn info(&self) -> DevInfo {
        self.below.info()
    }

    fn submit(&self, req: Request) -> IoFuture {
        if self.ops.contains(&req.kind()) {
            let fail = {
                let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
                g.1 += 1;
                let by_count = self.after.is_some_and(|a| g.1 >= a);
                let by_rate = self.rate > 0.0 && g.0.next_f64() < self.rate;
                by_count || by_rate
            };
            if fail {
                return ready(Err(self.errno));
            }
        }
        self.below.submit(req)
    }

    fn name(&self) -> String {
        format!("error(rate={},errno={})", self.rate, self.errno.name())
    }

    fn close(&self) -> IoFuture {
        self.below.close()
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::memory::MemoryDev;
    use crate::block::{BlockDevExt, Errno};
    use std::sync::Arc;

    #[tokio::test]
    async fn after_and_rate_are_reproducible() {
        let mem = Arc::new(MemoryDev::new(1 << 20));
        let d = super::super::build("error:after=3,ops=read,errno=ENOSPC", mem.clone()).unwrap();
        assert!(d.read(0, 10).await.is_ok());
        assert!(d.read(0, 10).await.is_ok());
        assert_eq!(d.read(0, 10).await, Err(Errno::ENOSPC));
        assert_eq!(d.read(0, 10).await, Err(Errno::ENOSPC));
        assert!(d.flush().await.is_ok());
        let pattern = |seed| async move {
            let d = super::super::build(
                &format!("error:rate=0.3,seed={seed}"),
                Arc::new(MemoryDev::new(4096)),
            )
            .unwrap();
            let mut v = Vec::new();
            for _ in 0..200 {
                v.push(d.read(0, 1).await.is_err());
            }
            v
        };
        let a = pattern(5).await;
        assert_eq!(a, pattern(5).await);
        assert_ne!(a, pattern(6).await);
        let n = a.iter().filter(|&&x| x).count();
        assert!((20..100).contains(&n), "{n} failures of 200 at rate 0.3");
    }
}
