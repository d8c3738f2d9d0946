//! Error type of placement requests.

/// A placement request that cannot be answered: a clear message, no panic.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OsdMapError {
    #[error("rule {0} does not exist in the crush map")]
    NoSuchRule(i32),
    #[error("invalid argument: {0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, OsdMapError>;
