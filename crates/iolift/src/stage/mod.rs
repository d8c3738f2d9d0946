//! Stages: devices that wrap the device below them (cache, scheduler, stats,
//! delay, error), like nbdkit filters.
//!
//! A stage is named by a spec `NAME[:key=value,...]`, e.g. `cache:size=32M`.
//! `--stage a --stage b` puts `a` on top: a request flows a -> b -> backend.
//! Adding a stage is one file plus one line in [`build`].

use crate::block::DevRef;
use anyhow::{bail, Result};

/// Wraps `below` in the stage that `spec` names.
pub fn build(spec: &str, below: DevRef) -> Result<DevRef> {
    let (name, _opts) = crate::util::split_spec(spec);
    let _ = below;
    bail!("unknown stage {name:?} in {spec:?}")
}

/// Builds a stack: `specs[0]` ends up on top.
pub fn build_stack(specs: &[String], backend: DevRef) -> Result<DevRef> {
    let mut dev = backend;
    for spec in specs.iter().rev() {
        dev = build(spec, dev)?;
    }
    Ok(dev)
}
