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

/// Requests in flight per connection (per tokio task: the NBD front-end
/// reads each connection on a task of its own and submits from it).
/// `uring.rs` runs a request on the reading thread only when nothing else
/// of its connection is in flight: with placement=worker the data path
/// follows the runtime thread, and the reader's task moves between those
/// threads, so a client at depth 8 could find the path of its new thread
/// idle and have a request read with a blocking pread on the reader's
/// thread while seven others are in flight (measured: 7-9% of a QD 8 job's
/// requests before this). Holds an entry only while its connection has a
/// request in flight.
#[derive(Default)]
pub struct ConnDepth {
    map: Mutex<HashMap<Id, u32>>,
}

impl ConnDepth {
    /// Counts a request of the current task in: its key for
    /// [`ConnDepth::leave`], and whether the task had nothing else in
    /// flight. Outside a task: no key, and nothing is known (true).
    pub fn enter(&self) -> (Option<Id>, bool) {
        let Some(id) = tokio::task::try_id() else {
            return (None, true);
        };
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(id).or_insert(0);
        *n += 1;
        (Some(id), *n == 1)
    }

    /// Counts the request of `enter` out (once it is answered).
    pub fn leave(&self, key: Option<Id>) {
        let Some(id) = key else { return };
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                m.remove(&id);
            }
        }
    }

    /// Connections with requests in flight.
    #[cfg(test)]
    pub fn busy(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task with a request in flight is never idle, whichever runtime
    /// thread it runs on after a yield; another task is; entries go away
    /// once their requests are answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_with_a_request_in_flight_is_not_idle_on_any_thread() {
        let d = std::sync::Arc::new(ConnDepth::default());
        assert_eq!(d.enter(), (None, true), "outside a task");
        let mut hs = Vec::new();
        for _ in 0..4 {
            let d = d.clone();
            hs.push(tokio::spawn(async move {
                let (k, idle) = d.enter();
                assert!(idle, "a task's first request");
                for _ in 0..100 {
                    tokio::task::yield_now().await;
                    let (k2, idle) = d.enter();
                    assert!(!idle, "busy task judged idle");
                    d.leave(k2);
                }
                d.leave(k);
                let (k, idle) = d.enter();
                assert!(idle, "idle again once answered");
                d.leave(k);
            }));
        }
        for h in hs {
            h.await.unwrap();
        }
        assert_eq!(d.busy(), 0, "entries left behind");
    }

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
