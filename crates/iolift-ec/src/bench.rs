//! `iolift ec bench`: encode and decode speed (GB/s of data in) of
//! iolift's codec next to its peers, measured in the same run: ISA-L
//! through its own API (its own matrix, its own inversion) and jerasure
//! (reed_sol_van with jerasure_matrix_encode/decode, cauchy_good with
//! jerasure_schedule_encode/decode_lazy), both loaded at run time. Before
//! timing, each peer's parity is compared with iolift's for the same
//! matrix, so the bench also checks bit-exactness.
//!
//! Decode: the first m data chunks are lost and rebuilt from the other
//! k - m data chunks and the m parity chunks. iolift and ISA-L build their
//! decode tables once per erasure pattern (as Ceph's isa plugin caches
//! them); jerasure_matrix_decode inverts on every call, as Ceph's jerasure
//! plugin calls it.

use crate::codec::{Codec, Engine, Plan};
use crate::isal::{EncodeData, InitTables};
use crate::profile::Profile;
use crate::Error;
use libloading::Library;
use std::io::Write;
use std::os::raw::{c_char, c_int};
use std::sync::Barrier;
use std::time::{Duration, Instant};

pub struct BenchOptions {
    pub km: Vec<(usize, usize)>,
    pub sizes: Vec<usize>,
    pub threads: Vec<usize>,
    pub reps: usize,
    pub ms: u64,
    /// Implementation names to run; empty = all that load but
    /// iolift-native (the same kernel as iolift on an AVX2 CPU).
    pub only: Vec<String>,
    /// Time each thread by its own CPU time (Linux CLOCK_THREAD_CPUTIME_ID)
    /// instead of the wall clock: time spent descheduled by other processes
    /// on a busy machine does not count, and the threads' rates add up (the
    /// speed they would have with a core each). Caches and memory are still
    /// shared with whatever else runs.
    pub cpu_clock: bool,
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Seconds of CPU time the calling thread has used.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu_secs() -> f64 {
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: t is a valid timespec (64-bit Linux layout); the clock id is
    // Linux's per-thread CPU clock.
    let r = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    t.sec as f64 + t.nsec as f64 * 1e-9
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu_secs() -> f64 {
    unreachable!("cpu_clock is refused off 64-bit Linux")
}

type GenMatrix = unsafe extern "C" fn(a: *mut u8, m: c_int, k: c_int);
type InvertMatrix = unsafe extern "C" fn(a: *mut u8, out: *mut u8, n: c_int) -> c_int;

/// ISA-L through its own API.
struct IsalPeer {
    gen_rs: GenMatrix,
    invert: InvertMatrix,
    init: InitTables,
    encode: EncodeData,
    _lib: Library,
}

impl IsalPeer {
    fn load() -> Result<IsalPeer, String> {
        // SAFETY: ISA-L's initialisers only set up CPU dispatch; the symbol
        // types match erasure_code.h.
        unsafe {
            let lib = Library::new("libisal.so.2").map_err(|e| e.to_string())?;
            let gen_rs = *lib
                .get::<GenMatrix>(b"gf_gen_rs_matrix\0")
                .map_err(|e| e.to_string())?;
            let invert = *lib
                .get::<InvertMatrix>(b"gf_invert_matrix\0")
                .map_err(|e| e.to_string())?;
            let init = *lib
                .get::<InitTables>(b"ec_init_tables\0")
                .map_err(|e| e.to_string())?;
            let encode = *lib
                .get::<EncodeData>(b"ec_encode_data\0")
                .map_err(|e| e.to_string())?;
            Ok(IsalPeer {
                gen_rs,
                invert,
                init,
                encode,
                _lib: lib,
            })
        }
    }

    fn tables(&self, k: usize, rows: usize, a: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; 32 * k * rows];
        // SAFETY: a is rows x k, t is 32*k*rows.
        unsafe { (self.init)(k as c_int, rows as c_int, a.as_ptr(), t.as_mut_ptr()) };
        t
    }

    /// Encode tables for ISA-L's own Vandermonde matrix.
    fn encode_tables(&self, k: usize, m: usize) -> Vec<u8> {
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: a holds (k+m) x k.
        unsafe { (self.gen_rs)(a.as_mut_ptr(), (k + m) as c_int, k as c_int) };
        self.tables(k, m, &a[k * k..])
    }

    /// Tables rebuilding data chunks 0..m from chunks m..k+m, with ISA-L's
    /// own matrix inversion.
    fn decode_tables(&self, k: usize, m: usize) -> Vec<u8> {
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: as above.
        unsafe { (self.gen_rs)(a.as_mut_ptr(), (k + m) as c_int, k as c_int) };
        let mut sub = a[m * k..(m + k) * k].to_vec();
        let mut inv = vec![0u8; k * k];
        // SAFETY: sub and inv are k x k.
        let r = unsafe { (self.invert)(sub.as_mut_ptr(), inv.as_mut_ptr(), k as c_int) };
        assert_eq!(r, 0, "ISA-L: singular decode matrix");
        self.tables(k, m, &inv[..m * k])
    }

    fn run(&self, t: &[u8], srcs: &[&[u8]], outs: &mut [&mut [u8]]) {
        let sp: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr()).collect();
        let dp: Vec<*mut u8> = outs.iter_mut().map(|s| s.as_mut_ptr()).collect();
        // SAFETY: equal-length distinct buffers; t from tables() for this shape.
        unsafe {
            (self.encode)(
                srcs[0].len() as c_int,
                srcs.len() as c_int,
                outs.len() as c_int,
                t.as_ptr(),
                sp.as_ptr(),
                dp.as_ptr(),
            )
        }
    }
}

