//! Small shared helpers: size and duration parsing, size formatting.
//!
//! The parsers trim nothing: a value with white space in it fails with a
//! message naming the value (the same rule as for stage and backend
//! options, see [`crate::spec`]).

use anyhow::{bail, Context, Result};
use std::time::Duration;

/// Fails naming `s` if it is empty or has white space in it.
fn no_spaces(what: &str, s: &str) -> Result<()> {
    if s.is_empty() {
        bail!("empty {what}");
    }
    if s.chars().any(char::is_whitespace) {
        bail!("bad {what} {s:?}: has spaces");
    }
    Ok(())
}

/// Parses a size such as `4096`, `64k`, `32M`, `1G`, `2T` (powers of 1024;
/// an optional trailing `B`/`iB` is accepted).
pub fn parse_size(s: &str) -> Result<u64> {
    no_spaces("size", s)?;
    let t = s
        .strip_suffix("iB")
        .or_else(|| s.strip_suffix("ib"))
        .or_else(|| s.strip_suffix('B'))
        .or_else(|| s.strip_suffix('b'))
        .unwrap_or(s);
    let (num, mult) = match t.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                'p' => 1 << 50,
                _ => bail!("bad size {s:?}: unknown unit {c:?} (use k, M, G, T, P)"),
            };
            (&t[..t.len() - 1], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num.parse().with_context(|| {
        format!("bad size {s:?}: expected a number with an optional k/M/G/T unit")
    })?;
    n.checked_mul(mult)
        .with_context(|| format!("bad size {s:?}: too large"))
}

/// Parses a duration: `50us` (or `50µs`), `1.5ms`, `2s`, `100ns`, `0`; at
/// most one hour.
pub fn parse_duration(s: &str) -> Result<Duration> {
    no_spaces("duration", s)?;
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s
        .find(|c: char| c.is_alphabetic())
        .with_context(|| format!("bad duration {s:?}: needs a unit (ns, us, ms, s)"))?;
    let (num, unit) = s.split_at(split);
    let x: f64 = num
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

/// Formats a byte count with the largest exact binary unit (`32M`, `1G`, `4097`).
pub fn format_size(n: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("k", 10)] {
        if n != 0 && n.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("32M").unwrap(), 32 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999P").is_err());
        assert_eq!(format_size(32 << 20), "32M");
        assert_eq!(format_size(4097), "4097");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50us").unwrap(), Duration::from_micros(50));
        assert_eq!(parse_duration("7µs").unwrap(), Duration::from_micros(7));
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
    fn spaces_are_errors_not_trimmed() {
        for bad in [" 4k", "4k ", "32 M", ""] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        let e = parse_size(" 4k").unwrap_err().to_string();
        assert!(e.contains("\" 4k\""), "{e}");
        for bad in [" 1ms", "1 ms", "1ms\n", ""] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
