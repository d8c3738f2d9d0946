//! `iolift serve`: serve exports over NBD, and optionally as FUSE block
//! files and a metrics endpoint.
//!
//! Order of work: settings (flags merged over `--config`, all checked;
//! [`crate::config`]) -> exports (backends opened, stages stacked;
//! [`crate::export`]) -> front-ends started in turn ([`crate::frontend`]:
//! NBD listeners bound, metrics, FUSE files) -> pidfile -> NBD accepts
//! connections -> hint lines -> wait
//! for SIGINT or SIGTERM -> front-ends stopped (connections drained, files
//! unmounted) -> every export flushed (`close()`) -> pidfile removed. An
//! error at any step releases what the earlier steps set up (socket files,
//! mounts, pidfile) as the values holding them are dropped.

use crate::config::{Flags, Settings};
use crate::export::build_exports;
use crate::frontend::{self, Running, StopOn};
use anyhow::Result;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

/// How long each export may take to flush at exit.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug, Default, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub flags: Flags,
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    let s = Settings::load(&a.flags)?;
    frontend::runtime(s.threads, "iolift")?.block_on(serve(s))
}

async fn serve(s: Settings) -> Result<ExitCode> {
    let exports = build_exports(&s.exports)?;
    let mut running = Running::start(&s, &exports).await?;
    if let Some(p) = &s.pidfile {
        running.write_pidfile(p)?;
    }
    running.begin();
    frontend::print_ready(&exports, &running);
    let sig = frontend::wait_for_signal(StopOn::IntTerm).await;
    tracing::info!("{sig}: stopping (in-flight requests finish first)");
    let code = running.close(&exports, FLUSH_TIMEOUT).await;
    tracing::info!("stopped");
    Ok(code)
}
