//! A kernel file of crates/iolift-offload/kernels/ built by the host C++
//! compiler (`$CXX`, else g++) as a shared library, with the host shims
//! every kernel file carries, and loaded. Used by the crush and ec host
//! tests (`#[path = "common/host.rs"] mod host;` where the rest of
//! common/ is not wanted).

use std::path::Path;
use std::process::Command;

/// `kernels/FILE` compiled with `-std=c++17 -O2 -Wall -Wextra -Werror`
/// and loaded; the directory holding the library lives as long as the
/// returned `TempDir`. A compiler error fails the test with its output.
pub fn build(file: &str) -> (tempfile::TempDir, libloading::Library) {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("libkernel_host.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("kernels")
        .join(file);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-shared",
            "-x",
            "c++",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .output()
        .unwrap_or_else(|e| panic!("{cxx} not runnable ({e}): install g++ (build-essential)"));
    assert!(
        out.status.success(),
        "{cxx} failed on kernels/{file}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: our own freshly built library; its initialisers are the C++
    // runtime's.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    (dir, lib)
}
