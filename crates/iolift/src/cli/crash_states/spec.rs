//! Crash states as text: SUBSET specs written for `--replay` and parsed
//! back, and shell quoting for the commands printed.

use super::model::{Model, State, Unit, WHOLE};
use anyhow::Result;

/// Quotes `s` for sh.
pub(super) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Writes `kept` as SUBSET: `none`, or pending records and ranges of them
/// (a range `a-b` keeps every pending record from `a` to `b`), or `R.P`.
pub(super) fn encode_subset(pending: &[usize], kept: &[Unit]) -> String {
    if kept.is_empty() {
        return "none".into();
    }
    if kept.len() == pending.len() && kept.iter().all(|u| u.piece == WHOLE) {
        return "all".into();
    }
    let mut parts = Vec::new();
    let mut k = 0;
    let mut i = 0;
    while k < kept.len() {
        let u = kept[k];
        if u.piece != WHOLE {
            parts.push(format!("{}.{}", u.rec, u.piece));
            k += 1;
            continue;
        }
        while pending[i] != u.rec {
            i += 1;
        }
        // Extend the run while the next pending record is kept whole.
        let start = u.rec;
        let mut last = u.rec;
        while k + 1 < kept.len()
            && i + 1 < pending.len()
            && kept[k + 1].piece == WHOLE
            && kept[k + 1].rec == pending[i + 1]
        {
            k += 1;
            i += 1;
            last = pending[i];
        }
        parts.push(if last == start {
            start.to_string()
        } else {
            format!("{start}-{last}")
        });
        k += 1;
    }
    parts.join(",")
}

/// Parses POINT:SUBSET against the model.
pub(super) fn decode_state(m: &Model, spec: &str) -> Result<State> {
    let bad = |why: String| anyhow::anyhow!("--replay {spec:?}: {why}");
    let (p, sub) = spec
        .split_once(':')
        .ok_or_else(|| bad("want POINT:SUBSET".into()))?;
    let point: usize = p.parse().map_err(|_| bad(format!("bad POINT {p:?}")))?;
    if point >= m.log.records.len() {
        return Err(bad(format!(
            "the log has {} records (0 to {})",
            m.log.records.len(),
            m.log.records.len().saturating_sub(1)
        )));
    }
    let pending = m.pending(point);
    let all_units = m.units(point);
    let mut kept: Vec<Unit> = match sub {
        "all" => all_units,
        "none" => Vec::new(),
        _ => {
            let mut v = Vec::new();
            for item in sub.split(',') {
                let num = |s: &str| -> Result<usize> {
                    s.parse().map_err(|_| bad(format!("bad item {item:?}")))
                };
                if let Some((r, piece)) = item.split_once('.') {
                    let (r, piece) = (num(r)?, num(piece)? as u32);
                    if m.tear.is_none() {
                        return Err(bad(format!("piece {item:?} needs --tear")));
                    }
                    if !all_units.contains(&Unit { rec: r, piece }) {
                        return Err(bad(format!("{item:?} is no pending piece of this state")));
                    }
                    v.push(Unit { rec: r, piece });
                } else {
                    let (a, b) = match item.split_once('-') {
                        Some((a, b)) => (num(a)?, num(b)?),
                        None => (num(item)?, num(item)?),
                    };
                    if a > b || b > point {
                        return Err(bad(format!(
                            "{item:?} is not a range of records up to {point}"
                        )));
                    }
                    let mut any = false;
                    for &j in pending.iter().filter(|&&j| (a..=b).contains(&j)) {
                        any = true;
                        v.extend(all_units.iter().filter(|u| u.rec == j));
                    }
                    if !any {
                        return Err(bad(format!("{item:?} names no pending write")));
                    }
                }
            }
            v
        }
    };
    kept.sort();
    kept.dedup();
    Ok(State { point, kept })
}
