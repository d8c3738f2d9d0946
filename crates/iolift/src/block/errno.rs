use std::fmt;

/// A positive POSIX errno value carried by a failed request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);
    pub const ENOTSUP: Errno = Errno(libc::ENOTSUP);
    pub const ESHUTDOWN: Errno = Errno(libc::ESHUTDOWN);

    /// The errno of an `std::io::Error`, EIO when it has none.
    pub fn from_io(e: &std::io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            libc::EPERM => "EPERM",
            libc::EIO => "EIO",
            libc::ENOMEM => "ENOMEM",
            libc::EINVAL => "EINVAL",
            libc::ENOSPC => "ENOSPC",
            libc::EOVERFLOW => "EOVERFLOW",
            libc::ENOTSUP => "ENOTSUP",
            libc::ESHUTDOWN => "ESHUTDOWN",
            libc::EROFS => "EROFS",
            libc::EAGAIN => "EAGAIN",
            libc::ETIMEDOUT => "ETIMEDOUT",
            _ => "errno",
        }
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno::from_io(&e)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            std::io::Error::from_raw_os_error(self.0),
            self.name()
        )
    }
}

impl std::error::Error for Errno {}
