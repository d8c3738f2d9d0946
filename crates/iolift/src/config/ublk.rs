//! Settings of the ublk front-end: `iolift serve --ublk[=NAME]`,
//! `--ublk-queues`, `--ublk-depth`, their bounds, and what they resolve to
//! against the exports. Kept with the other settings (config/), so the
//! front-end (crate::ublk) reads them and config never imports it.

use anyhow::{bail, Result};
use clap::Args;

/// How a ublk device is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UblkOptions {
    /// Hardware queues, each served by its own thread (1..=16).
    pub queues: u16,
    /// Requests the kernel may queue per hardware queue (1..=1024).
    pub depth: u16,
    /// Largest request in bytes, and each tag's buffer size (4 KiB to
    /// 1 MiB, a multiple of 4 KiB).
    pub max_io: u32,
}

impl Default for UblkOptions {
    fn default() -> Self {
        UblkOptions {
            queues: 1,
            depth: 64,
            max_io: 512 << 10,
        }
    }
}

impl UblkOptions {
    /// Checks the bounds the driver and this front-end accept.
    pub fn validate(&self) -> Result<()> {
        if !(1..=16).contains(&self.queues) {
            bail!("ublk queues must be 1 to 16, got {}", self.queues);
        }
        if !(1..=1024).contains(&self.depth) {
            bail!("ublk queue depth must be 1 to 1024, got {}", self.depth);
        }
        if !(4096..=1 << 20).contains(&self.max_io) || !self.max_io.is_multiple_of(4096) {
            bail!(
                "ublk largest request must be a multiple of 4 KiB from 4 KiB to 1 MiB, got {}",
                self.max_io
            );
        }
        Ok(())
    }
}

/// The flags of `iolift serve` for this front-end.
#[derive(Args, Debug, Default, Clone)]
pub struct UblkFlags {
    /// Also serve an export as a kernel block device /dev/ublkbN through
    /// the ublk driver: `--ublk` (the default export) or `--ublk=NAME`
    /// (repeatable; root, Linux 6.0+ with ublk_drv loaded). See docs/ublk.md.
    #[arg(long = "ublk", value_name = "NAME", num_args = 0..=1, require_equals = true,
          default_missing_value = "")]
    pub ublk: Vec<String>,
    /// Hardware queues of each ublk device, one thread each [default: 1].
    #[arg(long, value_name = "N")]
    pub ublk_queues: Option<u16>,
    /// Requests the kernel may queue on each ublk queue [default: 64].
    #[arg(long, value_name = "N")]
    pub ublk_depth: Option<u16>,
}

/// What `--ublk` resolved to: the exports to serve, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UblkPlan {
    /// Export names, each served as its own device, in the order given.
    pub exports: Vec<String>,
    pub opts: UblkOptions,
}

impl UblkPlan {
    /// Resolves the flags against the exports: `--ublk` alone names the
    /// default export (`default`, else the export "", else the only one).
    pub fn resolve(f: &UblkFlags, names: &[String], default: Option<&str>) -> Result<UblkPlan> {
        let d = UblkOptions::default();
        let opts = UblkOptions {
            queues: f.ublk_queues.unwrap_or(d.queues),
            depth: f.ublk_depth.unwrap_or(d.depth),
            max_io: d.max_io,
        };
        opts.validate()?;
        let mut exports = Vec::new();
        for n in &f.ublk {
            let name = if !n.is_empty() {
                n.as_str()
            } else if let Some(d) = default {
                d
            } else if names.iter().any(|x| x.is_empty()) || names.len() != 1 {
                ""
            } else {
                names[0].as_str()
            };
            if !names.iter().any(|x| x == name) {
                bail!("--ublk={n}: no export named {name:?}");
            }
            if exports.iter().any(|x| x == name) {
                bail!("--ublk: export {name:?} given twice");
            }
            exports.push(name.to_string());
        }
        Ok(UblkPlan { exports, opts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_bounds() {
        assert!(UblkOptions::default().validate().is_ok());
        let bad = [
            UblkOptions {
                queues: 0,
                ..Default::default()
            },
            UblkOptions {
                depth: 2000,
                ..Default::default()
            },
            UblkOptions {
                max_io: 5000,
                ..Default::default()
            },
            UblkOptions {
                max_io: 2 << 20,
                ..Default::default()
            },
        ];
        for o in bad {
            assert!(o.validate().is_err(), "{o:?} should be refused");
        }
    }

    #[test]
    fn resolve_names() {
        let names = vec!["".to_string(), "b".to_string()];
        let flags = |v: &[&str]| UblkFlags {
            ublk: v.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let p = UblkPlan::resolve(&flags(&["", "b"]), &names, None).unwrap();
        assert_eq!(p.exports, ["", "b"]);
        let p = UblkPlan::resolve(&flags(&[""]), &names, Some("b")).unwrap();
        assert_eq!(p.exports, ["b"]);
        let one = vec!["only".to_string()];
        let p = UblkPlan::resolve(&flags(&[""]), &one, None).unwrap();
        assert_eq!(p.exports, ["only"]);
        assert!(UblkPlan::resolve(&flags(&["nope"]), &names, None).is_err());
        assert!(UblkPlan::resolve(&flags(&["b", "b"]), &names, None).is_err());
        let mut f = flags(&[]);
        f.ublk_queues = Some(0);
        assert!(UblkPlan::resolve(&f, &names, None).is_err());
    }
}