type RsMatrix = unsafe extern "C" fn(k: c_int, m: c_int, w: c_int) -> *mut c_int;
type MatrixEncode = unsafe extern "C" fn(
    k: c_int,
    m: c_int,
    w: c_int,
    matrix: *const c_int,
    data: *const *mut c_char,
    coding: *const *mut c_char,
    size: c_int,
);
type MatrixDecode = unsafe extern "C" fn(
    k: c_int,
    m: c_int,
    w: c_int,
    matrix: *const c_int,
    row_k_ones: c_int,
    erasures: *const c_int,
    data: *const *mut c_char,
    coding: *const *mut c_char,
    size: c_int,
) -> c_int;
type ToBitmatrix =
    unsafe extern "C" fn(k: c_int, m: c_int, w: c_int, matrix: *const c_int) -> *mut c_int;
type ToSchedule =
    unsafe extern "C" fn(k: c_int, m: c_int, w: c_int, bitmatrix: *const c_int) -> *mut *mut c_int;
type ScheduleEncode = unsafe extern "C" fn(
    k: c_int,
    m: c_int,
    w: c_int,
    schedule: *const *mut c_int,
    data: *const *mut c_char,
    coding: *const *mut c_char,
    size: c_int,
    packetsize: c_int,
);
type ScheduleDecode = unsafe extern "C" fn(
    k: c_int,
    m: c_int,
    w: c_int,
    bitmatrix: *const c_int,
    erasures: *const c_int,
    data: *const *mut c_char,
    coding: *const *mut c_char,
    size: c_int,
    packetsize: c_int,
    smart: c_int,
) -> c_int;

/// jerasure (libJerasure.so.2, with gf-complete).
struct Jerasure {
    rs_matrix: RsMatrix,
    cauchy_good: RsMatrix,
    encode: MatrixEncode,
    decode: MatrixDecode,
    to_bits: ToBitmatrix,
    to_schedule: ToSchedule,
    sched_encode: ScheduleEncode,
    sched_decode: ScheduleDecode,
    _lib: Library,
}

