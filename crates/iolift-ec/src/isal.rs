//! ISA-L (Intel's Intelligent Storage Acceleration Library), loaded at run
//! time from `libisal.so.2` so that iolift builds and runs without it.
//! `ec_encode_data` multiplies any GF(2^8) matrix by the source chunks with
//! ISA-L's SIMD kernels, so jerasure's matrices run on it as well as ISA-L's
//! own.

use libloading::Library;
use std::os::raw::c_int;
use std::sync::OnceLock;

pub(crate) type InitTables =
    unsafe extern "C" fn(k: c_int, rows: c_int, a: *const u8, gftbls: *mut u8);
pub(crate) type EncodeData = unsafe extern "C" fn(
    len: c_int,
    k: c_int,
    rows: c_int,
    gftbls: *const u8,
    data: *const *const u8,
    coding: *const *mut u8,
);

/// The loaded library and the two entry points iolift uses.
pub struct Isal {
    init_tables: InitTables,
    encode_data: EncodeData,
    _lib: Library,
}

/// File names tried in order; `IOLIFT_ISAL` names another.
const NAMES: &[&str] = &["libisal.so.2", "libisal.so"];

impl Isal {
    fn load() -> Result<Isal, String> {
        let names: Vec<String> = match std::env::var("IOLIFT_ISAL") {
            Ok(v) if !v.is_empty() => vec![v],
            _ => NAMES.iter().map(|s| s.to_string()).collect(),
        };
        let mut last = String::new();
        for name in &names {
            // SAFETY: loading a shared library runs its initialisers; ISA-L's
            // only set up CPU dispatch.
            match unsafe { Library::new(name) } {
                Ok(lib) => {
                    // SAFETY: the symbol types match ISA-L's erasure_code.h.
                    let (init_tables, encode_data) = unsafe {
                        let i = lib.get::<InitTables>(b"ec_init_tables\0");
                        let e = lib.get::<EncodeData>(b"ec_encode_data\0");
                        match (i, e) {
                            (Ok(i), Ok(e)) => (*i, *e),
                            _ => {
                                last = format!("{name}: ec_init_tables/ec_encode_data missing");
                                continue;
                            }
                        }
                    };
                    return Ok(Isal {
                        init_tables,
                        encode_data,
                        _lib: lib,
                    });
                }
                Err(e) => last = format!("{name}: {e}"),
            }
        }
        Err(last)
    }

    /// The process-wide instance, loaded on first use; Err says why not.
    /// `IOLIFT_ISAL=off` disables it.
    pub fn get() -> Result<&'static Isal, &'static str> {
        static ONCE: OnceLock<Result<Isal, String>> = OnceLock::new();
        ONCE.get_or_init(|| {
            if std::env::var("IOLIFT_ISAL").as_deref() == Ok("off") {
                return Err("disabled by IOLIFT_ISAL=off".into());
            }
            Isal::load()
        })
        .as_ref()
        .map_err(|e| e.as_str())
    }

    /// ISA-L's expanded tables (32 bytes per coefficient) for a rows x k
    /// matrix.
    pub fn tables(&self, k: usize, rows: usize, coeffs: &[u8]) -> Vec<u8> {
        assert_eq!(coeffs.len(), k * rows);
        let mut t = vec![0u8; 32 * k * rows];
        // SAFETY: coeffs holds k*rows bytes and t the 32*k*rows ISA-L writes.
        unsafe { (self.init_tables)(k as c_int, rows as c_int, coeffs.as_ptr(), t.as_mut_ptr()) };
        t
    }

    /// outs[i] = sum_j coeffs[i][j] * srcs[j] with tables from `tables`.
    pub fn encode(&self, tables: &[u8], srcs: &[&[u8]], outs: &mut [&mut [u8]]) {
        let k = srcs.len();
        let rows = outs.len();
        assert_eq!(tables.len(), 32 * k * rows);
        let len = srcs.first().map_or(0, |s| s.len());
        assert!(srcs.iter().all(|s| s.len() == len));
        assert!(outs.iter().all(|s| s.len() == len));
        assert!(len <= c_int::MAX as usize);
        if len == 0 || rows == 0 {
            return;
        }
        // Pointer arrays on the stack for the usual sizes: no allocation
        // per call (this runs once per stripe).
        let mut sbuf = [std::ptr::null::<u8>(); 32];
        let mut dbuf = [std::ptr::null_mut::<u8>(); 32];
        let (sv, dv): (Vec<*const u8>, Vec<*mut u8>);
        let (sp, dp): (&[*const u8], &[*mut u8]) = if k <= 32 && rows <= 32 {
            for (p, s) in sbuf.iter_mut().zip(srcs) {
                *p = s.as_ptr();
            }
            for (p, o) in dbuf.iter_mut().zip(outs.iter_mut()) {
                *p = o.as_mut_ptr();
            }
            (&sbuf[..k], &dbuf[..rows])
        } else {
            sv = srcs.iter().map(|s| s.as_ptr()).collect();
            dv = outs.iter_mut().map(|s| s.as_mut_ptr()).collect();
            (&sv, &dv)
        };
        // SAFETY: k source and `rows` output pointers, each valid for len
        // bytes; the outputs do not overlap the sources (distinct borrows).
        unsafe {
            (self.encode_data)(
                len as c_int,
                k as c_int,
                rows as c_int,
                tables.as_ptr(),
                sp.as_ptr(),
                dp.as_ptr(),
            )
        };
    }
}
