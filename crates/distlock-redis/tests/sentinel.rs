//! `redis+sentinel://`: the master found through three real sentinels, also after a failover.

use distlock_core::Error;
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{self, ServerHarness};
use distlock_testkit::tls_cases::{client_options, fails, works};
use distlock_testkit::{SentinelSetup, SENTINEL_MASTER};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_subset_through_sentinel() {
    let setup = SentinelSetup::start().expect("sentinel setup");
    let h = ServerHarness::new(setup, SentinelSetup::url, |url, o| async move {
        RedisBackend::connect(&url, &o).await
    });
    conformance::mutual_exclusion(&h).await;
    conformance::reentrancy(&h).await;
    conformance::fencing_tokens_increase(&h).await;
    conformance::waiter_woken_by_release(&h).await;
}

#[tokio::test]
async fn unknown_master_and_bad_urls() {
    let setup = SentinelSetup::start().expect("sentinel setup");
    let url = setup.url().replace(SENTINEL_MASTER, "nosuchmaster");
    let e = fails(RedisBackend::connect(&url, &client_options()).await);
    assert!(e.is_connection(), "{e:?}");
    assert!(e.to_string().contains("nosuchmaster"), "{e}");
    for bad in [
        "redis+sentinel://127.0.0.1:1",
        "redis+sentinel:///m",
        "redis+sentinel://127.0.0.1:1/m?ca_file=/x",
    ] {
        let e = fails(RedisBackend::connect(bad, &client_options()).await);
        assert!(matches!(e, Error::InvalidUrl { .. }), "{bad}: {e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connect_after_failover_finds_the_promoted_replica() {
    let mut setup = SentinelSetup::start().expect("sentinel setup");
    let url = setup.url();
    works(RedisBackend::connect(&url, &client_options()).await).await;
    let (old, new) = (setup.master().port(), setup.replica().port());
    assert_eq!(setup.current_master_port(), Some(old));
    setup.master_mut().kill();
    // Wait for the sentinels to promote the replica (down-after 1 s, then the election).
    let t = Instant::now();
    while setup.current_master_port() != Some(new) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no failover after {:?}",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The promoted replica accepts writes once its role is master.
    let t = Instant::now();
    while !setup
        .replica()
        .command(&["ROLE"])
        .map(|r| r.starts_with("master"))
        .unwrap_or(false)
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "replica not promoted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = RedisBackend::connect(&url, &client_options())
        .await
        .expect("connect after failover");
    works(Ok(b)).await;
}
