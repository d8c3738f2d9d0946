//! `iolift osdmap MAP --upmap FILE [--upmap-pool NAME]... [--upmap-max N]
//! [--upmap-deviation D] [--upmap-active] [--save]` and `--upmap-cleanup
//! FILE`: osdmaptool's upmap options, same messages on stdout, same
//! command file (`-` is stdout). Pools are balanced in id order (osdmaptool
//! shuffles them); the search is `iolift_osdmap::balancer`.

use anyhow::{bail, Context, Result};
use clap::Args;
use iolift_osdmap::balancer::{self, Changes};
use iolift_osdmap::types::OsdMap;
use std::io::Write;
use std::time::Instant;

#[derive(Args, Debug, Default)]
pub struct UpmapArgs {
    /// Propose pg_upmap_items entries that balance PGs; write the `ceph
    /// osd` commands to FILE (`-`: stdout).
    #[arg(long, value_name = "FILE")]
    pub upmap: Option<String>,
    /// Only clean up upmap entries that no longer apply; commands to FILE.
    #[arg(long = "upmap-cleanup", value_name = "FILE")]
    pub upmap_cleanup: Option<String>,
    /// Most PGs to change (per round with --upmap-active).
    #[arg(
        long = "upmap-max",
        value_name = "N",
        default_value_t = 10,
        allow_negative_numbers = true
    )]
    pub upmap_max: u32,
    /// Stop when every OSD is within this many PGs of its target (>= 1).
    #[arg(long = "upmap-deviation", value_name = "D", default_value_t = 5)]
    pub upmap_deviation: u32,
    /// Balance only this pool (by name); repeatable.
    #[arg(long = "upmap-pool", value_name = "NAME")]
    pub upmap_pool: Vec<String>,
    /// Keep proposing and applying rounds until nothing more helps.
    #[arg(long = "upmap-active")]
    pub upmap_active: bool,
}

/// Run the upmap options on `map`. Returns None when none was given,
/// else whether the map was changed (to be written).
pub fn run(
    a: &UpmapArgs,
    save: bool,
    threads: usize,
    map: &mut OsdMap,
    out: &mut dyn Write,
) -> Result<Option<bool>> {
    let file = match (&a.upmap, &a.upmap_cleanup) {
        (Some(f), _) | (None, Some(f)) if !f.is_empty() => f.clone(),
        (None, None) => return Ok(None),
        _ => bail!("--upmap / --upmap-cleanup: empty file name (use - for stdout)"),
    };
    if a.upmap_deviation < 1 {
        bail!("--upmap-deviation must be >= 1 (got {})", a.upmap_deviation);
    }
    let mut cmds: Box<dyn Write> = if file == "-" {
        Box::new(std::io::stdout())
    } else {
        let f =
            std::fs::File::create(&file).with_context(|| format!("--upmap: creating {file}"))?;
        writeln!(out, "writing upmap command output to: {file}")?;
        Box::new(std::io::BufWriter::new(f))
    };
    let mut modified = false;
    writeln!(out, "checking for upmap cleanups")?;
    let c = balancer::clean(map);
    if !c.is_empty() {
        emit(&c, out, &mut *cmds)?;
        apply(&c, map);
        modified = save;
    }
    if a.upmap.is_none() {
        cmds.flush()?;
        return Ok(Some(modified));
    }
    writeln!(
        out,
        "upmap, max-count {}, max deviation {}",
        a.upmap_max, a.upmap_deviation
    )?;
    let mut pools: Vec<i64> = Vec::new();
    for name in &a.upmap_pool {
        let Some(p) = map.pool_by_name(name) else {
            out.flush()?;
            bail!("--upmap-pool: pool {name} does not exist");
        };
        if !pools.contains(&p.id) {
            pools.push(p.id);
        }
    }
    if !pools.is_empty() {
        let mut names = a.upmap_pool.clone();
        names.sort();
        names.dedup();
        let ids: Vec<String> = pools.iter().map(|i| i.to_string()).collect();
        writeln!(
            out,
            " limiting to pools {} ([{}])",
            names.join(","),
            ids.join(",")
        )?;
    } else {
        pools = map.pools.keys().copied().collect();
    }
    if pools.is_empty() {
        writeln!(out, "No pools available")?;
        cmds.flush()?;
        return Ok(Some(modified));
    }
    let start = Instant::now();
    let mut rounds = 0u32;
    loop {
        rounds += 1;
        let t0 = Instant::now();
        write!(out, "pools ")?;
        for id in &pools {
            write!(out, "{} ", map.pools[id].name)?;
        }
        writeln!(out)?;
        let mut all = Changes::default();
        let mut left = a.upmap_max as usize;
        for &id in &pools {
            if left == 0 {
                break;
            }
            let r = balancer::calc_pool(map, id, a.upmap_deviation as f64, left, threads)?;
            if let Some(why) = &r.skipped {
                eprintln!("iolift: upmap: skipping {why}");
            }
            left = left.saturating_sub(r.changes.len());
            all.merge(r.changes);
        }
        let did = all.len();
        writeln!(out, "prepared {did}/{} changes", a.upmap_max)?;
        if a.upmap_active {
            writeln!(out, "Time elapsed {} secs", t0.elapsed().as_secs_f64())?;
        }
        if did == 0 {
            writeln!(
                out,
                "Unable to find further optimization, or distribution is already perfect"
            )?;
            break;
        }
        emit(&all, out, &mut *cmds)?;
        if save || a.upmap_active {
            apply(&all, map);
            modified = save;
        }
        if !a.upmap_active {
            break;
        }
    }
    if a.upmap_active {
        for (osd, n) in pgs_per_osd(map, threads) {
            writeln!(out, "osd.{osd} pgs {n}")?;
        }
        writeln!(
            out,
            "Total time elapsed {} secs, {rounds} rounds",
            start.elapsed().as_secs_f64()
        )?;
    }
    cmds.flush()?;
    Ok(Some(modified))
}

/// Write the commands; flush stdout first when they go there too.
fn emit(c: &Changes, out: &mut dyn Write, cmds: &mut dyn Write) -> Result<()> {
    out.flush()?;
    c.write_commands(cmds)?;
    cmds.flush()?;
    Ok(())
}

/// Apply as an incremental: next epoch, zero modification stamp.
fn apply(c: &Changes, map: &mut OsdMap) {
    c.apply(map);
    map.epoch += 1;
    map.modified = Default::default();
}

/// PG shards per OSD over every pool's up sets, OSDs with at least one.
fn pgs_per_osd(map: &OsdMap, threads: usize) -> Vec<(i32, u64)> {
    let mut n = vec![0u64; map.max_osd.max(0) as usize];
    let pools: Vec<&iolift_osdmap::types::Pool> = map.pools.values().collect();
    let ranges = iolift_osdmap::bulk::ranges(map, &pools);
    let t = iolift_osdmap::bulk::thread_count(threads);
    iolift_osdmap::bulk::run(
        map,
        &ranges,
        t,
        || (),
        |_, m, p, r| {
            let mut v = Vec::new();
            for s in r.start..r.end {
                m.map_pg(r.pool, r.rule, s, p);
                v.extend(
                    p.up.iter()
                        .copied()
                        .filter(|&o| o >= 0 && o < m.map().max_osd),
                );
            }
            v
        },
        |v| {
            for o in v {
                n[o as usize] += 1;
            }
        },
    );
    n.into_iter()
        .enumerate()
        .filter(|&(_, c)| c > 0)
        .map(|(o, c)| (o as i32, c))
        .collect()
}
