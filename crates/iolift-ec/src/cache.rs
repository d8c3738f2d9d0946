//! A bounded cache of decode plans, keyed by erasure pattern (the chunks
//! at hand, in order, and the chunks wanted). Decoding the same pattern
//! again (every stripe of a degraded object, every read of a degraded
//! stripe) then skips the matrix inversion and the table expansion. At
//! most `capacity` plans are kept; when full, the least recently used
//! one is dropped. Capacity 0 keeps nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Plans kept per codec unless set otherwise: a plan for k = 12, m = 4
/// takes about 3 KiB, so 64 of them about 200 KiB.
pub const DEFAULT_CAPACITY: usize = 64;

/// The key: `have`, a separator, `want` (chunk ids are below 256 + 256).
fn key(have: &[usize], want: &[usize]) -> Vec<u16> {
    let mut k = Vec::with_capacity(have.len() + want.len() + 1);
    k.extend(have.iter().map(|&i| i as u16));
    k.push(u16::MAX);
    k.extend(want.iter().map(|&i| i as u16));
    k
}

struct Inner<T> {
    map: HashMap<Vec<u16>, (Arc<T>, u64)>,
    clock: u64,
}

pub struct PlanCache<T> {
    capacity: usize,
    inner: Mutex<Inner<T>>,
}

impl<T> PlanCache<T> {
    pub fn new(capacity: usize) -> PlanCache<T> {
        PlanCache {
            capacity,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                clock: 0,
            }),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Plans held now.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // A panic while holding the lock cannot leave the map half-updated
        // (each update is one insert or remove), so a poisoned lock is used.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plan for (have, want), made by `make` if not cached.
    pub fn get_or_make<E>(
        &self,
        have: &[usize],
        want: &[usize],
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        if self.capacity == 0 {
            return make().map(Arc::new);
        }
        let k = key(have, want);
        {
            let mut g = self.lock();
            g.clock += 1;
            let now = g.clock;
            if let Some((p, used)) = g.map.get_mut(&k) {
                *used = now;
                return Ok(p.clone());
            }
        }
        // Made outside the lock: other patterns are not held up by an
        // inversion. Two threads may make the same plan; one is kept.
        let plan = Arc::new(make()?);
        let mut g = self.lock();
        g.clock += 1;
        let now = g.clock;
        if !g.map.contains_key(&k) && g.map.len() >= self.capacity {
            if let Some(old) = g
                .map
                .iter()
                .min_by_key(|(_, v)| v.1)
                .map(|(k, _)| k.clone())
            {
                g.map.remove(&old);
            }
        }
        g.map.insert(k, (plan.clone(), now));
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_least_recently_used_goes() {
        let c: PlanCache<usize> = PlanCache::new(2);
        let made = std::cell::Cell::new(0);
        let get = |h: usize| {
            *c.get_or_make::<()>(&[h], &[9], || {
                made.set(made.get() + 1);
                Ok(h * 10)
            })
            .unwrap()
        };
        assert_eq!(get(1), 10);
        assert_eq!(get(2), 20);
        assert_eq!(get(1), 10); // cached; 2 is now the oldest
        assert_eq!(made.get(), 2);
        assert_eq!(get(3), 30); // evicts 2
        assert_eq!(c.len(), 2);
        assert_eq!(get(1), 10);
        assert_eq!(made.get(), 3);
        assert_eq!(get(2), 20);
        assert_eq!(made.get(), 4);
        // have and want are told apart, and order matters.
        let a = c.get_or_make::<()>(&[1, 2], &[3], || Ok(1)).unwrap();
        let b = c.get_or_make::<()>(&[1], &[2, 3], || Ok(2)).unwrap();
        let d = c.get_or_make::<()>(&[2, 1], &[3], || Ok(3)).unwrap();
        assert_eq!((*a, *b, *d), (1, 2, 3));
    }

    #[test]
    fn capacity_zero_keeps_nothing_and_errors_are_not_cached() {
        let c: PlanCache<u8> = PlanCache::new(0);
        assert_eq!(*c.get_or_make::<()>(&[1], &[2], || Ok(5)).unwrap(), 5);
        assert!(c.is_empty());
        let c: PlanCache<u8> = PlanCache::new(4);
        assert!(c.get_or_make(&[1], &[2], || Err("singular")).is_err());
        assert!(c.is_empty());
        assert_eq!(*c.get_or_make::<()>(&[1], &[2], || Ok(7)).unwrap(), 7);
    }
}
