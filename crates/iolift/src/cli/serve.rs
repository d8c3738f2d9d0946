//! `iolift serve`: NBD server front-end.

use anyhow::Result;
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Backend of the default export, e.g. memory:1G or file:PATH,size=1G.
    #[arg(default_value = "file:iolift-disk.img,size=1G")]
    pub backend: String,
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    let dev = crate::backend::open(&a.backend)?;
    anyhow::bail!(
        "serve: NBD front-end not built yet (backend {} opened)",
        dev.name()
    )
}
