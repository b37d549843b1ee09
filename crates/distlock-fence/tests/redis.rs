//! Fenced Redis commands on a real redis-server, with tokens from real dlock locks.
#![cfg(feature = "redis")]

mod common;

use common::Tally;
use distlock_fence::redis::{FencedScript, RedisFence};
use distlock_fence::{Error, Outcome, Stamp};
use distlock_testkit::{DelayProxy, RedisServer};
use redis::aio::MultiplexedConnection;
use std::time::Duration;

async fn connect(url: &str, timeout: Duration) -> MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(timeout));
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect")
}

async fn get(con: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(con)
        .await
        .expect("GET")
}

#[tokio::test]
async fn the_rule_on_its_cases() {
    let server = RedisServer::start().expect("redis-server");
    let mut con = connect(&server.url(), Duration::from_secs(5)).await;
    let fence = RedisFence::new("{r}:fence");
    for &(recorded, stamp, expected) in distlock_fence::CASES {
        redis::cmd("DEL")
            .arg("{r}:fence")
            .arg("{r}:v")
            .query_async::<()>(&mut con)
            .await
            .expect("DEL");
        if let Some(r) = recorded {
            let _ = fence
                .set(&mut con, r, "{r}:v", "before")
                .await
                .expect("record");
        }
        let got = match fence.set(&mut con, stamp, "{r}:v", "after").await {
            Ok(Outcome::Applied(())) => Ok(true),
            Ok(Outcome::Duplicate) => Ok(false),
            Err(Error::Stale { token, newer }) => {
                assert_eq!(token, stamp.token);
                Err(newer)
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(got, expected, "{recorded:?} then {stamp:?}");
        let v = get(&mut con, "{r}:v").await;
        assert_eq!(
            v.as_deref() == Some("after"),
            expected == Ok(true),
            "{recorded:?} then {stamp:?}"
        );
    }
}

/// A holder paused past its lease writes after the next holder wrote: rejected, typed.
#[tokio::test]
async fn a_holder_paused_past_its_lease_is_rejected() {
    let server = RedisServer::start().expect("redis-server");
    let client = distlock::connect(&server.url()).await.expect("connect");
    let mut con = connect(&server.url(), Duration::from_secs(5)).await;
    redis::cmd("SET")
        .arg("{sku}:stock")
        .arg(10)
        .query_async::<()>(&mut con)
        .await
        .expect("SET");
    let fence = RedisFence::new("{sku}:fence");

    let lease = Duration::from_millis(300);
    let first = client
        .lock("sku")
        .expect("lock")
        .lease(lease)
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    let old = first.fencing_token();
    let read: Option<i64> = fence
        .get(&mut con, old, "{sku}:stock")
        .await
        .expect("fenced read");
    assert_eq!(read, Some(10));
    // The pause: the lease runs out, the next holder takes the lock and sells one.
    let second = client
        .lock("sku")
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("the next holder gets the lock after the lease");
    assert!(first.is_lost());
    let new = second.fencing_token();
    assert!(new > old);
    let n: Option<i64> = fence.get(&mut con, new, "{sku}:stock").await.expect("read");
    assert_eq!(n, Some(10));
    let left = fence
        .set(&mut con, Stamp::new(new), "{sku}:stock", 9)
        .await
        .expect("write");
    assert_eq!(left, Outcome::Applied(()));

    // The first holder is back and writes its stale decrement (and tries each command).
    let stale = Error::Stale {
        token: old,
        newer: new,
    };
    assert_eq!(
        fence
            .set(&mut con, Stamp::new(old), "{sku}:stock", 9)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        fence
            .decr_by(&mut con, Stamp::new(old).seq(1), "{sku}:stock", 1)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        fence
            .incr_by(&mut con, Stamp::new(old).seq(2), "{sku}:stock", 1)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        fence
            .hset(&mut con, Stamp::new(old), "{sku}:h", "f", 1)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        fence
            .del(&mut con, Stamp::new(old), &["{sku}:stock"])
            .await
            .unwrap_err(),
        stale
    );
    let script = FencedScript::new("return redis.call('SET', KEYS[1], ARGV[1])");
    let r = fence
        .eval::<_, ()>(&mut con, Stamp::new(old), &script, &["{sku}:stock"], &[&0])
        .await;
    assert_eq!(r.unwrap_err(), stale);
    assert!(fence
        .get::<_, i64>(&mut con, old, "{sku}:stock")
        .await
        .unwrap_err()
        .is_stale());
    assert_eq!(get(&mut con, "{sku}:stock").await.as_deref(), Some("9"));
    assert_eq!(get(&mut con, "{sku}:h").await, None);
    assert_eq!(
        fence.recorded(&mut con).await.expect("recorded"),
        Some(Stamp::new(new))
    );

    // The current holder's commands go through.
    assert_eq!(
        fence
            .hset(&mut con, Stamp::new(new), "{sku}:h", "f", 1)
            .await
            .expect("hset"),
        Outcome::Applied(1)
    );
    assert_eq!(
        fence
            .del(&mut con, Stamp::new(new), &["{sku}:h"])
            .await
            .expect("del"),
        Outcome::Applied(1)
    );
    second.release().await.expect("release");
}

/// The reply of a fenced increment is lost; the retry with the same stamp over a new
/// connection is not counted twice.
#[tokio::test]
async fn a_retried_write_of_the_holder_is_applied_once() {
    let server = RedisServer::start().expect("redis-server");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let via_proxy = format!("redis://127.0.0.1:{}", proxy.port());
    let fence = RedisFence::new("{c}:fence");
    let stamp = Stamp::new(42).seq(1);

    let mut con = connect(&via_proxy, Duration::from_millis(500)).await;
    // Load the script first (on another fence), so that the request whose reply is lost is
    // the script itself, not an EVALSHA answered NOSCRIPT.
    let warm = RedisFence::new("{c}:warm-up");
    let _ = warm
        .set(&mut con, Stamp::new(1), "{c}:warm", 1)
        .await
        .expect("warm-up");
    proxy.set_drop_replies(true);
    let lost = fence.incr_by(&mut con, stamp, "{c}:n", 1).await;
    assert!(matches!(lost, Err(Error::Store { .. })), "{lost:?}");
    proxy.heal();
    drop(con);

    let mut direct = connect(&server.url(), Duration::from_secs(5)).await;
    // The request reached the server: the retry is a duplicate, the count stays 1.
    let retried = fence
        .incr_by(&mut direct, stamp, "{c}:n", 1)
        .await
        .expect("retry");
    assert_eq!(retried, Outcome::Duplicate);
    assert_eq!(get(&mut direct, "{c}:n").await.as_deref(), Some("1"));
    // The next write of the grant counts; the one before it can no longer be replayed.
    assert_eq!(
        fence
            .incr_by(&mut direct, Stamp::new(42).seq(2), "{c}:n", 5)
            .await
            .expect("next"),
        Outcome::Applied(6)
    );
    assert_eq!(
        fence
            .decr_by(&mut direct, Stamp::new(42).seq(1), "{c}:n", 1)
            .await
            .expect("replay"),
        Outcome::Duplicate
    );
    assert_eq!(get(&mut direct, "{c}:n").await.as_deref(), Some("6"));

    // The user's own Lua, fenced and deduplicated the same way.
    let sell = FencedScript::new(
        "local left = tonumber(redis.call('GET', KEYS[1]) or '0')
         if left <= 0 then return -1 end
         redis.call('RPUSH', KEYS[2], ARGV[1])
         return redis.call('DECR', KEYS[1])",
    );
    let s3 = Stamp::new(42).seq(3);
    let a: Outcome<i64> = fence
        .eval(
            &mut direct,
            s3,
            &sell,
            &["{c}:n", "{c}:orders"],
            &[&"buyer-1"],
        )
        .await
        .expect("eval");
    let b: Outcome<i64> = fence
        .eval(
            &mut direct,
            s3,
            &sell,
            &["{c}:n", "{c}:orders"],
            &[&"buyer-1"],
        )
        .await
        .expect("eval again");
    assert_eq!((a, b), (Outcome::Applied(5), Outcome::Duplicate));
    let orders: Vec<String> = redis::cmd("LRANGE")
        .arg("{c}:orders")
        .arg(0)
        .arg(-1)
        .query_async(&mut direct)
        .await
        .expect("LRANGE");
    assert_eq!(orders, ["buyer-1"]);
}

/// Holders of a lock whose 150 ms leases run out while their traffic to the lock service and to
/// the store is delayed: holders overlap, and each does a fenced read, work and a fenced write of
/// value + 1. However they interleave, no accepted increment is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_behind_a_delay_proxy_lose_no_update() {
    let server = RedisServer::start().expect("redis-server");
    let proxy = DelayProxy::start(server.addr(), Duration::from_millis(40)).expect("proxy");
    let via_proxy = format!("redis://127.0.0.1:{}", proxy.port());
    let client = distlock::connect(&via_proxy).await.expect("connect");
    let mut setup = connect(&server.url(), Duration::from_secs(5)).await;
    redis::cmd("SET")
        .arg("{v}:n")
        .arg(0)
        .query_async::<()>(&mut setup)
        .await
        .expect("SET");
    let fence = RedisFence::new("{v}:fence");

    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let client = client.clone();
            let fence = fence.clone();
            let url = via_proxy.clone();
            tokio::spawn(async move {
                let mut con = connect(&url, Duration::from_secs(10)).await;
                let mut tally = Tally::default();
                for _ in 0..4 {
                    let lock = client
                        .lock("v")
                        .expect("lock")
                        .lease(Duration::from_millis(150))
                        .expect("lease");
                    let guard = lock
                        .acquire_timeout(Duration::from_secs(30))
                        .await
                        .expect("acquire");
                    let token = guard.fencing_token();
                    let r = async {
                        let n: i64 = fence.get(&mut con, token, "{v}:n").await?.unwrap_or(0);
                        // Work that sometimes outlasts the lease.
                        tokio::time::sleep(Duration::from_millis(fastrand_ms())).await;
                        fence.set(&mut con, Stamp::new(token), "{v}:n", n + 1).await
                    }
                    .await;
                    assert!(
                        !matches!(r, Ok(Outcome::Duplicate)),
                        "an unsequenced write is never a duplicate"
                    );
                    tally.record(r);
                    drop(guard);
                }
                tally
            })
        })
        .collect();
    let Tally { applied, stale, .. } = Tally::sum(tasks).await;
    let n: i64 = get(&mut setup, "{v}:n")
        .await
        .expect("n")
        .parse()
        .expect("number");
    eprintln!("{applied} increments accepted, {stale} rejected as stale, value {n}");
    assert_eq!(
        n as u64, applied,
        "{applied} increments accepted, {stale} rejected, value {n}"
    );
    assert!(applied > 0);
}

fn fastrand_ms() -> u64 {
    // 0–250 ms, from the clock's low bits (no extra dependency).
    u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_micros())
            .unwrap_or(0),
    ) % 250
}
