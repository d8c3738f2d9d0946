//! Stages: devices that wrap the device below them (cache, scheduler, stats,
//! delay, error, log-writes: the [`STAGES`] table), like nbdkit filters.
//!
//! A stage is named by a spec `NAME[:key=value,...]`, e.g. `cache:size=32M`.
//! `--stage a --stage b` puts `a` on top: a request flows a -> b -> backend.
//! Each stage's file declares its options (`OPTIONS`, a table of
//! [`OptHelp`]); [`STAGES`] lists every stage with its summary, options and
//! functions, so adding a stage is one file plus one entry there. Options
//! are parsed and checked by [`crate::spec`] (strict, the same everywhere).
//!
//! See `docs/stages.md` for the design, options and measured figures.

use crate::block::DevRef;
pub use crate::spec::{Kind, OptHelp, Opts};
use anyhow::{bail, Result};

pub mod cache;
pub mod delay;
pub mod error;
pub mod log_writes;
pub mod scheduler;
pub mod stats;
mod timer;

/// One kind of stage.
pub struct StageKind {
    pub name: &'static str,
    /// One line for `iolift stages`.
    pub summary: &'static str,
    pub options: &'static [OptHelp],
    /// Checks options whose values depend on each other, without building
    /// anything (the keys and each value's kind are checked before).
    pub check: fn(&Opts) -> Result<()>,
    /// Builds the stage over `below`.
    pub build: fn(Opts, DevRef) -> Result<DevRef>,
}

/// Every stage, in the order `iolift stages` lists them.
pub const STAGES: &[StageKind] = &[
    StageKind {
        name: "cache",
        summary: "LRU block cache: write-back, write-through or read-only",
        options: cache::OPTIONS,
        check: |o| cache::parse(o).map(drop),
        build: cache::build,
    },
    StageKind {
        name: "scheduler",
        summary: "holds sequential reads and writes briefly and merges contiguous ones",
        options: scheduler::OPTIONS,
        check: |o| scheduler::parse(o).map(drop),
        build: scheduler::build,
    },
    StageKind {
        name: "stats",
        summary: "per-op request counts, bytes and latency, exported on /metrics",
        options: stats::OPTIONS,
        check: |o| o.label("name").map(drop),
        build: stats::build,
    },
    StageKind {
        name: "delay",
        summary: "adds a fixed or random latency to each request",
        options: delay::OPTIONS,
        check: |o| delay::parse(o).map(drop),
        build: delay::build,
    },
    StageKind {
        name: "error",
        summary: "fails requests with an errno, at a rate or from the Nth on",
        options: error::OPTIONS,
        check: |o| error::parse(o).map(drop),
        build: error::build,
    },
    StageKind {
        name: "log-writes",
        summary: "records every write, trim, zero and flush to a log for iolift crash-states",
        options: log_writes::OPTIONS,
        check: |o| log_writes::parse(o).map(drop),
        build: log_writes::build,
    },
];

