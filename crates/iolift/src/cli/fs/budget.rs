//! The flags `fs mount` and `fs serve-virtiofs` share: the kernel's cache
//! timeout, the mirror's budgets and the metrics address, declared once
//! and flattened into both commands.

use anyhow::{bail, Result};
use clap::Args;
use iolift_fs::mirror::MirrorOptions;
use std::time::Duration;

#[derive(Args, Debug)]
pub(super) struct BudgetArgs {
    /// Do not use READDIRPLUS (listings then carry names only).
    #[arg(long)]
    pub no_readdirplus: bool,
    /// How long the client kernel may cache names and attributes, in
    /// milliseconds (1000, as libfuse and bindfs by default; changes made
    /// on the host under the mirror show after at most this long).
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// mirror: nodes (host inodes the kernel knows) held at most; each holds
    /// an fd, so this is also kept below the open-files limit.
    #[arg(long, default_value_t = 1 << 18)]
    pub max_nodes: usize,
    /// mirror: open files and directories at most; each holds an fd.
    #[arg(long, default_value_t = 4096)]
    pub max_handles: usize,
    /// mirror: reads (with --uring-writes also writes) in flight on the
    /// io_uring data path at most
    /// (each holds its buffer, at most 1 MiB); 0 serves every read and write
    /// on the thread that received it (pread/pwrite).
    #[arg(long, default_value_t = 64)]
    pub uring_depth: usize,
    /// mirror: writes go to the io_uring too (off: buffered host writes
    /// run on io_uring's kernel worker threads, several times the CPU of a
    /// pwrite on the thread that received them).
    #[arg(long)]
    pub uring_writes: bool,
    /// Serve Prometheus metrics (per-operation counts and latency) on ADDR.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

impl BudgetArgs {
    /// The cache timeout.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// The mirror's options from these flags (budgets checked).
    pub fn mirror(&self, passthrough: bool, writeback: bool) -> Result<MirrorOptions> {
        if self.max_nodes == 0 || self.max_handles == 0 {
            bail!("--max-nodes and --max-handles must be at least 1");
        }
        if self.uring_depth > 4096 {
            bail!("--uring-depth must be at most 4096 (0: no io_uring)");
        }
        Ok(MirrorOptions {
            max_nodes: self.max_nodes,
            max_handles: self.max_handles,
            ttl: self.ttl(),
            passthrough,
            writeback,
            uring_depth: self.uring_depth,
            uring_writes: self.uring_writes,
        })
    }
}
