//! `iolift serve --ublk[=NAME]`: the ublk devices (crate::ublk) as a
//! front-end ([`start`], registered in [`crate::frontend::SERVE`]).

use crate::config::Settings;
use crate::export::Export;
use crate::frontend::{BoxFuture, Frontend};
use anyhow::Result;
use std::sync::Arc;

/// Starts one ublk device per `--ublk` export (none given: `None`). Fails
/// with a clear error where the driver is missing.
pub fn start<'a>(
    s: &'a Settings,
    exports: &'a [Arc<Export>],
) -> BoxFuture<'a, Result<Option<Box<dyn Frontend>>>> {
    Box::pin(async move {
        if s.ublk.exports.is_empty() {
            return Ok(None);
        }
        crate::ublk::check_driver()?;
        imp::start(s, exports)
    })
}

#[cfg(feature = "ublk")]
mod imp {
    use super::*;
    use crate::ublk::Device;
    use anyhow::Context;

    /// The devices of `iolift serve`; stopped and deleted when stopped or
    /// dropped.
    struct Devices {
        devs: Vec<(String, Device)>,
    }

    pub fn start(s: &Settings, exports: &[Arc<Export>]) -> Result<Option<Box<dyn Frontend>>> {
        let rt = tokio::runtime::Handle::current();
        let mut d = Devices { devs: Vec::new() };
        for name in &s.ublk.exports {
            let Some(e) = exports.iter().find(|e| &e.name == name) else {
                anyhow::bail!("--ublk: no export {name:?}");
            };
            let dev = tokio::task::block_in_place(|| {
                Device::start(e.dev.clone(), e.read_only, s.ublk.opts, rt.clone())
            })
            .with_context(|| format!("--ublk: {}", e.label()))?;
            tracing::info!("{}: serving as {}", e.label(), dev.path());
            d.devs.push((e.label(), dev));
        }
        Ok(Some(Box::new(d) as Box<dyn Frontend>))
    }

    impl Frontend for Devices {
        fn kind(&self) -> &'static str {
            "ublk"
        }

        fn hints(&self) -> Vec<String> {
            self.devs
                .iter()
                .map(|(label, d)| format!("{} ({label}, ublk)", d.path()))
                .collect()
        }

        /// Stops and deletes every device (requests in flight finish
        /// first).
        fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                let _ = tokio::task::spawn_blocking(move || {
                    for (label, d) in self.devs {
                        if let Err(e) = d.stop() {
                            tracing::warn!("{label}: ublk: {e:#}");
                        }
                    }
                })
                .await;
            })
        }
    }
}

#[cfg(not(feature = "ublk"))]
mod imp {
    use super::*;

    /// [`crate::ublk::check_driver`] already refused: a build without the
    /// feature never gets here.
    pub fn start(_: &Settings, _: &[Arc<Export>]) -> Result<Option<Box<dyn Frontend>>> {
        anyhow::bail!("this iolift was built without ublk support")
    }
}
