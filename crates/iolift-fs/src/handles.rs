//! A bounded table of open handles by `fh`, shared by the backends that
//! keep their own open files and directories (mirror, nfs).

use crate::model::{Errno, FsResult};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Open handles by `fh`, at most `max` (ENFILE beyond). Handle numbers
/// start at 1 and are never reused.
pub struct HandleTable<T> {
    map: RwLock<HashMap<u64, Arc<T>>>,
    next: AtomicU64,
    max: usize,
}

impl<T> HandleTable<T> {
    pub fn new(max: usize) -> HandleTable<T> {
        HandleTable {
            map: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
            max: max.max(1),
        }
    }

    /// Checks that one more handle fits (before opening anything costly).
    pub fn room(&self) -> FsResult<()> {
        if self.len() >= self.max {
            return Err(Errno::ENFILE);
        }
        Ok(())
    }

    pub fn add(&self, h: T) -> FsResult<u64> {
        let mut m = self.map.write().unwrap_or_else(|e| e.into_inner());
        if m.len() >= self.max {
            return Err(Errno::ENFILE);
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        m.insert(fh, Arc::new(h));
        Ok(fh)
    }

    /// The handle `fh` (EBADF if it is not open: a malformed request).
    pub fn get(&self, fh: u64) -> FsResult<Arc<T>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    pub fn contains(&self, fh: u64) -> bool {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&fh)
    }

    /// Takes `fh` out of the table (EBADF if it is not open).
    pub fn remove(&self, fh: u64) -> FsResult<Arc<T>> {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh)
            .ok_or(Errno::EBADF)
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_never_reused() {
        let t = HandleTable::new(2);
        let a = t.add("a").unwrap();
        let b = t.add("b").unwrap();
        assert_eq!(t.add("c"), Err(Errno::ENFILE));
        assert_eq!(t.room(), Err(Errno::ENFILE));
        assert_eq!(*t.remove(a).unwrap(), "a");
        assert_eq!(t.remove(a).map(drop), Err(Errno::EBADF));
        assert!(t.get(a).is_err() && t.contains(b));
        let c = t.add("c").unwrap();
        assert!(c != a && c != b);
        assert_eq!(t.len(), 2);
    }
}
