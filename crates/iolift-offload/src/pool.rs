//! The I/O pool (DeLiBA's I/O pool, on CPU workers or CUDA streams): tasks
//! are submitted one by one or in batches, aggregated into launches (a
//! launch goes when it holds `max_batch` tasks or `max_wait` after its first
//! task arrived), dispatched to the device's processing elements, and
//! completed through a future/blocking `Completion` or a callback.
//!
//! A task here is one CRUSH mapping: input x -> the OSDs of `rule`.
//!
//! A *group* (`submit_group`) is many tasks with one completion and one
//! flat result buffer (a `Mapping`): the pool splits it into chunks of at
//! most `max_batch` inputs, which PEs run in parallel and copy into the
//! group's buffer; the last chunk completes the group. Per task this costs
//! a copy of its row, against an `Arc` slot, a result `Vec` and a
//! completion per task for `submit_batch`.
//!
//! Latency design: there is no batcher thread. Submitters append to one
//! shared queue; the processing-element threads take turns as the
//! *collector* (one at a time, under a lock): the collector forms the next
//! batch from the queue (size / time rules above), hands the collector role
//! on and runs the batch on its own PE. A task therefore crosses one thread
//! hand-off on the way in and one on the way back. Both waits (the
//! collector waiting for a first task, a submitter waiting for its
//! completion) spin briefly (`IOLIFT_POOL_SPIN_US`, default 200 us on 8+
//! cores, 0 below; spinning then yielding) before parking, and a sleeper
//! is only signalled when it actually parked: a busy pool makes no futex
//! calls per task.

use crate::device::{Device, Inputs, MapHandle, Mapping};
use crate::error::{OffloadError, Result};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
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

/// How long a waiter spins (then yields) before it parks:
/// `IOLIFT_POOL_SPIN_US`, else 200 us on machines with 8 or more cores and
/// 0 (park at once) on smaller ones, where a spinning waiter would take the
/// core that the thread it waits for needs.
fn spin_budget() -> Duration {
    static S: OnceLock<Duration> = OnceLock::new();
    *S.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Duration::from_micros(
            std::env::var("IOLIFT_POOL_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if cores >= 8 { 200 } else { 0 }),
        )
    })
}

/// Spin (first busy, then yielding the CPU) until `ready()` or the spin
/// budget is used up; whether `ready()` became true.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let budget = spin_budget();
    if budget.is_zero() {
        return ready();
    }
    let t0 = Instant::now();
    let mut i = 0u32;
    loop {
        if ready() {
            return true;
        }
        i = i.wrapping_add(1);
        if i < 512 {
            std::hint::spin_loop();
        } else {
            if i.is_multiple_of(16) && t0.elapsed() >= budget {
                return ready();
            }
            if i.is_multiple_of(4) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

struct SlotState<T> {
    result: Option<T>,
    waker: Option<Waker>,
    sleeping: bool,
}

struct Slot<T> {
    done: AtomicBool,
    state: Mutex<SlotState<T>>,
    cv: Condvar,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            done: AtomicBool::new(false),
            state: Mutex::new(SlotState {
                result: None,
                waker: None,
                sleeping: false,
            }),
            cv: Condvar::new(),
        }
    }
}

impl<T> Slot<T> {
    fn complete(&self, r: T) {
        let mut g = self.state.lock().expect("slot lock");
        g.result = Some(r);
        self.done.store(true, Ordering::Release);
        let waker = g.waker.take();
        let sleeping = g.sleeping;
        drop(g);
        if let Some(w) = waker {
            w.wake();
        }
        if sleeping {
            self.cv.notify_all();
        }
    }

