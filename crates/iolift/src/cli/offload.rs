//! `iolift offload ...`: the offload engine's devices and kernels (the
//! CRUSH kernel's own commands are under `iolift crush`: test --device,
//! check, bench, map-pool).

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use iolift_offload::{device, kernels, nvrtc::Nvrtc};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct OffloadArgs {
    #[command(subcommand)]
    pub cmd: OffloadCmd,
}

#[derive(Subcommand, Debug)]
pub enum OffloadCmd {
    /// Open a device and get every registered kernel ready on it (on a GPU:
    /// compile or load from the PTX cache); fails with the reason when the
    /// device or a kernel is not usable.
    Info(InfoArgs),
    /// List the registered kernels and compile each with NVRTC (no GPU
    /// needed): size of the PTX, time, NVRTC's log.
    Kernels(KernelsArgs),
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// cpu, cpu:N (N workers), gpu, gpu:N (GPU ordinal).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Processing elements: CPU workers / CUDA streams (0 = default).
    #[arg(long, default_value_t = 0)]
    pub pes: usize,
}

#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// GPU architecture to compile for.
    #[arg(long, default_value = "compute_90")]
    pub arch: String,
    /// Only list the kernels, do not compile them.
    #[arg(long)]
    pub list: bool,
}

pub fn run(a: OffloadArgs) -> Result<ExitCode> {
    match a.cmd {
        OffloadCmd::Info(i) => info(i),
        OffloadCmd::Kernels(k) => kernels_cmd(k),
    }
}

fn info(a: InfoArgs) -> Result<ExitCode> {
    let dev = device::open(&a.device, a.pes)?;
    println!("device: {}", dev.name());
    println!("processing elements: {}", dev.processing_elements());
    let mut bad = 0;
    for (name, r) in kernels::prepare_all(&*dev) {
        match r {
            Ok(()) => println!("kernel {name}: ready"),
            Err(e) => {
                println!("kernel {name}: NOT READY: {e}");
                bad += 1;
            }
        }
    }
    if bad > 0 {
        bail!("{bad} kernel(s) not ready on {}", dev.name());
    }
    Ok(ExitCode::SUCCESS)
}

fn kernels_cmd(a: KernelsArgs) -> Result<ExitCode> {
    for k in kernels::ALL {
        println!(
            "{}: crates/iolift-offload/kernels/{} ({} bytes), entries {}",
            k.name,
            k.file,
            k.source.len(),
            k.entries.join(", ")
        );
    }
    if a.list {
        return Ok(ExitCode::SUCCESS);
    }
    let n = Nvrtc::load()?;
    let (maj, min) = n.version()?;
    println!("nvrtc {maj}.{min} at {}", n.path.display());
    for k in kernels::ALL {
        let t = Instant::now();
        let (ptx, log) = n.compile(k.source, k.file, &a.arch)?;
        println!(
            "{} -> {} bytes of PTX for {} in {:.2?}",
            k.file,
            ptx.len(),
            a.arch,
            t.elapsed()
        );
        if !log.trim().is_empty() {
            println!("log:\n{log}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
