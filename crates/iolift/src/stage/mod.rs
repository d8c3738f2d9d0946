//! Stages: devices that wrap the device below them (cache, scheduler, stats,
//! delay, error), like nbdkit filters.
//!
//! A stage is named by a spec `NAME[:key=value,...]`, e.g. `cache:size=32M`.
//! `--stage a --stage b` puts `a` on top: a request flows a -> b -> backend.
//! Adding a stage is one file plus one line in [`build`].
//!
//! See `docs/stages.md` for the design, options and measured figures.

use crate::block::DevRef;
use anyhow::{bail, Context, Result};
use std::time::Duration;

pub mod cache;
pub mod delay;
pub mod error;
pub mod metrics;
pub mod scheduler;
pub mod stats;
mod timer;

/// Wraps `below` in the stage that `spec` names.
pub fn build(spec: &str, below: DevRef) -> Result<DevRef> {
    let (name, opts) = crate::util::split_spec(spec);
    let o = Opts::new(name, opts);
    match name {
        "cache" => cache::build(o, below),
        "scheduler" => scheduler::build(o, below),
        "stats" => stats::build(o, below),
        "delay" => delay::build(o, below),
        "error" => error::build(o, below),
        _ => bail!(
            "unknown stage {name:?} in {spec:?} (known: cache, scheduler, stats, delay, error)"
        ),
    }
}

/// Builds a stack: `specs[0]` ends up on top.
pub fn build_stack(specs: &[String], backend: DevRef) -> Result<DevRef> {
    let mut dev = backend;
    for spec in specs.iter().rev() {
        dev = build(spec, dev)?;
    }
    Ok(dev)
}

/// A stage's `key=value` options, checked against the keys it knows.
pub struct Opts<'a> {
    stage: &'a str,
    opts: Vec<(&'a str, &'a str)>,
}

impl<'a> Opts<'a> {
    pub fn new(stage: &'a str, opts: Vec<(&'a str, &'a str)>) -> Self {
        Opts { stage, opts }
    }

    /// Fails naming the first key not in `known`.
    pub fn check(&self, known: &[&str]) -> Result<()> {
        for (k, _) in &self.opts {
            if !known.contains(k) {
                bail!(
                    "stage {}: unknown option {k:?} (known: {})",
                    self.stage,
                    known.join(", ")
                );
            }
        }
        Ok(())
    }

    /// The last value given for `key`.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.opts.iter().rev().find(|(k, _)| *k == key).map(|p| p.1)
    }

    fn ctx(&self, key: &str) -> String {
        format!("stage {}: option {key}", self.stage)
    }

    pub fn size(&self, key: &str, default: u64) -> Result<u64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => crate::util::parse_size(v).with_context(|| self.ctx(key)),
        }
    }

    pub fn duration(&self, key: &str, default: Duration) -> Result<Duration> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => parse_duration(v).with_context(|| self.ctx(key)),
        }
    }

    pub fn u64(&self, key: &str, default: u64) -> Result<u64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .trim()
                .parse()
                .with_context(|| format!("bad number {v:?}"))
                .with_context(|| self.ctx(key)),
        }
    }

    pub fn f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => {
                let x: f64 = v
                    .trim()
                    .parse()
                    .with_context(|| format!("bad number {v:?}"))
                    .with_context(|| self.ctx(key))?;
                if !x.is_finite() {
                    bail!("{}: bad number {v:?}", self.ctx(key));
                }
                Ok(x)
            }
        }
    }

    /// A value that must be one of `choices`.
    pub fn choice(&self, key: &str, choices: &[&'a str], default: &'a str) -> Result<&'a str> {
        match self.get(key) {
            None => Ok(default),
            Some(v) if choices.contains(&v) => Ok(v),
            Some(v) => bail!(
                "{}: bad value {v:?} (one of: {})",
                self.ctx(key),
                choices.join(", ")
            ),
        }
    }

    /// A free-form label (`name=...`): letters, digits, `_`, `-`, `.`.
    pub fn label(&self, key: &str, default: &str) -> Result<String> {
        match self.get(key) {
            None => Ok(default.to_string()),
            Some(v)
                if !v.is_empty()
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) =>
            {
                Ok(v.to_string())
            }
            Some(v) => bail!(
                "{}: bad value {v:?} (letters, digits, _ - . only)",
                self.ctx(key)
            ),
        }
    }
}

/// Parses a duration: `50us`, `1.5ms`, `2s`, `100ns`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| c.is_ascii_alphabetic())
        .with_context(|| format!("bad duration {s:?}: needs a unit (ns, us, ms, s)"))?;
    let (num, unit) = t.split_at(split);
    let x: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("bad duration {s:?}: expected a number and a unit"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => bail!("bad duration {s:?}: unknown unit {unit:?} (ns, us, ms, s)"),
    };
    let secs = x * scale;
    if !secs.is_finite() || !(0.0..=3600.0).contains(&secs) {
        bail!("bad duration {s:?}: must be between 0 and 1 hour");
    }
    Ok(Duration::from_secs_f64(secs))
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
    use std::sync::Arc;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50us").unwrap(), Duration::from_micros(50));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("-1s").is_err());
    }

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
            ("stats:name=a b", "name"),
            ("nosuch", "nosuch"),
        ] {
            let e = match build(spec, mem()) {
                Ok(_) => panic!("{spec} accepted"),
                Err(e) => format!("{e:#}"),
            };
            assert!(e.contains(want), "{spec}: {e}");
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
        let _ = build_stack(&specs, mem()).unwrap();
    }
}
