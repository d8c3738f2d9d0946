//! `iolift stages` / `iolift backends` list every registered stage and
//! backend with all its options, and the binary rejects a bad option in a
//! config file's stage as it does on the command line, naming the key.

use iolift::backend::BACKENDS;
use iolift::spec::OptHelp;
use iolift::stage::STAGES;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn iolift(args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_iolift"));
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("run iolift");
    let end = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("iolift {args:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn stdout_ok(args: &[&str]) -> String {
    let o = iolift(args);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "iolift {args:?} failed: {}{out}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The listing's block for `name`: from its usage line (`name`, `name[...`
/// or `name:...`) to the next blank line.
fn block<'a>(out: &'a str, name: &str) -> &'a str {
    out.split("\n\n")
        .find(|b| {
            let head = b.lines().next().unwrap_or("");
            head.strip_prefix(name)
                .is_some_and(|r| r.is_empty() || r.starts_with(['[', ':']))
        })
        .unwrap_or_else(|| panic!("no entry for {name} in:\n{out}"))
}

/// One registered stage or backend: its name, the start of its usage
/// line, its summary and options.
type Entry<'a> = (&'a str, String, &'a str, &'a [OptHelp]);

/// `iolift CMD` lists exactly `entries`, each with its usage line, summary
/// and every option's usage, default and help on one line.
fn check_listing(cmd: &str, entries: &[Entry]) {
    let out = stdout_ok(&[cmd]);
    assert_eq!(out.split("\n\n").count(), entries.len(), "{out}");
    for (name, usage, summary, options) in entries {
        let b = block(&out, name);
        assert!(b.starts_with(usage.as_str()), "{name}: usage line:\n{b}");
        assert!(b.contains(summary), "{name}: summary missing:\n{b}");
        for o in options.iter() {
            let line = b
                .lines()
                .find(|l| l.trim_start().starts_with(&o.usage()))
                .unwrap_or_else(|| panic!("{name}: option {} missing:\n{b}", o.name));
            assert!(line.contains(o.help), "{name}.{}: help: {line}", o.name);
            assert!(
                line.contains(o.default),
                "{name}.{}: default: {line}",
                o.name
            );
        }
        if options.is_empty() {
            assert!(b.contains("(no options)"), "{name}:\n{b}");
        }
    }
}

#[test]
fn stages_lists_every_stage_and_option() {
    let entries: Vec<Entry> = STAGES
        .iter()
        .map(|k| (k.name, k.name.to_string(), k.summary, k.options))
        .collect();
    check_listing("stages", &entries);
    let one = stdout_ok(&["stages", "delay"]);
    assert!(one.starts_with("delay["), "{one}");
    assert!(!one.contains("cache"), "{one}");
}

#[test]
fn backends_lists_every_backend_and_option() {
    let entries: Vec<Entry> = BACKENDS
        .iter()
        .map(|k| {
            (
                k.name,
                format!("{}:{}", k.name, k.arg),
                k.summary,
                k.options,
            )
        })
        .collect();
    check_listing("backends", &entries);
}

#[test]
fn unknown_names_list_the_table() {
    let o = iolift(&["stages", "nosuch"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    let names: Vec<&str> = STAGES.iter().map(|k| k.name).collect();
    assert!(e.contains(&format!("(known: {})", names.join(", "))), "{e}");
    let o = iolift(&["backends", "nosuch"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    let names: Vec<&str> = BACKENDS.iter().map(|k| k.name).collect();
    assert!(e.contains(&format!("(known: {})", names.join(", "))), "{e}");
}

#[test]
fn config_stage_with_unknown_option_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let sock = dir.path().join("s.sock");
    std::fs::write(
        &cfg,
        format!(
            "socket = {:?}\n[[export]]\nname = \"\"\nbackend = \"memory:1M\"\nstages = [\"delay:ms=1\"]\n",
            sock.display().to_string()
        ),
    )
    .unwrap();
    let o = iolift(&["serve", "--config", cfg.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "served with delay:ms=1: {e}");
    let opts: Vec<&str> = iolift::stage::delay::OPTIONS
        .iter()
        .map(|o| o.name)
        .collect();
    let want = format!(
        "stage delay: unknown option \"ms\" (known: {})",
        opts.join(", ")
    );
    assert!(e.contains(&want), "{e}");
}
