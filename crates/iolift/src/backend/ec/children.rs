//! The list of child devices in an `ec:` spec.
//!
//! The `ec` backend's positional argument (everything before the first
//! comma, see [`crate::backend::BackendSpec`]) lists its k+m children:
//!
//! - children are separated by `;`: `memory:1G;memory:1G;...`;
//! - one child may stand for several: a `{A..B}` range is expanded into one
//!   child per number, `file:/d/s{0..5}.img` is `file:/d/s0.img;...;file:/d/s5.img`;
//! - a child is a backend spec with optional stages on top, each stage
//!   followed by `>`: `error:rate=1+ops=read>file:/d/s0.img+size=1G`;
//! - because the `ec` options follow the first comma, a child writes `+`
//!   where its own spec has `,` (`file:/d/s0.img+size=1G` is
//!   `file:/d/s0.img,size=1G`).
//!
//! So paths with `;`, `>`, `+`, `{` or `,` cannot be children here.

use crate::block::DevRef;
use anyhow::{bail, Context, Result};
use std::sync::OnceLock;

/// Checks one stage spec (`crate::stage::check_spec`).
pub type CheckStage = fn(&str) -> Result<()>;
/// Stacks stage specs on a device (`crate::stage::build_stack`).
pub type BuildStack = fn(&[String], DevRef) -> Result<DevRef>;

static STAGES: OnceLock<(CheckStage, BuildStack)> = OnceLock::new();

/// Lets children carry stages. The backend module cannot use the stage
/// table itself (the stages' tests open backends, and sibling modules
/// must not import each other), so `cli::main` hands it over at start.
pub fn use_stages(check: CheckStage, build: BuildStack) {
    let _ = STAGES.set((check, build));
}

fn stages() -> Result<&'static (CheckStage, BuildStack)> {
    STAGES.get().context(
        "stages on ec children need the stage table, which the iolift binary provides (backend::ec::children::use_stages)",
    )
}

/// One child: stages (top first) over a backend, as plain specs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    pub stages: Vec<String>,
    pub backend: String,
}

impl ChildSpec {
    /// The child as the user would write it outside `ec:` (for messages).
    pub fn show(&self) -> String {
        let mut s = String::new();
        for st in &self.stages {
            s.push_str(st);
            s.push('>');
        }
        s.push_str(&self.backend);
        s
    }

    /// Checks the stages and the backend, opening nothing.
    pub fn check(&self) -> Result<()> {
        if !self.stages.is_empty() {
            let (check, _) = stages()?;
            for st in &self.stages {
                check(st)?;
            }
        }
        crate::backend::check_spec(&self.backend)
    }

    /// Whether the child is a `file:` backend with no stages on the
    /// thread-pool engine: it is opened with `inline_writes`, so that
    /// `submit_cb` writes it on the calling thread, and the device writes
    /// it from threads of its own (io.rs, `Inner::child_writes`).
    pub fn on_caller(&self) -> bool {
        if !self.stages.is_empty() {
            return false;
        }
        match crate::backend::BackendSpec::parse(&self.backend) {
            Ok(s) => s.kind == "file" && s.opts.get("engine").is_none_or(|e| e == "threads"),
            Err(_) => false,
        }
    }

    /// Opens the backend and stacks the stages on it.
    pub fn open(&self) -> Result<DevRef> {
        let given = crate::backend::BackendSpec::parse(&self.backend)
            .is_ok_and(|s| s.opts.get("inline_writes").is_some());
        if self.on_caller() && !given {
            return crate::backend::open(&format!("{},inline_writes", self.backend));
        }
        let dev = crate::backend::open(&self.backend)?;
        if self.stages.is_empty() {
            return Ok(dev);
        }
        let (_, build) = stages()?;
        build(&self.stages, dev)
    }
}

/// Expands one `{A..B}` range (at most one per child).
fn expand(item: &str) -> Result<Vec<String>> {
    let Some(open) = item.find('{') else {
        if item.contains('}') {
            bail!("child {item:?}: '}}' without '{{'");
        }
        return Ok(vec![item.to_string()]);
    };
    let close = item[open..]
        .find('}')
        .map(|i| open + i)
        .with_context(|| format!("child {item:?}: '{{' without '}}'"))?;
    let (head, range, tail) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    if tail.contains('{') || tail.contains('}') {
        bail!("child {item:?}: one {{A..B}} range per child");
    }
    let (a, b) = range
        .split_once("..")
        .with_context(|| format!("child {item:?}: {{{range}}} is not a range A..B"))?;
    let parse = |v: &str| {
        v.parse::<u32>()
            .with_context(|| format!("child {item:?}: {v:?} in {{{range}}} is not a number"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a > b || b - a >= 256 {
        bail!("child {item:?}: range {{{range}}} must go up and hold at most 256 numbers");
    }
    Ok((a..=b).map(|i| format!("{head}{i}{tail}")).collect())
}

/// Parses the children list (see the module doc).
pub fn parse(arg: &str) -> Result<Vec<ChildSpec>> {
    let mut out = Vec::new();
    for item in arg.split(';') {
        if item.is_empty() {
            bail!("empty child in {arg:?} (children are separated by ';')");
        }
        for one in expand(item)? {
            let one = one.replace('+', ",");
            let mut parts: Vec<String> = one.split('>').map(str::to_string).collect();
            let backend = parts.pop().unwrap_or_default();
            if backend.is_empty() || parts.iter().any(|p| p.is_empty()) {
                bail!("child {item:?}: empty stage or backend around '>'");
            }
            out.push(ChildSpec {
                stages: parts,
                backend,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_lists_stages_and_plus() {
        let c = parse("file:/d/s{0..2}.img+size=1M;error:rate=1+ops=read>memory:1M").unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].backend, "file:/d/s0.img,size=1M");
        assert_eq!(c[2].backend, "file:/d/s2.img,size=1M");
        assert_eq!(c[3].stages, vec!["error:rate=1,ops=read".to_string()]);
        assert_eq!(c[3].backend, "memory:1M");
        assert_eq!(c[3].show(), "error:rate=1,ops=read>memory:1M");
    }

    #[test]
    fn bad_lists_name_the_part() {
        for (arg, want) in [
            ("memory:1M;;memory:1M", "empty child"),
            ("file:/d/s{0..x}.img", "\"x\""),
            ("file:/d/s{3..1}.img", "must go up"),
            ("file:/d/s{0..1.img", "without '}'"),
            ("file:/d/s0}.img", "without '{'"),
            ("file:/d/s{0..1}{0..1}", "one {A..B}"),
            ("file:/d/s{01}", "not a range"),
            (">memory:1M", "empty stage"),
            ("stats>", "empty stage or backend"),
        ] {
            let e = format!("{:#}", parse(arg).unwrap_err());
            assert!(e.contains(want), "{arg}: {e}");
        }
    }
}
