//! The parts of the kernel's FUSE-over-io_uring ABI (include/uapi/linux/
//! fuse.h, Linux 6.14 and later) this transport uses, declared here as
//! offsets and constants: the ring entry's header buffer, the command
//! that goes in a 128-byte SQE, and the INIT flags that turn it on.

/// `FUSE_IO_URING_CMD_REGISTER`: hands the kernel one ring entry (a
/// header buffer and a payload buffer); it completes when a request has
/// been written into them.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: the reply for `commit_id` is in
/// the entry's buffers; complete again with the next request.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out` (fuse_in_header in, then
/// fuse_out_header back), `op_in` (the operation's fixed arguments),
/// then `struct fuse_uring_ent_in_out`.
pub const HEADER_BUF_LEN: usize = 128 + 128 + 32;
pub const IN_OUT_OFF: usize = 0;
pub const OP_IN_OFF: usize = 128;
pub const OP_IN_LEN: usize = 128;
const ENT_IN_OUT_OFF: usize = 256;
/// fuse_uring_ent_in_out.commit_id: the request's unique, to give back.
pub const COMMIT_ID_OFF: usize = ENT_IN_OUT_OFF + 8;
/// fuse_uring_ent_in_out.payload_sz: bytes in the payload buffer (the
/// request's variable arguments in, the reply's body back).
pub const PAYLOAD_SZ_OFF: usize = ENT_IN_OUT_OFF + 16;

/// An SQE's `len`: the two iovecs (header, payload) of a REGISTER.
pub const IOV_SEGS: u32 = 2;

/// fuse_init_in/out `flags`: FUSE_INIT_EXT (flags2 is valid).
pub const INIT_EXT: u32 = 1 << 30;
/// fuse_init_in/out `flags`: FUSE_AUTO_INVAL_DATA.
pub const AUTO_INVAL_DATA: u32 = 1 << 12;
/// fuse_init_in/out `flags2`: FUSE_OVER_IO_URING (bit 41 of the 64-bit flags).
pub const OVER_IO_URING2: u32 = 1 << (41 - 32);
/// fuse_open_out `open_flags`: FOPEN_KEEP_CACHE and FOPEN_CACHE_DIR.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;

/// `struct fuse_uring_cmd_req` in the SQE's 80-byte command area:
/// flags (u64, 0), commit_id (u64), qid (u16), padding.
pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

/// Reads a little-endian u32 at `off` (None past the end).
pub fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Reads a little-endian u64 at `off` (None past the end).
pub fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmd_req_layout() {
        let c = cmd_req(0x0102_0304_0506_0708, 3);
        assert_eq!(&c[0..8], &[0; 8]);
        assert_eq!(u64_at(&c, 8), Some(0x0102_0304_0506_0708));
        assert_eq!(&c[16..18], &[3, 0]);
        assert!(c[18..].iter().all(|&b| b == 0));
        assert_eq!(u32_at(&c, 78), None);
    }
}
