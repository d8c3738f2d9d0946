//! Errors: every one names what was wrong (the field, the entry, the
//! cluster), so a bad image is diagnosable from the message alone.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The image's metadata contradicts itself or the file (bad offsets,
    /// a cluster past the end of the file, a refcount underflow).
    #[error("corrupt qcow2 image: {0}")]
    Corrupt(String),
    /// A valid image using something this implementation does not do.
    #[error("unsupported qcow2 image: {0}")]
    Unsupported(String),
    /// A bad argument from the caller (a range past the end, ...).
    #[error("{0}")]
    Invalid(String),
    /// A write to an image opened read-only.
    #[error("qcow2 image is read-only: {0}")]
    ReadOnly(String),
    #[error("{ctx}: {source}")]
    Io {
        ctx: String,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno a block device reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Corrupt(_) => libc::EIO,
            Error::Unsupported(_) => libc::ENOTSUP,
            Error::Invalid(_) => libc::EINVAL,
            Error::ReadOnly(_) => libc::EPERM,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// `map_err(io_ctx("reading the L1 table"))`.
pub fn io_ctx(ctx: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let ctx = ctx.into();
    move |source| Error::Io { ctx, source }
}

pub fn corrupt<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt(msg.into()))
}
