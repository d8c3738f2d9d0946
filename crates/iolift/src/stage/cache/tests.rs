//! Unit tests of the cache: the block map's bookkeeping, and write-back
//! timing against a device below whose writes a test releases one by one.

use super::map::State;
use super::*;
use crate::backend::memory::MemoryDev;
use crate::block::BlockDevExt;
use crate::block::{Flags, Reply};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use tokio::sync::Semaphore;

/// Memory whose writes each wait for a permit, so a test decides when
/// each write-back completes.
struct Gate {
    mem: Arc<MemoryDev>,
    permits: Arc<Semaphore>,
    started: Arc<AtomicU64>,
}

impl BlockDev for Gate {
    fn info(&self) -> DevInfo {
        // One block per write below: every dirty block is its own run.
        DevInfo {
            max_block: 4096,
            ..self.mem.info()
        }
    }
    fn submit(&self, req: Request) -> IoFuture {
        if !matches!(req, Request::Write { .. }) {
            return self.mem.submit(req);
        }
        self.started.fetch_add(1, Relaxed);
        let (p, mem) = (self.permits.clone(), self.mem.clone());
        Box::pin(async move {
            p.acquire().await.expect("open").forget();
            mem.submit(req).await
        })
    }
    fn name(&self) -> String {
        "gate".into()
    }
}

fn gate() -> (Arc<MemoryDev>, Arc<Semaphore>, Arc<AtomicU64>, Arc<Gate>) {
    let mem = Arc::new(MemoryDev::new(64 << 20));
    let permits = Arc::new(Semaphore::new(0));
    let started = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(Gate {
        mem: mem.clone(),
        permits: permits.clone(),
        started: started.clone(),
    });
    (mem, permits, started, gate)
}

fn wb_config(limit: u64, target: u64) -> CacheConfig {
    CacheConfig {
        size: 4 << 20,
        block: 4096,
        mode: Mode::WriteBack,
        dirty_limit: limit,
        dirty_target: target,
        max_age: Duration::from_secs(3600),
        name: Some("wbtest".into()),
    }
}

async fn wait_started(started: &AtomicU64, n: u64) {
    for _ in 0..5000 {
        if started.load(Relaxed) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "write-backs started: {}, expected {n}",
        started.load(Relaxed)
    );
}

/// A writer held at the dirty limit resumes as soon as one write-back
/// completes, not when the whole pass of write-backs has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_writer_resumes_on_first_write_back() {
    let (mem, permits, started, gate) = gate();
    let cache = CacheDev::new(gate, wb_config(256 << 10, 128 << 10));
    // Up to the target with 32 scattered blocks: nothing over the
    // target yet, so the flusher has nothing to do.
    for i in 0..32u64 {
        let r = cache
            .write(i * 8192, Bytes::from(vec![i as u8 + 1; 4096]), Flags::NONE)
            .await;
        assert_eq!(r, Ok(Reply::Done(4096)));
    }
    // One 128K write takes dirty data from the target to the limit at
    // once, so any flusher pass from now on writes back exactly the 32
    // oldest (scattered) blocks, 32 runs.
    let r = cache
        .write(1 << 20, Bytes::from(vec![0x55; 128 << 10]), Flags::NONE)
        .await;
    assert_eq!(r, Ok(Reply::Done(128 << 10)));
    assert_eq!(cache.dirty_bytes(), 256 << 10);
    // Over the limit: this one waits for write-back.
    let held = tokio::spawn(cache.write(2 << 20, Bytes::from(vec![0xAA; 4096]), Flags::NONE));
    wait_started(&started, 32).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(started.load(Relaxed), 32, "one pass of 32 runs");
    assert!(!held.is_finished(), "writer went past the dirty limit");
    // One write-back completes: the writer must go on while the other
    // 31 are still held below.
    permits.add_permits(1);
    let r = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("writer still held after a write-back completed")
        .expect("task");
    assert_eq!(r, Ok(Reply::Done(4096)));
    assert!(cache.dirty_bytes() > 128 << 10);
    // Let everything through; a flush leaves nothing dirty and the data
    // below is what was written.
    permits.add_permits(10_000);
    cache.flush().await.unwrap();
    assert_eq!(cache.dirty_bytes(), 0);
    for i in 0..32u64 {
        let d = mem.read(i * 8192, 4096).await.unwrap();
        assert!(d.iter().all(|&b| b == i as u8 + 1), "block {i}");
    }
    let d = mem.read(1 << 20, 128 << 10).await.unwrap();
    assert!(d.iter().all(|&b| b == 0x55));
    let d = mem.read(2 << 20, 4096).await.unwrap();
    assert!(d.iter().all(|&b| b == 0xAA));
}

