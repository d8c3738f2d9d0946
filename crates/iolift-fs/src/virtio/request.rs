//! Decoding one FUSE request (fuse_in_header plus the operation's
//! arguments) from the bytes of a virtqueue element. Every length and
//! field is checked: a malformed request decodes to an error that names
//! what was wrong (answered with EINVAL, or ENOSYS for an unknown opcode),
//! never to a panic.

use super::wire::{self, op, In};
use crate::model::{Ctx, SetAttr, TimeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// fuse_in_header.
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Header {
    pub fn ctx(&self) -> Ctx {
        Ctx {
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
        }
    }
}

/// One request's arguments, borrowing names and data from the bytes read.
#[derive(Debug)]
pub enum Request<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u32,
    },
    Destroy,
    Lookup {
        name: &'a OsStr,
    },
    Forget {
        nlookup: u64,
    },
    BatchForget {
        nodes: Vec<(u64, u64)>,
    },
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetAttr),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        name: &'a OsStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a OsStr,
        newname: &'a OsStr,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open {
        flags: u32,
    },
    Opendir {
        flags: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
    },
    Write {
        fh: u64,
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release {
        fh: u64,
        dir: bool,
    },
    Fsync {
        fh: u64,
        datasync: bool,
        dir: bool,
    },
    Flush {
        fh: u64,
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: u32,
    },
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Access {
        mask: u32,
    },
    Create {
        name: &'a OsStr,
        flags: u32,
        mode: u32,
        umask: u32,
    },
    Interrupt,
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        fh: u64,
        offset: u64,
        whence: u32,
    },
    CopyFileRange {
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    },
    /// An opcode this server does not serve (answered ENOSYS).
    Unknown,
}

/// Why a request could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

fn short(what: &str) -> DecodeError {
    DecodeError(format!("{what}: request too short or malformed"))
}

/// Reads the header; `bytes` is the whole device-readable part.
pub fn header(bytes: &[u8]) -> Result<Header, DecodeError> {
    let mut r = In::new(bytes);
    let h = (|| {
        Some(Header {
            len: r.u32()?,
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
        })
    })()
    .ok_or_else(|| short("fuse_in_header"))?;
    if (h.len as usize) < wire::IN_HEADER_LEN || h.len as usize > bytes.len() {
        return Err(DecodeError(format!(
            "fuse_in_header.len {} outside {}..={} (the bytes the request carries)",
            h.len,
            wire::IN_HEADER_LEN,
            bytes.len()
        )));
    }
    Ok(h)
}

fn name(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Decodes the arguments that follow the header. `body` is the request
/// after the header, up to the header's `len`.
pub fn decode<'a>(h: &Header, body: &'a [u8]) -> Result<Request<'a>, DecodeError> {
    let mut r = In::new(body);
    let what = opname(h.opcode);
    let req = parse(h.opcode, &mut r).ok_or_else(|| short(what))?;
    Ok(req)
}

