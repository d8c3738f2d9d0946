//! The I/O pool (DeLiBA's I/O pool, on CPU workers or CUDA streams): tasks
//! are submitted one by one or in batches, aggregated into launches (a
//! launch goes when it holds `max_batch` tasks or `max_wait` after its first
//! task arrived), dispatched to the device's processing elements, and
//! completed through a future/blocking `Completion` or a callback.
//!
//! The pool runs any `Kernel` (kernels/mod.rs): a task is one
//! `K::Input`, completed with one `K::Item`; a batch runs as one launch of
//! the kernel on one processing element (`kernel::run_batch`).
//!
//! A *group* (`submit_group`) is many tasks with one completion and one
//! result buffer (one `K::Output`, e.g. CRUSH's flat `Mapping`): the pool
//! splits it into chunks of at most `max_batch` inputs, which PEs run in
//! parallel and copy into the group's buffer (`Kernel::copy_rows`); the
//! last chunk completes the group. Per task this costs a copy of its
//! result, against an `Arc` slot, an `Item` and a completion per task for
//! `submit_batch`.
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

mod slot;

use crate::device::Device;
use crate::error::{OffloadError, Result};
use crate::kernel::{run_batch, Kernel};
use slot::{spin_until, Slot};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
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

/// Completion of one task: `.await` it or `wait()` for it.
pub struct Completion<T>(Arc<Slot<Result<T>>>);

impl<T> Completion<T> {
    /// Block until the task completes (spins briefly, then parks).
    pub fn wait(self) -> Result<T> {
        self.0.wait()
    }
}

impl<T> Future for Completion<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        self.0.poll(cx)
    }
}

/// Completion of a group: every result in one output, in input order.
pub struct GroupCompletion<O>(Arc<Slot<Result<O>>>);

impl<O> GroupCompletion<O> {
    /// Block until the whole group completes.
    pub fn wait(self) -> Result<O> {
        self.0.wait()
    }
}

impl<O> Future for GroupCompletion<O> {
    type Output = Result<O>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<O>> {
        self.0.poll(cx)
    }
}

/// A group in flight: its inputs, the shared result buffer its chunks
/// fill, and how many chunks are still out.
struct Group<K: Kernel> {
    inputs: Vec<K::Input>,
    acc: Mutex<GroupAcc<K::Output>>,
    slot: Arc<Slot<Result<K::Output>>>,
}

struct GroupAcc<O> {
    out: Option<O>,
    error: Option<OffloadError>,
    chunks_left: usize,
}

