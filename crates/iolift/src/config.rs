//! The TOML configuration of `iolift serve --config FILE`.
//!
//! ```toml
//! socket = "/tmp/iolift.sock"      # unix socket path
//! tcp = "127.0.0.1:10809"          # also listen on TCP (HOST:PORT, HOST or :PORT)
//! read_only = false                # every export read-only
//! max_request = "32M"              # largest read/write payload
//! threads = 2                      # tokio worker threads
//! poll_us = 100                    # poll mode budget, microseconds (0 = off)
//! coalesce_us = 50                 # longest coalescing pause, microseconds (0 = off)
//! default_export = "disk"          # the export answering to the empty name
//! stages = ["cache:size=64M"]      # stacked on every export (first = top)
//!
//! [[export]]
//! name = "disk"
//! backend = "file:/var/tmp/disk.img,size=1G"
//! read_only = false
//! stages = []                      # stacked below the global stages
//! description = "scratch disk"
//! ```
//!
//! Unknown fields are errors naming the field; values are validated with
//! the field's path (`export[1].backend: ...`).

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A size given as a number of bytes or a string such as "32M".
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    pub fn bytes(&self, field: &str) -> Result<u64> {
        match self {
            SizeValue::Bytes(n) => Ok(*n),
            SizeValue::Text(s) => crate::util::parse_size(s).with_context(|| field.to_string()),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub socket: Option<PathBuf>,
    pub tcp: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    pub max_request: Option<SizeValue>,
    pub threads: Option<usize>,
    pub poll_us: Option<u64>,
    pub coalesce_us: Option<u64>,
    pub default_export: Option<String>,
    #[serde(default)]
    pub stages: Vec<String>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportConfig>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    #[serde(default)]
    pub name: String,
    pub backend: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub stages: Vec<String>,
    pub description: Option<String>,
}

impl Config {
    /// Parses and validates TOML text; errors name the bad field.
    pub fn parse(text: &str) -> Result<Config> {
        let c: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        c.validate()?;
        Ok(c)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("config {}: cannot read", path.display()))?;
        Config::parse(&text).with_context(|| format!("config {}", path.display()))
    }

    /// Checks values the types cannot: sizes, specs, names.
    pub fn validate(&self) -> Result<()> {
        if let Some(m) = &self.max_request {
            validate_max_request(m.bytes("max_request")?).context("max_request")?;
        }
        if let Some(t) = &self.tcp {
            crate::cli::serve::parse_tcp_addr(t).context("tcp")?;
        }
        if self.threads == Some(0) {
            bail!("threads: must be at least 1");
        }
        if let Some(n) = self.poll_us {
            validate_poll_us(n).context("poll_us")?;
        }
        if let Some(n) = self.coalesce_us {
            validate_coalesce_us(n).context("coalesce_us")?;
        }
        for (i, s) in self.stages.iter().enumerate() {
            validate_stage_spec(s).with_context(|| format!("stages[{i}]"))?;
        }
        let mut seen = std::collections::HashSet::new();
        for (i, e) in self.exports.iter().enumerate() {
            let p = format!("export[{i}]");
            crate::nbd::wire::check_string(e.name.as_bytes())
                .map_err(|m| anyhow::anyhow!("{p}.name: {m}"))?;
            if !seen.insert(e.name.as_str()) {
                bail!("{p}.name: duplicate export name {:?}", e.name);
            }
            crate::backend::check_spec(&e.backend).with_context(|| format!("{p}.backend"))?;
            for (j, s) in e.stages.iter().enumerate() {
                validate_stage_spec(s).with_context(|| format!("{p}.stages[{j}]"))?;
            }
        }
        if let Some(d) = &self.default_export {
            if !self.exports.iter().any(|e| &e.name == d) {
                bail!("default_export: no [[export]] named {d:?}");
            }
        }
        Ok(())
    }
}

/// A duration in microseconds, 0 (off) up to `max`.
fn validate_us(n: u64, max: std::time::Duration) -> Result<u64> {
    let max = max.as_micros() as u64;
    if n > max {
        bail!("{n} us is more than the maximum of {max} us");
    }
    Ok(n)
}

/// The poll-mode budget: 0 (off) up to 10 ms; past that sleeping is
/// cheaper than spinning.
pub fn validate_poll_us(n: u64) -> Result<u64> {
    validate_us(n, crate::nbd::poll::MAX_POLL)
}

