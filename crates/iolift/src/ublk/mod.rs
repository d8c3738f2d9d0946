//! ublk front-end: an export as a kernel block device, /dev/ublkbN,
//! through the kernel's ublk driver (Linux 6.0+, `ublk_drv`).
//!
//! The driver hands block requests to user space over io_uring: each
//! hardware queue has a thread with its own ring and a buffer per tag;
//! the thread receives a request descriptor, runs the request on the
//! export's device (the same stages and backends as every other
//! front-end) and commits the result, which also fetches the next request
//! of that tag. The ring work is done by the `libublk` crate (cargo
//! feature `ublk`, which needs libclang at build time for its kernel
//! header bindings); see docs/ublk.md.
//!
//! - [`driver_present`]: `/dev/ublk-control` exists; without it the
//!   front-end refuses with an error that says so ([`check_driver`]).
//! - [`UblkOptions`]: queues, depth, largest request.
//! - `Device` (feature `ublk`): one served device; `Device::stop` removes it.
//! - [`UblkFlags`] / [`UblkPlan`]: `iolift serve --ublk[=NAME]` and what
//!   it resolves to (kept in config/ublk.rs); the front-end `serve`
//!   starts is crate::frontend::ublk.
//!
//! Requests of one queue run one at a time, in the queue's thread (the
//! device call is awaited there); queues run in parallel. Good for
//! correctness and moderate loads; see docs/ublk.md for the limits.

use anyhow::{bail, Result};
use std::path::Path;

pub use crate::config::ublk::{UblkFlags, UblkOptions, UblkPlan};

#[cfg(feature = "ublk")]
mod device;
#[cfg(feature = "ublk")]
pub use device::Device;

/// The driver's control node; present once `ublk_drv` is loaded.
pub const CONTROL: &str = "/dev/ublk-control";

/// Whether the kernel's ublk driver is loaded here.
pub fn driver_present() -> bool {
    Path::new(CONTROL).exists()
}

/// Fails with a message that names what is missing when this host cannot
/// serve ublk devices: no driver, or a build without the `ublk` feature.
pub fn check_driver() -> Result<()> {
    if !driver_present() {
        bail!(
            "the kernel's ublk driver is not available: {CONTROL} does not exist \
             (load it with `modprobe ublk_drv`; it needs Linux 6.0 or later built \
             with CONFIG_BLK_DEV_UBLK, and a container must be given the device)"
        );
    }
    if !cfg!(feature = "ublk") {
        bail!(
            "this iolift was built without ublk support: rebuild with \
             `cargo build --features ublk` (libublk's bindings need libclang)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_driver_is_named() {
        match (driver_present(), cfg!(feature = "ublk"), check_driver()) {
            (false, _, Err(e)) => {
                let e = e.to_string();
                assert!(e.contains(CONTROL) && e.contains("ublk_drv"), "{e}");
            }
            (true, true, Ok(())) => {}
            (true, false, Err(e)) => {
                assert!(e.to_string().contains("--features ublk"), "{e}");
            }
            (present, feature, r) => {
                panic!("driver present: {present}, feature: {feature}, check_driver: {r:?}")
            }
        }
    }
}
