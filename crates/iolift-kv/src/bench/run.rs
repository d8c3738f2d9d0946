//! The runner: opens the database, runs each benchmark on one or more
//! client threads, keeps the model of what was written, prints reports.

use super::gen::{key, Rng, Values};
use super::{BenchOpts, Report};
use rusty_leveldb::{LdbIterator, Options, WriteBatch, DB};
use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One operation of a client.
#[derive(Debug, Clone, Copy)]
enum Op {
    Put { k: u64, sync: bool },
    Get { k: u64 },
}

/// Which keys a client visits.
#[derive(Debug, Clone, Copy)]
enum Plan {
    FillSeq { n: u64, sync: bool },
    FillRandom { n: u64, sync: bool },
    ReadRandom { n: u64 },
}

impl Plan {
    fn ops(self, num: u64, seed: u64) -> impl Iterator<Item = Op> + Send {
        let mut rng = Rng::new(seed);
        let n = match self {
            Plan::FillSeq { n, .. } | Plan::FillRandom { n, .. } | Plan::ReadRandom { n } => n,
        };
        (0..n).map(move |i| match self {
            Plan::FillSeq { sync, .. } => Op::Put { k: i % num, sync },
            Plan::FillRandom { sync, .. } => Op::Put {
                k: rng.below(num),
                sync,
            },
            Plan::ReadRandom { .. } => Op::Get { k: rng.below(num) },
        })
    }
}

/// The database and the model of what this run wrote.
struct State<'o> {
    db: DB,
    /// Per key: the tag of its last write in this run (0: none).
    tags: Vec<u32>,
    next_tag: u32,
    /// The model covers the whole database (it was made empty in this run).
    complete: bool,
    values: Values,
    print_synced: bool,
    out: &'o mut dyn Write,
}

impl State<'_> {
    /// Runs one operation: Ok(true) for a write or a read that found its key.
    fn exec(&mut self, op: Op) -> Result<bool, String> {
        match op {
            Op::Put { k, sync } => {
                let tag = self.next_tag;
                self.next_tag = self
                    .next_tag
                    .checked_add(1)
                    .ok_or("more than 2^32 writes")?;
                let v = self.values.value(tag);
                let mut b = WriteBatch::default();
                b.put(&key(k), &v);
                self.db
                    .write(b, sync)
                    .map_err(|e| format!("put {k}: {e}"))?;
                self.tags[k as usize] = tag;
                if sync && self.print_synced {
                    let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
                    writeln!(
                        self.out,
                        "synced {} {hex}",
                        String::from_utf8_lossy(&key(k))
                    )
                    .and_then(|_| self.out.flush())
                    .map_err(|e| e.to_string())?;
                }
                Ok(true)
            }
            Op::Get { k } => Ok(self.db.get(&key(k)).is_some()),
        }
    }
}

/// Runs `plan` on `threads` clients; returns (ops, found or written, summed
/// client seconds, wall time).
fn drive(
    st: &mut State,
    plan: Plan,
    threads: usize,
    num: u64,
    seed: u64,
) -> Result<(u64, u64, f64, Duration), String> {
    let start = Instant::now();
    if threads == 1 {
        let (mut ops, mut hits) = (0, 0);
        for op in plan.ops(num, seed) {
            hits += st.exec(op)? as u64;
            ops += 1;
        }
        let el = start.elapsed();
        return Ok((ops, hits, el.as_secs_f64(), el));
    }
    type Req = (Op, mpsc::SyncSender<Result<bool, String>>);
    let (tx, rx) = mpsc::channel::<Req>();
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for t in 0..threads {
            let tx = tx.clone();
            joins.push(s.spawn(move || -> Result<(u64, u64, f64), String> {
                let (rtx, rrx) = mpsc::sync_channel(1);
                let t0 = Instant::now();
                let (mut ops, mut hits) = (0, 0);
                for op in plan.ops(num, seed.wrapping_add(t as u64 * 7919)) {
                    tx.send((op, rtx.clone()))
                        .map_err(|_| "database thread gone")?;
                    hits += rrx.recv().map_err(|_| "database thread gone")?? as u64;
                    ops += 1;
                }
                Ok((ops, hits, t0.elapsed().as_secs_f64()))
            }));
        }
        drop(tx);
        let mut failed = None;
        while let Ok((op, reply)) = rx.recv() {
            let r = if failed.is_some() {
                Err("stopped after an error".to_string())
            } else {
                st.exec(op)
            };
            if let Err(e) = &r {
                failed.get_or_insert_with(|| e.clone());
            }
            let _ = reply.send(r);
        }
        let wall = start.elapsed();
        let (mut ops, mut hits, mut secs) = (0, 0, 0.0);
        for j in joins {
            match j.join() {
                Ok(Ok((o, h, s))) => {
                    ops += o;
                    hits += h;
                    secs += s;
                }
                Ok(Err(e)) => {
                    failed.get_or_insert(e);
                }
                Err(_) => {
                    failed.get_or_insert_with(|| "a client thread panicked".into());
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok((ops, hits, secs, wall)),
        }
    })
}

fn open(opt: &Options, db: &Path, fresh: bool) -> Result<DB, String> {
    if fresh && opt.env.exists(db).map_err(|e| e.to_string())? {
        opt.env
            .rmdir(db)
            .map_err(|e| format!("removing the old database: {e}"))?;
    }
    crate::logcheck::check_logs(opt.env.as_ref().as_ref(), db)?;
    DB::open(db, opt.clone()).map_err(|e| format!("opening the database: {e}"))
}

