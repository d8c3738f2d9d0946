//! Work deferred to the end of a batch of requests on one thread.
//!
//! A front-end thread that serves several requests in a row (the virtio
//! queue thread popping every available chain, the mirror's io_uring
//! reaper completing every finished I/O) opens a batch with [`run`];
//! what the requests [`defer`] inside it runs once at the end, once per
//! key: so one `io_uring_enter` submits every I/O the batch queued, and
//! one notification tells the guest about every reply the batch wrote.
//! Outside a batch, deferred work runs at once.

use std::cell::RefCell;

/// What a deferred piece of work is, with the address of the object it
/// belongs to: two pieces with the same key are the same work, done once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// Submit what a ring has queued.
    Submit(usize),
    /// Signal a virtqueue's used ring.
    Notify(usize),
}

type Work = Vec<(Key, Box<dyn FnOnce()>)>;

thread_local! {
    static BATCH: RefCell<Option<Work>> = const { RefCell::new(None) };
}

/// Closes the batch even if a piece of work panics.
struct Close;

impl Drop for Close {
    fn drop(&mut self) {
        BATCH.with(|b| *b.borrow_mut() = None);
    }
}

/// Runs `f` as one batch: work deferred inside it (and inside the deferred
/// work itself) runs when `f` returns. A batch inside a batch is part of
/// the outer one.
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    let nested = BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.is_some() {
            return true;
        }
        *b = Some(Vec::new());
        false
    });
    if nested {
        return f();
    }
    let _close = Close;
    let r = f();
    loop {
        let work = BATCH.with(|b| b.borrow_mut().as_mut().map(std::mem::take));
        match work {
            Some(w) if !w.is_empty() => w.into_iter().for_each(|(_, f)| f()),
            _ => break,
        }
    }
    r
}

/// Runs `f` at the end of this thread's batch (unless work with the same
/// key is already waiting there), or now when no batch is open.
pub fn defer(key: Key, f: impl FnOnce() + 'static) {
    let f: Box<dyn FnOnce()> = Box::new(f);
    let now = BATCH.with(|b| match b.borrow_mut().as_mut() {
        Some(w) => {
            if !w.iter().any(|(k, _)| *k == key) {
                w.push((key, f));
            }
            None
        }
        None => Some(f),
    });
    if let Some(f) = now {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn deferred_work_runs_once_per_key_at_the_end_or_at_once() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        defer(Key::Notify(1), move || l.borrow_mut().push("now"));
        assert_eq!(*log.borrow(), ["now"]);
        let l = log.clone();
        run(|| {
            for i in 0..3 {
                let l2 = l.clone();
                defer(Key::Notify(1), move || l2.borrow_mut().push("notify"));
                let l3 = l.clone();
                // Work deferred by deferred work runs in the same batch.
                defer(Key::Submit(i % 2), move || {
                    l3.borrow_mut().push("submit");
                    let l4 = l3.clone();
                    defer(Key::Notify(2), move || l4.borrow_mut().push("late"));
                });
            }
            run(|| l.borrow_mut().push("inner"));
            assert_eq!(l.borrow().len(), 2, "nothing deferred ran inside");
        });
        assert_eq!(
            *log.borrow(),
            ["now", "inner", "notify", "submit", "submit", "late"]
        );
        // The batch is closed: work runs at once again.
        let l = log.clone();
        defer(Key::Notify(1), move || l.borrow_mut().push("after"));
        assert_eq!(log.borrow().last(), Some(&"after"));
    }
}
