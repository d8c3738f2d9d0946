//! `iolift stages` and `iolift backends`: every stage or backend with its
//! options, from the same tables that check specs ([`crate::stage::STAGES`],
//! [`crate::backend::BACKENDS`]).

use crate::spec::render_help;
use anyhow::{bail, Result};
use clap::Args;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Show only this one.
    pub name: Option<String>,
}

/// One entry of a listing: its usage line, summary and options.
struct Entry {
    name: &'static str,
    usage: String,
    summary: &'static str,
    help: String,
}

/// `head[SEP key=value,...]`, or `head` alone when there are no options.
fn usage(head: &str, sep: &str, options: &[crate::spec::OptHelp]) -> String {
    if options.is_empty() {
        head.to_string()
    } else {
        format!("{head}[{sep}key=value,...]")
    }
}

fn stages() -> Vec<Entry> {
    crate::stage::STAGES
        .iter()
        .map(|k| Entry {
            name: k.name,
            usage: usage(k.name, ":", k.options),
            summary: k.summary,
            help: render_help(k.options),
        })
        .collect()
}

fn backends() -> Vec<Entry> {
    crate::backend::BACKENDS
        .iter()
        .map(|k| Entry {
            name: k.name,
            usage: usage(&format!("{}:{}", k.name, k.arg), ",", k.options),
            summary: k.summary,
            help: render_help(k.options),
        })
        .collect()
}

/// Prints the entries (or the one `only` names), blank-line separated.
fn print(family: &str, entries: Vec<Entry>, only: Option<&str>) -> Result<ExitCode> {
    let names: Vec<&str> = entries.iter().map(|e| e.name).collect();
    if let Some(n) = only {
        if !names.contains(&n) {
            bail!("unknown {family} {n:?} (known: {})", names.join(", "));
        }
    }
    let mut out = String::new();
    for e in entries.iter().filter(|e| only.is_none_or(|n| n == e.name)) {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("{}\n  {}\n", e.usage, e.summary));
        if e.help.is_empty() {
            out.push_str("  (no options)\n");
        } else {
            out.push_str(&e.help);
        }
    }
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

pub fn run_stages(a: ListArgs) -> Result<ExitCode> {
    print("stage", stages(), a.name.as_deref())
}

pub fn run_backends(a: ListArgs) -> Result<ExitCode> {
    print("backend", backends(), a.name.as_deref())
}
