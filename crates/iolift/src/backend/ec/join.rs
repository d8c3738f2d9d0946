//! Waiting on several child requests at once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A boxed future of the `ec` backend's own.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs every future concurrently; their outputs in the same order.
pub async fn join_all<'a, T: Send + 'a>(futs: Vec<Fut<'a, T>>) -> Vec<T> {
    JoinAll {
        futs: futs.into_iter().map(Some).collect(),
        out: Vec::new(),
    }
    .await
}

struct JoinAll<'a, T> {
    futs: Vec<Option<Fut<'a, T>>>,
    out: Vec<Option<T>>,
}

// Outputs are moved, never pinned; the futures are boxed.
impl<T> Unpin for JoinAll<'_, T> {}

impl<T> Future for JoinAll<'_, T> {
    type Output = Vec<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<T>> {
        let this = self.get_mut();
        if this.out.len() != this.futs.len() {
            this.out = (0..this.futs.len()).map(|_| None).collect();
        }
        let mut pending = false;
        for (f, o) in this.futs.iter_mut().zip(this.out.iter_mut()) {
            if let Some(fut) = f {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *o = Some(v);
                        *f = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(this.out.drain(..).map(|o| o.expect("joined")).collect())
    }
}
