//! A one-shot result that can be awaited (as a future) or waited for (by a
//! blocking thread): what the engine's convenience calls return.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

struct State<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// A thread sleeps in [`Pending::wait`]: only then does `set` signal
    /// the condition variable (a system call even with nobody waiting).
    sleeping: bool,
}

struct Inner<T> {
    state: Mutex<State<T>>,
    cv: Condvar,
}

/// The receiving side: a future, or [`Pending::wait`].
pub struct Pending<T>(Arc<Inner<T>>);

/// The sending side; [`Setter::set`] completes the [`Pending`].
pub struct Setter<T>(Arc<Inner<T>>);

/// A connected pair.
pub fn pair<T>() -> (Setter<T>, Pending<T>) {
    let inner = Arc::new(Inner {
        state: Mutex::new(State {
            value: None,
            waker: None,
            sleeping: false,
        }),
        cv: Condvar::new(),
    });
    (Setter(inner.clone()), Pending(inner))
}

impl<T> Setter<T> {
    pub fn set(self, v: T) {
        let (waker, sleeping) = {
            let mut s = self.0.state.lock().unwrap();
            s.value = Some(v);
            (s.waker.take(), s.sleeping)
        };
        if sleeping {
            self.0.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Pending<T> {
    /// Blocks the calling thread until the value is set.
    pub fn wait(self) -> T {
        let mut s = self.0.state.lock().unwrap();
        loop {
            if let Some(v) = s.value.take() {
                return v;
            }
            s.sleeping = true;
            s = self.0.cv.wait(s).unwrap();
        }
    }
}

impl<T> Future for Pending<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.0.state.lock().unwrap();
        match s.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
