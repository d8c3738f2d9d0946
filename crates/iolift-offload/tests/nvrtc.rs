//! The CUDA sources compile with NVRTC in CPU-only CI (pip's
//! nvidia-cuda-nvrtc-cu12 wheel needs no GPU or driver): a kernel that does
//! not compile fails here. Also checks the PTX cache and the error path.

use iolift_offload::kernels::crush::{KERNEL_THREAD, KERNEL_WARP, SOURCE};
use iolift_offload::nvrtc::Nvrtc;
use iolift_offload::{cached_ptx, source_hash, CacheHit};

const CRUSH_CU: &str = SOURCE.source;

fn nvrtc() -> Nvrtc {
    Nvrtc::load().unwrap_or_else(|e| {
        panic!("{e}\n(scripts/test.sh installs it: pip install nvidia-cuda-nvrtc-cu12)")
    })
}

#[test]
fn crush_kernels_compile_to_ptx() {
    let n = nvrtc();
    let (maj, _) = n.version().unwrap();
    assert!(maj >= 11, "NVRTC {maj} too old");
    for arch in ["compute_75", "compute_90"] {
        let (ptx, log) = n
            .compile(CRUSH_CU, "crush.cu", arch)
            .unwrap_or_else(|e| panic!("kernels/crush.cu does not compile for {arch}: {e}"));
        for k in [KERNEL_THREAD, KERNEL_WARP] {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{arch}: PTX lacks entry {k}"
            );
        }
        let target = arch.replace("compute_", "sm_");
        assert!(
            ptx.contains(&format!(".target {target}")),
            "{arch}: PTX target"
        );
        assert!(!log.contains("warning"), "{arch}: NVRTC warnings:\n{log}");
        // the warp kernel's reduction really uses shuffles
        assert!(
            ptx.contains("shfl.sync"),
            "{arch}: no warp shuffle in the PTX"
        );
    }
}

/// Every registered kernel (crush today, and each one added later)
/// compiles without warnings and defines its entry points.
#[test]
fn every_registered_kernel_compiles_to_ptx() {
    let n = nvrtc();
    for k in iolift_offload::kernels::ALL {
        for arch in ["compute_75", "compute_90"] {
            let (ptx, log) = n
                .compile(k.source, k.file, arch)
                .unwrap_or_else(|e| panic!("kernels/{} does not compile for {arch}: {e}", k.file));
            for e in k.entries {
                assert!(
                    ptx.contains(&format!(".entry {e}(")),
                    "{} {arch}: PTX lacks entry {e}",
                    k.file
                );
            }
            assert!(
                !log.contains("warning"),
                "{} {arch}: NVRTC warnings:\n{log}",
                k.file
            );
        }
    }
}

/// Through ptxas to sm_90 machine code (still no GPU): resources per kernel.
#[test]
fn crush_kernels_assemble_for_sm_90() {
    let n = nvrtc();
    let (size, log) = n
        .compile_cubin(CRUSH_CU, "crush.cu", "sm_90")
        .unwrap_or_else(|e| panic!("ptxas: {e}"));
    assert!(size > 1000, "CUBIN of {size} bytes");
    let lb6 = format!("{KERNEL_THREAD}_lb6");
    let lb8 = format!("{KERNEL_THREAD}_lb8");
    for k in [KERNEL_THREAD, KERNEL_WARP, &lb6, &lb8] {
        assert!(
            log.contains(&format!("Compiling entry function '{k}' for 'sm_90'")),
            "{log}"
        );
    }
    eprintln!(
        "{}",
        log.lines()
            .filter(|l| l.contains("registers")
                || l.contains("stack frame")
                || l.contains("entry function"))
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn broken_source_reports_the_log() {
    let n = nvrtc();
    let bad = format!("{CRUSH_CU}\n__global__ void broken() {{ undeclared_thing = 1; }}\n");
    let e = n
        .compile(&bad, "bad.cu", "compute_80")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("undeclared_thing"),
        "log should name the error: {e}"
    );
}

#[test]
fn ptx_cache_by_source_hash() {
    let dir = tempfile::tempdir().unwrap();
    // the only test in this binary that reads the cache location
    std::env::set_var("IOLIFT_KERNEL_CACHE", dir.path());
    let src = format!("{CRUSH_CU}\n// cache test {}\n", std::process::id());
    let (p1, h1) = cached_ptx(&src, "crush", "compute_80").unwrap();
    assert_eq!(h1, CacheHit::Compiled);
    let (p2, h2) = cached_ptx(&src, "crush", "compute_80").unwrap();
    assert_eq!(h2, CacheHit::Memory);
    assert_eq!(p1, p2);
    let file = dir
        .path()
        .join(format!("crush-{:016x}-compute_80.ptx", source_hash(&src)));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), *p1);
    assert_ne!(source_hash(&src), source_hash(CRUSH_CU));
}

/// The fixed search finds a pip wheel's library by globbing the Python
/// version directory (no python3 run), highest name first.
#[test]
fn search_globs_wheel_layouts() {
    use iolift_offload::nvrtc::{expand_glob, search_patterns};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    for py in ["python3.10", "python3.11"] {
        let lib = dir
            .path()
            .join(format!("lib/{py}/site-packages/nvidia/cuda_nvrtc/lib"));
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvrtc.so.12"), b"").unwrap();
    }
    std::fs::create_dir_all(dir.path().join("lib/perl5")).unwrap();
    let got = expand_glob(&format!(
        "{root}/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
    ));
    let want: Vec<std::path::PathBuf> = ["python3.11", "python3.10"]
        .iter()
        .map(|py| {
            dir.path().join(format!(
                "lib/{py}/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
            ))
        })
        .collect();
    assert_eq!(got, want);
    assert!(expand_glob(&format!("{root}/lib/python2*/x")).is_empty());
    let pats = search_patterns();
    for p in [
        "/usr/local/lib/python3*/dist-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so.12",
        "libnvrtc.so.12",
    ] {
        assert!(pats.iter().any(|x| x == p), "{p} not searched: {pats:?}");
    }
    if let Ok(h) = std::env::var("HOME") {
        let local =
            format!("{h}/.local/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
        assert!(pats.contains(&local), "{local} not searched");
    }
}

/// Nothing usable: the error lists every pattern tried and the files that
/// exist but do not load.
#[test]
fn load_error_lists_what_was_tried() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libnvrtc.so.12");
    std::fs::write(&fake, b"not a library").unwrap();
    let pats = vec![
        dir.path()
            .join("missing/libnvrtc.so.12")
            .display()
            .to_string(),
        "libnvrtc-iolift-test-absent.so".to_string(),
        fake.display().to_string(),
    ];
    let e = Nvrtc::load_from(&pats)
        .err()
        .expect("nothing loadable")
        .to_string();
    for p in &pats {
        assert!(e.contains(p.as_str()), "{p} missing from: {e}");
    }
    assert!(e.contains("found but unusable"), "{e}");
    assert!(e.contains("IOLIFT_NVRTC"), "{e}");
}
