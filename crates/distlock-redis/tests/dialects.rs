//! The shared conformance suite's mutex cases on the dialects' layouts (`?dialect=redisson`,
//! `?dialect=python-redis-lock`): dlock's own promises — exclusion, re-entry, fencing tokens,
//! wake-ups, the watchdog, the lost signal, retried and late requests through a proxy that
//! delays, drops and duplicates — hold on another library's keys too. Tests against the peer
//! libraries themselves are in crates/distlock-cli/tests/dialects.rs.

use distlock_core::{Client, Error, LockKind};
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{fast_opts, unique_name, ServerHarness};
use distlock_testkit::{RedisCluster, RedisServer};

fn harness(dialect: &'static str) -> ServerHarness<RedisServer> {
    let server = RedisServer::start().expect("start redis-server");
    ServerHarness::new(
        server,
        move |s| format!("{}?dialect={dialect}", s.url()),
        |url, o| async move { RedisBackend::connect(&url, &o).await },
    )
    .proxy(|s| vec![s.addr()])
    .lose_data(|s| async move { assert_eq!(s.command(&["FLUSHALL"]).expect("FLUSHALL"), "OK") })
    .break_lock(move |s, name| async move {
        let key = match dialect {
            "redisson" => name.to_string(),
            _ => format!("lock:{name}"),
        };
        assert_eq!(
            s.command(&["DEL", &key]).expect("DEL"),
            "1",
            "nothing to delete"
        );
    })
}

/// The conformance cases that apply to a plain mutex without a server-side queue, on the
/// keys of `$dialect`.
macro_rules! mutex_cases {
    ($dialect:literal) => {
        use super::*;
        distlock_testkit::conformance_suite!(@cases harness($dialect);
            mutual_exclusion, try_acquire_contended, reentrancy, non_owner_cannot_release,
            fencing_tokens_increase, acquire_timeout_deadline, waiter_woken_by_release,
            cancelled_acquire_leaves_nothing, watchdog_renews, drop_releases,
            fixed_lease_expires, crashed_holder_frees_at_lease_end, extend_lease,
            lost_when_broken);
        distlock_testkit::adversarial_suite!(@cases harness($dialect);
            late_reply_on_release, retried_acquire_is_one, late_reply_on_renew,
            extend_shorter_than_watchdog, fixed_and_watchdog_guards, cancel_at_every_await,
            data_loss_tokens_increase, contended_soak,
            late_request_of_a_try, late_request_of_a_released_attempt, late_request_of_a_wait);
    };
}

mod redisson {
    mutex_cases!("redisson");
}

mod python_redis_lock {
    mutex_cases!("python-redis-lock");
}

/// The kinds a dialect does not speak are refused, saying what to do instead; so are a
/// cluster for python-redis-lock and an unknown dialect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_kinds_and_unknown_dialects_are_refused() {
    let server = RedisServer::start().expect("redis");
    for dialect in ["redisson", "python-redis-lock"] {
        let url = format!("{}?dialect={dialect}", server.url());
        let b = RedisBackend::connect(&url, &fast_opts())
            .await
            .expect("connect");
        let c = Client::new(std::sync::Arc::new(b), fast_opts()).expect("client");
        let e = c
            .rw_lock("x")
            .expect("handle")
            .read()
            .try_acquire()
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        assert!(e.to_string().contains(&format!("dialect={dialect}")), "{e}");
        let e = c.inspect_kind("x", LockKind::Fair).await.unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        // The lock key is the name itself: other data under it is a typed error saying so.
        let key = match dialect {
            "redisson" => "taken".to_owned(),
            _ => "lock:taken".to_owned(),
        };
        match dialect {
            "redisson" => server.command(&["SET", &key, "x"]).expect("set"),
            _ => server.command(&["HSET", &key, "f", "v"]).expect("hset"),
        };
        let e = c
            .lock("taken")
            .expect("lock")
            .try_acquire()
            .await
            .unwrap_err();
        assert!(matches!(e, Error::UnexpectedReply { .. }), "{e:?}");
        assert!(e.to_string().contains(&format!("key `{key}`")), "{e}");
    }
    let e = RedisBackend::connect(&format!("{}?dialect=jedis", server.url()), &fast_opts())
        .await
        .err()
        .expect("unknown dialect");
    assert!(e.to_string().contains("redisson, python-redis-lock"), "{e}");
}

/// Redis Cluster: Redisson's lock and dlock's keys beside it stay in the lock's slot, so the
/// scripts run (no CROSSSLOT), renewals go by slot, and release wake-ups cross nodes;
/// python-redis-lock's two keys do not share a slot, so that dialect is refused there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_dialect_on_a_cluster() {
    let cluster = RedisCluster::start().expect("cluster");
    let url = format!("{}?dialect=redisson", cluster.url());
    let make = || async {
        let b = RedisBackend::connect(&url, &fast_opts())
            .await
            .expect("connect");
        Client::new(std::sync::Arc::new(b), fast_opts()).expect("client")
    };
    let (a, b) = (make().await, make().await);
    // Names in many slots, with and without a hash tag of their own.
    for name in ["orders", "a{tag}b", &unique_name("slot")] {
        let g = a
            .lock(name)
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .expect("free");
        assert!(b
            .lock(name)
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .is_none());
        g.extend(std::time::Duration::from_secs(5))
            .await
            .expect("renew by slot");
        let waiter = {
            let b = b.clone();
            let name = name.to_owned();
            tokio::spawn(async move {
                b.lock(&name)
                    .expect("lock")
                    .acquire_timeout(std::time::Duration::from_secs(20))
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let first = g.fencing_token();
        g.release().await.expect("release");
        let g2 = waiter.await.expect("join").expect("woken");
        assert!(g2.fencing_token() > first);
        g2.release().await.expect("release");
    }
    let e = RedisBackend::connect(
        &format!("{}?dialect=python-redis-lock", cluster.url()),
        &fast_opts(),
    )
    .await
    .err()
    .expect("refused");
    assert!(e.to_string().contains("python-redis-lock"), "{e}");
}

/// Through Sentinel: both dialects lock the peer's keys on the master the sentinels name,
/// and exclude each other; a waiter gets the lock after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dialects_through_sentinel() {
    use distlock_testkit::SentinelSetup;
    use std::time::Duration;
    let setup = SentinelSetup::start().expect("sentinel setup");
    for (dialect, key) in [("redisson", "orders"), ("python-redis-lock", "lock:orders")] {
        let url = format!("{}?dialect={dialect}", setup.url());
        let make = || async {
            let b = RedisBackend::connect(&url, &fast_opts())
                .await
                .expect("connect");
            Client::new(std::sync::Arc::new(b), fast_opts()).expect("client")
        };
        let (a, b) = (make().await, make().await);
        let g = a
            .lock("orders")
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .expect("free");
        assert_eq!(
            setup.master().command(&["EXISTS", key]).expect("exists"),
            "1"
        );
        assert!(b
            .lock("orders")
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .is_none());
        let waiter = tokio::spawn(async move {
            b.lock("orders")
                .expect("lock")
                .acquire_timeout(Duration::from_secs(20))
                .await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        g.release().await.expect("release");
        let g2 = waiter.await.expect("join").expect("woken");
        g2.release().await.expect("release");
    }
}
