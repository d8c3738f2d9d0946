//! Error type of OSDMap decoding and placement requests.

/// A map that cannot be read or a request that cannot be answered: a
/// clear message naming the field (and byte offset), never a panic.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OsdMapError {
    #[error("rule {0} does not exist in the crush map")]
    NoSuchRule(i32),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("osdmap truncated at byte {offset}: {field} needs {needed} bytes, {left} left")]
    Truncated {
        offset: usize,
        field: String,
        needed: usize,
        left: usize,
    },
    #[error("corrupt osdmap at byte {offset}: {field}: {msg}")]
    Corrupt {
        offset: usize,
        field: String,
        msg: String,
    },
    #[error(
        "unsupported osdmap encoding at byte {offset}: {field} is version {version} ({supported})"
    )]
    Unsupported {
        offset: usize,
        field: String,
        version: u8,
        supported: String,
    },
    #[error("osdmap's embedded crush map (starting at byte {offset}): {err}")]
    Crush {
        offset: usize,
        err: iolift_crush::CrushError,
    },
}

pub type Result<T> = std::result::Result<T, OsdMapError>;
