//! `iolift osdmap MAPFILE [options]`: an osdmaptool-compatible front-end to
//! the `iolift-osdmap` library (same options, same output line for line;
//! the program name in messages is `iolift`). Operations run in
//! osdmaptool's order: edits (--mark-up-in, --mark-out), --import-crush,
//! --export-crush, --test-map-object, --test-map-pg, --test-map-pgs*,
//! --print, then the write of a modified map. `--createsimple`, `diff` and
//! `--what-if` are in `tools.rs` and `diff.rs`.

mod diff;
mod gpu;
mod report;
mod tools;
mod upmap;

use anyhow::{bail, Context, Result};
use clap::Args;
use iolift_osdmap::types::{OsdMap, OSD_EXISTS, OSD_IN, OSD_OUT, OSD_UP};
use iolift_osdmap::{mapping, Mapper, PgId, PgPlacement};
use std::io::Write;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct OsdmapArgs {
    /// Binary OSDMap (`ceph osd getmap -o FILE`, `osdmaptool --createsimple`).
    pub mapfile: String,
    /// Print the map as `osdmaptool --print` does.
    #[arg(long)]
    pub print: bool,
    /// Map all PGs; print the per-OSD summary.
    #[arg(long = "test-map-pgs")]
    pub test_map_pgs: bool,
    /// Map all PGs; print `PG\t[acting]\tprimary` lines and the summary.
    #[arg(long = "test-map-pgs-dump")]
    pub test_map_pgs_dump: bool,
    /// Map all PGs; print raw, up and acting sets per PG and the summary.
    #[arg(long = "test-map-pgs-dump-all")]
    pub test_map_pgs_dump_all: bool,
    /// Map an object name to its PG and acting set.
    #[arg(long = "test-map-object", value_name = "NAME")]
    pub test_map_object: Option<String>,
    /// Map one PG (POOL.SEEDHEX) to its raw, up and acting sets.
    #[arg(long = "test-map-pg", value_name = "PGID")]
    pub test_map_pg: Option<String>,
    /// Restrict to one pool (id).
    #[arg(long, allow_negative_numbers = true)]
    pub pool: Option<i64>,
    /// Pretend every mapped pool has this many PGs (--test-map-pgs*).
    #[arg(long = "pg_num", alias = "pg-num")]
    pub pg_num: Option<u32>,
    /// Mark all OSDs up and in (in memory; with --save also written).
    #[arg(long = "mark-up-in")]
    pub mark_up_in: bool,
    /// Mark an OSD out (in memory; with --save also written). As in
    /// osdmaptool, only the last --mark-out counts.
    #[arg(long = "mark-out", value_name = "OSD", allow_negative_numbers = true)]
    pub mark_out: Vec<i32>,
    /// Replace the map's crush map with this binary crush map.
    #[arg(long = "import-crush", value_name = "FILE")]
    pub import_crush: Option<String>,
    /// Write the map's crush map to FILE.
    #[arg(long = "export-crush", value_name = "FILE")]
    pub export_crush: Option<String>,
    /// Write the map back to MAPFILE after --mark-out / --mark-up-in edits
    /// (osdmaptool writes only upmap and crush-weight changes).
    #[arg(long)]
    pub save: bool,
    /// Where to map: cpu (all cores, or --threads), or gpu (CRUSH of the
    /// --test-map-pgs* reports on the GPU, the rest on the CPU).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Mapping threads (default: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    #[command(flatten)]
    pub tools: tools::ToolArgs,
    #[command(flatten)]
    pub upmap: upmap::UpmapArgs,
}

const ME: &str = "iolift";

