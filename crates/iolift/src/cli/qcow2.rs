//! `iolift qcow2 snapshot list|create|delete|apply IMAGE [NAME]`: internal
//! snapshots of a qcow2 image that no server has open (like `qemu-img
//! snapshot -l|-c|-d|-a`). The control plane of `iolift-qcow2` does the
//! work; `qemu-img check` finds the image clean afterwards.
//!
//! `iolift qcow2 control SOCKET COMMAND...`: sends one command to the
//! control socket of a server serving `qcow2:...,control=SOCKET` (online
//! snapshots, discard, compaction, cache resize, statistics) and prints
//! the answer; the exit status is 1 when the server answers an error.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use iolift_qcow2::{ControlPlane, Options};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct Qcow2Args {
    #[command(subcommand)]
    pub cmd: Qcow2Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Qcow2Cmd {
    /// Internal snapshots of an image not in use by a server.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Send a command to a running server's control socket
    /// (qcow2:IMAGE,control=SOCKET): stats | snapshot list |
    /// snapshot create NAME | snapshot delete NAME | snapshot revert NAME |
    /// discard OFFSET LENGTH | compact | cache ENTRIES | flush
    Control {
        socket: PathBuf,
        #[arg(required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// One line per snapshot: ID, NAME, date (UTC seconds), VM state size.
    List { image: PathBuf },
    /// Snapshot the image's current contents as NAME.
    Create { image: PathBuf, name: String },
    /// Delete the snapshot NAME (or ID); its clusters are freed.
    Delete { image: PathBuf, name: String },
    /// Revert the image to the snapshot NAME (or ID), which is kept.
    #[command(alias = "revert")]
    Apply { image: PathBuf, name: String },
}

fn open(image: &Path, read_only: bool) -> Result<Arc<ControlPlane>> {
    let opts = Options {
        read_only,
        cache_entries: 0,
        data_paths: 1,
        direct: false,
    };
    ControlPlane::open(image, &opts).with_context(|| format!("{}", image.display()))
}

pub fn run(a: Qcow2Args) -> Result<ExitCode> {
    let op = match a.cmd {
        Qcow2Cmd::Snapshot(op) => op,
        Qcow2Cmd::Control { socket, command } => return control(&socket, &command.join(" ")),
    };
    match op {
        SnapshotCmd::List { image } => {
            let cp = open(&image, true)?;
            println!(
                "{:<6} {:<24} {:>12} {:>12}",
                "ID", "NAME", "DATE", "VM_STATE"
            );
            for s in cp.snapshots() {
                println!(
                    "{:<6} {:<24} {:>12} {:>12}",
                    s.id, s.name, s.date_sec, s.vm_state_size
                );
            }
        }
        SnapshotCmd::Create { image, name } => {
            let cp = open(&image, false)?;
            cp.snapshot_create(&name)
                .with_context(|| format!("creating snapshot {name:?}"))?;
            cp.close().context("closing the image")?;
        }
        SnapshotCmd::Delete { image, name } => {
            let cp = open(&image, false)?;
            cp.snapshot_delete(&name)
                .with_context(|| format!("deleting snapshot {name:?}"))?;
            cp.close().context("closing the image")?;
        }
        SnapshotCmd::Apply { image, name } => {
            let cp = open(&image, false)?;
            cp.snapshot_revert(&name)
                .with_context(|| format!("reverting to snapshot {name:?}"))?;
            cp.close().context("closing the image")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Sends `line` to the control socket, prints the answer's lines.
fn control(socket: &Path, line: &str) -> Result<ExitCode> {
    use std::io::{BufRead, BufReader, Write};
    if line.contains('\n') {
        anyhow::bail!("a control command is one line");
    }
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    writeln!(s, "{line}").context("sending the command")?;
    s.shutdown(std::net::Shutdown::Write)
        .context("sending the command")?;
    for l in BufReader::new(s).lines() {
        let l = l.context("reading the answer")?;
        if l == "ok" {
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(e) = l.strip_prefix("error: ") {
            eprintln!("iolift qcow2 control: {e}");
            return Ok(ExitCode::FAILURE);
        }
        println!("{l}");
    }
    anyhow::bail!(
        "control socket {}: the server closed the connection without an answer",
        socket.display()
    )
}
