//! Options of stages and backends: one parser, one checker, one help format.
//!
//! A stage is named by `NAME[:ITEM,...]` (`cache:size=32M,mode=wt`), a
//! backend by `KIND:ARG[,ITEM,...]` (`file:/var/tmp/disk.img,size=1G,direct`).
//! An ITEM is `key=value`, or a bare `key` for a flag. Each stage and
//! backend declares its options as a table of [`OptHelp`] (name, value
//! kind, default, meaning) next to its code; the same table checks a spec
//! ([`Opts::check`]) and prints the help (`iolift stages`, `iolift
//! backends`).
//!
//! Strictness, the same for every stage and backend, on the command line
//! and in the config file:
//! - a key not in the table fails, listing the known keys;
//! - nothing is trimmed: a name, key, value or positional argument with
//!   leading or trailing white space fails, naming it; so does an empty
//!   item (`a=1,,b=2`, a trailing comma) and an empty value (`size=`);
//! - a bare `key` is a flag; for any other kind it fails ("needs a value");
//! - every value must parse as its declared kind (`size=12Q` fails);
//! - a key given twice takes its last value.

use crate::util::{parse_duration, parse_size};
use anyhow::{anyhow, bail, Context, Result};
use std::time::Duration;

/// The kind of value an option takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A byte count: `4096`, `64k`, `32M`, `1G`.
    Size,
    /// A duration: `50us`, `1.5ms`, `2s`, `0`.
    Duration,
    /// A whole number.
    Count,
    /// A finite decimal number.
    Number,
    /// One of a fixed set of words.
    Choice(&'static [&'static str]),
    /// A label: letters, digits, `_`, `-`, `.`.
    Label,
    /// A flag: a bare `key`, or `key=` with 1/0, true/false, yes/no or on/off.
    Flag,
    /// Free text (a path, a user name), shown as the given placeholder.
    Text(&'static str),
}

impl Kind {
    /// The placeholder shown in help: `SIZE`, `a|b`, ...
    pub fn show(&self) -> String {
        match self {
            Kind::Size => "SIZE".into(),
            Kind::Duration => "DURATION".into(),
            Kind::Count => "N".into(),
            Kind::Number => "NUMBER".into(),
            Kind::Choice(c) => c.join("|"),
            Kind::Label => "NAME".into(),
            Kind::Flag => "BOOL".into(),
            Kind::Text(p) => (*p).into(),
        }
    }

    /// Checks that `v` parses as this kind.
    fn check(&self, v: &str) -> Result<()> {
        match self {
            Kind::Size => parse_size(v).map(drop),
            Kind::Duration => parse_duration(v).map(drop),
            Kind::Count => parse_u64(v).map(drop),
            Kind::Number => parse_f64(v).map(drop),
            Kind::Choice(c) => pick(c, v).map(drop),
            Kind::Label => parse_label(v).map(drop),
            Kind::Flag => parse_flag(v).map(drop),
            Kind::Text(_) => Ok(()),
        }
    }
}

/// One declared option: its name, value kind, default and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptHelp {
    pub name: &'static str,
    pub kind: Kind,
    /// The default as shown in help (`32M`, `min(24M, 3/4 size)`, `off`).
    pub default: &'static str,
    /// One line: what it does.
    pub help: &'static str,
}

impl OptHelp {
    /// `name=KIND`, or `name[=BOOL]` for a flag: the left column of help.
    pub fn usage(&self) -> String {
        match self.kind {
            Kind::Flag => format!("{}[=BOOL]", self.name),
            k => format!("{}={}", self.name, k.show()),
        }
    }
}

/// Renders an option table as help lines, one option a line:
/// `    size=SIZE      default 32M    bytes of blocks held`.
pub fn render_help(options: &[OptHelp]) -> String {
    let w = options.iter().map(|o| o.usage().len()).max().unwrap_or(0);
    let d = options.iter().map(|o| o.default.len()).max().unwrap_or(0);
    let mut out = String::new();
    for o in options {
        let default = if o.default.is_empty() { "-" } else { o.default };
        out.push_str(&format!(
            "    {:w$}  default {:d$}  {}\n",
            o.usage(),
            default,
            o.help
        ));
    }
    out
}

