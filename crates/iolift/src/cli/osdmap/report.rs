//! osdmaptool's report formats: `--test-map-pgs[-dump[-all]]` lines and
//! per-OSD summary, set and PG formatting.

use anyhow::Result;
use iolift_crush::tester::fmt_g;
use iolift_crush::CrushMap;
use iolift_osdmap::bulk::{self, PgRange};
use iolift_osdmap::types::{OsdMap, Pool, ITEM_NONE};
use iolift_osdmap::{PgId, PgPlacement};
use std::fmt::Write as _;
use std::io::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Summary,
    Dump,
    DumpAll,
}

/// `[1,2,3]` (C++ `operator<<` of a vector).
pub fn osds(v: &[i32]) -> String {
    let mut s = String::with_capacity(2 + v.len() * 5);
    push_osds(&mut s, v);
    s
}

fn push_osds(s: &mut String, v: &[i32]) {
    s.push('[');
    for (i, o) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{o}");
    }
    s.push(']');
}

/// `PG raw ([..], pN) up ([..], pN) acting ([..], pN)`.
pub fn dump_all_line(pg: PgId, p: &PgPlacement) -> String {
    let mut s = String::new();
    push_dump_all(&mut s, pg, p);
    s
}

fn push_dump_all(s: &mut String, pg: PgId, p: &PgPlacement) {
    let _ = write!(s, "{pg} raw (");
    push_osds(s, &p.raw);
    let _ = write!(s, ", p{}) up (", p.raw_primary);
    push_osds(s, &p.up);
    let _ = write!(s, ", p{}) acting (", p.up_primary);
    push_osds(s, &p.acting);
    let _ = write!(s, ", p{})", p.acting_primary);
}

/// `CrushWrapper::get_item_weight`: the item's weight in the first bucket
/// (by slot) that holds it; `None` when no bucket does.
pub fn crush_item_weight(map: &CrushMap, id: i32) -> Option<u32> {
    for b in map.buckets.iter().flatten() {
        if let Some(i) = b.items.iter().position(|&x| x == id) {
            return Some(b.item_weights.get(i).copied().unwrap_or(0));
        }
    }
    None
}

/// Every device's CRUSH weight in one pass (same answer as
/// [`crush_item_weight`] per device).
fn device_weights(map: &CrushMap, n: usize) -> Vec<Option<u32>> {
    let mut w = vec![None; n];
    for b in map.buckets.iter().flatten() {
        for (i, &it) in b.items.iter().enumerate() {
            if it >= 0 && (it as usize) < n && w[it as usize].is_none() {
                w[it as usize] = Some(b.item_weights.get(i).copied().unwrap_or(0));
            }
        }
    }
    w
}

/// Counters of one thread (merged at the end).
struct Stats {
    count: Vec<u64>,
    first: Vec<u64>,
    primary: Vec<u64>,
    size: Vec<u64>,
}

impl Stats {
    fn new(n: usize) -> Stats {
        Stats {
            count: vec![0; n],
            first: vec![0; n],
            primary: vec![0; n],
            size: vec![0; 256],
        }
    }

    fn add(&mut self, osds: &[i32], primary: i32) {
        self.size[osds.len().min(255)] += 1;
        let n = self.count.len();
        for &o in osds {
            if o != ITEM_NONE && o >= 0 && (o as usize) < n {
                self.count[o as usize] += 1;
            }
        }
        if let Some(&o) = osds.first() {
            if o != ITEM_NONE && o >= 0 && (o as usize) < n {
                self.first[o as usize] += 1;
            }
        }
        if primary >= 0 && (primary as usize) < n {
            self.primary[primary as usize] += 1;
        }
    }