pub fn run(a: OsdmapArgs) -> Result<ExitCode> {
    if !matches!(a.device.as_str(), "cpu" | "gpu") {
        bail!("--device {}: expected cpu or gpu", a.device);
    }
    // osdmaptool treats an empty option value as not given
    let a = OsdmapArgs {
        test_map_object: a.test_map_object.filter(|s| !s.is_empty()),
        test_map_pg: a.test_map_pg.filter(|s| !s.is_empty()),
        import_crush: a.import_crush.filter(|s| !s.is_empty()),
        export_crush: a.export_crush.filter(|s| !s.is_empty()),
        ..a
    };
    if let Some(code) = tools::early(&a)? {
        return Ok(code);
    }
    eprintln!("{ME}: osdmap file '{}'", a.mapfile);
    let (mut map, created) = match tools::load(&a)? {
        Ok(m) => m,
        Err(code) => return Ok(code),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut modified = created;
    let mut edited = false;

    if a.mark_up_in {
        writeln!(out, "marking all OSDs up and in")?;
        mark_up_in(&mut map)?;
        edited = true;
    }
    if let Some(&o) = a.mark_out.last() {
        if o >= 0 && o < map.max_osd {
            writeln!(out, "marking OSD@{o} as out")?;
            map.osd_state[o as usize] |= OSD_UP;
            map.osd_weight[o as usize] = OSD_OUT;
            edited = true;
        }
    }
    let upmapped = upmap::run(&a.upmap, a.save, a.threads, &mut map, &mut out)?;
    modified |= upmapped == Some(true);
    if let Some(f) = &a.import_crush {
        let raw = std::fs::read(f).with_context(|| format!("reading crush map from {f}"))?;
        let crush =
            iolift_crush::decode(&raw).with_context(|| format!("decoding crush map {f}"))?;
        if crush.max_devices > map.max_osd {
            out.flush()?;
            eprintln!(
                "{ME}: crushmap max_devices {} > osdmap max_osd {}",
                crush.max_devices, map.max_osd
            );
            return Ok(ExitCode::from(1));
        }
        let len = raw.len();
        map.set_crush_bytes(crush, raw);
        // As applying an incremental does: next epoch, its (zero) stamp.
        map.epoch += 1;
        map.modified = Default::default();
        if map.require_luminous() {
            map.crush_version += 1;
        }
        writeln!(out, "{ME}: imported {len} byte crush map from {f}")?;
        modified = true;
    }
    if let Some(f) = &a.export_crush {
        std::fs::write(f, map.crush_bytes()).with_context(|| format!("writing {f}"))?;
        writeln!(out, "{ME}: exported crush map to {f}")?;
    }
    if let Some(name) = &a.test_map_object {
        let pool_id = match a.pool {
            Some(p) => p,
            None => {
                writeln!(out, "{ME}: assuming pool 1 (use --pool to override)")?;
                1
            }
        };
        let Some(pool) = map.pools.get(&pool_id) else {
            out.flush()?;
            eprintln!("There is no pool {pool_id}");
            return Ok(ExitCode::from(1));
        };
        let pg = mapping::object_to_pg(pool, "", name)?;
        let mut p = PgPlacement::default();
        Mapper::new(&map).map_pgid(pg, &mut p);
        writeln!(
            out,
            " object '{name}' -> {pg} -> {}",
            report::osds(&p.acting)
        )?;
    }
    if let Some(s) = &a.test_map_pg {
        let pg: PgId = s.parse()?;
        writeln!(out, " parsed '{s}' -> {pg}")?;
        let mut p = PgPlacement::default();
        Mapper::new(&map).map_pgid(pg, &mut p);
        writeln!(out, "{}", report::dump_all_line(pg, &p))?;
    }
    if a.test_map_pgs || a.test_map_pgs_dump || a.test_map_pgs_dump_all {
        if let Some(p) = a.pool {
            if !map.pools.contains_key(&p) {
                out.flush()?;
                eprintln!("There is no pool {p}");
                return Ok(ExitCode::from(1));
            }
        }
        let mode = if a.test_map_pgs_dump_all {
            report::Mode::DumpAll
        } else if a.test_map_pgs_dump {
            report::Mode::Dump
        } else {
            report::Mode::Summary
        };
        if let Some(n) = a.pg_num.filter(|&n| n > 0) {
            for (id, p) in map.pools.iter_mut() {
                if a.pool.is_none_or(|q| q == *id) {
                    p.pg_num = n;
                }
            }
        }
        let threads = iolift_osdmap::bulk::thread_count(a.threads);
        let gpu = gpu::open(&a.device)?;
        report::test_map_pgs(&map, a.pool, mode, threads, gpu.as_ref(), &mut out)?;
    }
    let nothing = !modified
        && a.export_crush.is_none()
        && a.test_map_object.is_none()
        && a.test_map_pg.is_none()
        && !a.test_map_pgs
        && !a.test_map_pgs_dump
        && !a.test_map_pgs_dump_all
        && !a.print
        && upmapped.is_none()
        && !(a.save && edited);
    if nothing {
        out.flush()?;
        eprintln!("{ME}: no action specified?");
        return Ok(ExitCode::from(1));
    }
    let write = modified || (a.save && edited);
    if write {
        map.epoch += 1;
    }
    if a.print {
        write!(out, "{}", map.print_text()?)?;
    }
    if write {
        let enc = iolift_osdmap::encode(&map);
        writeln!(out, "{ME}: writing epoch {} to {}", map.epoch, a.mapfile)?;
        out.flush()?;
        std::fs::write(&a.mapfile, enc).with_context(|| format!("writing {}", a.mapfile))?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `--mark-up-in`: every OSD exists, is up and fully in; an OSD whose CRUSH weight
/// is 0 gets weight 1.0 in CRUSH (as osdmaptool 16.2 does).
fn mark_up_in(map: &mut OsdMap) -> Result<()> {
    for i in 0..map.max_osd as usize {
        map.osd_state[i] |= OSD_EXISTS | OSD_UP;
        map.osd_weight[i] = OSD_IN;
    }
    let zero: Vec<i32> = (0..map.max_osd)
        .filter(|&o| report::crush_item_weight(&map.crush, o) == Some(0))
        .collect();
    if !zero.is_empty() {
        let mut crush = map.crush.clone();
        for o in zero {
            iolift_osdmap::crush_edit::adjust_item_weight(&mut crush, o, 0x10000)?;
        }
        map.set_crush(crush);
    }
    Ok(())
}
