//! The facade with the `zookeeper` feature: `distlock::connect("zk://…")` on a real ensemble.
#![cfg(feature = "zookeeper")]

use distlock::{ClientOptions, Error, ReleaseOutcome};
use distlock_testkit::ZkEnsemble;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_zk_url() {
    let ensemble = ZkEnsemble::shared();
    // A chroot and a namespace of our own; the chroot node is created on first use.
    let url = format!("{}/facade-test?namespace=app", ensemble.url());
    let opts = ClientOptions::default().watchdog_lease(Duration::from_secs(5));
    let a = distlock::connect_with(&url, opts.clone())
        .await
        .expect("connect");
    let b = distlock::connect_with(&url, opts).await.expect("connect");
    assert_eq!(a.backend_kind(), "zookeeper");
    let g = a
        .lock("facade")
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    assert!(g.fencing_token() > 0);
    assert!(b
        .lock("facade")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    let info = b.inspect("facade").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.fencing_token, g.fencing_token());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let g = b
        .lock("facade")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    drop(g);
}

#[tokio::test]
async fn bad_zk_urls() {
    for (url, want) in [
        ("zk://", "no host"),
        ("zk://h:x", "not a port"),
        ("zk://h?nope=1", "unknown parameter"),
    ] {
        let err = distlock::connect(url).await.expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains(want), "{url}: {err}");
    }
    // Nothing listens there: a connection error, quickly.
    let port = distlock_testkit::free_port();
    let opts = ClientOptions::default().connect_timeout(Duration::from_secs(2));
    let err = distlock::connect_with(&format!("zk://127.0.0.1:{port}"), opts)
        .await
        .expect_err("no server");
    assert!(err.is_connection(), "{err:?}");
}
