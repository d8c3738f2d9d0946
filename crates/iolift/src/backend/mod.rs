//! Backends: the devices at the bottom of a stack.
//!
//! A backend is named by a spec `KIND:ARG[,key=value...]`, e.g.
//! `null:1G`, `memory:1G`, `file:/var/tmp/disk.img,size=1G,direct`.
//! Each backend's file declares its options (`OPTIONS`, a table of
//! [`OptHelp`]); [`BACKENDS`] lists every backend with its summary,
//! positional argument, options and functions, so adding a backend is one
//! file plus one entry there. Options are parsed and checked by
//! [`crate::spec`] (strict, the same everywhere).

use crate::block::DevRef;
pub use crate::spec::{Kind, OptHelp, Opts};
use anyhow::{bail, Context, Result};

pub mod alone;
pub mod ec;
pub mod file;
pub mod file_uring;
pub mod memory;
pub mod null;
pub mod qcow2;
pub mod rbd;

/// A parsed backend spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    pub kind: String,
    /// The positional argument: a size, a path, `pool/image`.
    pub arg: String,
    pub opts: Opts,
}

impl BackendSpec {
    /// Splits `KIND:ARG[,ITEM...]`; checks the syntax (see [`crate::spec`]),
    /// not the kind or the keys.
    pub fn parse(spec: &str) -> Result<Self> {
        if !spec.contains(':') {
            bail!("bad backend {spec:?}: expected KIND:ARG, e.g. memory:1G, file:/path/disk.img,size=1G, null:1G");
        }
        let (kind, rest) = crate::spec::split_name("backend", spec)?;
        let (arg, items) = rest.split_once(',').unwrap_or((rest, ""));
        if arg.trim() != arg {
            bail!("backend {kind}: argument {arg:?} has leading or trailing spaces");
        }
        Ok(BackendSpec {
            kind: kind.to_string(),
            arg: arg.to_string(),
            opts: Opts::parse("backend", kind, items)?,
        })
    }

    /// The positional argument as a size (`null:1G`, `memory:1G`).
    /// A zero size fails, naming the value: a device of no bytes.
    pub fn size_arg(&self) -> Result<u64> {
        let n = crate::util::parse_size(&self.arg)
            .with_context(|| format!("backend {}: SIZE", self.kind))?;
        if n == 0 {
            bail!(
                "backend {}: SIZE {:?} is zero: a device needs at least one byte",
                self.kind,
                self.arg
            );
        }
        Ok(n)
    }
}

/// One kind of backend.
pub struct BackendKind {
    pub name: &'static str,
    /// The positional argument, as help shows it (`SIZE`, `PATH`).
    pub arg: &'static str,
    /// One line for `iolift backends`.
    pub summary: &'static str,
    pub options: &'static [OptHelp],
    /// Checks the argument and options whose values depend on each other,
    /// opening nothing (the keys and each value's kind are checked before).
    pub check: fn(&BackendSpec) -> Result<()>,
    /// Opens the device.
    pub open: fn(&BackendSpec) -> Result<DevRef>,
}

/// Every backend, in the order `iolift backends` lists them.
pub const BACKENDS: &[BackendKind] = &[
    BackendKind {
        name: "null",
        arg: "SIZE",
        summary: "reads zeroes, drops writes (measures the framework's own cost)",
        options: null::OPTIONS,
        check: |s| s.size_arg().map(drop),
        open: null::open,
    },
    BackendKind {
        name: "memory",
        arg: "SIZE",
        summary: "a sparse in-memory disk",
        options: memory::OPTIONS,
        check: |s| s.size_arg().map(drop),
        open: memory::open,
    },
    BackendKind {
        name: "file",
        arg: "PATH",
        summary: "a regular file (created sparse if missing) or a block device",
        options: file::OPTIONS,
        check: |s| file::parse(s).map(drop),
        open: file::open,
    },
    BackendKind {
        name: "rbd",
        arg: "POOL/IMAGE[@SNAP]",
        summary: "a Ceph RBD image through librbd (loaded at run time)",
        options: rbd::OPTIONS,
        check: |s| rbd::RbdSpec::parse(s).map(drop),
        open: rbd::open,
    },
    BackendKind {
        name: "qcow2",
        arg: "PATH",
        summary: "a qcow2 image (v3, or v2) read and written through per-worker mapping caches",
        options: qcow2::OPTIONS,
        check: |s| qcow2::parse(s).map(drop),
        open: qcow2::open,
    },
    BackendKind {
        name: "ec",
        arg: "CHILD;CHILD...",
        summary:
            "erasure-coded over k+m child devices (survives the loss of m), see docs/ec-device.md",
        options: ec::OPTIONS,
        check: |s| ec::parse(s).map(drop),
        open: ec::open,
    },
];

/// The names in `BACKENDS`, comma-separated.
fn known() -> String {
    let names: Vec<&str> = BACKENDS.iter().map(|k| k.name).collect();
    names.join(", ")
}

/// Parses a spec, finds its backend and checks its options.
fn parse_spec(spec: &str) -> Result<(&'static BackendKind, BackendSpec)> {
    let s = BackendSpec::parse(spec)?;
    let Some(kind) = BACKENDS.iter().find(|k| k.name == s.kind) else {
        bail!(
            "unknown backend kind {:?} in {spec:?} (known: {})",
            s.kind,
            known()
        );
    };
    s.opts.check(kind.options)?;
    Ok((kind, s))
}