/// Runs the benchmarks of `o` on the database at `db` (the engine's
/// options `opt` carry the environment), printing one db_bench report
/// line each on `out`. Returns the reports; an error (a failed operation,
/// or `verify` finding a missing or wrong value) ends the run.
pub fn run(
    o: &BenchOpts,
    opt: &Options,
    db: &Path,
    out: &mut dyn Write,
) -> Result<Vec<Report>, String> {
    o.check()?;
    let fresh_first =
        !o.use_existing_db && o.benchmarks.first().is_some_and(|b| b.starts_with("fill"));
    let mut st = State {
        db: open(opt, db, fresh_first)?,
        tags: vec![0; o.num as usize],
        next_tag: 1,
        complete: fresh_first,
        values: Values::new(o.value_size, o.seed),
        print_synced: o.print_synced,
        out,
    };
    let reads = o.reads.unwrap_or(o.num);
    let entry = (16 + o.value_size) as f64;
    let mut reports = Vec::new();
    for (i, name) in o.benchmarks.iter().enumerate() {
        let fresh = name.starts_with("fill") && !o.use_existing_db;
        if fresh && i > 0 {
            st.db
                .close()
                .map_err(|e| format!("closing the database: {e}"))?;
            st.db = open(opt, db, true)?;
            st.tags.iter_mut().for_each(|t| *t = 0);
            st.complete = true;
        }
        let seed = o.seed.wrapping_add(i as u64 * 1_000_003);
        let write = |n, sync, seq| match seq {
            true => Plan::FillSeq { n, sync },
            false => Plan::FillRandom { n, sync },
        };
        let plan = match name.as_str() {
            "fillseq" => Some(write(o.num, o.sync, true)),
            "fillrandom" | "overwrite" => Some(write(o.num, o.sync, false)),
            "fillsync" => Some(write((o.num / 1000).max(1), true, false)),
            "readrandom" => Some(Plan::ReadRandom { n: reads }),
            _ => None,
        };
        let r = match plan {
            Some(p) => {
                let (ops, hits, secs, wall) = drive(&mut st, p, o.threads, o.num, seed)?;
                let is_read = matches!(p, Plan::ReadRandom { .. });
                Report {
                    name: name.clone(),
                    ops,
                    micros_per_op: secs * 1e6 / ops.max(1) as f64,
                    mb_per_s: (!is_read)
                        .then(|| ops as f64 * entry / 1048576.0 / wall.as_secs_f64()),
                    message: if is_read {
                        format!("({hits} of {ops} found)")
                    } else {
                        String::new()
                    },
                }
            }
            None => single(&mut st, name, reads)?,
        };
        writeln!(st.out, "{}", r.line()).map_err(|e| e.to_string())?;
        reports.push(r);
    }
    st.db
        .close()
        .map_err(|e| format!("closing the database: {e}"))?;
    Ok(reports)
}

/// The benchmarks that run once on the database's thread.
fn single(st: &mut State, name: &str, reads: u64) -> Result<Report, String> {
    let start = Instant::now();
    let (mut ops, mut bytes, mut message) = (0u64, 0u64, String::new());
    match name {
        "readseq" => {
            let mut it = st.db.new_iter().map_err(|e| format!("readseq: {e}"))?;
            while ops < reads && it.advance() {
                if let Some((k, v)) = it.current() {
                    bytes += (k.len() + v.len()) as u64;
                }
                ops += 1;
            }
        }
        "compact" => {
            st.db
                .compact_range(&key(0), &key(9_999_999_999_999_999))
                .map_err(|e| format!("compact: {e}"))?;
            ops = 1;
        }
        "verify" => {
            let (checked, missing, wrong) = verify(st)?;
            ops = checked;
            message = format!("({checked} keys checked, {missing} missing, {wrong} wrong)");
            if missing + wrong > 0 {
                let line = format!("{name:<12} : {message}");
                let _ = writeln!(st.out, "{line}");
                return Err(format!("verify: {missing} keys missing, {wrong} wrong"));
            }
        }
        _ => return Err(format!("unknown benchmark {name:?}")),
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Report {
        name: name.to_string(),
        ops,
        micros_per_op: secs * 1e6 / ops.max(1) as f64,
        mb_per_s: (bytes > 0).then(|| bytes as f64 / 1048576.0 / secs),
        message,
    })
}

/// Reads every key of the model back: (checked, missing, wrong). Keys
/// never written must be absent when the model covers the database.
fn verify(st: &mut State) -> Result<(u64, u64, u64), String> {
    let snap = st.db.get_snapshot();
    let (mut checked, mut missing, mut wrong) = (0, 0, 0);
    for k in 0..st.tags.len() {
        let tag = st.tags[k];
        if tag == 0 && !st.complete {
            continue;
        }
        let got = st
            .db
            .get_at(&snap, &key(k as u64))
            .map_err(|e| format!("verify: get {k}: {e}"))?;
        checked += 1;
        match (tag, got) {
            (0, None) => {}
            (0, Some(_)) => wrong += 1,
            (_, None) => missing += 1,
            (t, Some(v)) => wrong += (v[..] != st.values.value(t)[..]) as u64,
        }
    }
    Ok((checked, missing, wrong))
}
