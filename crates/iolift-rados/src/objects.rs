//! Object calls on a pool ([`IoCtx`]): whole-object data, xattrs and omap,
//! all synchronous. Each returns librados's errno (positive) on failure,
//! so a file system can hand it on as it is. Object names and omap keys
//! with a NUL byte cannot be passed to librados: they fail with EINVAL.

use crate::api::{Handle, RadosApi};
use crate::cluster::IoCtx;
use std::ffi::{c_char, c_int, c_uchar, CStr, CString};
use std::ptr;

/// Key/value pairs of an omap.
pub type OmapPairs = Vec<(Vec<u8>, Vec<u8>)>;

fn c(b: &[u8]) -> Result<CString, i32> {
    CString::new(b).map_err(|_| libc::EINVAL)
}

fn check(r: c_int) -> Result<c_int, i32> {
    if r < 0 {
        Err(-r)
    } else {
        Ok(r)
    }
}

impl IoCtx {
    /// Reads up to `buf.len()` bytes at `off` of `oid`; the count read.
    pub fn read(&self, oid: &str, buf: &mut [u8], off: u64) -> Result<usize, i32> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context; the buffer's length is passed.
        let r = unsafe {
            (self.api().rados_read)(
                self.handle(),
                o.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
                off,
            )
        };
        check(r).map(|n| n as usize)
    }

    pub fn write(&self, oid: &str, data: &[u8], off: u64) -> Result<(), i32> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context; the data's length is passed.
        let r = unsafe {
            (self.api().rados_write)(
                self.handle(),
                o.as_ptr(),
                data.as_ptr() as *const c_char,
                data.len(),
                off,
            )
        };
        check(r).map(drop)
    }

    pub fn trunc(&self, oid: &str, size: u64) -> Result<(), i32> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context and name.
        check(unsafe { (self.api().rados_trunc)(self.handle(), o.as_ptr(), size) }).map(drop)
    }

    pub fn remove(&self, oid: &str) -> Result<(), i32> {
        let o = c(oid.as_bytes())?;
        // SAFETY: valid context and name.
        check(unsafe { (self.api().rados_remove)(self.handle(), o.as_ptr()) }).map(drop)
    }

    /// An xattr of `oid` (at most 64 bytes).
    pub fn getxattr(&self, oid: &str, name: &str) -> Result<Vec<u8>, i32> {
        let (o, n) = (c(oid.as_bytes())?, c(name.as_bytes())?);
        let mut buf = [0u8; 64];
        // SAFETY: valid context; the buffer's length is passed.
        let r = unsafe {
            (self.api().rados_getxattr)(
                self.handle(),
                o.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
            )
        };
        let n = check(r)? as usize;
        Ok(buf[..n.min(buf.len())].to_vec())
    }

    pub fn setxattr(&self, oid: &str, name: &str, value: &[u8]) -> Result<(), i32> {
        let (o, n) = (c(oid.as_bytes())?, c(name.as_bytes())?);
        // SAFETY: valid context; the value's length is passed.
        let r = unsafe {
            (self.api().rados_setxattr)(
                self.handle(),
                o.as_ptr(),
                n.as_ptr(),
                value.as_ptr() as *const c_char,
                value.len(),
            )
        };
        check(r).map(drop)
    }

    /// Sets the `set` keys and removes the `rm` keys of `oid`'s omap in
    /// one atomic operation (creating the object if needed).
    pub fn omap_update(&self, oid: &str, set: &[(&[u8], &[u8])], rm: &[&[u8]]) -> Result<(), i32> {
        let api = self.api();
        let o = c(oid.as_bytes())?;
        let keys: Vec<CString> = set.iter().map(|(k, _)| c(k)).collect::<Result<_, _>>()?;
        let rmk: Vec<CString> = rm.iter().map(|k| c(k)).collect::<Result<_, _>>()?;
        let kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let vp: Vec<*const c_char> = set
            .iter()
            .map(|(_, v)| v.as_ptr() as *const c_char)
            .collect();
        let lens: Vec<usize> = set.iter().map(|(_, v)| v.len()).collect();
        let rp: Vec<*const c_char> = rmk.iter().map(|k| k.as_ptr()).collect();
        // SAFETY: the op is created, filled with pointers that outlive
        // operate (the vectors above), run once and released once.
        unsafe {
            let op = (api.rados_create_write_op)();
            if op.is_null() {
                return Err(libc::ENOMEM);
            }
            if !set.is_empty() {
                (api.rados_write_op_omap_set)(
                    op,
                    kp.as_ptr(),
                    vp.as_ptr(),
                    lens.as_ptr(),
                    kp.len(),
                );
            }
            if !rm.is_empty() {
                (api.rados_write_op_omap_rm_keys)(op, rp.as_ptr(), rp.len());
            }
            let r = (api.rados_write_op_operate)(op, self.handle(), o.as_ptr(), ptr::null_mut(), 0);
            (api.rados_release_write_op)(op);
            check(r).map(drop)
        }
    }

    /// The value of omap key `key` of `oid`, `None` if the key (or the
    /// object) does not exist.
    pub fn omap_get(&self, oid: &str, key: &[u8]) -> Result<Option<Vec<u8>>, i32> {
        let k = c(key)?;
        let kp = [k.as_ptr()];
        let got = self.read_omap(oid, |api, op, iter, rval| {
            // SAFETY: called by read_omap on a live op with out-pointers.
            unsafe { (api.rados_read_op_omap_get_vals_by_keys)(op, kp.as_ptr(), 1, iter, rval) }
        })?;
        Ok(got.into_iter().find(|(kk, _)| kk == key).map(|(_, v)| v))
    }

    /// At most `max` omap pairs of `oid` after key `after` (from the
    /// start if `None`), in key order, and whether more follow.
    pub fn omap_list(
        &self,
        oid: &str,
        after: Option<&[u8]>,
        max: u64,
    ) -> Result<(OmapPairs, bool), i32> {
        let a = after.map(c).transpose()?;
        let empty = CString::default();
        let mut more: c_uchar = 0;
        let pm: *mut c_uchar = &mut more;
        let got = self.read_omap(oid, |api, op, iter, rval| {
            // SAFETY: called by read_omap on a live op; strings outlive it.
            unsafe {
                (api.rados_read_op_omap_get_vals2)(
                    op,
                    a.as_ref().unwrap_or(&empty).as_ptr(),
                    empty.as_ptr(),
                    max,
                    iter,
                    pm,
                    rval,
                )
            }
        })?;
        Ok((got, more != 0))
    }

    /// Runs a read op with one omap step added by `add` and collects the
    /// pairs its iterator yields; a missing object reads as no pairs.
    fn read_omap(
        &self,
        oid: &str,
        add: impl FnOnce(&'static RadosApi, Handle, *mut Handle, *mut c_int),
    ) -> Result<OmapPairs, i32> {
        let api = self.api();
        let o = c(oid.as_bytes())?;
        let mut out = Vec::new();
        // SAFETY: the op is created, run once and released once; the
        // iterator is read only after a successful operate and ended once.
        unsafe {
            let op = (api.rados_create_read_op)();
            if op.is_null() {
                return Err(libc::ENOMEM);
            }
            let mut iter: Handle = ptr::null_mut();
            let mut rval: c_int = 0;
            add(api, op, &mut iter, &mut rval);
            let r = (api.rados_read_op_operate)(op, self.handle(), o.as_ptr(), 0);
            if r < 0 || rval < 0 {
                // The iterator is allocated when the step is added: end
                // it on every path.
                if !iter.is_null() {
                    (api.rados_omap_get_end)(iter);
                }
                (api.rados_release_read_op)(op);
                if r == -libc::ENOENT {
                    return Ok(out);
                }
                return Err(-(if r < 0 { r } else { rval }));
            }
            loop {
                let (mut k, mut v, mut len) = (ptr::null_mut(), ptr::null_mut(), 0usize);
                if (api.rados_omap_get_next)(iter, &mut k, &mut v, &mut len) < 0 || k.is_null() {
                    break;
                }
                let key = CStr::from_ptr(k).to_bytes().to_vec();
                let val = if v.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(v as *const u8, len).to_vec()
                };
                out.push((key, val));
            }
            (api.rados_omap_get_end)(iter);
            (api.rados_release_read_op)(op);
        }
        Ok(out)
    }
}
