//! Every registered kernel (`kernels::ALL`): its CUDA file in
//! crates/iolift-offload/kernels/ is the embedded source, and it builds as
//! host C++ with g++ (the host shims every kernel file carries), so a new
//! kernel is checked without a GPU as soon as it is registered. NVRTC
//! builds of each are in tests/nvrtc.rs.

use iolift_offload::kernels::ALL;
use std::path::Path;
use std::process::Command;

#[test]
fn registered_sources_are_the_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    assert!(!ALL.is_empty());
    let mut names: Vec<&str> = ALL.iter().map(|k| k.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ALL.len(), "kernel names must be unique");
    for k in ALL {
        let text = std::fs::read_to_string(dir.join(k.file))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(k.file).display()));
        assert_eq!(text, k.source, "{}: embedded source differs", k.file);
        assert!(!k.entries.is_empty(), "{}: no entry points", k.name);
        for e in k.entries {
            assert!(
                k.source.contains(&format!(" {e}(")),
                "{}: no definition of entry {e}",
                k.file
            );
        }
    }
}

#[test]
fn registered_sources_build_as_host_cpp() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    for k in ALL {
        let out = Command::new(&cxx)
            .args([
                "-std=c++17",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fsyntax-only",
                "-x",
                "c++",
            ])
            .arg(dir.join(k.file))
            .output()
            .unwrap_or_else(|e| panic!("{cxx} not runnable ({e}): install g++ (build-essential)"));
        assert!(
            out.status.success(),
            "{cxx} failed on kernels/{}:\n{}",
            k.file,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
