//! The metrics endpoint as a front-end of `iolift serve` (`--metrics
//! ADDR`): the stages' counters in Prometheus text format over HTTP. It
//! serves no exports; it is started and reported like the others.

use super::{BoxFuture, Frontend};
use crate::config::Settings;
use crate::export::Export;
use anyhow::Result;
use std::net::SocketAddr;
use std::sync::Arc;

struct MetricsFront {
    addr: SocketAddr,
}

pub fn start<'a>(
    s: &'a Settings,
    _exports: &'a [Arc<Export>],
) -> BoxFuture<'a, Result<Option<Box<dyn Frontend>>>> {
    Box::pin(async move {
        let Some(m) = &s.metrics else {
            return Ok(None);
        };
        let addr = crate::metrics::spawn(m).await?;
        tracing::info!("metrics: http://{addr}/metrics");
        Ok(Some(Box::new(MetricsFront { addr }) as Box<dyn Frontend>))
    })
}

impl Frontend for MetricsFront {
    fn kind(&self) -> &'static str {
        "metrics"
    }

    fn hints(&self) -> Vec<String> {
        vec![format!("curl http://{}/metrics", self.addr)]
    }

    /// The endpoint only reads counters: it keeps answering until the
    /// runtime ends.
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}
