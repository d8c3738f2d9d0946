//! The movement report of `iolift osdmap diff OLD NEW` and `--what-if`:
//! with `--list` one line per PG whose up set changes
//! (`pg 1.1f [0,1,2] -> [0,1,3] in [3] out [2]`), then the totals and the
//! shards (and bytes, with `--pg-dump`) moved in and out of each OSD.

use super::report::osds;
use super::OsdmapArgs;
use anyhow::{Context, Result};
use iolift_osdmap::diff::{DiffOptions, PgChange};
use iolift_osdmap::types::{OsdMap, Pool};
use iolift_osdmap::PgId;
use std::collections::HashMap;
use std::io::Write;

/// Bytes of one shard of each PG, from a pg dump.
struct Sizes {
    bytes: HashMap<PgId, u64>,
    /// Data chunks per erasure pool (a shard holds 1/k of the PG).
    k: HashMap<i64, u64>,
}

impl Sizes {
    fn shard(&self, pool: &Pool, pg: PgId) -> u64 {
        let b = self.bytes.get(&pg).copied().unwrap_or(0);
        match self.k.get(&pool.id) {
            Some(&k) if k > 0 => b.div_ceil(k),
            _ => b,
        }
    }
}

fn sizes(path: &str, new: &OsdMap, pool: Option<i64>, max: usize) -> Result<Sizes> {
    let f = std::fs::File::open(path).with_context(|| format!("opening pg dump {path}"))?;
    let bytes = iolift_osdmap::pgdump::read_pg_bytes(std::io::BufReader::new(f), max)
        .with_context(|| format!("reading pg dump {path}"))?;
    let mut k = HashMap::new();
    let selected = |p: &&Pool| p.is_erasure() && pool.is_none_or(|q| q == p.id);
    for p in new.pools.values().filter(selected) {
        let profile = iolift_osdmap::pool_detail::PoolDetail::read(p)?.erasure_code_profile;
        let kk = iolift_osdmap::pgdump::ec_profile_k(new, &profile).with_context(|| {
            format!(
                "pool {}: erasure-code profile '{profile}' has no k in the map",
                p.id
            )
        })?;
        k.insert(p.id, kk);
    }
    Ok(Sizes { bytes, k })
}

/// Compare `old` and `new` and print the report (after `head` lines).
pub fn report(old: &OsdMap, new: &OsdMap, a: &OsdmapArgs, head: &mut Vec<String>) -> Result<()> {
    let t = &a.tools;
    let sz = match &t.pg_dump {
        Some(p) => Some(sizes(p, new, a.pool, t.pg_dump_max)?),
        None => None,
    };
    let f = |pool: &Pool, pg: PgId| sz.as_ref().map_or(0, |s| s.shard(pool, pg));
    let pools: Vec<i64> = a.pool.into_iter().collect();
    let opts = DiffOptions {
        pools: &pools,
        threads: a.threads,
        shard_bytes: if sz.is_some() { Some(&f) } else { None },
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    for l in head.drain(..) {
        writeln!(out, "{l}")?;
    }
    let mut werr = None;
    let list = t.list;
    let totals = iolift_osdmap::diff::diff(old, new, &opts, |c: &PgChange| {
        if list && werr.is_none() {
            if let Err(e) = writeln!(
                out,
                "pg {} {} -> {} in {} out {}",
                c.pg,
                osds(&c.old_up),
                osds(&c.new_up),
                osds(&c.moved_in),
                osds(&c.moved_out)
            ) {
                werr = Some(e);
            }
        }
    })?;
    if let Some(e) = werr {
        return Err(e.into());
    }
    let pct = if totals.pgs > 0 {
        100.0 * totals.changed as f64 / totals.pgs as f64
    } else {
        0.0
    };
    writeln!(out, "pgs compared {}", totals.pgs)?;
    writeln!(out, "pgs changed {} ({pct:.2}%)", totals.changed)?;
    if totals.only_old + totals.only_new > 0 {
        writeln!(
            out,
            "pgs only in old {} only in new {} (pg_num changed; not counted as moves)",
            totals.only_old, totals.only_new
        )?;
    }
    writeln!(
        out,
        "shards moved in {} out {}",
        totals.total_in(),
        totals.total_out()
    )?;
    if sz.is_some() {
        writeln!(out, "bytes moved {}", totals.total_bytes())?;
    }
    for (o, (&i, &x)) in totals.shards_in.iter().zip(&totals.shards_out).enumerate() {
        if i == 0 && x == 0 {
            continue;
        }
        write!(out, "osd.{o} in {i} out {x}")?;
        if sz.is_some() {
            write!(
                out,
                " bytes_in {} bytes_out {}",
                totals.bytes_in[o], totals.bytes_out[o]
            )?;
        }
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}