    /// Block until completed (spins briefly, then parks).
    fn wait(&self) -> T {
        spin_until(|| self.done.load(Ordering::Acquire));
        let mut g = self.state.lock().expect("slot lock");
        loop {
            if let Some(r) = g.result.take() {
                return r;
            }
            g.sleeping = true;
            g = self.cv.wait(g).expect("slot lock");
            g.sleeping = false;
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<T> {
        let mut g = self.state.lock().expect("slot lock");
        if let Some(r) = g.result.take() {
            return Poll::Ready(r);
        }
        g.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Completion of one task: `.await` it or `wait()` for it.
pub struct Completion(Arc<Slot<TaskResult>>);

impl Completion {
    /// Block until the task completes (spins briefly, then parks).
    pub fn wait(self) -> TaskResult {
        self.0.wait()
    }
}

impl Future for Completion {
    type Output = TaskResult;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TaskResult> {
        self.0.poll(cx)
    }
}

/// Completion of a group: every row in one `Mapping`, in input order.
pub struct GroupCompletion(Arc<Slot<Result<Mapping>>>);

impl GroupCompletion {
    /// Block until the whole group completes.
    pub fn wait(self) -> Result<Mapping> {
        self.0.wait()
    }
}

impl Future for GroupCompletion {
    type Output = Result<Mapping>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Mapping>> {
        self.0.poll(cx)
    }
}

/// A group in flight: its inputs, the shared result buffer its chunks
/// fill, and how many chunks are still out.
struct Group {
    xs: Vec<i32>,
    result_max: usize,
    acc: Mutex<GroupAcc>,
    slot: Arc<Slot<Result<Mapping>>>,
}

struct GroupAcc {
    out: Vec<i32>,
    lens: Vec<u32>,
    error: Option<OffloadError>,
    chunks_left: usize,
}

impl Group {
    /// Chunk `start..start + len` of the group is rows `at..at + len` of `m`
    /// (or failed with `e`); completes the group after its last chunk.
    fn chunk_done(
        &self,
        start: usize,
        len: usize,
        r: std::result::Result<(&Mapping, usize), &OffloadError>,
    ) {
        let rm = self.result_max;
        let mut a = self.acc.lock().expect("group lock");
        match r {
            Ok((m, at)) => {
                a.out[start * rm..(start + len) * rm]
                    .copy_from_slice(&m.out[at * rm..(at + len) * rm]);
                a.lens[start..start + len].copy_from_slice(&m.lens[at..at + len]);
            }
            Err(e) => {
                if a.error.is_none() {
                    a.error = Some(e.clone());
                }
            }
        }
        a.chunks_left -= 1;
        if a.chunks_left > 0 {
            return;
        }
        let r = match a.error.take() {
            Some(e) => Err(e),
            None => Ok(Mapping {
                result_max: rm,
                out: std::mem::take(&mut a.out),
                lens: std::mem::take(&mut a.lens),
                fallbacks: 0,
            }),
        };
        drop(a);
        self.slot.complete(r);
    }
}

type Callback = Box<dyn FnOnce(TaskResult) + Send>;

enum Done {
    Slot(Arc<Slot<TaskResult>>),
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

/// One queue entry: a single task, or a chunk of a group.
enum Task {
    One {
        x: i32,
        done: Done,
    },
    Chunk {
        group: Arc<Group>,
        start: usize,
        len: usize,
    },
}

impl Task {
    fn inputs(&self) -> usize {
        match self {
            Task::One { .. } => 1,
            Task::Chunk { len, .. } => *len,
        }
    }

    fn fail(self, e: &OffloadError) {
        match self {
            Task::One { done, .. } => done.complete(Err(e.clone())),
            Task::Chunk { group, start, len } => group.chunk_done(start, len, Err(e)),
        }
    }
}

/// A batch being formed: its entries and how many inputs they hold.
struct Batch {
    tasks: Vec<Task>,
    inputs: usize,
}

/// Counters: how tasks were grouped into launches.
#[derive(Debug, Default)]
pub struct PoolStats {
    pub tasks: AtomicU64,
    pub launches: AtomicU64,
    pub largest_launch: AtomicU64,
}

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
    closed: bool,
    /// The collector is parked on `Shared::cv`.
    parked: bool,
}

struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Tasks queued (read without the lock while spinning).
    queued: AtomicUsize,
    closed: AtomicBool,
    /// Held by the PE that is forming the next batch.
    collector: Mutex<()>,
    cfg: PoolConfig,
    stats: Arc<PoolStats>,
}

impl Shared {
    fn push(&self, tasks: impl IntoIterator<Item = Task>) {
        let mut g = self.q.lock().expect("queue lock");
        if g.closed {
            drop(g);
            for t in tasks {
                t.fail(&OffloadError::Closed);
            }
            return;
        }
        g.tasks.extend(tasks);
        self.queued.store(g.tasks.len(), Ordering::Release);
        let wake = g.parked;
        drop(g);
        if wake {
            self.cv.notify_one();
        }
    }

    /// Moves queued entries into `batch` while their inputs fit in
    /// `max_batch` (a chunk is never larger than that, so an empty batch
    /// always takes the first entry).
    fn take(&self, g: &mut Queue, batch: &mut Batch) {
        while let Some(t) = g.tasks.front() {
            let k = t.inputs();
            if batch.inputs > 0 && batch.inputs + k > self.cfg.max_batch {
                break;
            }
            batch.inputs += k;
            batch.tasks.extend(g.tasks.pop_front());
        }
        self.queued.store(g.tasks.len(), Ordering::Release);
    }

    /// The next batch (called by the collector); None when the pool is
    /// closed and drained.
    fn collect(&self) -> Option<Batch> {
        spin_until(|| {
            self.queued.load(Ordering::Acquire) > 0 || self.closed.load(Ordering::Acquire)
        });
        let mut g = self.q.lock().expect("queue lock");
        while g.tasks.is_empty() {
            if g.closed {
                return None;
            }
            g.parked = true;
            g = self.cv.wait(g).expect("queue lock");
            g.parked = false;
        }
        let max = self.cfg.max_batch;
        let mut batch = Batch {
            tasks: Vec::with_capacity(g.tasks.len().min(max)),
            inputs: 0,
        };
        self.take(&mut g, &mut batch);
        if batch.inputs < max && !self.cfg.max_wait.is_zero() {
            let deadline = Instant::now() + self.cfg.max_wait;
            loop {
                self.take(&mut g, &mut batch);
                if batch.inputs >= max || g.closed || !g.tasks.is_empty() {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                g.parked = true;
                g = self
                    .cv
                    .wait_timeout(g, deadline - now)
                    .expect("queue lock")
                    .0;
                g.parked = false;
            }
        }
        drop(g);
        let st = &self.stats;
        st.tasks.fetch_add(batch.inputs as u64, Ordering::Relaxed);
        st.launches.fetch_add(1, Ordering::Relaxed);
        st.largest_launch
            .fetch_max(batch.inputs as u64, Ordering::Relaxed);
        Some(batch)
    }
}

pub struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    result_max: usize,
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
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            collector: Mutex::new(()),
            cfg,
            stats: Arc::new(PoolStats::default()),
        });
        let weights = Arc::new(weights);
        let mut pool = IoPool {
            shared: shared.clone(),
            threads: Vec::new(),
            result_max,
        };
        for pe in 0..pes.max(1) {
            let (device, map, weights, sh) =
                (device.clone(), map.clone(), weights.clone(), shared.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("iolift-pe{pe}"))
                .spawn(move || {
                    let mut xs: Vec<i32> = Vec::new();
                    loop {
                        let batch = {
                            let _collector = sh.collector.lock().expect("collector lock");
                            match sh.collect() {
                                Some(b) => b,
                                None => return,
                            }
                        };
                        xs.clear();
                        for t in &batch.tasks {
                            match t {
                                Task::One { x, .. } => xs.push(*x),
                                Task::Chunk { group, start, len } => {
                                    xs.extend_from_slice(&group.xs[*start..start + len])
                                }
                            }
                        }
                        match device.map_on(pe, &map, rule, Inputs::Xs(&xs), result_max, &weights) {
                            Ok(m) => {
                                let mut at = 0;
                                for t in batch.tasks {
                                    match t {
                                        Task::One { done, .. } => {
                                            done.complete(Ok(m.row(at).to_vec()));
                                            at += 1;
                                        }
                                        Task::Chunk { group, start, len } => {
                                            group.chunk_done(start, len, Ok((&m, at)));
                                            at += len;
                                        }
                                    }
                                }
                            }
                            Err(e) => {
                                for t in batch.tasks {
                                    t.fail(&e);
                                }
                            }
                        }
                    }
                });
            match spawned {
                Ok(t) => pool.threads.push(t),
                Err(e) => return Err(OffloadError::Invalid(format!("spawn: {e}"))),
            }
        }
        Ok(pool)
    }

