//! `iolift ec rebuild SPEC`: offline rebuild of an `ec:` device's replaced
//! or failed children, with a progress bar, and with `--check` a read of
//! every stripe afterwards (crcs, decoding, parity against data). The
//! server must not be running on the same children.

use crate::backend::ec::{self, rebuild};
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct RebuildArgs {
    /// The device, as given to `iolift serve` (`ec:CHILD;CHILD...,k=..,m=..`).
    pub spec: String,
    /// After the rebuild, read every stripe and check crcs and parity;
    /// exit 1 if a stripe cannot be decoded or its parity does not match.
    #[arg(long)]
    pub check: bool,
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    let style = ProgressStyle::with_template(
        "{msg} [{bar:40}] {pos}/{len} stripes {elapsed_precise} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style.progress_chars("=> "));
    pb.set_message(what.to_string());
    pb
}

pub fn run(a: &RebuildArgs) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("runtime")?;
    let d = ec::open_offline(&a.spec)?;
    let targets = rebuild::targets(&d);
    let code = rt.block_on(async {
        if targets.is_empty() {
            println!("ec rebuild: no child needs a rebuild");
        } else {
            let pb = bar(d.geo.stripes, &format!("rebuild {targets:?}"));
            let r = rebuild::rebuild(&d, &targets, &|s| pb.set_position(s)).await;
            pb.finish_and_clear();
            let r = r.context("ec rebuild")?;
            println!("ec rebuild: {r}");
        }
        let mut code = ExitCode::SUCCESS;
        if a.check {
            let pb = bar(d.geo.stripes, "check");
            let c = rebuild::check(&d, &|s| pb.set_position(s)).await;
            pb.finish_and_clear();
            println!("ec check: {c}");
            if c.unreadable + c.inconsistent > 0 || d.degraded() > 0 {
                code = ExitCode::FAILURE;
            }
        }
        d.flush()
            .await
            .map_err(|e| anyhow::anyhow!("ec rebuild: flush: {e:?}"))?;
        anyhow::Ok(code)
    })?;
    Ok(code)
}