/// The longest coalescing pause: 0 (off) up to 1 ms.
pub fn validate_coalesce_us(n: u64) -> Result<u64> {
    validate_us(n, crate::nbd::coalesce::MAX_PAUSE)
}

/// max_request must fit the wire's 32-bit length and be at least 512.
pub fn validate_max_request(n: u64) -> Result<u32> {
    if !(512..=u32::MAX as u64).contains(&n) {
        bail!("{n} out of range (512 bytes to 4G-1)");
    }
    Ok(n as u32)
}

/// A stage spec, checked as strictly as building it would (nothing is built).
fn validate_stage_spec(s: &str) -> Result<()> {
    crate::stage::check_spec(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_full_parses() {
        let c = Config::parse(
            r#"
socket = "/tmp/x.sock"
tcp = ":10810"
read_only = true
max_request = "1M"
stages = ["stats"]
default_export = "b"
[[export]]
name = "a"
backend = "memory:1G"
[[export]]
name = "b"
backend = "null:1G"
read_only = true
stages = ["delay:all=1ms"]
"#,
        )
        .unwrap();
        assert_eq!(c.exports.len(), 2);
        assert_eq!(c.max_request.unwrap().bytes("m").unwrap(), 1 << 20);
        assert!(c.read_only);
    }

    #[test]
    fn config_errors_name_the_field() {
        let e = Config::parse("sockett = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("sockett"), "{e}");
        let e = Config::parse("[[export]]\nname=\"a\"\nbackend=\"memory:1G\"\nbogus=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = format!("{:#}", Config::parse("max_request = \"12Q\"").unwrap_err());
        assert!(e.contains("max_request"), "{e}");
        let e = format!("{:#}", Config::parse("max_request = 10").unwrap_err());
        assert!(e.contains("max_request"), "{e}");
        let e = format!(
            "{:#}",
            Config::parse("[[export]]\nname=\"a\"\nbackend=\"nocolon\"").unwrap_err()
        );
        assert!(e.contains("export[0].backend"), "{e}");
        let e = format!(
            "{:#}",
            Config::parse("[[export]]\nname=\"a\"\nbackend=\"null:1G\"\n[[export]]\nname=\"a\"\nbackend=\"null:1G\"")
                .unwrap_err()
        );
        assert!(e.contains("export[1].name"), "{e}");
        let e = format!(
            "{:#}",
            Config::parse("tcp = \"host:notaport\"").unwrap_err()
        );
        assert!(e.contains("tcp"), "{e}");
        let e = format!(
            "{:#}",
            Config::parse("default_export = \"zz\"").unwrap_err()
        );
        assert!(e.contains("default_export"), "{e}");
    }

    #[test]
    fn stage_and_backend_specs_are_checked_strictly() {
        let exp = |backend: &str, stages: &str| {
            format!("[[export]]\nname=\"a\"\nbackend=\"{backend}\"\nstages=[{stages}]")
        };
        for (text, want) in [
            (
                exp("null:1G", "\"delay:ms=1\""),
                "export[0].stages[0]: stage delay: unknown option \"ms\"",
            ),
            (
                exp("null:1G", "\"stats\", \"cache:size=1Q\""),
                "export[0].stages[1]: stage cache: option size",
            ),
            (
                exp("memory:1G,size=1G", ""),
                "export[0].backend: backend memory: unknown option \"size\"",
            ),
            (
                exp("bogus:1G", ""),
                "export[0].backend: unknown backend kind \"bogus\"",
            ),
            (
                exp("file:/nonexistent/dir/d.img,direct=maybe", ""),
                "option direct",
            ),
            (
                "stages = [\"delay:ms=1\"]".to_string(),
                "stages[0]: stage delay: unknown option \"ms\"",
            ),
        ] {
            let e = format!("{:#}", Config::parse(&text).unwrap_err());
            assert!(e.contains(want), "{text}: {e}");
        }
        // Checking opens nothing: a file backend is not created.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("d.img");
        Config::parse(&exp(
            &format!("file:{},size=1M", f.display()),
            "\"delay:all=1ms\"",
        ))
        .unwrap();
        assert!(!f.exists());
    }
}