    fn merge(&mut self, o: &Stats) {
        for (a, b) in [
            (&mut self.count, &o.count),
            (&mut self.first, &o.first),
            (&mut self.primary, &o.primary),
            (&mut self.size, &o.size),
        ] {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
    }
}

/// `--test-map-pgs`, `--test-map-pgs-dump`, `--test-map-pgs-dump-all`.
pub fn test_map_pgs(
    map: &OsdMap,
    pool: Option<i64>,
    mode: Mode,
    threads: usize,
    gpu: Option<&super::gpu::Gpu>,
    out: &mut impl Write,
) -> Result<()> {
    let n = map.max_osd as usize;
    let mut total = Stats::new(n);
    for p in map.pools.values() {
        if pool.is_some_and(|q| q != p.id) {
            continue;
        }
        writeln!(out, "pool {} pg_num {}", p.id, p.pg_num)?;
        let sel: Vec<&Pool> = vec![p];
        let all = bulk::ranges(map, &sel);
        // With a GPU, segments of at most gpu::BATCH PGs: CRUSH for the
        // segment on the GPU, the rest per chunk on the CPU threads.
        let seg = if gpu.is_some() {
            super::gpu::BATCH
        } else {
            u32::MAX
        };
        let mut start = 0u32;
        while start < p.pg_num {
            let end = p.pg_num.min(start.saturating_add(seg));
            let rule = all.first().map_or(-1, |r| r.rule);
            let rows = match gpu {
                Some(g) if rule >= 0 => Some(g.rows(map, p, rule, start, end)?),
                _ => None,
            };
            let ranges: Vec<PgRange> = all
                .iter()
                .filter(|r| r.start >= start && r.end <= end)
                .copied()
                .collect();
            let states = segment(map, &ranges, threads, mode, rows.as_ref(), start, out)?;
            for s in &states {
                total.merge(s);
            }
            start = end;
        }
    }
    summary(map, &total, out)
}

/// Map and report the PGs of `ranges` (all within one segment starting
/// at seed `base`; `rows`: the segment's CRUSH results from the GPU).
fn segment(
    map: &OsdMap,
    ranges: &[PgRange],
    threads: usize,
    mode: Mode,
    rows: Option<&iolift_offload::kernels::crush::Mapping>,
    base: u32,
    out: &mut impl Write,
) -> Result<Vec<Stats>> {
    let n = map.max_osd as usize;
    let mut err = None;
    let states = bulk::run(
        map,
        ranges,
        threads,
        || Stats::new(n),
        |st, m, pl, r: &PgRange| {
            let mut s = String::new();
            for seed in r.start..r.end {
                match rows {
                    Some(rows) => {
                        m.map_pg_crush(r.pool, seed, rows.row((seed - base) as usize), pl)
                    }
                    None => m.map_pg(r.pool, r.rule, seed, pl),
                }
                st.add(&pl.acting, pl.acting_primary);
                let pg = PgId {
                    pool: r.pool.id as u64,
                    seed,
                };
                match mode {
                    Mode::DumpAll => {
                        push_dump_all(&mut s, pg, pl);
                        s.push('\n');
                    }
                    Mode::Dump => {
                        let _ = write!(s, "{pg}\t");
                        push_osds(&mut s, &pl.acting);
                        let _ = writeln!(s, "\t{}", pl.acting_primary);
                    }
                    Mode::Summary => {}
                }
            }
            s
        },
        |s| {
            if err.is_none() && !s.is_empty() {
                if let Err(e) = out.write_all(s.as_bytes()) {
                    err = Some(e);
                }
            }
        },
    );
    if let Some(e) = err {
        return Err(e.into());
    }
    Ok(states)
}

/// osdmaptool's per-OSD table and distribution lines.
fn summary(map: &OsdMap, st: &Stats, out: &mut impl Write) -> Result<()> {
    let n = map.max_osd as usize;
    let cw = device_weights(&map.crush, n);
    out.write_all(b"#osd\tcount\tfirst\tprimary\tc wt\twt\n")?;
    let mut total: u64 = 0;
    let mut inn: u64 = 0;
    let mut min_osd: Option<usize> = None;
    let mut max_osd: Option<usize> = None;
    let counted = |i: usize| map.is_in(i as i32) && cw[i].is_some_and(|w| w as i32 > 0);
    for (i, w) in cw.iter().enumerate() {
        if !counted(i) {
            continue;
        }
        inn += 1;
        let c = st.count[i];
        writeln!(
            out,
            "osd.{i}\t{c}\t{}\t{}\t{}\t{}",
            st.first[i],
            st.primary[i],
            fmt_g((w.unwrap_or(0) as f32 / 65536f32) as f64),
            fmt_g((map.weight(i as i32) as f32 / 65536f32) as f64),
        )?;
        total += c;
        if c > 0 && min_osd.is_none_or(|m| c < st.count[m]) {
            min_osd = Some(i);
        }
        if c > 0 && max_osd.is_none_or(|m| c > st.count[m]) {
            max_osd = Some(i);
        }
    }
    let avg = total.checked_div(inn).unwrap_or(0);
    let mut dev = 0f64;
    for i in 0..n {
        if counted(i) {
            let d = avg.wrapping_sub(st.count[i]);
            dev += d.wrapping_mul(d) as f64;
        }
    }
    dev /= inn as f64;
    dev = dev.sqrt();
    let edev = (total as f64 / inn as f64 * (1.0 - 1.0 / inn as f64)).sqrt();
    writeln!(out, " in {inn}")?;
    writeln!(
        out,
        " avg {avg} stddev {} ({}x) (expected {} {}x))",
        g(dev),
        g(dev / avg as f64),
        g(edev),
        g(edev / avg as f64)
    )?;
    if let Some(i) = min_osd {
        writeln!(out, " min osd.{i} {}", st.count[i])?;
    }
    if let Some(i) = max_osd {
        writeln!(out, " max osd.{i} {}", st.count[i])?;
    }
    for (i, &c) in st.size.iter().enumerate() {
        if c > 0 {
            writeln!(out, "size {i}\t{c}")?;
        }
    }
    Ok(())
}

/// `%g` as glibc prints it; a NaN from 0/0 is printed `-nan` (x86's
/// default NaN has the sign bit set).
fn g(v: f64) -> String {
    if v.is_nan() {
        if v.is_sign_negative() || v.to_bits() == f64::NAN.to_bits() {
            return "-nan".into();
        }
        return "nan".into();
    }
    fmt_g(v)
}
