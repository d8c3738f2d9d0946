//! db_bench's workloads on rusty-leveldb, with db_bench's report lines
//! (`fillseq      :       3.015 micros/op;   36.7 MB/s`).
//!
//! Benchmarks: `fillseq`, `fillrandom`, `fillsync` (num/1000 writes, each
//! synced), `overwrite`, `readseq`, `readrandom`, `compact`, and `verify`
//! (not db_bench's): every key written in this run is read back and
//! compared with the value last written to it. Fills start from an empty
//! database unless `use_existing_db`.
//!
//! Memory: the model of what was written is one u32 per key (`num` x 4
//! bytes); values come from a 1 MiB pool.
//!
//! The engine's `DB` is single-threaded (it is not `Send`). With
//! `threads` > 1 the database stays on the calling thread and the client
//! threads send it their operations one at a time, as db_bench's threads
//! share one database; `readseq`, `compact` and `verify` run once.

pub mod gen;
mod run;

pub use run::run;

/// What to run (db_bench's flags).
#[derive(Debug, Clone)]
pub struct BenchOpts {
    pub benchmarks: Vec<String>,
    /// Keys (and writes per fill).
    pub num: u64,
    /// Reads of readrandom / entries of readseq (default: num).
    pub reads: Option<u64>,
    pub value_size: usize,
    pub threads: usize,
    /// Every write synced (db_bench's --sync).
    pub sync: bool,
    pub use_existing_db: bool,
    pub seed: u64,
    /// Print `synced KEY VALUE-HEX` after every synced write.
    pub print_synced: bool,
}

impl Default for BenchOpts {
    fn default() -> Self {
        BenchOpts {
            benchmarks: [
                "fillseq",
                "fillrandom",
                "overwrite",
                "readseq",
                "readrandom",
            ]
            .map(String::from)
            .to_vec(),
            num: 1_000_000,
            reads: None,
            value_size: 100,
            threads: 1,
            sync: false,
            use_existing_db: false,
            seed: 301,
            print_synced: false,
        }
    }
}

/// The benchmarks this runner knows.
pub const KNOWN: &[&str] = &[
    "fillseq",
    "fillrandom",
    "fillsync",
    "overwrite",
    "readseq",
    "readrandom",
    "compact",
    "verify",
];

impl BenchOpts {
    /// Checks the options; an error names the bad one.
    pub fn check(&self) -> Result<(), String> {
        for b in &self.benchmarks {
            if !KNOWN.contains(&b.as_str()) {
                return Err(format!(
                    "--benchmarks: unknown benchmark {b:?} (known: {})",
                    KNOWN.join(",")
                ));
            }
        }
        if self.num == 0 || self.num > u32::MAX as u64 {
            return Err(format!("--num: {} (1 to {})", self.num, u32::MAX));
        }
        if self.value_size == 0 || self.value_size > 16 << 20 {
            return Err(format!("--value_size: {} (1 to 16 MiB)", self.value_size));
        }
        if self.threads == 0 || self.threads > 256 {
            return Err(format!("--threads: {} (1 to 256)", self.threads));
        }
        Ok(())
    }
}

/// One benchmark's result.
#[derive(Debug, Clone)]
pub struct Report {
    pub name: String,
    pub ops: u64,
    pub micros_per_op: f64,
    pub mb_per_s: Option<f64>,
    pub message: String,
}

impl Report {
    /// db_bench's line.
    pub fn line(&self) -> String {
        let mut extra = match self.mb_per_s {
            Some(r) => format!("{r:6.1} MB/s"),
            None => String::new(),
        };
        if !self.message.is_empty() {
            if !extra.is_empty() {
                extra.push(' ');
            }
            extra.push_str(&self.message);
        }
        format!(
            "{:<12} : {:>11.3} micros/op;{}{}",
            self.name,
            self.micros_per_op,
            if extra.is_empty() { "" } else { " " },
            extra
        )
    }
}
