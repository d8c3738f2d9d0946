use thiserror::Error;

/// Errors of the offload engine. Asking for a device that is not there is
/// an error with a message that says what is missing, never a panic.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OffloadError {
    #[error("GPU offload unavailable: {0}")]
    NoGpu(String),
    #[error("NVRTC unavailable: {0}")]
    NoNvrtc(String),
    #[error("kernel compilation failed:\n{0}")]
    Compile(String),
    #[error("CUDA error: {0}")]
    Cuda(String),
    #[error("map not supported by the offload layout: {0}")]
    Unsupported(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("I/O pool closed")]
    Closed,
}

pub type Result<T> = std::result::Result<T, OffloadError>;
