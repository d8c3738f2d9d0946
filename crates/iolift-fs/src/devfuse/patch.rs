//! What this transport adds to the answers of the shared FUSE session
//! (virtio/session.rs, written for virtio-fs): in the INIT reply the
//! 64-bit flags (FUSE_INIT_EXT), FUSE_OVER_IO_URING when the ring is
//! wanted and the kernel offered it, and FUSE_AUTO_INVAL_DATA with the
//! directory cache; in OPENDIR replies FOPEN_CACHE_DIR and KEEP_CACHE, so
//! that the kernel keeps listings as the fuser front-end lets it.

use super::abi;
use crate::virtio::wire::{self, op};

/// A change to make to one reply, decided from its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patch {
    /// INIT: `ext` and `uring` say what the kernel offered and is wanted.
    Init {
        ext: bool,
        uring: bool,
        auto_inval: bool,
    },
    /// OPENDIR: let the kernel keep the listing.
    CacheDir,
}

/// What the kernel offered in an INIT request (its flags and flags2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offer {
    pub flags: u32,
    pub flags2: u32,
}

impl Offer {
    /// Reads fuse_init_in's flags (and flags2 with FUSE_INIT_EXT) from a
    /// whole INIT request; None if the request is not an INIT or too short.
    pub fn parse(req: &[u8]) -> Option<Offer> {
        if abi::u32_at(req, 4)? != op::INIT {
            return None;
        }
        let flags = abi::u32_at(req, wire::IN_HEADER_LEN + 12)?;
        let flags2 = if flags & abi::INIT_EXT != 0 {
            abi::u32_at(req, wire::IN_HEADER_LEN + 16).unwrap_or(0)
        } else {
            0
        };
        Some(Offer { flags, flags2 })
    }

    /// Whether the kernel offered FUSE_OVER_IO_URING (it does when its
    /// fuse module's enable_uring parameter is on).
    pub fn uring(&self) -> bool {
        self.flags & abi::INIT_EXT != 0 && self.flags2 & abi::OVER_IO_URING2 != 0
    }
}

/// The patch `req` (a whole request) needs, if any.
pub fn for_request(req: &[u8], want_uring: bool, dir_cache: bool) -> Option<Patch> {
    match abi::u32_at(req, 4)? {
        op::INIT => {
            let o = Offer::parse(req)?;
            Some(Patch::Init {
                ext: o.flags & abi::INIT_EXT != 0,
                uring: want_uring && o.uring(),
                auto_inval: dir_cache && o.flags & abi::AUTO_INVAL_DATA != 0,
            })
        }
        op::OPENDIR if dir_cache => Some(Patch::CacheDir),
        _ => None,
    }
}

/// Applies `p` to a whole reply (fuse_out_header plus body); error
/// replies and replies too short for the field are left alone.
pub fn apply(p: Patch, reply: &mut [u8]) {
    if abi::u32_at(reply, 4) != Some(0) {
        return;
    }
    let b = wire::OUT_HEADER_LEN;
    match p {
        Patch::Init {
            ext,
            uring,
            auto_inval,
        } => {
            let mut add = if auto_inval { abi::AUTO_INVAL_DATA } else { 0 };
            let mut add2 = 0;
            if ext {
                add |= abi::INIT_EXT;
                if uring {
                    add2 |= abi::OVER_IO_URING2;
                }
            }
            or_u32(reply, b + 12, add);
            or_u32(reply, b + 32, add2);
        }
        Patch::CacheDir => or_u32(reply, b + 8, abi::FOPEN_CACHE_DIR | abi::FOPEN_KEEP_CACHE),
    }
}

fn or_u32(buf: &mut [u8], off: usize, bits: u32) {
    if let Some(v) = abi::u32_at(buf, off) {
        buf[off..off + 4].copy_from_slice(&(v | bits).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init_req(flags: u32, flags2: u32) -> Vec<u8> {
        let mut r = vec![0u8; wire::IN_HEADER_LEN + 64];
        let len = r.len() as u32;
        r[0..4].copy_from_slice(&len.to_le_bytes());
        r[4..8].copy_from_slice(&op::INIT.to_le_bytes());
        r[40..44].copy_from_slice(&7u32.to_le_bytes());
        r[44..48].copy_from_slice(&45u32.to_le_bytes());
        r[52..56].copy_from_slice(&flags.to_le_bytes());
        r[56..60].copy_from_slice(&flags2.to_le_bytes());
        r
    }

    #[test]
    fn init_gets_uring_only_when_offered_and_wanted() {
        let offered = init_req(abi::INIT_EXT | abi::AUTO_INVAL_DATA, abi::OVER_IO_URING2);
        assert!(Offer::parse(&offered).unwrap().uring());
        let p = for_request(&offered, true, true).unwrap();
        let mut rep = vec![0u8; 16 + 64];
        apply(p, &mut rep);
        assert_eq!(
            abi::u32_at(&rep, 16 + 12),
            Some(abi::INIT_EXT | abi::AUTO_INVAL_DATA)
        );
        assert_eq!(abi::u32_at(&rep, 16 + 32), Some(abi::OVER_IO_URING2));
        // Not wanted: no flags2 bit.
        let mut rep = vec![0u8; 16 + 64];
        apply(for_request(&offered, false, false).unwrap(), &mut rep);
        assert_eq!(abi::u32_at(&rep, 16 + 12), Some(abi::INIT_EXT));
        assert_eq!(abi::u32_at(&rep, 16 + 32), Some(0));
        // Not offered (flags2 without FUSE_INIT_EXT means nothing).
        let plain = init_req(0, abi::OVER_IO_URING2);
        assert!(!Offer::parse(&plain).unwrap().uring());
        let mut rep = vec![0u8; 16 + 64];
        apply(for_request(&plain, true, false).unwrap(), &mut rep);
        assert!(rep.iter().all(|&b| b == 0));
    }

    #[test]
    fn opendir_and_errors() {
        let mut req = vec![0u8; 48];
        req[4..8].copy_from_slice(&op::OPENDIR.to_le_bytes());
        assert_eq!(for_request(&req, true, false), None);
        let p = for_request(&req, true, true).unwrap();
        let mut rep = vec![0u8; 16 + 16];
        apply(p, &mut rep);
        assert_eq!(
            abi::u32_at(&rep, 24),
            Some(abi::FOPEN_CACHE_DIR | abi::FOPEN_KEEP_CACHE)
        );
        let mut err = vec![0u8; 16];
        err[4..8].copy_from_slice(&(-2i32).to_le_bytes());
        apply(p, &mut err);
        assert_eq!(abi::u32_at(&err, 4), Some((-2i32) as u32));
        // A truncated request is no INIT.
        assert_eq!(Offer::parse(&req[..6]), None);
    }
}