/// dirty_target equal to dirty_limit: a writer at the limit still gets
/// room (the flusher writes back what the waiting writer needs) instead
/// of waiting for max_age.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_equal_to_limit_does_not_stall_writers() {
    let (mem, permits, started, gate) = gate();
    permits.add_permits(1 << 20);
    let cache = CacheDev::new(gate, wb_config(64 << 10, 64 << 10));
    for i in 0..32u64 {
        let w = cache.write(i * 8192, Bytes::from(vec![i as u8 + 1; 4096]), Flags::NONE);
        let r = tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("writer stalled at the dirty limit");
        assert_eq!(r, Ok(Reply::Done(4096)));
    }
    assert!(started.load(Relaxed) >= 16, "{started:?}");
    assert!(cache.dirty_bytes() <= 64 << 10);
    cache.flush().await.unwrap();
    for i in 0..32u64 {
        let d = mem.read(i * 8192, 4096).await.unwrap();
        assert!(d.iter().all(|&b| b == i as u8 + 1), "block {i}");
    }
}

/// Eviction drops the least recently used clean blocks, skips busy and
/// dirty ones, and keeps the byte counts in step.
#[test]
fn map_evicts_lru_clean_blocks_outside_busy_ranges() {
    let mut st = State::default();
    for b in 0..4 {
        st.insert_clean(b, vec![b as u8; 100]);
    }
    // Use order now 1, 2, 3, 0; block 1 busy, block 2 dirty.
    st.touch(0);
    let busy = st.push_busy(1, 2);
    st.mark_dirty(2);
    assert_eq!((st.bytes, st.dirty_bytes), (400, 100));
    assert_eq!(st.evict(200), 2);
    let mut left: Vec<u64> = st.map.keys().copied().collect();
    left.sort_unstable();
    assert_eq!(left, vec![1, 2], "LRU clean block 3 and then 0 go");
    assert_eq!((st.bytes, st.dirty_bytes), (200, 100));
    // Nothing more to evict while 1 is busy and 2 is dirty.
    assert_eq!(st.evict(0), 0);
    assert!(st.drop_busy(busy).is_some());
    assert_eq!(st.evict(0), 1);
    assert_eq!(st.map.keys().copied().collect::<Vec<_>>(), vec![2]);
}

/// A write-back of an old snapshot records it as flushed but leaves a
/// block changed since dirty; the current snapshot makes it clean.
#[test]
fn map_written_back_cleans_only_unchanged_blocks() {
    let mut st = State::default();
    st.insert_dirty(7, vec![1; 512]);
    let g1 = st.map[&7].gen;
    st.mark_dirty(7);
    let g2 = st.map[&7].gen;
    assert!(g2 > g1);
    st.written_back(7, g1);
    assert!(st.map[&7].dirty);
    assert_eq!(st.map[&7].flushed_gen, g1);
    assert_eq!(st.dirty_bytes, 512);
    assert_eq!(st.dirty_gens(None).len(), 1);
    st.written_back(7, g2);
    assert!(!st.map[&7].dirty);
    assert_eq!(
        (st.dirty_bytes, st.dirty.len(), st.dirty_fifo.len()),
        (0, 0, 0)
    );
    assert_eq!(st.lru.len(), 1);
}

/// A fill is tainted by any overlapping change, and one not registered
/// counts as tainted.
#[test]
fn map_fills_are_tainted_by_overlapping_changes() {
    let mut st = State::default();
    let a = st.push_fill(0, 4);
    let b = st.push_fill(8, 9);
    st.taint(3, 5);
    assert!(st.take_fill(a));
    assert!(!st.take_fill(b));
    assert!(st.take_fill(b), "taken twice");
}