/// Fails if `v` is empty or has leading or trailing white space.
fn check_bare(what: &str, v: &str) -> Result<()> {
    if v.is_empty() {
        bail!("empty {what}");
    }
    if v.trim() != v {
        bail!("{what} {v:?} has leading or trailing spaces");
    }
    Ok(())
}

/// A stage's or backend's `key=value` options, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opts {
    /// `stage` or `backend`, for messages.
    family: &'static str,
    /// The stage or backend name, for messages.
    owner: String,
    /// `(key, value)` in order; a bare key has the value `None`.
    items: Vec<(String, Option<String>)>,
}

impl Opts {
    /// Parses comma-separated items (`a=1,b,c=x`); `rest` may be empty.
    pub fn parse(family: &'static str, owner: &str, rest: &str) -> Result<Opts> {
        let mut items = Vec::new();
        if !rest.is_empty() {
            for item in rest.split(',') {
                let (k, v) = match item.split_once('=') {
                    Some((k, v)) => (k, Some(v)),
                    None => (item, None),
                };
                check_bare("option", k)
                    .map_err(|e| anyhow!("{family} {owner}: {e} in {rest:?}"))?;
                if let Some(v) = v {
                    check_bare("value", v)
                        .map_err(|e| anyhow!("{family} {owner}: option {k}: {e}"))?;
                }
                items.push((k.to_string(), v.map(str::to_string)));
            }
        }
        Ok(Opts {
            family,
            owner: owner.to_string(),
            items,
        })
    }

    /// `stage cache: option size: MSG`, an error about option `key`.
    pub fn err(&self, key: &str, msg: impl std::fmt::Display) -> anyhow::Error {
        anyhow!("{}: {msg}", self.ctx(key))
    }

    fn ctx(&self, key: &str) -> String {
        format!("{} {}: option {key}", self.family, self.owner)
    }

    /// Checks every given option against the declared ones: a known key
    /// (else fails listing them), a value where one is needed, a value of
    /// the declared kind.
    pub fn check(&self, known: &[OptHelp]) -> Result<()> {
        for (k, v) in &self.items {
            let Some(o) = known.iter().find(|o| o.name == k) else {
                let names: Vec<&str> = known.iter().map(|o| o.name).collect();
                let names = if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                };
                bail!(
                    "{} {}: unknown option {k:?} (known: {names})",
                    self.family,
                    self.owner
                );
            };
            match v {
                None if o.kind != Kind::Flag => {
                    return Err(self.err(k, format_args!("needs a value ({})", o.usage())));
                }
                None => {}
                Some(v) => o.kind.check(v).with_context(|| self.ctx(k))?,
            }
        }
        Ok(())
    }

    /// The last value given for `key`; `Some("")` for a bare flag.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.items
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_deref().unwrap_or(""))
    }

    /// The value of `key` parsed by `f`, or `default` when not given.
    fn typed<T>(&self, key: &str, default: T, f: impl Fn(&str) -> Result<T>) -> Result<T> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => f(v).with_context(|| self.ctx(key)),
        }
    }

    /// Whether flag `key` is set (a bare `key`, or `key=1|true|yes|on`).
    pub fn flag(&self, key: &str) -> Result<bool> {
        self.typed(key, false, |v| {
            if v.is_empty() {
                Ok(true)
            } else {
                parse_flag(v)
            }
        })
    }

    pub fn size(&self, key: &str, default: u64) -> Result<u64> {
        self.typed(key, default, parse_size)
    }

    pub fn duration(&self, key: &str, default: Duration) -> Result<Duration> {
        self.typed(key, default, parse_duration)
    }

    pub fn u64(&self, key: &str, default: u64) -> Result<u64> {
        self.typed(key, default, parse_u64)
    }

    pub fn f64(&self, key: &str, default: f64) -> Result<f64> {
        self.typed(key, default, parse_f64)
    }

    /// A value that must be one of `choices`.
    pub fn choice<'c>(&self, key: &str, choices: &[&'c str], default: &'c str) -> Result<&'c str> {
        self.typed(key, default, |v| pick(choices, v))
    }

    /// A label (`name=...`): letters, digits, `_`, `-`, `.`.
    pub fn label(&self, key: &str) -> Result<Option<String>> {
        self.typed(key, None, |v| parse_label(v).map(Some))
    }
}

fn parse_u64(v: &str) -> Result<u64> {
    v.parse().with_context(|| format!("bad number {v:?}"))
}