impl Jerasure {
    fn load() -> Result<Jerasure, String> {
        // SAFETY: the symbol types match jerasure.h, reed_sol.h, cauchy.h.
        unsafe {
            let lib = Library::new("libJerasure.so.2").map_err(|e| e.to_string())?;
            macro_rules! sym {
                ($name:literal) => {
                    *lib.get($name).map_err(|e| e.to_string())?
                };
            }
            Ok(Jerasure {
                rs_matrix: sym!(b"reed_sol_vandermonde_coding_matrix\0"),
                cauchy_good: sym!(b"cauchy_good_general_coding_matrix\0"),
                encode: sym!(b"jerasure_matrix_encode\0"),
                decode: sym!(b"jerasure_matrix_decode\0"),
                to_bits: sym!(b"jerasure_matrix_to_bitmatrix\0"),
                to_schedule: sym!(b"jerasure_smart_bitmatrix_to_schedule\0"),
                sched_encode: sym!(b"jerasure_schedule_encode\0"),
                sched_decode: sym!(b"jerasure_schedule_decode_lazy\0"),
                _lib: lib,
            })
        }
    }
}

/// One stripe's buffers.
struct Stripe {
    data: Vec<Vec<u8>>,
    parity: Vec<Vec<u8>>,
}

impl Stripe {
    fn new(k: usize, m: usize, size: usize, seed: u64) -> Stripe {
        let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        };
        Stripe {
            data: (0..k).map(|_| (0..size).map(|_| rnd()).collect()).collect(),
            parity: vec![vec![0u8; size]; m],
        }
    }
}

/// Runs `f` with the stripe's data chunks as sources and its parity
/// chunks as outputs.
fn encode_with(s: &mut Stripe, f: impl FnOnce(&[&[u8]], &mut [&mut [u8]])) {
    let srcs: Vec<&[u8]> = s.data.iter().map(|d| d.as_slice()).collect();
    let mut o: Vec<&mut [u8]> = s.parity.iter_mut().map(|p| p.as_mut_slice()).collect();
    f(&srcs, &mut o)
}

/// Runs `f` with the k chunks that survive the loss of the first m data
/// chunks (data m..k, then parity) as sources and those m as outputs.
fn decode_with(s: &mut Stripe, m: usize, f: impl FnOnce(&[&[u8]], &mut [&mut [u8]])) {
    let (lost, kept) = s.data.split_at_mut(m);
    let srcs: Vec<&[u8]> = kept
        .iter()
        .chain(s.parity.iter())
        .map(|d| d.as_slice())
        .collect();
    let mut o: Vec<&mut [u8]> = lost.iter_mut().map(|p| p.as_mut_slice()).collect();
    f(&srcs, &mut o)
}

fn ptrs(v: &mut [Vec<u8>]) -> Vec<*mut c_char> {
    v.iter_mut()
        .map(|b| b.as_mut_ptr() as *mut c_char)
        .collect()
}

/// What one implementation does to a stripe, per operation.
type Op<'a> = Box<dyn Fn(&mut Stripe) + Sync + 'a>;

struct Impl<'a> {
    name: &'static str,
    encode: Op<'a>,
    decode: Op<'a>,
}

fn profile(text: &str) -> Profile {
    Profile::parse(text).expect("bench profile")
}