/// Checks a backend spec as strictly as [`open`] does, opening nothing:
/// the kind, the argument, every key, every value.
pub fn check_spec(spec: &str) -> Result<()> {
    let (kind, s) = parse_spec(spec)?;
    (kind.check)(&s)
}

/// Opens the backend a spec names.
pub fn open(spec: &str) -> Result<DevRef> {
    let (kind, s) = parse_spec(spec)?;
    (kind.open)(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_specs_name_the_key_or_value() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("d.img");
        let f = f.display();
        for (spec, want) in [
            ("nocolon", "expected KIND:ARG"),
            ("bogus:1M", "unknown backend kind \"bogus\""),
            ("null:12Q", "SIZE"),
            ("null:", "SIZE"),
            ("null: 1G", "\" 1G\""),
            ("memory:1G,size=1", "unknown option \"size\" (known: none)"),
            (&format!("file:{f},sise=1M"), "sise"),
            (&format!("file:{f},size=1Q"), "size"),
            (&format!("file:{f},size= 1M"), "\" 1M\""),
            (&format!("file:{f},direct=maybe"), "direct"),
            (&format!("file:{f},size"), "size"),
            (&format!("file:{f},,ro"), "empty option"),
            ("file:", "PATH"),
            ("rbd:pool", "POOL/IMAGE"),
            ("rbd:p/i,timeout=0", "timeout"),
            ("rbd:p/i,conf=", "conf"),
            ("rbd:p/i,bogus=1", "bogus"),
        ] {
            let e = match open(spec) {
                Ok(_) => panic!("{spec} accepted"),
                Err(e) => format!("{e:#}"),
            };
            assert!(e.contains(want), "{spec}: {e}");
            let c = format!("{:#}", check_spec(spec).unwrap_err());
            assert_eq!(c, e, "check_spec and open differ on {spec}");
        }
        assert!(!std::path::Path::new(&f.to_string()).exists());
    }

    /// Every option of every backend in the table, and the size argument
    /// of null and memory, set to awkward values (zero, huge, overflowing,
    /// negative, nan, wrong words): check_spec accepts it or names the
    /// option (the argument: says SIZE), never a panic; it opens nothing.
    #[test]
    fn every_option_of_every_backend_is_checked_or_named() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("d.img");
        let img = img.display();
        let values = [
            "0",
            "1",
            "-1",
            "3",
            "4096",
            "1M",
            "1P",
            "16383P",
            "18446744073709551615",
            "18446744073709551616",
            "1e400",
            "nan",
            "inf",
            "0.5",
            "x",
            "on",
            "off",
            "0s",
            "3600s",
            "yes",
            "uring",
            "isa",
            "gpu",
            "memory:1M",
        ];
        let base = |name: &str| match name {
            "null" | "memory" => "1M".to_string(),
            "rbd" => "p/i".to_string(),
            "ec" => "memory:1M;memory:1M;memory:1M,k=2,m=1".to_string(),
            _ => img.to_string(),
        };
        let (mut ok, mut refused) = (0, 0);
        for k in BACKENDS {
            check_spec(&format!("{}:{}", k.name, base(k.name))).unwrap();
            for opt in k.options {
                for v in values {
                    let spec = format!("{}:{},{}={v}", k.name, base(k.name), opt.name);
                    match check_spec(&spec) {
                        Ok(()) => ok += 1,
                        Err(e) => {
                            let e = format!("{e:#}");
                            assert!(e.contains(opt.name), "{spec}: {e}");
                            refused += 1;
                        }
                    }
                }
            }
            if matches!(k.name, "null" | "memory") {
                for v in values {
                    let spec = format!("{}:{v}", k.name);
                    if let Err(e) = check_spec(&spec) {
                        let e = format!("{e:#}");
                        assert!(e.contains("SIZE"), "{spec}: {e}");
                    }
                }
            }
        }
        assert!(ok > 0 && refused > ok, "{ok} accepted, {refused} refused");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn check_spec_opens_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("new.img");
        let spec = format!("file:{},size=1M,direct=0,ro=no", f.display());
        check_spec(&spec).unwrap();
        assert!(!f.exists(), "check_spec created the file");
        check_spec("rbd:pool/img@s1,conf=/nonexistent/ceph.conf,timeout=3").unwrap();
        check_spec("null:1G").unwrap();
        check_spec("memory:64k").unwrap();
        let spec = format!("file:{},size=1M", f.display());
        assert_eq!(open(&spec).unwrap().info().size, 1 << 20);
        assert!(f.exists());
    }

    #[test]
    fn known_lists_come_from_the_table() {
        let e = format!("{:#}", check_spec("zz:1").unwrap_err());
        assert!(e.contains(&format!("(known: {})", known())), "{e}");
        assert!(e.contains("null, memory, file, rbd"), "{e}");
        for k in BACKENDS {
            let spec = format!("{}:x,zzz=1", k.name);
            let e = format!("{:#}", check_spec(&spec).unwrap_err());
            let opts: Vec<&str> = k.options.iter().map(|o| o.name).collect();
            let opts = if opts.is_empty() {
                "none".to_string()
            } else {
                opts.join(", ")
            };
            let want = format!("backend {}: unknown option \"zzz\" (known: {opts})", k.name);
            assert!(e.contains(&want), "{e}");
        }
    }
}
