//! Error type for map decoding and mapping requests.

/// Everything that can go wrong decoding a map or running a rule.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CrushError {
    #[error("crush map truncated at byte {offset}: {what} needs {needed} bytes, {left} left")]
    Truncated {
        offset: usize,
        what: String,
        needed: usize,
        left: usize,
    },
    #[error("not a crush map: bad magic {0:#010x} (expected 0x00010000)")]
    BadMagic(u32),
    #[error("corrupt crush map at byte {offset}: {msg}")]
    Corrupt { offset: usize, msg: String },
    #[error("rule {0} does not exist in the crush map")]
    NoSuchRule(i32),
    #[error("invalid argument: {0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, CrushError>;