    /// Submit one task; its completion.
    pub fn submit(&self, x: i32) -> Completion {
        let slot = Arc::new(Slot::default());
        self.shared.push(std::iter::once(Task::One {
            x,
            done: Done::Slot(slot.clone()),
        }));
        Completion(slot)
    }

    /// Submit one task; `f` runs on a processing element when it completes.
    pub fn submit_with<F: FnOnce(TaskResult) + Send + 'static>(&self, x: i32, f: F) {
        self.shared.push(std::iter::once(Task::One {
            x,
            done: Done::Callback(Box::new(f)),
        }));
    }

    /// Submit a batch (queued at once); one completion per input, in order.
    pub fn submit_batch(&self, xs: &[i32]) -> Vec<Completion> {
        let slots: Vec<Arc<Slot<TaskResult>>> =
            xs.iter().map(|_| Arc::new(Slot::default())).collect();
        self.shared
            .push(xs.iter().zip(&slots).map(|(&x, s)| Task::One {
                x,
                done: Done::Slot(s.clone()),
            }));
        slots.into_iter().map(Completion).collect()
    }

    /// Submit a group: one completion for all of `xs`, whose rows come back
    /// in one `Mapping` in input order. Split into chunks of up to
    /// `max_batch` inputs that the PEs run in parallel. The group's
    /// `fallbacks` is 0: per-launch counts stay with the device.
    pub fn submit_group(&self, xs: Vec<i32>) -> GroupCompletion {
        let n = xs.len();
        let rm = self.result_max;
        let chunk = self.shared.cfg.max_batch;
        let chunks = n.div_ceil(chunk);
        let slot = Arc::new(Slot::default());
        if n == 0 {
            slot.complete(Ok(Mapping {
                result_max: rm,
                out: Vec::new(),
                lens: Vec::new(),
                fallbacks: 0,
            }));
            return GroupCompletion(slot);
        }
        let group = Arc::new(Group {
            xs,
            result_max: rm,
            acc: Mutex::new(GroupAcc {
                out: vec![0; n * rm],
                lens: vec![0; n],
                error: None,
                chunks_left: chunks,
            }),
            slot: slot.clone(),
        });
        self.shared.push((0..chunks).map(|c| Task::Chunk {
            group: group.clone(),
            start: c * chunk,
            len: chunk.min(n - c * chunk),
        }));
        GroupCompletion(slot)
    }

    pub fn stats(&self) -> &PoolStats {
        &self.shared.stats
    }

    /// Stop accepting tasks, finish the queued ones and join the threads.
    pub fn shutdown(mut self) {
        self.close();
    }

    fn close(&mut self) {
        {
            let mut g = self.shared.q.lock().expect("queue lock");
            g.closed = true;
            self.shared.closed.store(true, Ordering::Release);
        }
        self.shared.cv.notify_all();
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
