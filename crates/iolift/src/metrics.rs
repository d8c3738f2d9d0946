//! The metrics registry and the `--metrics ADDR` HTTP endpoint.
//!
//! Stages that keep counters (stats, cache, scheduler) register a
//! [`MetricSource`]; `GET /metrics` renders every live source in Prometheus
//! text format (version 0.0.4). Every series of a stage carries the label
//! set its [`Instance`] renders: `stage="cache",instance="2"` (the stage's
//! kind, and its `name=` option or else a number in creation order). The endpoint is a ~60-line HTTP/1.0
//! responder on tokio rather than a web framework: it serves one fixed
//! path, read-only, to a scraper, and an HTTP stack would add a large
//! dependency tree for that.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Something with counters to export.
pub trait MetricSource: Send + Sync {
    /// Appends sample lines (`name{labels} value`).
    fn render(&self, out: &mut String);
    /// (family, type, help) of the families it renders.
    fn headers(&self) -> &'static [(&'static str, &'static str, &'static str)];
}

static REGISTRY: Mutex<Vec<Weak<dyn MetricSource>>> = Mutex::new(Vec::new());
static IDS: AtomicU64 = AtomicU64::new(0);

/// A process-wide sequence number for default stage instance names.
pub fn next_id() -> u64 {
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// One stage instance's identity in /metrics: the labels every series of
/// that stage starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    name: String,
    labels: String,
}

impl Instance {
    /// `stage` is the stage's kind (`cache`); `name` the user's `name=`
    /// option, or `None` for the next number of [`next_id`].
    pub fn new(stage: &str, name: Option<String>) -> Self {
        let name = name.unwrap_or_else(|| next_id().to_string());
        let labels = format!("stage=\"{}\",instance=\"{}\"", escape(stage), escape(&name));
        Instance { name, labels }
    }

    /// The instance name (the `instance` label's value).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Appends one sample line, `family{stage=..,instance=..,k="v",..} value`,
    /// with the `extra` labels after the instance's.
    pub fn sample(
        &self,
        out: &mut String,
        family: &str,
        extra: &[(&str, &str)],
        value: impl Display,
    ) {
        let _ = write!(out, "{family}{{{}", self.labels);
        for (k, v) in extra {
            let _ = write!(out, ",{k}=\"{}\"", escape(v));
        }
        let _ = writeln!(out, "}} {value}");
    }
}

/// Escapes a label value (backslash, double quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Registers a source; it is dropped from the registry when it is freed.
pub fn register(s: Arc<dyn MetricSource>) {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    g.retain(|w| w.strong_count() > 0);
    g.push(Arc::downgrade(&s));
}

/// Renders every live source, samples grouped by family with their headers.
pub fn render_all() -> String {
    let live: Vec<Arc<dyn MetricSource>> = {
        let g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().filter_map(|w| w.upgrade()).collect()
    };
    let mut headers: BTreeMap<&'static str, (&'static str, &'static str)> = BTreeMap::new();
    let mut families: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &live {
        for (f, t, h) in s.headers() {
            headers.insert(f, (t, h));
        }
        let mut buf = String::new();
        s.render(&mut buf);
        for line in buf.lines() {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            let fam = [
                name,
                name.trim_end_matches("_sum"),
                name.trim_end_matches("_count"),
            ]
            .into_iter()
            .find(|n| headers.contains_key(n))
            .unwrap_or(name);
            families
                .entry(fam.to_string())
                .or_default()
                .push(line.to_string());
        }
    }
    let mut out = String::new();
    for (fam, lines) in families {
        if let Some((t, h)) = headers.get(fam.as_str()) {
            out.push_str(&format!("# HELP {fam} {h}\n# TYPE {fam} {t}\n"));
        }
        for l in lines {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// Binds `addr` (e.g. `127.0.0.1:9100`) and serves `GET /metrics` on it in
/// a background task. Returns the bound address (port 0 picks one).
pub async fn spawn(addr: &str) -> Result<SocketAddr> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics: cannot listen on {addr:?}"))?;
    let local = l.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(10), answer(s)).await;
            });
        }
    });
    Ok(local)
}

async fn answer(mut s: tokio::net::TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > 16 << 10 {
            break;
        }
    }
    let req = String::from_utf8_lossy(&buf);
    let mut words = req.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, ctype, body) = if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        )
    } else if path == "/metrics" || path.starts_with("/metrics?") {
        (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render_all(),
        )
    } else {
        ("404 Not Found", "text/plain", "try /metrics\n".to_string())
    };
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    if method == "GET" {
        s.write_all(body.as_bytes()).await?;
    }
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_labels_name_stage_and_instance_apart() {
        let i = Instance::new("cache", Some("c1".into()));
        assert_eq!(i.name(), "c1");
        let mut out = String::new();
        i.sample(&mut out, "iolift_cache_hits_total", &[], 7);
        i.sample(&mut out, "iolift_x", &[("op", "read"), ("q", "a\"b")], 0.5);
        assert_eq!(
            out,
            "iolift_cache_hits_total{stage=\"cache\",instance=\"c1\"} 7\n\
             iolift_x{stage=\"cache\",instance=\"c1\",op=\"read\",q=\"a\\\"b\"} 0.5\n"
        );
        let (a, b) = (Instance::new("stats", None), Instance::new("stats", None));
        assert_ne!(a.name(), b.name(), "default instances are numbered apart");
        assert!(a.name().parse::<u64>().is_ok(), "{}", a.name());
    }
}