/// Runs `op` on `threads` threads for `ms` each (wall clock, or each
/// thread's CPU time with `cpu`); GB/s of data in.
fn measure(op: &Op, k: usize, m: usize, size: usize, threads: usize, ms: u64, cpu: bool) -> f64 {
    let barrier = Barrier::new(threads);
    if cpu {
        let rates: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let mut st = Stripe::new(k, m, size, t as u64 + 1);
                        op(&mut st);
                        barrier.wait();
                        let start = thread_cpu_secs();
                        let mut n = 0u64;
                        let secs = loop {
                            op(&mut st);
                            n += 1;
                            let e = thread_cpu_secs() - start;
                            if e >= ms as f64 / 1000.0 {
                                break e;
                            }
                        };
                        n as f64 * (k * size) as f64 / secs / 1e9
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        return rates.iter().sum();
    }
    let results: Vec<(u64, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut st = Stripe::new(k, m, size, t as u64 + 1);
                    op(&mut st);
                    barrier.wait();
                    let start = Instant::now();
                    let until = start + Duration::from_millis(ms);
                    let mut n = 0u64;
                    loop {
                        op(&mut st);
                        n += 1;
                        if Instant::now() >= until {
                            break;
                        }
                    }
                    (n, start.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ops: u64 = results.iter().map(|r| r.0).sum();
    let secs = results
        .iter()
        .map(|r| r.1.as_secs_f64())
        .fold(0.0, f64::max);
    ops as f64 * (k * size) as f64 / secs / 1e9
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Errors unless `peer` and `ours` compute the same parity for the same
/// random stripe.
fn same_parity(
    what: &str,
    (k, m, size): (usize, usize, usize),
    peer: &dyn Fn(&mut Stripe),
    ours: &Codec,
) -> Result<(), Error> {
    let mut a = Stripe::new(k, m, size, 99);
    peer(&mut a);
    let mut b = Stripe::new(k, m, size, 99);
    let mut r = Ok(());
    encode_with(&mut b, |d, p| r = ours.encode(d, p));
    r?;
    if a.parity != b.parity {
        return Err(Error::Invalid(format!(
            "bench check: {what} parity differs from iolift's (k={k} m={m} chunk={size})"
        )));
    }
    Ok(())
}

/// iolift's codec as an implementation: encode, and decode with the plan
/// for the first m data chunks lost.
fn ours<'a>(name: &'static str, codec: Codec, m: usize) -> Result<Impl<'a>, Error> {
    let k = codec.profile().k;
    let have: Vec<usize> = (m..k + m).collect();
    let lost: Vec<usize> = (0..m).collect();
    let plan: Plan = codec.recovery_plan(&have, &lost)?;
    Ok(Impl {
        name,
        encode: Box::new(move |s: &mut Stripe| encode_with(s, |d, p| codec.encode(d, p).unwrap())),
        decode: Box::new(move |s: &mut Stripe| decode_with(s, m, |d, p| plan.run(d, p))),
    })
}

/// Builds the implementations for one k, m, chunk size, checking each
/// peer's parity against iolift's for the same matrix.
fn impls<'a>(
    k: usize,
    m: usize,
    size: usize,
    isal: Option<&'a IsalPeer>,
    jer: Option<&'a Jerasure>,
    want: &dyn Fn(&str) -> bool,
) -> Result<Vec<Impl<'a>>, Error> {
    let mut out: Vec<Impl> = Vec::new();
    let shape = (k, m, size);
    // iolift as it runs by default (auto: its own AVX2 kernel where the
    // CPU has AVX2), and with its matrices on ISA-L's kernels.
    let jer_rs = profile(&format!(
        "plugin=jerasure,technique=reed_sol_van,k={k},m={m}"
    ));
    if want("iolift") {
        out.push(ours(
            "iolift",
            Codec::with_engine(&jer_rs, Engine::Auto)?,
            m,
        )?);
    }
    for (name, engine) in [
        ("iolift-native", Engine::Native),
        ("iolift-isal", Engine::Isal),
    ] {
        if want(name) && (engine != Engine::Isal || isal.is_some()) {
            out.push(ours(name, Codec::with_engine(&jer_rs, engine)?, m)?);
        }
    }
    if let Some(isal) = isal.filter(|_| want("isal")) {
        let et = isal.encode_tables(k, m);
        let dt = isal.decode_tables(k, m);
        let enc = move |s: &mut Stripe| encode_with(s, |d, p| isal.run(&et, d, p));
        // ISA-L's own matrix is iolift's isa reed_sol_van.
        let isa = profile(&format!("plugin=isa,k={k},m={m}"));
        same_parity(
            "ISA-L's",
            shape,
            &enc,
            &Codec::with_engine(&isa, Engine::Native)?,
        )?;
        out.push(Impl {
            name: "isal",
            encode: Box::new(enc),
            decode: Box::new(move |s: &mut Stripe| decode_with(s, m, |d, p| isal.run(&dt, d, p))),
        });
    }
    let Some(j) = jer else {
        return Ok(out);
    };
    let (kc, mc, w) = (k as c_int, m as c_int, 8 as c_int);
    let erasures: Vec<c_int> = (0..m as c_int).chain([-1]).collect();
    if want("jerasure") {
        // SAFETY: jerasure allocates and returns an m x k matrix.
        let matrix = unsafe { (j.rs_matrix)(kc, mc, w) };
        if matrix.is_null() {
            return Err(Error::Invalid("jerasure: no coding matrix".into()));
        }
        let mp = matrix as usize;
        let enc = move |s: &mut Stripe| {
            let (d, c) = (ptrs(&mut s.data), ptrs(&mut s.parity));
            // SAFETY: k data and m coding buffers of `size` bytes.
            unsafe {
                (j.encode)(
                    kc,
                    mc,
                    w,
                    mp as *const c_int,
                    d.as_ptr(),
                    c.as_ptr(),
                    size as c_int,
                )
            };
        };
        same_parity(
            "jerasure's",
            shape,
            &enc,
            &Codec::with_engine(&jer_rs, Engine::Native)?,
        )?;
        let er = erasures.clone();
        out.push(Impl {
            name: "jerasure",
            encode: Box::new(enc),
            decode: Box::new(move |s: &mut Stripe| {
                let (d, c) = (ptrs(&mut s.data), ptrs(&mut s.parity));
                // SAFETY: as above; erasures ends with -1.
                let r = unsafe {
                    let mp = mp as *const c_int;
                    (j.decode)(
                        kc,
                        mc,
                        w,
                        mp,
                        1,
                        er.as_ptr(),
                        d.as_ptr(),
                        c.as_ptr(),
                        size as c_int,
                    )
                };
                assert_eq!(r, 0);
            }),
        });
    }
    let ps = (size / 8).min(2048);
    if (want("jerasure-cauchy") || want("iolift-cauchy")) && size.is_multiple_of(64) {
        // SAFETY: jerasure allocates the matrix, bitmatrix and schedule.
        let (bits, sched) = unsafe {
            let mat = (j.cauchy_good)(kc, mc, w);
            let bits = (j.to_bits)(kc, mc, w, mat);
            (bits as usize, (j.to_schedule)(kc, mc, w, bits) as usize)
        };
        let (sz, psc) = (size as c_int, ps as c_int);
        let enc = move |s: &mut Stripe| {
            let (d, c) = (ptrs(&mut s.data), ptrs(&mut s.parity));
            let sched = sched as *const *mut c_int;
            // SAFETY: as above; size is a multiple of 8 * ps.
            unsafe { (j.sched_encode)(kc, mc, w, sched, d.as_ptr(), c.as_ptr(), sz, psc) };
        };
        let cp = profile(&format!(
            "plugin=jerasure,technique=cauchy_good,k={k},m={m},packetsize={ps}"
        ));
        same_parity("jerasure cauchy_good", shape, &enc, &Codec::new(&cp)?)?;
        if want("jerasure-cauchy") {
            out.push(Impl {
                name: "jerasure-cauchy",
                encode: Box::new(enc),
                decode: Box::new(move |s: &mut Stripe| {
                    let (d, c) = (ptrs(&mut s.data), ptrs(&mut s.parity));
                    let (bits, er) = (bits as *const c_int, erasures.as_ptr());
                    // SAFETY: as above.
                    let r = unsafe {
                        (j.sched_decode)(kc, mc, w, bits, er, d.as_ptr(), c.as_ptr(), sz, psc, 1)
                    };
                    assert_eq!(r, 0);
                }),
            });
        }
        if want("iolift-cauchy") {
            out.push(ours("iolift-cauchy", Codec::new(&cp)?, m)?);
        }
    }
    Ok(out)
}

