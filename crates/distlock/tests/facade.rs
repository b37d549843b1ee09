//! The facade: `connect(url)` for every built backend, and the blocking API.

use distlock::{ClientOptions, Error, ReleaseOutcome};
use distlock_testkit::{RedisServer, TempDir};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_by_url() {
    let server = RedisServer::start().expect("redis");
    let dir = TempDir::new().expect("tmp");
    for url in [server.url(), format!("file://{}", dir.path().display())] {
        let client = distlock::connect(&url).await.expect("connect");
        let g = client
            .lock("facade")
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        assert!(g.fencing_token() >= 1);
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test]
async fn bad_urls() {
    let mut cases = vec![
        ("localhost:6379", "no scheme"),
        ("nope://x", "unknown scheme"),
        ("redis://h?x=1", "unknown parameter"),
        ("file://relative/dir", "file:///"),
    ];
    if cfg!(not(feature = "tls")) {
        cases.push(("rediss://h", "tls"));
    }
    for (url, want) in cases {
        let err = distlock::connect(url).await.expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains(want), "{url}: {err}");
    }
    let err = distlock::connect_with(
        "redis://127.0.0.1:1",
        ClientOptions::default().watchdog_lease(Duration::from_millis(5)),
    )
    .await
    .expect_err("short lease");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[test]
fn blocking_api() {
    let server = RedisServer::start().expect("redis");
    let client = distlock::blocking::connect(&server.url()).expect("connect");
    let other = distlock::blocking::connect(&server.url()).expect("connect");
    let lock = client.lock("nightly").expect("lock");
    let g = lock.acquire().expect("acquire");
    assert!(!g.is_lost());
    assert!(other
        .lock("nightly")
        .expect("lock")
        .try_acquire()
        .expect("try")
        .is_none());
    let err = other
        .lock("nightly")
        .expect("lock")
        .acquire_timeout(Duration::from_millis(200))
        .expect_err("held");
    assert!(err.is_timeout());
    let info = other.inspect("nightly").expect("inspect");
    assert_eq!(info.holders[0].owner, lock.owner_id());
    assert_eq!(g.release().expect("release"), ReleaseOutcome::Released);
    let g = other
        .lock("nightly")
        .expect("lock")
        .try_acquire()
        .expect("try")
        .expect("free");
    drop(g); // released in the background
    let g = client
        .lock("nightly")
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .expect("acquire after drop");
    assert_eq!(g.release().expect("release"), ReleaseOutcome::Released);
}

#[tokio::test]
async fn blocking_api_refuses_async_context() {
    let err = distlock::blocking::connect("redis://127.0.0.1:1").expect_err("must refuse");
    assert!(matches!(err, Error::Runtime(_)), "{err:?}");
}