/// The names in `STAGES`, comma-separated.
fn known() -> String {
    STAGES.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// Finds the stage a spec names and parses and checks its options.
fn parse_spec(spec: &str) -> Result<(&'static StageKind, Opts)> {
    let (name, rest) = crate::spec::split_name("stage", spec)?;
    let Some(kind) = STAGES.iter().find(|k| k.name == name) else {
        bail!("unknown stage {name:?} in {spec:?} (known: {})", known());
    };
    let o = Opts::parse("stage", name, rest)?;
    o.check(kind.options)?;
    Ok((kind, o))
}

/// Checks a stage spec as strictly as [`build`] does, building nothing:
/// the name, every key, every value.
pub fn check_spec(spec: &str) -> Result<()> {
    let (kind, o) = parse_spec(spec)?;
    (kind.check)(&o)
}

/// Wraps `below` in the stage that `spec` names.
pub fn build(spec: &str, below: DevRef) -> Result<DevRef> {
    let (kind, o) = parse_spec(spec)?;
    (kind.build)(o, below)
}

/// Builds a stack: `specs[0]` ends up on top.
pub fn build_stack(specs: &[String], backend: DevRef) -> Result<DevRef> {
    let mut dev = backend;
    for spec in specs.iter().rev() {
        dev = build(spec, dev)?;
    }
    Ok(dev)
}

/// A small seeded PRNG (splitmix64): reproducible fault and delay patterns.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDev;
    use crate::block::{BlockDevExt, Flags};
    use std::sync::Arc;

    #[test]
    fn bad_specs_name_the_key() {
        let mem = || -> DevRef { Arc::new(MemoryDev::new(1 << 20)) };
        for (spec, want) in [
            ("cache:sise=1M", "sise"),
            ("cache:size=12Q", "size"),
            ("cache:mode=fast", "mode"),
            ("cache:block=3000", "block"),
            ("scheduler:max_delay=5", "max_delay"),
            ("scheduler:bogus=1", "bogus"),
            ("delay:read=abc", "read"),
            ("delay:foo=1ms", "foo"),
            ("error:rate=2", "rate"),
            ("error:errno=EWHAT", "errno"),
            ("error:ops=read|frob", "ops"),
            ("error:seed=1", "rate=P or after=N"),
            ("stats:name=a b", "name"),
            ("delay:ms=1", "ms"),
            ("delay:all= 1ms", "\" 1ms\""),
            ("delay:all=", "all"),
            ("stats:name=x,", "empty option"),
            ("scheduler:max_merge=0", "max_merge"),
            ("cache:size=8k,block=8k", "size"),
            ("cache:dirty_target=30M", "dirty_target"),
            ("nosuch", "nosuch"),
            (" cache", "\" cache\""),
        ] {
            let e = match build(spec, mem()) {
                Ok(_) => panic!("{spec} accepted"),
                Err(e) => format!("{e:#}"),
            };
            assert!(e.contains(want), "{spec}: {e}");
            let c = format!("{:#}", check_spec(spec).unwrap_err());
            assert_eq!(c, e, "check_spec and build differ on {spec}");
        }
        let specs: Vec<String> = [
            "stats",
            "cache:size=1M,block=8k",
            "scheduler",
            "delay:all=0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for s in &specs {
            check_spec(s).unwrap();
        }
        let _ = build_stack(&specs, mem()).unwrap();
    }

    /// Every option of every stage in the table set to awkward values
    /// (zero, huge, overflowing, negative, wrong kind, other options'
    /// words): refused with an error naming the option, or built over a
    /// 1 MiB memory device that then takes a write, a read, a flush and
    /// a close (each given 100 ms: a long delay times out), never a panic.
    #[test]
    fn every_option_of_every_stage_is_built_or_named() {
        let dir = tempfile::tempdir().unwrap();
        let values = [
            "0",
            "1",
            "-1",
            "3000",
            "4096",
            "1M",
            "1G",
            "1P",
            "16383P",
            "18446744073709551615",
            "18446744073709551616",
            "0s",
            "1ns",
            "1h",
            "2h",
            "1e9",
            "1e400",
            "nan",
            "inf",
            "0.5",
            "2",
            "x",
            "on",
            "off",
            "read",
            "read|write",
            "EIO",
            "ENOSPC",
            "1ms",
        ];
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (mut built, mut refused, mut n) = (0, 0, 0);
        for k in STAGES {
            for opt in k.options {
                for v in values {
                    n += 1;
                    let mut spec = format!("{}:{}={v}", k.name, opt.name);
                    // What each stage needs besides the option tried.
                    if k.name == "error" && opt.name != "rate" {
                        spec += ",rate=0.5";
                    }
                    if k.name == "log-writes" && opt.name != "path" {
                        spec += &format!(",path={}/{n}.log", dir.path().display());
                    }
                    let r = rt.block_on(async {
                        let mem: DevRef = Arc::new(MemoryDev::new(1 << 20));
                        let dev = build(&spec, mem)?;
                        let t = std::time::Duration::from_millis(100);
                        let data = bytes::Bytes::from(vec![7u8; 4096]);
                        let _ = tokio::time::timeout(t, dev.write(0, data, Flags::NONE)).await;
                        let _ = tokio::time::timeout(t, dev.read(0, 4096)).await;
                        let _ = tokio::time::timeout(t, dev.flush()).await;
                        let _ = tokio::time::timeout(t, dev.close()).await;
                        anyhow::Ok(())
                    });
                    match r {
                        Ok(()) => built += 1,
                        Err(e) => {
                            let e = format!("{e:#}");
                            assert!(e.contains(opt.name), "{spec}: {e}");
                            refused += 1;
                        }
                    }
                }
            }
        }
        assert!(
            built > 0 && refused > built,
            "{built} built, {refused} refused"
        );
    }

    #[test]
    fn known_lists_come_from_the_table() {
        let e = format!("{:#}", check_spec("nosuch").unwrap_err());
        let names: Vec<&str> = STAGES.iter().map(|k| k.name).collect();
        assert!(e.contains(&format!("(known: {})", names.join(", "))), "{e}");
        for k in STAGES {
            let e = format!(
                "{:#}",
                check_spec(&format!("{}:zzz=1", k.name)).unwrap_err()
            );
            let opts: Vec<&str> = k.options.iter().map(|o| o.name).collect();
            let want = format!(
                "stage {}: unknown option \"zzz\" (known: {})",
                k.name,
                opts.join(", ")
            );
            assert!(e.contains(&want), "{e}");
            assert!(
                !k.summary.is_empty() && !k.summary.contains('\n'),
                "{}",
                k.name
            );
        }
    }
}