fn parse<'a>(opcode: u32, r: &mut In<'a>) -> Option<Request<'a>> {
    Some(match opcode {
        op::INIT => {
            let (major, minor, max_readahead, flags) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
            Request::Init {
                major,
                minor,
                max_readahead,
                flags,
            }
        }
        op::DESTROY => Request::Destroy,
        op::LOOKUP => Request::Lookup {
            name: name(r.cstr()?),
        },
        op::FORGET => Request::Forget { nlookup: r.u64()? },
        op::BATCH_FORGET => {
            let count = r.u32()? as usize;
            r.skip(4)?;
            // Each entry is 16 bytes: a count larger than the body is bad.
            if count > r.rest_len() / 16 {
                return None;
            }
            let mut nodes = Vec::with_capacity(count);
            for _ in 0..count {
                nodes.push((r.u64()?, r.u64()?));
            }
            Request::BatchForget { nodes }
        }
        op::GETATTR => {
            let (flags, _, fh) = (r.u32()?, r.u32()?, r.u64()?);
            Request::Getattr {
                fh: (flags & wire::GETATTR_FH != 0).then_some(fh),
            }
        }
        op::SETATTR => Request::Setattr(setattr(r)?),
        op::READLINK => Request::Readlink,
        op::SYMLINK => {
            let n = name(r.cstr()?);
            Request::Symlink {
                name: n,
                target: name(r.cstr()?),
            }
        }
        op::MKNOD => {
            let (mode, rdev, umask, _) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
            Request::Mknod {
                name: name(r.cstr()?),
                mode,
                rdev,
                umask,
            }
        }
        op::MKDIR => {
            let (mode, umask) = (r.u32()?, r.u32()?);
            Request::Mkdir {
                name: name(r.cstr()?),
                mode,
                umask,
            }
        }
        op::UNLINK => Request::Unlink {
            name: name(r.cstr()?),
        },
        op::RMDIR => Request::Rmdir {
            name: name(r.cstr()?),
        },
        op::RENAME | op::RENAME2 => {
            let newdir = r.u64()?;
            let flags = if opcode == op::RENAME2 {
                let f = r.u32()?;
                r.skip(4)?;
                f
            } else {
                0
            };
            let n = name(r.cstr()?);
            Request::Rename {
                newdir,
                flags,
                name: n,
                newname: name(r.cstr()?),
            }
        }
        op::LINK => {
            let oldnodeid = r.u64()?;
            Request::Link {
                oldnodeid,
                newname: name(r.cstr()?),
            }
        }
        op::OPEN | op::OPENDIR => {
            let (flags, _open_flags) = (r.u32()?, r.u32()?);
            if opcode == op::OPEN {
                Request::Open { flags }
            } else {
                Request::Opendir { flags }
            }
        }
        op::READ | op::READDIR | op::READDIRPLUS => {
            let (fh, offset, size) = (r.u64()?, r.u64()?, r.u32()?);
            if opcode == op::READ {
                Request::Read { fh, offset, size }
            } else {
                Request::Readdir {
                    fh,
                    offset,
                    size,
                    plus: opcode == op::READDIRPLUS,
                }
            }
        }
        op::WRITE => {
            let (fh, offset, size, write_flags) = (r.u64()?, r.u64()?, r.u32()?, r.u32()?);
            r.skip(16)?; // lock_owner, flags, padding
            let data = r.bytes(size as usize)?;
            Request::Write {
                fh,
                offset,
                write_flags,
                data,
            }
        }
        op::STATFS => Request::Statfs,
        op::RELEASE | op::RELEASEDIR => Request::Release {
            fh: r.u64()?,
            dir: opcode == op::RELEASEDIR,
        },
        op::FSYNC | op::FSYNCDIR => {
            let (fh, flags) = (r.u64()?, r.u32()?);
            Request::Fsync {
                fh,
                datasync: flags & wire::FSYNC_FDATASYNC != 0,
                dir: opcode == op::FSYNCDIR,
            }
        }
        op::FLUSH => Request::Flush { fh: r.u64()? },
        op::SETXATTR => {
            // Without FUSE_SETXATTR_EXT (not negotiated) the header is 8 bytes.
            let (size, flags) = (r.u32()?, r.u32()?);
            let n = name(r.cstr()?);
            Request::Setxattr {
                name: n,
                value: r.bytes(size as usize)?,
                flags,
            }
        }
        op::GETXATTR => {
            let (size, _) = (r.u32()?, r.u32()?);
            Request::Getxattr {
                name: name(r.cstr()?),
                size,
            }
        }
        op::LISTXATTR => {
            let (size, _) = (r.u32()?, r.u32()?);
            Request::Listxattr { size }
        }
        op::REMOVEXATTR => Request::Removexattr {
            name: name(r.cstr()?),
        },
        op::ACCESS => Request::Access { mask: r.u32()? },
        op::CREATE => {
            let (flags, mode, umask, _) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
            Request::Create {
                name: name(r.cstr()?),
                flags,
                mode,
                umask,
            }
        }
        op::INTERRUPT => Request::Interrupt,
        op::FALLOCATE => {
            let (fh, offset, length, mode) = (r.u64()?, r.u64()?, r.u64()?, r.u32()?);
            Request::Fallocate {
                fh,
                offset,
                length,
                mode,
            }
        }
        op::LSEEK => {
            let (fh, offset, whence) = (r.u64()?, r.u64()?, r.u32()?);
            Request::Lseek { fh, offset, whence }
        }
        op::COPY_FILE_RANGE => {
            let (fh_in, off_in, _nodeid_out) = (r.u64()?, r.u64()?, r.u64()?);
            let (fh_out, off_out, len, flags) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            Request::CopyFileRange {
                fh_in,
                off_in,
                fh_out,
                off_out,
                len,
                flags,
            }
        }
        _ => Request::Unknown,
    })
}

fn setattr(r: &mut In) -> Option<SetAttr> {
    let valid = r.u32()?;
    r.skip(4)?;
    let (fh, size, _lock_owner) = (r.u64()?, r.u64()?, r.u64()?);
    let (atime, mtime, _ctime) = (r.u64()?, r.u64()?, r.u64()?);
    let (atimensec, mtimensec, _ctimensec) = (r.u32()?, r.u32()?, r.u32()?);
    let (mode, _, uid, gid) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    use wire::fattr as f;
    let has = |bit: u32| valid & bit != 0;
    let t = |set: u32, now: u32, s: u64, ns: u32| {
        if has(now) {
            Some(TimeSet::Now)
        } else if has(set) {
            Some(TimeSet::At(crate::model::epoch_time(s, ns)))
        } else {
            None
        }
    };
    Some(SetAttr {
        mode: has(f::MODE).then_some(mode),
        uid: has(f::UID).then_some(uid),
        gid: has(f::GID).then_some(gid),
        size: has(f::SIZE).then_some(size),
        atime: t(f::ATIME, f::ATIME_NOW, atime, atimensec),
        mtime: t(f::MTIME, f::MTIME_NOW, mtime, mtimensec),
        fh: has(f::FH).then_some(fh),
    })
}

/// The operation's name, as the metrics label it.
pub fn opname(opcode: u32) -> &'static str {
    match opcode {
        op::LOOKUP => "lookup",
        op::FORGET | op::BATCH_FORGET => "forget",
        op::GETATTR => "getattr",
        op::SETATTR => "setattr",
        op::READLINK => "readlink",
        op::SYMLINK => "symlink",
        op::MKNOD => "mknod",
        op::MKDIR => "mkdir",
        op::UNLINK => "unlink",
        op::RMDIR => "rmdir",
        op::RENAME | op::RENAME2 => "rename",
        op::LINK => "link",
        op::OPEN => "open",
        op::READ => "read",
        op::WRITE => "write",
        op::FLUSH => "flush",
        op::RELEASE => "release",
        op::FSYNC => "fsync",
        op::OPENDIR => "opendir",
        op::READDIR => "readdir",
        op::READDIRPLUS => "readdirplus",
        op::RELEASEDIR => "releasedir",
        op::FSYNCDIR => "fsyncdir",
        op::STATFS => "statfs",
        op::SETXATTR => "setxattr",
        op::GETXATTR => "getxattr",
        op::LISTXATTR => "listxattr",
        op::REMOVEXATTR => "removexattr",
        op::ACCESS => "access",
        op::CREATE => "create",
        op::FALLOCATE => "fallocate",
        op::LSEEK => "lseek",
        op::COPY_FILE_RANGE => "copy_file_range",
        _ => "other",
    }
}
