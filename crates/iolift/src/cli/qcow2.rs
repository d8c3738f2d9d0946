//! `iolift qcow2 snapshot list|create|delete IMAGE [NAME]`: internal
//! snapshots of a qcow2 image that no server has open (like `qemu-img
//! snapshot -l|-c|-d`). The control plane of `iolift-qcow2` does the
//! work; `qemu-img check` finds the image clean afterwards.

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
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// One line per snapshot: ID, NAME, date (UTC seconds), VM state size.
    List { image: PathBuf },
    /// Snapshot the image's current contents as NAME.
    Create { image: PathBuf, name: String },
    /// Delete the snapshot NAME (or ID); its clusters are freed.
    Delete { image: PathBuf, name: String },
}

fn open(image: &Path, read_only: bool) -> Result<Arc<ControlPlane>> {
    let opts = Options {
        read_only,
        cache_entries: 0,
        data_paths: 1,
    };
    ControlPlane::open(image, &opts).with_context(|| format!("{}", image.display()))
}

pub fn run(a: Qcow2Args) -> Result<ExitCode> {
    let Qcow2Cmd::Snapshot(op) = a.cmd;
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
    }
    Ok(ExitCode::SUCCESS)
}