impl<K: Kernel> Group<K> {
    /// Chunk `start..start + len` of the group is results `at..at + len`
    /// of `m` (or failed with `e`); completes the group after its last
    /// chunk.
    fn chunk_done(
        &self,
        k: &K,
        start: usize,
        len: usize,
        r: std::result::Result<(&K::Output, usize), &OffloadError>,
    ) {
        let mut a = self.acc.lock().expect("group lock");
        match r {
            Ok((m, at)) => {
                if let Some(out) = a.out.as_mut() {
                    k.copy_rows(out, start, m, at, len);
                }
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
        let r = match (a.error.take(), a.out.take()) {
            (Some(e), _) => Err(e),
            (None, Some(out)) => Ok(out),
            (None, None) => Err(OffloadError::Invalid("group completed twice".into())),
        };
        drop(a);
        self.slot.complete(r);
    }
}

type Callback<T> = Box<dyn FnOnce(Result<T>) + Send>;

enum Done<T> {
    Slot(Arc<Slot<Result<T>>>),
    Callback(Callback<T>),
}

impl<T> Done<T> {
    fn complete(self, r: Result<T>) {
        match self {
            Done::Slot(s) => s.complete(r),
            Done::Callback(f) => f(r),
        }
    }
}

/// One queue entry: a single task, or a chunk of a group.
enum Task<K: Kernel> {
    One {
        input: K::Input,
        done: Done<K::Item>,
    },
    Chunk {
        group: Arc<Group<K>>,
        start: usize,
        len: usize,
    },
}

impl<K: Kernel> Task<K> {
    fn inputs(&self) -> usize {
        match self {
            Task::One { .. } => 1,
            Task::Chunk { len, .. } => *len,
        }
    }

    fn fail(self, k: &K, e: &OffloadError) {
        match self {
            Task::One { done, .. } => done.complete(Err(e.clone())),
            Task::Chunk { group, start, len } => group.chunk_done(k, start, len, Err(e)),
        }
    }
}

/// A batch being formed: its entries and how many inputs they hold.
struct Batch<K: Kernel> {
    tasks: Vec<Task<K>>,
    inputs: usize,
}

/// Counters: how tasks were grouped into launches.
#[derive(Debug, Default)]
pub struct PoolStats {
    pub tasks: AtomicU64,
    pub launches: AtomicU64,
    pub largest_launch: AtomicU64,
}

struct Queue<K: Kernel> {
    tasks: VecDeque<Task<K>>,
    closed: bool,
    /// The collector is parked on `Shared::cv`.
    parked: bool,
}

struct Shared<K: Kernel> {
    kernel: Arc<K>,
    q: Mutex<Queue<K>>,
    cv: Condvar,
    /// Tasks queued (read without the lock while spinning).
    queued: AtomicUsize,
    closed: AtomicBool,
    /// Held by the PE that is forming the next batch.
    collector: Mutex<()>,
    cfg: PoolConfig,
    stats: Arc<PoolStats>,
}

impl<K: Kernel> Shared<K> {
    fn push(&self, tasks: impl IntoIterator<Item = Task<K>>) {
        let mut g = self.q.lock().expect("queue lock");
        if g.closed {
            drop(g);
            for t in tasks {
                t.fail(&self.kernel, &OffloadError::Closed);
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
    fn take(&self, g: &mut Queue<K>, batch: &mut Batch<K>) {
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
    fn collect(&self) -> Option<Batch<K>> {
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

pub struct IoPool<K: Kernel> {
    shared: Arc<Shared<K>>,
    threads: Vec<JoinHandle<()>>,
}

impl<K: Kernel> IoPool<K> {
    /// A pool running `kernel` on `device`.
    pub fn new(device: Arc<dyn Device>, kernel: K, cfg: PoolConfig) -> Result<IoPool<K>> {
        if cfg.max_batch == 0 {
            return Err(OffloadError::Invalid("max_batch must be > 0".into()));
        }
        let pes = if cfg.pes == 0 {
            device.processing_elements()
        } else {
            cfg.pes
        };
        let shared = Arc::new(Shared {
            kernel: Arc::new(kernel),
            q: Mutex::new(Queue {
                tasks: VecDeque::new(),
                closed: false,
                parked: false,
            }),
            cv: Condvar::new(),
            queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            collector: Mutex::new(()),
            cfg,
            stats: Arc::new(PoolStats::default()),
        });
        let mut pool = IoPool {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        for pe in 0..pes.max(1) {
            let (device, sh) = (device.clone(), shared.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("iolift-pe{pe}"))
                .spawn(move || pe_loop(&*device, pe, &sh));
            match spawned {
                Ok(t) => pool.threads.push(t),
                Err(e) => return Err(OffloadError::Invalid(format!("spawn: {e}"))),
            }
        }
        Ok(pool)
    }

    /// The kernel this pool runs.
    pub fn kernel(&self) -> &K {
        &self.shared.kernel
    }

    /// Submit one task; its completion.
    pub fn submit(&self, input: K::Input) -> Completion<K::Item> {
        let slot = Arc::new(Slot::default());
        self.shared.push(std::iter::once(Task::One {
            input,
            done: Done::Slot(slot.clone()),
        }));
        Completion(slot)
    }

    /// Submit one task; `f` runs on a processing element when it completes.
    pub fn submit_with<F: FnOnce(Result<K::Item>) + Send + 'static>(&self, input: K::Input, f: F) {
        self.shared.push(std::iter::once(Task::One {
            input,
            done: Done::Callback(Box::new(f)),
        }));
    }

    /// Submit a batch (queued at once); one completion per input, in order.
    pub fn submit_batch(&self, inputs: &[K::Input]) -> Vec<Completion<K::Item>> {
        let slots: Vec<Arc<Slot<Result<K::Item>>>> =
            inputs.iter().map(|_| Arc::new(Slot::default())).collect();
        self.shared
            .push(inputs.iter().zip(&slots).map(|(x, s)| Task::One {
                input: x.clone(),
                done: Done::Slot(s.clone()),
            }));
        slots.into_iter().map(Completion).collect()
    }

    /// Submit a group: one completion for all of `inputs`, whose results
    /// come back in one output in input order. Split into chunks of up to
    /// `max_batch` inputs that the PEs run in parallel.
    pub fn submit_group(&self, inputs: Vec<K::Input>) -> GroupCompletion<K::Output> {
        let n = inputs.len();
        let chunk = self.shared.cfg.max_batch;
        let chunks = n.div_ceil(chunk);
        let slot = Arc::new(Slot::default());
        let out = self.shared.kernel.alloc(n);
        if n == 0 {
            slot.complete(Ok(out));
            return GroupCompletion(slot);
        }
        let group = Arc::new(Group {
            inputs,
            acc: Mutex::new(GroupAcc {
                out: Some(out),
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

impl<K: Kernel> Drop for IoPool<K> {
    fn drop(&mut self) {
        self.close();
    }
}

/// A processing element's thread: take turns collecting a batch, run it,
/// complete its tasks; until the pool is closed and drained.
fn pe_loop<K: Kernel>(device: &dyn Device, pe: usize, sh: &Shared<K>) {
    let k = &*sh.kernel;
    let mut inputs: Vec<K::Input> = Vec::new();
    loop {
        let batch = {
            let _collector = sh.collector.lock().expect("collector lock");
            match sh.collect() {
                Some(b) => b,
                None => return,
            }
        };
        inputs.clear();
        for t in &batch.tasks {
            match t {
                Task::One { input, .. } => inputs.push(input.clone()),
                Task::Chunk { group, start, len } => {
                    inputs.extend_from_slice(&group.inputs[*start..start + len])
                }
            }
        }
        match run_batch(device, pe, k, &inputs) {
            Ok(m) => {
                let mut at = 0;
                for t in batch.tasks {
                    match t {
                        Task::One { done, .. } => {
                            done.complete(Ok(k.item(&m, at)));
                            at += 1;
                        }
                        Task::Chunk { group, start, len } => {
                            group.chunk_done(k, start, len, Ok((&m, at)));
                            at += len;
                        }
                    }
                }
            }
            Err(e) => {
                for t in batch.tasks {
                    t.fail(k, &e);
                }
            }
        }
    }
}
