//! A small pool of idle connections that hold nothing.

use std::sync::{Mutex as StdMutex, MutexGuard};

/// Idle connections kept for reuse (at most `max`; more are dropped, which closes them).
pub struct IdlePool<C> {
    idle: StdMutex<Vec<C>>,
    max: usize,
}

impl<C> IdlePool<C> {
    /// A pool keeping at most `max` connections.
    pub fn new(max: usize) -> Self {
        IdlePool {
            idle: StdMutex::new(Vec::new()),
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<C>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently kept connection.
    pub fn take(&self) -> Option<C> {
        self.lock().pop()
    }

    /// Keeps `conn` (or drops it when the pool is full).
    pub fn put(&self, conn: C) {
        let mut idle = self.lock();
        if idle.len() < self.max {
            idle.push(conn);
        }
    }

    /// Drops every idle connection (the server went away: they are dead too).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// How many connections are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
