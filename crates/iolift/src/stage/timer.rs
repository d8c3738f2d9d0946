//! Sleeps with microsecond resolution.
//!
//! tokio's timer wheel has a 1 ms resolution, so `tokio::time::sleep(50us)`
//! sleeps about 1 ms. Delays of 2 ms and more use tokio timers; shorter ones
//! are queued on one timer thread that waits with a 1 us timer slack and
//! completes a oneshot per deadline. One thread serves every stage.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

struct Entry {
    at: Instant,
    seq: u64,
    tx: oneshot::Sender<()>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Wheel {
    heap: Mutex<(BinaryHeap<Reverse<Entry>>, u64)>,
    thread: Thread,
}

fn wheel() -> &'static Wheel {
    static W: OnceLock<&'static Wheel> = OnceLock::new();
    W.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<&'static Wheel>();
        let h = std::thread::Builder::new()
            .name("iolift-timer".into())
            .spawn(move || {
                // SAFETY: prctl with plain integer arguments on this thread.
                unsafe {
                    libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64);
                }
                let w: &'static Wheel = rx.recv().expect("timer wheel");
                run(w)
            })
            .expect("spawn timer thread");
        let w: &'static Wheel = Box::leak(Box::new(Wheel {
            heap: Mutex::new((BinaryHeap::new(), 0)),
            thread: h.thread().clone(),
        }));
        tx.send(w).expect("timer thread");
        w
    })
}

fn run(w: &'static Wheel) -> ! {
    loop {
        let next = {
            let mut g = w.heap.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            while g.0.peek().is_some_and(|Reverse(e)| e.at <= now) {
                let Reverse(e) = g.0.pop().expect("peeked");
                let _ = e.tx.send(());
            }
            g.0.peek().map(|Reverse(e)| e.at)
        };
        match next {
            Some(at) => std::thread::park_timeout(at.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
    }
}

/// Sleeps for `d`, precisely for short delays.
pub async fn sleep(d: Duration) {
    if d.is_zero() {
        return;
    }
    if d >= Duration::from_millis(2) {
        tokio::time::sleep(d).await;
        return;
    }
    let w = wheel();
    let (tx, rx) = oneshot::channel();
    let at = Instant::now() + d;
    let first = {
        let mut g = w.heap.lock().unwrap_or_else(|e| e.into_inner());
        g.1 += 1;
        let seq = g.1;
        let first = g.0.peek().is_none_or(|Reverse(e)| at < e.at);
        g.0.push(Reverse(Entry { at, seq, tx }));
        first
    };
    if first {
        w.thread.unpark();
    }
    let _ = rx.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sleeps_at_least_the_delay() {
        for us in [1, 50, 500, 2500] {
            let t = Instant::now();
            sleep(Duration::from_micros(us)).await;
            assert!(t.elapsed() >= Duration::from_micros(us));
        }
    }
}
