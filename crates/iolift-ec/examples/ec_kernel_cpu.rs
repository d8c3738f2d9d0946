//! Kernel A/B timing on a busy machine: GB/s of data in per second of
//! this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so time the thread
//! spends descheduled by other processes does not count. Encode and decode
//! (first m data chunks lost) with iolift's native kernel and with its
//! matrices on ISA-L's kernels, one thread:
//! `cargo run --release -p iolift-ec --example ec_kernel_cpu -- 8,12 4 4096,65536`.
//! Not a measurement of record (bench/ec.sh is): other processes still
//! share the caches.

use iolift_ec::{Codec, Engine, Profile};

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

fn cpu_secs() -> f64 {
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock 3 is CLOCK_THREAD_CPUTIME_ID on Linux; t is valid.
    let r = unsafe { clock_gettime(3, &mut t) };
    assert_eq!(r, 0);
    t.sec as f64 + t.nsec as f64 * 1e-9
}

fn list(v: &str) -> Vec<usize> {
    v.split(',').map(|x| x.parse().expect("a number")).collect()
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let ks = list(a.first().map_or("8", |s| s));
    let m: usize = a.get(1).map_or(4, |s| s.parse().expect("m"));
    let sizes = list(a.get(2).map_or("4096,65536", |s| s));
    for &k in &ks {
        let p = Profile::parse(&format!(
            "plugin=jerasure,technique=reed_sol_van,k={k},m={m}"
        ))
        .expect("profile");
        for &size in &sizes {
            let data: Vec<Vec<u8>> = (0..k)
                .map(|j| iolift_testkit::random_bytes(size, j as u64 + 1))
                .collect();
            let mut line = format!("k={k} m={m} chunk={size}:");
            for (name, e) in [("native", Engine::Native), ("isal", Engine::Isal)] {
                let Ok(c) = Codec::with_engine(&p, e) else {
                    continue;
                };
                let have: Vec<usize> = (m..k + m).collect();
                let lost: Vec<usize> = (0..m).collect();
                let plan = c.recovery_plan(&have, &lost).expect("plan");
                let mut par = vec![vec![0u8; size]; m];
                let mut out = vec![vec![0u8; size]; m];
                for op in ["enc", "dec"] {
                    let mut best = 0f64;
                    for _ in 0..5 {
                        let (t0, mut n) = (cpu_secs(), 0u64);
                        while cpu_secs() - t0 < 0.05 {
                            for _ in 0..16 {
                                let d: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
                                if op == "enc" {
                                    let mut o: Vec<&mut [u8]> =
                                        par.iter_mut().map(|v| v.as_mut_slice()).collect();
                                    c.encode(&d, &mut o).expect("encode");
                                } else {
                                    let s: Vec<&[u8]> = d[m..]
                                        .iter()
                                        .copied()
                                        .chain(par.iter().map(|v| v.as_slice()))
                                        .collect();
                                    let mut o: Vec<&mut [u8]> =
                                        out.iter_mut().map(|v| v.as_mut_slice()).collect();
                                    plan.run(&s, &mut o);
                                }
                                n += 1;
                            }
                        }
                        let gbs = (n * (k * size) as u64) as f64 / (cpu_secs() - t0) / 1e9;
                        best = best.max(gbs);
                    }
                    line += &format!(" {name}-{op} {best:.2}");
                }
            }
            println!("{line}");
        }
    }
}
