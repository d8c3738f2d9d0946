//! The `iolift` command line: one subcommand per file.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub mod accelfs;
pub mod attach;
pub mod crash_states;
pub mod crush;
pub mod ec;
pub mod ec_rebuild;
pub mod fs;
pub mod kv;
pub mod list;
pub mod offload;
pub mod osdmap;
pub mod qcow2;
pub mod serve;

#[derive(Parser, Debug)]
#[command(
    name = "iolift",
    version,
    about = "A user-space block I/O stack with accelerator offload"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info`, `iolift=debug`.
    #[arg(long, global = true, env = "IOLIFT_LOG", default_value = "info")]
    pub log: String,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Serve block devices over NBD (unix socket and/or TCP).
    Serve(serve::ServeArgs),
    /// CRUSH placement: crushtool-compatible test, decompile, info, map-object.
    Crush(crush::CrushArgs),
    /// Erasure coding like ceph-erasure-code-tool (jerasure, isa), plus bench.
    Ec(ec::EcArgs),
    /// Attach a device as a kernel block device (/dev/loopN) through a
    /// FUSE file and a loop device (root; no nbd module needed).
    Attach(attach::AttachArgs),
    /// Undo `attach`: unbind the loop device, flush, unmount, stop the server.
    Detach(attach::DetachArgs),
    /// Replay a `log-writes` log: check every state a power loss can leave.
    CrashStates(crash_states::CrashStatesArgs),
    /// List the stages (`--stage NAME:key=value,...`) and their options.
    Stages(list::ListArgs),
    /// List the backends (`KIND:ARG,key=value,...`) and their options.
    Backends(list::ListArgs),
    /// OSDMap placement like osdmaptool: --test-map-pgs[-dump[-all]], --print, ...
    Osdmap(osdmap::OsdmapArgs),
    /// Offload engine: devices and kernels (info, kernels).
    Offload(offload::OffloadArgs),
    /// qcow2 images: internal snapshots (list, create, delete) offline.
    Qcow2(qcow2::Qcow2Args),
    /// AccelFS on the io_uring engine: mkfs, fsck, ls, mkdir, rm, cp-in, cp-out.
    Accelfs(accelfs::AccelfsArgs),
    /// Key-value store on AccelFS (rusty-leveldb): db_bench-style bench, dump.
    Kv(kv::KvArgs),
    /// File systems through the kernel's FUSE client: mount null or mirror:DIR.
    Fs(fs::FsArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    crate::backend::ec::children::use_stages(crate::stage::check_spec, crate::stage::build_stack);
    let r = match cli.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Crush(a) => crush::run(a),
        Cmd::Ec(a) => ec::run(a),
        Cmd::Attach(a) => attach::run_attach(a),
        Cmd::Detach(a) => attach::run_detach(a),
        Cmd::CrashStates(a) => crash_states::run(a),
        Cmd::Stages(a) => list::run_stages(a),
        Cmd::Backends(a) => list::run_backends(a),
        Cmd::Osdmap(a) => osdmap::run(a),
        Cmd::Offload(a) => offload::run(a),
        Cmd::Qcow2(a) => qcow2::run(a),
        Cmd::Accelfs(a) => accelfs::run(a),
        Cmd::Kv(a) => kv::run(a),
        Cmd::Fs(a) => fs::run(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("iolift: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
