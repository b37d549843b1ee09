//! Helpers shared by this crate's test files (each includes it with `mod common;`).
#![allow(dead_code)] // each test file uses a part

use distlock_core::{Client, LockGuard};

/// Acquires mutex `name` through `c`, waiting as long as it takes.
pub async fn hold(c: &Client, name: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire")
}

/// Acquires the read side of read-write lock `name` through `c`.
pub async fn read(c: &Client, name: &str) -> LockGuard {
    c.rw_lock(name)
        .expect("rw")
        .read()
        .acquire()
        .await
        .expect("read")
}