/// Runs the grid and prints one row per cell: the median (and best) GB/s
/// of each implementation, and iolift's ratios to ISA-L and jerasure.
pub fn run(opts: &BenchOptions, out: &mut dyn Write) -> Result<(), Error> {
    if opts.cpu_clock && !cfg!(all(target_os = "linux", target_pointer_width = "64")) {
        return Err(Error::Invalid(
            "bench: --clock cpu needs 64-bit Linux (CLOCK_THREAD_CPUTIME_ID)".into(),
        ));
    }
    let isal = IsalPeer::load();
    let jer = Jerasure::load();
    let io = |e: std::io::Error| Error::Invalid(format!("bench output: {e}"));
    writeln!(
        out,
        "# iolift ec bench: {} reps x {} ms of {} per cell, GB/s of data in (k x chunk bytes per op); isal: {}; jerasure: {}; iolift kernel: {}",
        opts.reps,
        opts.ms,
        if opts.cpu_clock {
            "each thread's CPU time"
        } else {
            "wall clock"
        },
        isal.as_ref().map_or_else(|e| format!("not loaded ({e})"), |_| "libisal.so.2".into()),
        jer.as_ref().map_or_else(|e| format!("not loaded ({e})"), |_| "libJerasure.so.2".into()),
        Codec::new(&profile("plugin=isa,k=4,m=2"))?.kernel(),
    )
    .map_err(io)?;
    writeln!(out, "op\tk\tm\tchunk\tthreads\timpl\tmedian_gbs\tbest_gbs").map_err(io)?;
    // iolift-native is what auto runs on an AVX2 CPU: timed only when named.
    let want = |n: &str| {
        if opts.only.is_empty() {
            n != "iolift-native"
        } else {
            opts.only.iter().any(|o| o == n)
        }
    };
    for &(k, m) in &opts.km {
        for &size in &opts.sizes {
            let list = impls(k, m, size, isal.as_ref().ok(), jer.as_ref().ok(), &want)?;
            for &threads in &opts.threads {
                for op in ["encode", "decode"] {
                    // Repetitions alternate between the implementations
                    // (each rep starts with the next one), so a change in
                    // the machine's load is shared by all of them.
                    let n = list.len();
                    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); n];
                    for rep in 0..opts.reps.max(1) {
                        for i in 0..n {
                            let at = (rep + i) % n;
                            let im = &list[at];
                            let f = if op == "encode" {
                                &im.encode
                            } else {
                                &im.decode
                            };
                            samples[at].push(measure(
                                f,
                                k,
                                m,
                                size,
                                threads,
                                opts.ms,
                                opts.cpu_clock,
                            ));
                        }
                    }
                    let mut rows: Vec<(&str, f64)> = Vec::new();
                    for (im, v) in list.iter().zip(samples.iter_mut()) {
                        let best = v.iter().cloned().fold(0.0, f64::max);
                        let med = median(v);
                        writeln!(
                            out,
                            "{op}\t{k}\t{m}\t{size}\t{threads}\t{}\t{med:.3}\t{best:.3}",
                            im.name
                        )
                        .map_err(io)?;
                        rows.push((im.name, med));
                    }
                    let get = |n: &str| rows.iter().find(|r| r.0 == n).map(|r| r.1);
                    let mut ratios = Vec::new();
                    for (a, b) in [
                        ("iolift", "isal"),
                        ("iolift-native", "isal"),
                        ("iolift-isal", "isal"),
                        ("iolift", "jerasure"),
                        ("isal", "jerasure"),
                        ("iolift-cauchy", "jerasure-cauchy"),
                    ] {
                        if let (Some(x), Some(y)) = (get(a), get(b)) {
                            ratios.push(format!("{a}/{b}={:.2}", x / y));
                        }
                    }
                    writeln!(
                        out,
                        "ratio\t{op}\t{k}\t{m}\t{size}\t{threads}\t{}",
                        ratios.join("\t")
                    )
                    .map_err(io)?;
                }
            }
        }
    }
    match peak_rss_kib() {
        Some(kib) => writeln!(
            out,
            "# peak RSS {:.1} MiB (VmHWM of this process: iolift and the peers it loaded)",
            kib as f64 / 1024.0
        ),
        None => writeln!(out, "# peak RSS: not available (no /proc/self/status)"),
    }
    .map_err(io)?;
    Ok(())
}

/// The process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
