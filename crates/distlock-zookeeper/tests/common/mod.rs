//! Helpers shared by this crate's test files (each includes it with `mod common;`).
#![allow(dead_code)] // each test file uses a part

use distlock_core::{Client, ClientOptions, LockGuard, ReleaseOutcome};
use distlock_testkit::ZkEnsemble;
use distlock_zookeeper::ZkBackend;
use std::sync::Arc;
use std::time::Duration;

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

/// A client of its own ZooKeeper session on the ensemble at `url`.
pub async fn client_at(url: &str, opts: ClientOptions) -> Client {
    let backend = ZkBackend::connect(url, &opts).await.expect("connect");
    Client::new(Arc::new(backend), opts).expect("client")
}

/// A client of its own session on the shared test ensemble.
pub async fn shared_client(opts: ClientOptions) -> Client {
    client_at(&ZkEnsemble::shared().url(), opts).await
}

/// Releases `g` and checks that it was still held.
pub async fn released(g: LockGuard) {
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Acquires mutex `name` through `c` within `timeout`; `what` names the step if it fails.
pub async fn hold_within(c: &Client, name: &str, timeout: Duration, what: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire_timeout(timeout)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}
