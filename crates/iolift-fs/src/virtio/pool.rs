//! A fixed pool of threads that serve requests handed over by the queue
//! threads, so that one virtqueue can have many requests of a blocking
//! backend in progress at once (as virtiofsd's `--thread-pool-size`).
//! The hand-over queue is bounded: a full queue makes the queue thread
//! wait, which leaves further requests in the guest's ring.

use super::reply::Reply;
use super::session::Session;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

type Job = (Vec<u8>, Reply);

pub struct Pool {
    tx: SyncSender<Job>,
}

impl Pool {
    /// `threads` workers; at most `backlog` requests wait for one.
    pub fn new(session: Arc<Session>, threads: usize, backlog: usize) -> std::io::Result<Pool> {
        let (tx, rx) = sync_channel::<Job>(backlog.max(1));
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let (rx, s) = (rx.clone(), session.clone());
            std::thread::Builder::new()
                .name(format!("virtiofs-pool-{i}"))
                .spawn(move || worker(&rx, &s))?;
        }
        Ok(Pool { tx })
    }

    pub fn submit(&self, req: Vec<u8>, reply: Reply) {
        if let Err(e) = self.tx.send((req, reply)) {
            // Every worker is gone (a panic in a backend): the reply,
            // dropped here, answers EIO.
            drop(e.0);
        }
    }
}

fn worker(rx: &Mutex<Receiver<Job>>, s: &Session) {
    loop {
        let job = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        match job {
            Ok((req, reply)) => s.handle(&req, reply),
            Err(_) => return,
        }
    }
}
