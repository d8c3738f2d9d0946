//! The kv backend's spec: `kv:rados:POOL[,conf=PATH][,id=CLIENT]
//! [,prefix=NAME][,object_size=SIZE][,max_nodes=N][,timeout=SECONDS]`.

use super::rados::Target;

/// A parsed `kv:` spec.
#[derive(Clone, Debug)]
pub struct KvSpec {
    pub target: Target,
    /// Every object of this file system is named `PREFIX.…`.
    pub prefix: String,
    /// Bytes per data object, a power of two from 4 KiB to 64 MiB.
    pub object_size: u64,
    /// Nodes (files the kernel holds a reference to) kept at most.
    pub max_nodes: usize,
}

pub const USAGE: &str = "kv:rados:POOL[,conf=CEPH_CONF][,id=CLIENT][,prefix=NAME][,object_size=4M][,max_nodes=65536][,timeout=30]";

/// Parses what follows `kv:`; an error names the bad part.
pub fn parse(arg: &str) -> Result<KvSpec, String> {
    let Some(rest) = arg.strip_prefix("rados:") else {
        let store = arg.split([':', ',']).next().unwrap_or("");
        return Err(format!(
            "kv:{arg}: unknown store {store:?} (known: rados); usage: {USAGE}"
        ));
    };
    let mut parts = rest.split(',');
    let pool = parts.next().unwrap_or("");
    if pool.is_empty() || pool.contains('=') {
        return Err(format!(
            "kv:{arg}: the pool name is missing; usage: {USAGE}"
        ));
    }
    let mut s = KvSpec {
        target: Target {
            pool: pool.into(),
            conf: None,
            id: None,
            timeout_s: 30,
        },
        prefix: "kvfs".into(),
        object_size: 4 << 20,
        max_nodes: 65536,
    };
    for p in parts {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| format!("kv:{arg}: option {p:?} is not KEY=VALUE"))?;
        let bad = |why: &str| format!("kv:{arg}: {k}={v}: {why}");
        match k {
            "conf" if !v.is_empty() => s.target.conf = Some(v.into()),
            "id" if !v.is_empty() => s.target.id = Some(v.into()),
            "prefix" => {
                if v.is_empty() || v.len() > 64 || v.contains(['.', '\0']) {
                    return Err(bad("must be 1 to 64 bytes without '.'"));
                }
                s.prefix = v.into()
            }
            "object_size" => {
                s.object_size = crate::parse_size(v)
                    .filter(|n| n.is_power_of_two() && (4096..=64 << 20).contains(n))
                    .ok_or_else(|| bad("must be a power of two from 4K to 64M"))?
            }
            "max_nodes" => {
                s.max_nodes = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1 << 24).contains(n))
                    .ok_or_else(|| bad("must be a number from 1 to 16777216"))?
            }
            "timeout" => {
                s.target.timeout_s = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=3600).contains(n))
                    .ok_or_else(|| bad("must be whole seconds from 1 to 3600"))?
            }
            "conf" | "id" => return Err(bad("must not be empty")),
            _ => {
                return Err(format!(
                    "kv:{arg}: unknown option {k:?} (known: conf, id, prefix, object_size, max_nodes, timeout)"
                ))
            }
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_and_bad_ones_named() {
        let s = parse("rados:fs,conf=/c/ceph.conf,object_size=64K,prefix=a1").unwrap();
        assert_eq!(s.target.pool, "fs");
        assert_eq!(s.target.conf.as_deref(), Some("/c/ceph.conf"));
        assert_eq!(s.object_size, 65536);
        assert_eq!(s.prefix, "a1");
        assert_eq!(parse("rados:p").unwrap().object_size, 4 << 20);
        for (bad, says) in [
            ("redis:x", "unknown store \"redis\""),
            ("rados:", "pool name is missing"),
            ("rados:p,object_size=3000", "object_size=3000"),
            ("rados:p,prefix=a.b", "prefix=a.b"),
            ("rados:p,max_nodes=0", "max_nodes=0"),
            ("rados:p,color=red", "unknown option \"color\""),
            ("rados:p,conf", "\"conf\" is not KEY=VALUE"),
            ("rados:p,id=", "id=: must not be empty"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
