//! The parts of `iolift osdmap` beyond osdmaptool's mapping reports:
//! `--createsimple` (a new map, as osdmaptool makes it), `--print`, and
//! the movement reports `iolift osdmap diff OLD NEW` and `iolift osdmap
//! MAP --what-if EDIT...` (see `diff.rs`).

use super::{diff, OsdmapArgs, ME};
use anyhow::{bail, Context, Result};
use clap::Args;
use iolift_osdmap::types::{OsdMap, UTime};
use std::process::ExitCode;

#[derive(Args, Debug, Default)]
pub struct ToolArgs {
    /// Create a map with N OSDs (none of them existing yet), as
    /// `osdmaptool --createsimple N` does.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub createsimple: Option<i64>,
    /// With --createsimple: add the pool 'rbd' (N << pg_bits PGs).
    #[arg(long = "with-default-pool")]
    pub with_default_pool: bool,
    /// With --createsimple: PGs per OSD of the default pool, as a power of two.
    #[arg(long = "pg_bits", alias = "pg-bits", default_value_t = 6)]
    pub pg_bits: u32,
    /// With --createsimple: placement seeds per OSD, as a power of two.
    #[arg(long = "pgp_bits", alias = "pgp-bits", default_value_t = 6)]
    pub pgp_bits: u32,
    /// With --createsimple: overwrite MAPFILE if it exists.
    #[arg(long)]
    pub clobber: bool,
    /// Report the PG movement an edit would cause (repeatable): out:OSD[,..],
    /// in:OSD[,..], reweight:OSD:W, crush-weight:OSD:W, rule:POOL:RULE,
    /// add-host:NAME:N:W:PARENT.
    #[arg(long = "what-if", value_name = "EDIT")]
    pub what_if: Vec<String>,
    /// diff / --what-if: `ceph pg dump -f json` output, for bytes moved.
    #[arg(long = "pg-dump", value_name = "JSON")]
    pub pg_dump: Option<String>,
    /// diff / --what-if: list every PG whose up set changes.
    #[arg(long)]
    pub list: bool,
    /// diff / --what-if: most PGs read from --pg-dump (the table's memory bound).
    #[arg(long = "pg-dump-max", default_value_t = iolift_osdmap::pgdump::DEFAULT_MAX_PGS)]
    pub pg_dump_max: usize,
    /// `iolift osdmap diff OLD NEW`: the two maps after `diff`.
    #[arg(value_name = "NEW", hide = true)]
    pub more: Vec<String>,
}

fn read_map(path: &str) -> Result<OsdMap> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    iolift_osdmap::decode(&bytes).with_context(|| format!("decoding osdmap {path}"))
}

fn check_device(a: &OsdmapArgs) -> Result<()> {
    if a.device != "cpu" {
        bail!(
            "--device {}: diff and --what-if map on the CPU (all cores, or --threads)",
            a.device
        );
    }
    Ok(())
}

/// `diff` and `--what-if`, which replace the rest of the command.
pub fn early(a: &OsdmapArgs) -> Result<Option<ExitCode>> {
    let t = &a.tools;
    if a.mapfile == "diff" {
        let [old, new] = t.more.as_slice() else {
            bail!("usage: iolift osdmap diff OLD NEW [--pool ID] [--pg-dump JSON] [--list]");
        };
        if !t.what_if.is_empty() {
            bail!("diff takes no --what-if (apply them to one map instead)");
        }
        check_device(a)?;
        let (o, n) = (read_map(old)?, read_map(new)?);
        diff::report(&o, &n, a, &mut Vec::new())?;
        return Ok(Some(ExitCode::SUCCESS));
    }
    if !t.more.is_empty() {
        bail!(
            "unexpected argument '{}' (one MAPFILE, or: diff OLD NEW)",
            t.more[0]
        );
    }
    if t.what_if.is_empty() {
        return Ok(None);
    }
    check_device(a)?;
    let old = read_map(&a.mapfile)?;
    let mut new = old.clone();
    let edits = t
        .what_if
        .iter()
        .map(|s| iolift_osdmap::whatif::Edit::parse(s).map(|e| (s, e)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut head = Vec::new();
    for (s, e) in &edits {
        new.apply_edit(s, e)?;
        head.push(format!("what-if: {s}"));
    }
    diff::report(&old, &new, a, &mut head)?;
    Ok(Some(ExitCode::SUCCESS))
}

/// The map the command works on: MAPFILE, or a new one with
/// --createsimple (then `Ok(Err(code))` when osdmaptool would stop). The
/// bool says whether the map is new (it is written at the end).
pub fn load(a: &OsdmapArgs) -> Result<std::result::Result<(OsdMap, bool), ExitCode>> {
    let t = &a.tools;
    let Some(n) = t.createsimple else {
        return Ok(Ok((read_map(&a.mapfile)?, false)));
    };
    if !t.clobber && std::path::Path::new(&a.mapfile).exists() {
        eprintln!("{ME}: {} exists, --clobber to overwrite", a.mapfile);
        return Ok(Err(ExitCode::from(255)));
    }
    if n < 1 {
        eprintln!("{ME}: osd count must be > 0");
        return Ok(Err(ExitCode::from(1)));
    }
    let n = i32::try_from(n).context("--createsimple: OSD count too large")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let now = UTime {
        sec: now.as_secs() as u32,
        nsec: now.subsec_micros() * 1000,
    };
    let map =
        iolift_osdmap::create::build_simple(n, t.pg_bits, t.pgp_bits, t.with_default_pool, now)?;
    Ok(Ok((map, true)))
}
