//! Work put off until the end of a batch of completion callbacks.
//!
//! The engine's thread reaps every completion the ring holds at once, then
//! calls their callbacks one after another inside [`run`]. A callback that
//! would make a system call of its own for each completion (a reply
//! written to a socket) can [`defer`] that call instead: the deferred work
//! runs once every callback of the batch has run, so that, for example,
//! the replies of one batch to one connection go out in one write. On any
//! other thread (an inline engine's caller, a thread of the caller's own)
//! [`defer`] hands the work back, to be done at once.
//!
//! The deferred work is bounded by the batch: at most one closure per
//! completion, run before the thread waits for the ring again.

use std::cell::RefCell;

/// Deferred work.
pub type Later = Box<dyn FnOnce()>;

thread_local! {
    /// Some while this thread runs a batch's callbacks.
    static LATER: RefCell<Option<Vec<Later>>> = const { RefCell::new(None) };
}

/// Runs `f` (a batch's callbacks), then everything they deferred, in the
/// order deferred (work deferred by deferred work runs too, after it).
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    let outer = LATER.with(|l| l.borrow_mut().replace(Vec::new()));
    let r = f();
    loop {
        let now = LATER.with(|l| std::mem::take(l.borrow_mut().as_mut().expect("in a batch")));
        if now.is_empty() {
            break;
        }
        for g in now {
            g();
        }
    }
    LATER.with(|l| *l.borrow_mut() = outer);
    r
}

/// Whether this thread is running a batch's callbacks (so [`defer`] would
/// take work).
pub fn active() -> bool {
    LATER.with(|l| l.borrow().is_some())
}

/// Puts `g` off until the end of the batch this thread is running; gives
/// it back if the thread is not running one.
pub fn defer(g: Later) -> Result<(), Later> {
    LATER.with(|l| match l.borrow_mut().as_mut() {
        Some(v) => {
            v.push(g);
            Ok(())
        }
        None => Err(g),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn deferred_work_runs_after_the_batch_in_order() {
        let log = Rc::new(RefCell::new(Vec::new()));
        assert!(!active());
        let l = log.clone();
        let back = defer(Box::new(move || l.borrow_mut().push("outside")));
        assert!(
            back.is_err(),
            "no batch on this thread: the work comes back"
        );
        let r = run(|| {
            assert!(active());
            for i in 0..3 {
                log.borrow_mut().push(["cb0", "cb1", "cb2"][i]);
                let l = log.clone();
                let l2 = log.clone();
                let took = defer(Box::new(move || {
                    l.borrow_mut().push(["later0", "later1", "later2"][i]);
                    if i == 2 {
                        // deferred by deferred work: still runs
                        assert!(defer(Box::new(move || l2.borrow_mut().push("last"))).is_ok());
                    }
                }));
                assert!(took.is_ok(), "inside a batch");
            }
            7
        });
        assert_eq!(r, 7);
        assert!(!active());
        assert_eq!(
            *log.borrow(),
            ["cb0", "cb1", "cb2", "later0", "later1", "later2", "last"]
        );
    }

    #[test]
    fn a_nested_batch_keeps_the_outer_one() {
        let log = Rc::new(RefCell::new(Vec::new()));
        run(|| {
            let l = log.clone();
            assert!(defer(Box::new(move || l.borrow_mut().push("outer"))).is_ok());
            run(|| {
                let l = log.clone();
                assert!(defer(Box::new(move || l.borrow_mut().push("inner"))).is_ok());
            });
            assert_eq!(*log.borrow(), ["inner"]);
            assert!(active());
        });
        assert_eq!(*log.borrow(), ["inner", "outer"]);
    }
}
