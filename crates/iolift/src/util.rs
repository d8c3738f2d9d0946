//! Small shared helpers: size parsing and formatting, `key=value` option lists.

use anyhow::{bail, Context, Result};

/// Parses a size such as `4096`, `64k`, `32M`, `1G`, `2T` (powers of 1024;
/// an optional trailing `B`/`iB` is accepted).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| t.strip_suffix('B'))
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(t);
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
    let n: u64 = num.trim().parse().with_context(|| {
        format!("bad size {s:?}: expected a number with an optional k/M/G/T unit")
    })?;
    n.checked_mul(mult)
        .with_context(|| format!("bad size {s:?}: too large"))
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

/// Splits `name:k=v,k2=v2,flag` into the name and its options, in order.
/// A bare word without `=` becomes `(word, "")`.
pub fn split_spec(spec: &str) -> (&str, Vec<(&str, &str)>) {
    let (name, rest) = match spec.split_once(':') {
        Some((n, r)) => (n, r),
        None => (spec, ""),
    };
    let opts = rest
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    (name, opts)
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
    fn specs() {
        let (n, o) = split_spec("cache:size=32M,mode=wt,ro");
        assert_eq!(n, "cache");
        assert_eq!(o, vec![("size", "32M"), ("mode", "wt"), ("ro", "")]);
        assert_eq!(split_spec("scheduler"), ("scheduler", vec![]));
    }
}
