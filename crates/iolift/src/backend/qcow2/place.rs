//! Which data path serves a request (`placement=worker|conn`).
//!
//! - `worker`: each thread that runs requests is given a data path once,
//!   round robin, and keeps it ([`worker`]): blocking-pool threads with
//!   engine=threads, the runtime threads that read the connections with
//!   engine=uring.
//! - `conn`: each NBD connection is given a data path once, round robin
//!   ([`Conns::path`]). The front-end reads each connection on a task of
//!   its own and submits from it, so the connection is known by the
//!   current tokio task; no front-end change is needed. Outside a task
//!   (a caller that is not a front-end) the thread's worker path is used.
//!   The table of connections is bounded ([`MAX_CONNS`] entries; when it
//!   is full it starts again, which only moves connections to other,
//!   equally correct, data paths).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use tokio::task::Id;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Worker,
    Conn,
}

/// Connections remembered at once.
pub const MAX_CONNS: usize = 4096;

static NEXT_WORKER: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
    /// The last connection (task) this thread submitted for, its path.
    static LAST_CONN: Cell<Option<(Id, usize)>> = const { Cell::new(None) };
}

/// This thread's worker number (given once, round robin).
pub fn worker() -> usize {
    WORKER.with(|w| match w.get() {
        Some(i) => i,
        None => {
            let i = NEXT_WORKER.fetch_add(1, Relaxed);
            w.set(Some(i));
            i
        }
    })
}

/// The connections' data paths, given round robin.
#[derive(Default)]
pub struct Conns {
    map: Mutex<HashMap<Id, usize>>,
    next: AtomicUsize,
}

impl Conns {
    /// The current connection's number (the caller takes it modulo the
    /// number of data paths). A thread that keeps submitting for one
    /// connection finds it in a thread-local without a lock.
    pub fn path(&self) -> usize {
        let Some(id) = tokio::task::try_id() else {
            return worker();
        };
        if let Some((last, p)) = LAST_CONN.with(|c| c.get()) {
            if last == id {
                return p;
            }
        }
        let p = {
            let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
            if m.len() >= MAX_CONNS && !m.contains_key(&id) {
                m.clear();
            }
            *m.entry(id)
                .or_insert_with(|| self.next.fetch_add(1, Relaxed))
        };
        LAST_CONN.with(|c| c.set(Some((id, p))));
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_task_keeps_its_own_path() {
        let conns = std::sync::Arc::new(Conns::default());
        let mut hs = Vec::new();
        for _ in 0..4 {
            let c = conns.clone();
            hs.push(tokio::spawn(async move {
                let first = c.path();
                for _ in 0..100 {
                    assert_eq!(c.path(), first);
                    tokio::task::yield_now().await;
                }
                first
            }));
        }
        let mut got = Vec::new();
        for h in hs {
            got.push(h.await.unwrap());
        }
        got.sort();
        assert_eq!(
            got,
            vec![0, 1, 2, 3],
            "paths given round robin, one per task"
        );
    }
}
