//! Maps made by Ceph's own tools (`osdmaptool`, `crushtool`, package
//! ceph-base, installed by scripts/test.sh) for the OSDMap and CRUSH
//! tests, and the scratch directory they are written to.

use crate::process::tool_ok;
use std::path::{Path, PathBuf};

/// A scratch directory for tool input and output, removed when dropped.
pub struct ToolDir(tempfile::TempDir);

impl ToolDir {
    /// A fresh directory under the system temp dir, named after `tag`.
    pub fn new(tag: &str) -> ToolDir {
        let d = tempfile::Builder::new()
            .prefix(&format!("iolift-{tag}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for {tag}: {e}"));
        ToolDir(d)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// `name` inside the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// `name` inside the directory, as a string (for tool arguments).
    pub fn p(&self, name: &str) -> String {
        self.file(name).to_str().unwrap().to_string()
    }
}

/// `osdmaptool --createsimple OSDS --clobber MAP EXTRA...`; panics with
/// the tool's output if it fails.
pub fn createsimple(map: &Path, osds: u32, extra: &[&str]) {
    let n = osds.to_string();
    let mut args = vec!["--createsimple", &n, "--clobber", map.to_str().unwrap()];
    args.extend_from_slice(extra);
    tool_ok("osdmaptool", &args);
}

/// `crushtool --build` of a straw2 hierarchy into `out`: OSDS OSDs, then
/// each `(type, n)` of `levels` groups n items of the level below into one
/// straw2 bucket of that type (`[("host", 10), ("rack", 10)]`: 10 OSDs per
/// host, 10 hosts per rack), all under one straw2 `root`.
pub fn crush_build_straw2(out: &Path, osds: u32, levels: &[(&str, u32)]) {
    let n = osds.to_string();
    let sizes: Vec<String> = levels.iter().map(|(_, k)| k.to_string()).collect();
    let mut args = vec!["--build", "--num_osds", &n];
    for ((name, _), k) in levels.iter().zip(&sizes) {
        args.extend_from_slice(&[name, "straw2", k]);
    }
    args.extend_from_slice(&["root", "straw2", "0", "-o", out.to_str().unwrap()]);
    tool_ok("crushtool", &args);
}
