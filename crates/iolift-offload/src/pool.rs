//! The I/O pool (DeLiBA's I/O pool, on CPU workers or CUDA streams): tasks
//! are submitted one by one or in batches, aggregated into launches (a
//! launch goes when it holds `max_batch` tasks or `max_wait` after its first
//! task arrived), dispatched to the device's processing elements, and
//! completed through a future/blocking `Completion` or a callback.
//!
//! A task here is one CRUSH mapping: input x -> the OSDs of `rule`.

use crate::device::{Device, Inputs, MapHandle};
use crate::error::{OffloadError, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Batching policy.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Launch when a batch holds this many tasks.
    pub max_batch: usize,
    /// ... or this long after the batch's first task (0: launch whatever is
    /// queued at once).
    pub max_wait: Duration,
    /// Processing elements to drive (0 = the device's count).
    pub pes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_batch: 4096,
            max_wait: Duration::from_micros(20),
            pes: 0,
        }
    }
}

type TaskResult = Result<Vec<i32>>;

#[derive(Default)]
struct Slot {
    state: Mutex<(Option<TaskResult>, Option<Waker>)>,
    cv: Condvar,
}

impl Slot {
    fn complete(&self, r: TaskResult) {
        let mut g = self.state.lock().expect("slot lock");
        g.0 = Some(r);
        if let Some(w) = g.1.take() {
            w.wake();
        }
        self.cv.notify_all();
    }
}

/// Completion of one task: `.await` it or `wait()` for it.
pub struct Completion(Arc<Slot>);

impl Completion {
    /// Block until the task completes.
    pub fn wait(self) -> TaskResult {
        let mut g = self.0.state.lock().expect("slot lock");
        loop {
            if let Some(r) = g.0.take() {
                return r;
            }
            g = self.0.cv.wait(g).expect("slot lock");
        }
    }
}

impl Future for Completion {
    type Output = TaskResult;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TaskResult> {
        let mut g = self.0.state.lock().expect("slot lock");
        if let Some(r) = g.0.take() {
            return Poll::Ready(r);
        }
        g.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}

type Callback = Box<dyn FnOnce(TaskResult) + Send>;

enum Done {
    Slot(Arc<Slot>),
    Callback(Callback),
}

impl Done {
    fn complete(self, r: TaskResult) {
        match self {
            Done::Slot(s) => s.complete(r),
            Done::Callback(f) => f(r),
        }
    }
}

struct Task {
    x: i32,
    done: Done,
}

/// Counters: how tasks were grouped into launches.
#[derive(Debug, Default)]
pub struct PoolStats {
    pub tasks: AtomicU64,
    pub launches: AtomicU64,
    pub largest_launch: AtomicU64,
}

pub struct IoPool {
    tx: Option<mpsc::Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<PoolStats>,
}

impl IoPool {
    /// A pool mapping inputs through `rule` of `map` (`result_max` OSDs per
    /// task, device reweights `weights`) on `device`.
    pub fn new(
        device: Arc<Device>,
        map: Arc<MapHandle>,
        rule: i32,
        result_max: usize,
        weights: Vec<u32>,
        cfg: PoolConfig,
    ) -> Result<IoPool> {
        if map.map.rule(rule).is_none() {
            return Err(OffloadError::Invalid(format!("no rule {rule} in the map")));
        }
        if cfg.max_batch == 0 {
            return Err(OffloadError::Invalid("max_batch must be > 0".into()));
        }
        let pes = if cfg.pes == 0 {
            device.processing_elements()
        } else {
            cfg.pes
        };
        let stats = Arc::new(PoolStats::default());
        let (tx, rx) = mpsc::channel::<Task>();
        let (btx, brx) = mpsc::channel::<Vec<Task>>();
        let brx = Arc::new(Mutex::new(brx));
        let weights = Arc::new(weights);
        let mut threads = Vec::new();
        let st = stats.clone();
        threads.push(
            std::thread::Builder::new()
                .name("iolift-batcher".into())
                .spawn(move || batcher(rx, btx, cfg, st))
                .map_err(|e| OffloadError::Invalid(format!("spawn: {e}")))?,
        );
        for pe in 0..pes.max(1) {
            let (device, map, weights, brx) =
                (device.clone(), map.clone(), weights.clone(), brx.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("iolift-pe{pe}"))
                    .spawn(move || loop {
                        let batch = match brx.lock().expect("batch queue").recv() {
                            Ok(b) => b,
                            Err(_) => return,
                        };
                        let xs: Vec<i32> = batch.iter().map(|t| t.x).collect();
                        match device.map_on(pe, &map, rule, Inputs::Xs(&xs), result_max, &weights) {
                            Ok(m) => {
                                for (i, t) in batch.into_iter().enumerate() {
                                    t.done.complete(Ok(m.row(i).to_vec()));
                                }
                            }
                            Err(e) => {
                                for t in batch {
                                    t.done.complete(Err(e.clone()));
                                }
                            }
                        }
                    })
                    .map_err(|e| OffloadError::Invalid(format!("spawn: {e}")))?,
            );
        }
        Ok(IoPool {
            tx: Some(tx),
            threads,
            stats,
        })
    }

    fn send(&self, t: Task) {
        if let Some(tx) = &self.tx {
            if let Err(mpsc::SendError(t)) = tx.send(t) {
                t.done.complete(Err(OffloadError::Closed));
            }
        } else {
            t.done.complete(Err(OffloadError::Closed));
        }
    }

    /// Submit one task; its completion.
    pub fn submit(&self, x: i32) -> Completion {
        let slot = Arc::new(Slot::default());
        self.send(Task {
            x,
            done: Done::Slot(slot.clone()),
        });
        Completion(slot)
    }

    /// Submit one task; `f` runs on a processing element when it completes.
    pub fn submit_with<F: FnOnce(TaskResult) + Send + 'static>(&self, x: i32, f: F) {
        self.send(Task {
            x,
            done: Done::Callback(Box::new(f)),
        });
    }

    /// Submit a batch; one completion per input, in order.
    pub fn submit_batch(&self, xs: &[i32]) -> Vec<Completion> {
        xs.iter().map(|&x| self.submit(x)).collect()
    }

    pub fn stats(&self) -> &PoolStats {
        &self.stats
    }

    /// Stop accepting tasks, finish the queued ones and join the threads.
    pub fn shutdown(mut self) {
        self.close();
    }

    fn close(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.close();
    }
}

fn batcher(
    rx: mpsc::Receiver<Task>,
    btx: mpsc::Sender<Vec<Task>>,
    cfg: PoolConfig,
    stats: Arc<PoolStats>,
) {
    loop {
        let first = match rx.recv() {
            Ok(t) => t,
            Err(_) => return,
        };
        let mut batch = Vec::with_capacity(cfg.max_batch.min(1 << 16));
        batch.push(first);
        let deadline = Instant::now() + cfg.max_wait;
        let mut closed = false;
        while batch.len() < cfg.max_batch {
            match rx.try_recv() {
                Ok(t) => {
                    batch.push(t);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
                Err(mpsc::TryRecvError::Empty) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match rx.recv_timeout(deadline - now) {
                Ok(t) => batch.push(t),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        stats.tasks.fetch_add(batch.len() as u64, Ordering::Relaxed);
        stats.launches.fetch_add(1, Ordering::Relaxed);
        stats
            .largest_launch
            .fetch_max(batch.len() as u64, Ordering::Relaxed);
        if let Err(mpsc::SendError(b)) = btx.send(batch) {
            for t in b {
                t.done.complete(Err(OffloadError::Closed));
            }
            return;
        }
        if closed {
            return;
        }
    }
}
