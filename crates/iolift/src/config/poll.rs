//! The poll-mode setting (`serve --poll-us auto|N`, `poll_us = "auto"` or a
//! number in the config file) and what the NBD server makes of it.

use crate::nbd::poll::{PollMode, MAX_POLL};
use anyhow::{bail, Result};
use serde::Deserialize;
use std::time::Duration;

/// `--poll-us`: adaptive or a fixed budget in microseconds (0 = off, the
/// default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PollSetting {
    Fixed(u64),
    Named(PollName),
}

/// The named values of `poll_us` (only `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollName {
    Auto,
}

/// Poll mode unless told otherwise: off. On the 2-core development VM
/// neither the adaptive mode nor fixed budgets beat `--poll-us 0` in the
/// client's IOPS, quiet or busy (docs/measurements/nbd.md), so polling is
/// opt-in (`auto` or a budget).
pub const DEFAULT_POLL: PollSetting = PollSetting::Fixed(0);

impl PollSetting {
    /// Checks a fixed budget: 0 (off) up to 10 ms, past which sleeping is
    /// cheaper than spinning.
    pub fn check(self) -> Result<PollSetting> {
        if let PollSetting::Fixed(n) = self {
            let max = MAX_POLL.as_micros() as u64;
            if n > max {
                bail!("{n} us is more than the maximum of {max} us (or \"auto\")");
            }
        }
        Ok(self)
    }

    /// What the NBD server does with it.
    pub fn mode(self) -> PollMode {
        match self {
            PollSetting::Named(PollName::Auto) => PollMode::Auto,
            PollSetting::Fixed(0) => PollMode::Off,
            PollSetting::Fixed(n) => PollMode::Fixed(Duration::from_micros(n)),
        }
    }
}

impl std::str::FromStr for PollSetting {
    type Err = anyhow::Error;

    /// `auto` or a number of microseconds.
    fn from_str(s: &str) -> Result<PollSetting> {
        if s == "auto" {
            return Ok(PollSetting::Named(PollName::Auto));
        }
        match s.parse::<u64>() {
            Ok(n) => PollSetting::Fixed(n).check(),
            Err(_) => bail!("{s:?} is neither \"auto\" nor a number of microseconds"),
        }
    }
}

impl std::fmt::Display for PollSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollSetting::Named(PollName::Auto) => f.write_str("auto"),
            PollSetting::Fixed(n) => write!(f, "{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values() {
        assert_eq!(
            "auto".parse::<PollSetting>().unwrap(),
            PollSetting::Named(PollName::Auto)
        );
        assert_eq!(
            "auto".parse::<PollSetting>().unwrap().mode(),
            PollMode::Auto
        );
        assert_eq!(
            "250".parse::<PollSetting>().unwrap(),
            PollSetting::Fixed(250)
        );
        assert_eq!("0".parse::<PollSetting>().unwrap().mode(), PollMode::Off);
        assert_eq!(
            "250".parse::<PollSetting>().unwrap().mode(),
            PollMode::Fixed(Duration::from_micros(250))
        );
        assert_eq!(DEFAULT_POLL.mode(), PollMode::Off);
        for bad in ["Auto", "-1", "1.5", "", "10001"] {
            let e = bad.parse::<PollSetting>().unwrap_err().to_string();
            assert!(e.contains("auto"), "{bad}: {e}");
        }
        assert_eq!(PollSetting::Named(PollName::Auto).to_string(), "auto");
        assert_eq!(DEFAULT_POLL.to_string(), "0");
    }

    #[test]
    fn toml_values() {
        #[derive(Deserialize)]
        struct T {
            poll_us: PollSetting,
        }
        let t: T = toml::from_str("poll_us = \"auto\"").unwrap();
        assert_eq!(t.poll_us, PollSetting::Named(PollName::Auto));
        let t: T = toml::from_str("poll_us = 7").unwrap();
        assert_eq!(t.poll_us, PollSetting::Fixed(7));
        assert!(toml::from_str::<T>("poll_us = \"fast\"").is_err());
        assert!(toml::from_str::<T>("poll_us = -3").is_err());
    }
}
