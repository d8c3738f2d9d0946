//! Backends: the devices at the bottom of a stack.
//!
//! A backend is named by a spec `KIND:ARG[,key=value...]`, e.g.
//! `null:1G`, `memory:1G`, `file:/var/tmp/disk.img,size=1G,direct`.
//! Adding a backend is one file plus one line in [`open`].

use crate::block::DevRef;
use anyhow::{bail, Result};

pub mod file;
pub mod memory;
pub mod null;
pub mod rbd;

/// A parsed backend spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    pub kind: String,
    /// The positional argument: a size, a path, `pool/image`.
    pub arg: String,
    pub opts: Vec<(String, String)>,
}

impl BackendSpec {
    pub fn parse(spec: &str) -> Result<Self> {
        let Some((kind, rest)) = spec.split_once(':') else {
            bail!("bad backend {spec:?}: expected KIND:ARG, e.g. memory:1G, file:/path/disk.img,size=1G, null:1G");
        };
        let mut parts = rest.split(',');
        let arg = parts.next().unwrap_or("").to_string();
        let opts = parts
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        Ok(BackendSpec {
            kind: kind.to_string(),
            arg,
            opts,
        })
    }

    /// The value of option `key`, if given.
    pub fn opt(&self, key: &str) -> Option<&str> {
        self.opts
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether a flag option (`direct`, `ro`, ...) is set.
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.opt(key), Some("" | "1" | "true" | "yes" | "on"))
    }

    /// Fails naming the first option not in `known`.
    pub fn check_opts(&self, known: &[&str]) -> Result<()> {
        for (k, _) in &self.opts {
            if !known.contains(&k.as_str()) {
                bail!(
                    "backend {}: unknown option {k:?} (known: {})",
                    self.kind,
                    known.join(", ")
                );
            }
        }
        Ok(())
    }
}

/// Opens the backend a spec names.
pub fn open(spec: &str) -> Result<DevRef> {
    let s = BackendSpec::parse(spec)?;
    match s.kind.as_str() {
        "null" => null::open(&s),
        "memory" => memory::open(&s),
        "file" => file::open(&s),
        "rbd" => rbd::open(&s),
        other => {
            bail!("unknown backend kind {other:?} in {spec:?} (known: null, memory, file, rbd)")
        }
    }
}
