//! Helpers shared by this crate's test files.
#![allow(dead_code)]

use distlock_core::{Client, ClientOptions, LockGuard, ReleaseOutcome, Result};
use distlock_redis::RedisBackend;
use std::sync::Arc;
use std::time::Duration;

/// A client on `url` and its backend.
pub async fn client_for(url: &str, opts: ClientOptions) -> (Client, Arc<RedisBackend>) {
    let backend = Arc::new(RedisBackend::connect(url, &opts).await.expect("connect"));
    let client = Client::new(backend.clone(), opts).expect("client");
    (client, backend)
}

/// `name` acquired through `c` (waiting without a bound).
pub async fn acquired(c: &Client, name: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire")
}

/// Releases `g`, the last guard of its hold.
pub async fn released(g: LockGuard) {
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// `name` acquired through `client`, waiting at most `secs` seconds.
pub async fn acquire_within(client: &Client, name: &str, secs: u64) -> Result<LockGuard> {
    client
        .lock(name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(secs))
        .await
}

/// A unique lock name of `prefix` whose keys live on master `m` of `cluster`.
pub fn name_on(cluster: &distlock_testkit::RedisCluster, m: usize, prefix: &str) -> String {
    (0..)
        .map(|i| distlock_testkit::conformance::unique_name(&format!("{prefix}{i}")))
        .find(|n| {
            cluster
                .master_of(&format!("dlock:{{{n}}}"))
                .expect("master")
                == m
        })
        .expect("some name")
}