fn parse_f64(v: &str) -> Result<f64> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => bail!("bad number {v:?}"),
    }
}

fn pick<'c>(choices: &[&'c str], v: &str) -> Result<&'c str> {
    match choices.iter().find(|c| **c == v) {
        Some(c) => Ok(c),
        None => bail!("bad value {v:?} (one of: {})", choices.join(", ")),
    }
}

fn parse_label(v: &str) -> Result<String> {
    if !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    {
        Ok(v.to_string())
    } else {
        bail!("bad value {v:?} (letters, digits, _ - . only)")
    }
}

fn parse_flag(v: &str) -> Result<bool> {
    match v {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("bad value {v:?} (1/0, true/false, yes/no, on/off)"),
    }
}

/// Splits `NAME[:REST]` and checks the name (not empty, no stray spaces).
pub fn split_name<'s>(family: &str, spec: &'s str) -> Result<(&'s str, &'s str)> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    check_bare(&format!("{family} name"), name).with_context(|| format!("in {spec:?}"))?;
    Ok((name, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: &[OptHelp] = &[
        OptHelp {
            name: "size",
            kind: Kind::Size,
            default: "1M",
            help: "a size",
        },
        OptHelp {
            name: "mode",
            kind: Kind::Choice(&["a", "b"]),
            default: "a",
            help: "a mode",
        },
        OptHelp {
            name: "direct",
            kind: Kind::Flag,
            default: "off",
            help: "a flag",
        },
        OptHelp {
            name: "name",
            kind: Kind::Label,
            default: "",
            help: "a label",
        },
    ];

    fn opts(rest: &str) -> Result<Opts> {
        let o = Opts::parse("stage", "t", rest)?;
        o.check(OPTS)?;
        Ok(o)
    }

    fn err(rest: &str) -> String {
        match opts(rest) {
            Ok(_) => panic!("{rest:?} accepted"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn values_parse_by_kind() {
        let o = opts("size=64k,mode=b,direct,name=x.1").unwrap();
        assert_eq!(o.size("size", 0).unwrap(), 64 << 10);
        assert_eq!(o.choice("mode", &["a", "b"], "a").unwrap(), "b");
        assert!(o.flag("direct").unwrap());
        assert_eq!(o.label("name").unwrap().as_deref(), Some("x.1"));
        let o = opts("direct=off,size=1k,size=2k").unwrap();
        assert!(!o.flag("direct").unwrap());
        assert_eq!(o.size("size", 0).unwrap(), 2048, "the last value wins");
        assert_eq!(opts("").unwrap().size("size", 7).unwrap(), 7);
    }

    #[test]
    fn strict_errors_name_the_key_or_value() {
        for (rest, want) in [
            (
                "sise=1M",
                "unknown option \"sise\" (known: size, mode, direct, name)",
            ),
            ("size=12Q", "option size: bad size \"12Q\""),
            (
                "size= 1M",
                "option size: value \" 1M\" has leading or trailing spaces",
            ),
            ("size=1M ", "value \"1M \" has leading"),
            (" size=1M", "option \" size\" has leading"),
            ("size=", "option size: empty value"),
            ("size", "option size: needs a value (size=SIZE)"),
            ("size=1M,,mode=a", "empty option"),
            ("size=1M,", "empty option"),
            ("mode=c", "option mode: bad value \"c\" (one of: a, b)"),
            ("direct=maybe", "option direct: bad value \"maybe\""),
            ("name=a b", "option name: bad value \"a b\""),
        ] {
            let e = err(rest);
            assert!(e.contains(want), "{rest:?}: {e}");
            assert!(e.starts_with("stage t: "), "{rest:?}: {e}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(
            split_name("stage", "cache:size=1").unwrap(),
            ("cache", "size=1")
        );
        assert_eq!(split_name("stage", "stats").unwrap(), ("stats", ""));
        for bad in ["", ":size=1", " cache", "cache :x=1"] {
            assert!(split_name("stage", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn help_lists_every_option() {
        let h = render_help(OPTS);
        assert_eq!(h.lines().count(), OPTS.len());
        assert!(h.contains("size=SIZE"), "{h}");
        assert!(h.contains("mode=a|b"), "{h}");
        assert!(h.contains("direct[=BOOL]"), "{h}");
        assert!(h.contains("a label"), "{h}");
    }
}
