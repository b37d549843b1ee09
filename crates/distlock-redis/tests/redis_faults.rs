//! Redis-specific behaviour and faults, on real redis-server processes.

mod common;

use common::{acquire_within, acquired, client_for, released};

use distlock_core::{Error, LockKind, LostReason, ReleaseOutcome};
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{fast_opts, unique_name};
use distlock_testkit::{RedisOptions, RedisServer};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_fires_when_server_is_killed() {
    let mut server = RedisServer::start().expect("redis");
    let (client, _) = client_for(&server.url(), fast_opts()).await;
    let g = acquired(&client, "killed").await;
    let t = Instant::now();
    server.kill();
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost signal did not fire");
    assert_eq!(reason, LostReason::LeaseExpired);
    // It fires when the 1 s lease has run out (the holder cannot renew), not at the 5 s bound.
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let out = g.release().await;
    assert!(matches!(out, Err(Error::Connection { .. })), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_fires_after_restart_without_persistence() {
    let mut server = RedisServer::start().expect("redis");
    let (client, _) = client_for(&server.url(), fast_opts()).await;
    let g = acquired(&client, "restarted").await;
    server.restart().expect("restart");
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost signal did not fire");
    assert!(
        matches!(reason, LostReason::NotHeld | LostReason::LeaseExpired),
        "{reason:?}"
    );
    // The client reconnects and keeps working after the restart (scripts reloaded on NOSCRIPT).
    let g2 = acquire_within(&client, "restarted", 5)
        .await
        .expect("acquire after restart");
    released(g2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_an_auth_error() {
    let server = RedisServer::start_with(RedisOptions {
        password: Some("s3cret".into()),
        acl_user: Some(("locker".into(), "pw-locker".into())),
        ..Default::default()
    })
    .expect("redis");
    let port = server.port();
    for url in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
        format!("redis://locker:nope@127.0.0.1:{port}"),
    ] {
        let err = RedisBackend::connect(&url, &fast_opts())
            .await
            .err()
            .expect("must fail");
        assert!(matches!(err, Error::Auth { .. }), "{url}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains("credentials"), "{msg}");
        assert!(
            !msg.contains("nope") && !msg.contains("wrong@"),
            "password leaked: {msg}"
        );
    }
    // The right password, and an ACL user, work.
    for url in [
        format!("redis://:s3cret@127.0.0.1:{port}"),
        format!("redis://locker:pw-locker@127.0.0.1:{port}"),
    ] {
        let (client, _) = client_for(&url, fast_opts()).await;
        let g = client
            .lock("auth")
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .expect("free");
        released(g).await;
    }
}

#[tokio::test]
async fn unreachable_server_is_a_connection_error() {
    let port = distlock_testkit::free_port();
    let t = Instant::now();
    let err = RedisBackend::connect(&format!("redis://127.0.0.1:{port}"), &fast_opts())
        .await
        .err()
        .expect("must fail");
    assert!(err.is_connection(), "{err:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn invalid_urls_are_rejected() {
    let mut urls = vec!["redis://", "redis://h:1/notadb", "redis://h:1?bogus=1"];
    if cfg!(not(feature = "tls")) {
        urls.push("rediss://h:1");
    }
    for url in urls {
        let err = RedisBackend::connect(url, &fast_opts())
            .await
            .err()
            .expect("must fail");
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_is_an_unexpected_reply() {
    let server = RedisServer::start().expect("redis");
    let (client, _) = client_for(&server.url(), fast_opts()).await;
    assert_eq!(
        server
            .command(&["SET", "dlock:{taken}", "not a hash"])
            .expect("set"),
        "OK"
    );
    let err = client
        .lock("taken")
        .expect("lock")
        .try_acquire()
        .await
        .expect_err("must fail");
    assert!(matches!(err, Error::UnexpectedReply { .. }), "{err:?}");
    assert!(err.to_string().contains("namespace"), "{err}");
    server
        .command(&["SET", "dlock:{fence}:fence", "abc"])
        .expect("set");
    let err = client
        .lock("fence")
        .expect("lock")
        .try_acquire()
        .await
        .expect_err("must fail");
    assert!(matches!(err, Error::UnexpectedReply { .. }), "{err:?}");
    // Nothing was left locked by the failed attempts.
    assert_eq!(
        server
            .command(&["EXISTS", "dlock:{fence}"])
            .expect("exists"),
        "0"
    );
    // Another namespace is unaffected.
    let (other, _) = client_for(&server.url(), fast_opts().namespace("other")).await;
    let g = other
        .lock("taken")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    released(g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_flush() {
    let server = RedisServer::start().expect("redis");
    let (client, _) = client_for(&server.url(), fast_opts()).await;
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]).expect("flush"), "OK");
    let g = acquired(&client, "flush").await;
    released(g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_costs_a_bounded_time() {
    let mut server = RedisServer::start().expect("redis");
    let (client, _) = client_for(&server.url(), fast_opts()).await;
    server.pause();
    let t = Instant::now();
    let r = client.lock("paused").expect("lock").try_acquire().await;
    let took = t.elapsed();
    server.resume();
    let err = r.expect_err("must fail while paused");
    assert!(err.is_connection(), "{err:?}");
    assert!(took < Duration::from_secs(8), "took {took:?}");
    let g = acquire_within(&client, "paused", 5)
        .await
        .expect("after resume");
    released(g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_subscribe_only_while_waiting() {
    let server = RedisServer::start().expect("redis");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(20));
    let (holder, _) = client_for(&server.url(), opts.clone()).await;
    let (waiter, backend) = client_for(&server.url(), opts).await;
    let names: Vec<String> = (0..20)
        .map(|i| format!("{}-{i}", unique_name("sub")))
        .collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(
            holder
                .lock(n)
                .expect("lock")
                .acquire()
                .await
                .expect("acquire"),
        );
    }
    let mut waits = Vec::new();
    for n in &names {
        let lock = waiter.lock(n).expect("lock");
        waits.push(tokio::spawn(async move {
            lock.acquire_timeout(Duration::from_secs(10)).await
        }));
    }
    // Every mutex waiter listens on its client's one wake channel (where its handoff goes):
    // one subscription however many names are waited for, no lock channel.
    let wake_channels = || {
        let out = server
            .command(&["PUBSUB", "CHANNELS", "dlock:wake:*"])
            .expect("PUBSUB CHANNELS");
        out.lines().filter(|l| !l.trim().is_empty()).count()
    };
    let t = Instant::now();
    while (backend.subscribed_channels().await < 1 || server_waiters(&server, &names) < names.len())
        && t.elapsed() < Duration::from_secs(5)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server_waiters(&server, &names),
        names.len(),
        "every waiter queued"
    );
    assert_eq!(backend.subscribed_channels().await, 1);
    assert_eq!(wake_channels(), 1, "one wake channel for all the waits");
    for g in guards {
        released(g).await;
    }
    for w in waits {
        let g = w.await.expect("join").expect("acquired");
        released(g).await;
    }
    let t = Instant::now();
    while backend.subscribed_channels().await > 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        backend.subscribed_channels().await,
        0,
        "idle subscriptions left"
    );
    let channels = server
        .command(&[
            "PUBSUB",
            "NUMSUB",
            &format!("dlock:{{{}}}:released", names[0]),
        ])
        .expect("numsub");
    assert!(
        channels.ends_with("\n0"),
        "server still has a subscriber: {channels:?}"
    );
    // The wake channel stays subscribed for the next wait (no SUBSCRIBE per wait).
    assert_eq!(wake_channels(), 1, "the wake channel is kept");
}

/// Waiters of `names` in the servers' queues.
fn server_waiters(server: &RedisServer, names: &[String]) -> usize {
    names
        .iter()
        .map(|n| {
            server
                .command(&["ZCARD", &format!("dlock:{{{n}}}:queue")])
                .ok()
                .and_then(|c| c.trim().parse::<usize>().ok())
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_are_renewed_together() {
    let server = RedisServer::start().expect("redis");
    let (client, _) = client_for(&server.url(), fast_opts()).await;
    let mut guards = Vec::new();
    for i in 0..50 {
        guards.push(
            client
                .lock(&format!("batch-{i}"))
                .expect("lock")
                .acquire()
                .await
                .expect("acquire"),
        );
    }
    server.command(&["CONFIG", "RESETSTAT"]).expect("resetstat");
    let t = Instant::now();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(guards.iter().all(|g| !g.is_lost()));
    let info = server.command(&["INFO", "commandstats"]).expect("info");
    let took = t.elapsed();
    let evalsha = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse::<u64>().ok())
        .expect("evalsha stats");
    // All 50 renewals of a tick (lease/3 = 333 ms) in one script (up to 1,000 grants a
    // script), about 6 ticks in 2.1 s, and no other traffic. The bounds follow the time that
    // really passed (a loaded machine sleeps longer): at least two ticks (the 1 s lease would
    // have run out otherwise), at most one per 333 ms plus slack.
    let ticks = (took.as_millis() / 333) as u64 + 2;
    assert!(
        (2..=ticks).contains(&evalsha),
        "renewal scripts: {evalsha} in {took:?}"
    );
    for g in guards {
        released(g).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_confirmation_with_wait() {
    let master = RedisServer::start().expect("master");
    let mut replica = RedisServer::start_replica_of(&master).expect("replica");
    // A generous bound where the replica is healthy (a loaded machine can take a while to
    // ack), a short one where it is paused and the bound is what the test is about.
    let url = format!("{}?wait_replicas=1&wait_timeout=10s", master.url());
    // WAIT blocks on the connection: a wait the operation timeout (500 ms here) would cut off
    // is refused up front, not retried into a second hold.
    let err = match RedisBackend::connect(&url, &fast_opts()).await {
        Ok(_) => panic!("a wait_timeout above the operation timeout was accepted"),
        Err(e) => e,
    };
    assert!(
        matches!(err, distlock_core::Error::InvalidArgument(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("wait_timeout=10s"), "{err}");
    let (client, _) = client_for(&url, fast_opts().op_timeout(Duration::from_secs(15))).await;
    let short = format!("{}?wait_replicas=1&wait_timeout=300ms", master.url());
    let (short_client, _) = client_for(&short, fast_opts()).await;
    let g = acquired(&client, "replicated").await;
    assert_eq!(
        replica
            .command(&["EXISTS", "dlock:{replicated}"])
            .expect("exists"),
        "1"
    );
    released(g).await;
    replica.pause();
    let err = short_client
        .lock("unreplicated")
        .expect("lock")
        .try_acquire()
        .await
        .expect_err("must fail");
    replica.resume();
    assert!(err.to_string().contains("replicas"), "{err}");
    assert_eq!(
        master
            .command(&["EXISTS", "dlock:{unreplicated}"])
            .expect("exists"),
        "0",
        "grant not given back"
    );
}

/// Waiters are served in arrival order, each woken alone: the holder's release hands the lock
/// to the oldest waiter, and nobody else retries (no herd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_fifo_without_a_herd() {
    let server = RedisServer::start().expect("redis");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(30));
    let (holder, _) = client_for(&server.url(), opts.clone()).await;
    let name = unique_name("fifo");
    let g = acquired(&holder, &name).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    let n = 8;
    for i in 0..n {
        let (c, _) = client_for(&server.url(), opts.clone()).await;
        let (lock_name, order) = (name.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let g = acquire_within(&c, &lock_name, 20).await.expect("acquire");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            g.release().await.expect("release");
        }));
        // Queue them one after the other.
        let t = Instant::now();
        while server
            .command(&["ZCARD", &format!("dlock:{{{name}}}:queue")])
            .expect("zcard")
            != (i + 1).to_string()
        {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "waiter {i} never queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    server.command(&["CONFIG", "RESETSTAT"]).expect("resetstat");
    let t = Instant::now();
    released(g).await;
    for w in waiters {
        w.await.expect("join");
    }
    let secs = t.elapsed().as_secs();
    assert_eq!(*order.lock().expect("order"), (0..n).collect::<Vec<_>>());
    let info = server.command(&["INFO", "commandstats"]).expect("info");
    let evalsha = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse::<u64>().ok())
        .expect("evalsha stats");
    // One release per holder (9) and one confirming attempt per handoff (9) and nothing else.
    // Allow heartbeats (one per waiter per second of the run, plus one) in case the machine is
    // slow; a herd would add a retry per remaining waiter per release (~n²/2).
    let n = n as u64;
    assert!(
        evalsha <= 2 * 9 + n * (secs + 1),
        "too many script calls: {evalsha} in {secs} s (herd?)"
    );
}

/// A waiter that gives up (deadline or dropped future) leaves the queue at once, and a lock
/// handed to it meanwhile is passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_the_queue() {
    let server = RedisServer::start().expect("redis");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(30));
    let (a, _) = client_for(&server.url(), opts.clone()).await;
    let (b, _) = client_for(&server.url(), opts.clone()).await;
    let name = unique_name("giveup");
    let zcard = || {
        server
            .command(&["ZCARD", &format!("dlock:{{{name}}}:queue")])
            .expect("zcard")
    };
    let g = acquired(&a, &name).await;
    let err = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_millis(300))
        .await
        .expect_err("held");
    assert!(err.is_timeout());
    let lock_b = b.lock(&name).expect("lock");
    let r = tokio::time::timeout(Duration::from_millis(300), lock_b.acquire()).await;
    assert!(r.is_err());
    let t = Instant::now();
    while zcard() != "0" {
        assert!(t.elapsed() < Duration::from_secs(3), "queue not emptied");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The holder's release finds nobody to hand to: the lock is free.
    released(g).await;
    let info = a.inspect(&name).await.expect("inspect");
    assert!(!info.held(), "{info:?}");
}

/// The eviction check at connect reads `CONFIG GET maxmemory-policy`; a server where CONFIG is
/// renamed away (common on managed Redis) or that evicts must still be usable (a warning or a
/// debug line, never an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tolerates_config_disabled_and_evicting_servers() {
    for extra in [
        vec!["--rename-command", "CONFIG", ""],
        vec!["--maxmemory-policy", "allkeys-lru"],
    ] {
        let server = RedisServer::start_with(RedisOptions {
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .expect("redis");
        let (client, _) = client_for(&server.url(), fast_opts()).await;
        let g = client
            .lock("config")
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .expect("free");
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released,
            "{extra:?}"
        );
    }
}

/// A request lost inside the connection's stream (a proxy that blackholes, then heals) leaves
/// the multiplexed connection matching every later reply to a request that timed out long
/// ago. The backend goes on with a fresh connection after a timeout, so the client works again
/// as soon as the network does. (Before: every call after the heal timed out, for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_recovers_after_requests_lost_in_the_stream() {
    let server = RedisServer::start().expect("redis");
    let proxy = distlock_testkit::DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let (client, backend) = client_for(&url, fast_opts()).await;
    proxy.set_blackhole(true);
    let r = backend.ping().await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
    proxy.heal();
    let t = Instant::now();
    let g = acquire_within(&client, &unique_name("recovers"), 5)
        .await
        .expect("the client never recovered");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    released(g).await;
}

/// With `?wait_replicas=1` a renewal counts only once the replica has it: with the replica
/// paused the holder's renewals are not confirmed, so its lost signal fires when the lease
/// runs out, although the primary alone would have extended it — a promoted replica would
/// hold the older expiry. Healthy, the same holder keeps the lock over several leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreplicated_renewals_do_not_extend_the_lease() {
    let master = RedisServer::start().expect("master");
    let mut replica = RedisServer::start_replica_of(&master).expect("replica");
    let url = format!("{}?wait_replicas=1&wait_timeout=300ms", master.url());
    let opts = fast_opts()
        .watchdog_lease(Duration::from_secs(3))
        .op_timeout(Duration::from_secs(2));
    let (client, _) = client_for(&url, opts).await;
    let g = acquired(&client, "renewed-on-replica").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !g.is_lost(),
        "lost while the replica confirmed the renewals"
    );
    replica.pause();
    let t = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("the lost signal did not fire with the replica paused");
    let waited = t.elapsed();
    replica.resume();
    assert_eq!(reason, LostReason::LeaseExpired);
    // Within the lease (3 s) of the last confirmed renewal, not at the 10 s bound.
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    // The primary alone did extend it: the key is still there, with its later expiry.
    assert_eq!(
        master
            .command(&["EXISTS", "dlock:{renewed-on-replica}"])
            .expect("exists"),
        "1"
    );
}

/// Calls of `command` on the server since the last `CONFIG RESETSTAT`.
fn calls(server: &RedisServer, command: &str) -> u64 {
    server.calls(command).expect("INFO commandstats")
}

/// Waits until `n` waiters are queued for `name`.
async fn queued(server: &RedisServer, name: &str, n: usize) {
    let t = Instant::now();
    while server_waiters(server, &[name.to_owned()]) < n {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Once a client has waited, its next waits cost the server one acquire script each (the one
/// that queues it) and no SUBSCRIBE or UNSUBSCRIBE: the wake channel stays subscribed and the
/// waiter's watch is in place before its request, so a handoff right after the request is not
/// missed; the release that hands the lock over rewrites the grant's hash in place, and its
/// notice, naming the waiter's request it followed, is the grant. (Before: a SUBSCRIBE and an
/// UNSUBSCRIBE per wait, a DEL per handoff, and until the handoff notices named requests, a
/// second acquire per wait to confirm the handoff: a notice can be older than the waiter's
/// last request, see src/requests.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_wait_is_one_request_and_no_subscription() {
    let server = RedisServer::start().expect("redis");
    // No renewal and no timed-out request within the test: only the waits' own calls count.
    let opts = fast_opts()
        .watchdog_lease(Duration::from_secs(30))
        .op_timeout(Duration::from_secs(5));
    // The holder's releases hand over (the contended mode frees the lock for a young waiter:
    // one DEL, and the waiter's grant is a fresh one; tests/contended.rs).
    let url = format!("{}?handoff_after=0", server.url());
    let (holder, _) = client_for(&url, opts.clone()).await;
    let (waiter, _) = client_for(&server.url(), opts).await;
    let name = unique_name("one-request");
    for round in 0..4 {
        let g = acquired(&holder, &name).await;
        if round > 0 {
            server.command(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
        }
        let started = Instant::now();
        let lock = waiter.lock(&name).expect("lock");
        let wait = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(10)).await });
        queued(&server, &name, 1).await;
        released(g).await;
        let got = tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("the waiter was not woken by the handoff")
            .expect("join")
            .expect("acquired");
        if round > 0 {
            // The waiter's acquire and the holder's release (which handed the lock over):
            // the handoff's notice, which names the waiter's request it followed, is the
            // grant (src/requests.rs; before, the waiter confirmed it with a third script),
            // and one more per heartbeat (1 s) if the machine is so slow that one came.
            let heartbeats = started.elapsed().as_secs();
            let scripts = calls(&server, "evalsha");
            assert!(
                scripts >= 2 && scripts <= 2 + heartbeats,
                "round {round}: {scripts} scripts in {:?}",
                started.elapsed()
            );
            assert_eq!(calls(&server, "subscribe"), 0, "round {round}");
            assert_eq!(calls(&server, "unsubscribe"), 0, "round {round}");
            // The handoff rewrites the grant's hash: no DEL first.
            assert_eq!(calls(&server, "del"), 0, "round {round}");
        }
        released(got).await;
    }
}

/// With `?wait_replicas=1`, a forced release's `WAIT` (pipelined behind its script) counts the
/// replica: confirmed, the removal is on the replica too; with the replica paused, the release
/// is done on the primary and reported as not confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_waits_for_the_replicas() {
    let master = RedisServer::start().expect("master");
    let mut replica = RedisServer::start_replica_of(&master).expect("replica");
    let url = format!("{}?wait_replicas=1&wait_timeout=300ms", master.url());
    let opts = fast_opts().watchdog_lease(Duration::from_secs(60));
    let (client, backend) = client_for(&url, opts).await;
    let force = |name: String| {
        let backend = backend.clone();
        async move { distlock_core::Operator::force_release(&*backend, &name, LockKind::Mutex).await }
    };
    let name = unique_name("forced-replicated");
    let g = acquired(&client, &name).await;
    let done = force(name.clone()).await.expect("confirmed forced release");
    assert_eq!(done.removed.len(), 1, "{done:?}");
    let key = format!("dlock:{{{name}}}");
    assert_eq!(replica.command(&["EXISTS", &key]).expect("exists"), "0");
    drop(g);
    let name = unique_name("forced-unreplicated");
    let g = acquired(&client, &name).await;
    replica.pause();
    let err = force(name.clone())
        .await
        .expect_err("a release no replica confirmed");
    replica.resume();
    assert!(
        err.to_string()
            .contains("only 0 of 1 replicas confirmed it"),
        "{err}"
    );
    let key = format!("dlock:{{{name}}}");
    assert_eq!(master.command(&["EXISTS", &key]).expect("exists"), "0");
    drop(g);
}

/// A forced release (`dlock release --force`) wakes a queued mutex waiter on the wake channel
/// its queue entry names — the channel its client's subscriber listens on (a spy sees the
/// 'r' there, and nowhere else) — and the waiter takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_wakes_a_queued_waiter() {
    let server = RedisServer::start().expect("redis");
    // Long leases: the waiter's heartbeat (1 s) and the holder's lease (60 s) are far off.
    let opts = fast_opts().watchdog_lease(Duration::from_secs(60));
    let (holder, _) = client_for(&server.url(), opts.clone()).await;
    let (waiter, backend) = client_for(&server.url(), opts).await;
    let name = unique_name("forced-wake");
    let g = acquired(&holder, &name).await;
    let lock = waiter.lock(&name).expect("lock");
    let wait = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await });
    queued(&server, &name, 1).await;
    // The wake channel the waiter's queue entry names (field '>ATTEMPT'), and its listener.
    let entry = server
        .command(&["HGETALL", &format!("dlock:{{{name}}}:waiters")])
        .expect("HGETALL");
    let fields: Vec<&str> = entry.lines().collect();
    let wake = fields
        .chunks(2)
        .find(|f| f[0].starts_with('>'))
        .and_then(|f| f.get(1))
        .map(|w| w.to_string())
        .expect("the queue entry names no wake channel");
    // A client's first wait queues, then subscribes: wait for the subscription.
    let t = Instant::now();
    loop {
        let listeners = server
            .command(&["PUBSUB", "NUMSUB", &wake])
            .expect("NUMSUB");
        if listeners.ends_with("\n1") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "nobody listens on {wake}: {listeners:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut spy = server.spy("dlock:wake:*").expect("spy");
    distlock_core::Operator::force_release(&*backend, &name, distlock_core::LockKind::Mutex)
        .await
        .expect("force release");
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert_eq!(
        seen.len(),
        1,
        "one wake-up for the one waiting client: {seen:?}"
    );
    assert_eq!(seen[0], (wake, "r".to_owned()), "{seen:?}");
    let got = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("never acquired")
        .expect("join")
        .expect("acquired");
    assert!(got.fencing_token() > g.fencing_token());
    drop(g);
    released(got).await;
}

/// An uncontended acquire+release runs the fewest calls the hash layout and the fencing rule
/// allow: the acquire one `EXISTS` of the hash, the queue and the end record (nothing there:
/// the fast path, no `HMGET`), the token's one `TIME` and the counter's one `SET ... GET`
/// (scripts/fence.lua: the clock is above the counter), `HSET`, `PEXPIRE`; the release one
/// `HMGET` (no `q` field: nobody queued behind the grant, so no look at the queue) and `DEL`.
/// No `ZREM` or `ZPOPMIN` of a queue that does not exist, no `PUBLISH`. (Before: nine calls,
/// the counter's `GET` and the release's `EXISTS` of the queue among them; ten before that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_is_seven_calls() {
    let server = RedisServer::start().expect("redis");
    // No renewal and no timed-out request within the test: only the pairs' own calls count.
    let opts = fast_opts()
        .watchdog_lease(Duration::from_secs(30))
        .op_timeout(Duration::from_secs(5));
    let (client, _) = client_for(&server.url(), opts).await;
    let name = unique_name("ten-calls");
    let lock = client.lock(&name).expect("lock");
    // Scripts loaded, connection warm.
    released(lock.acquire().await.expect("acquire")).await;
    server.command(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    let rounds = 10;
    for _ in 0..rounds {
        released(
            lock.acquire_timeout(Duration::from_secs(5))
                .await
                .expect("acquire"),
        )
        .await;
        released(lock.try_acquire().await.expect("try").expect("free")).await;
    }
    let pairs = 2 * rounds;
    for (command, per_pair) in [
        ("evalsha", 2),
        ("hmget", 1),
        ("exists", 1),
        ("time", 1),
        ("get", 0),
        ("pttl", 0),
        ("set", 1),
        ("incr", 0),
        ("hset", 1),
        ("pexpire", 1),
        ("del", 1),
        ("zpopmin", 0),
        ("zrem", 0),
        ("publish", 0),
    ] {
        assert_eq!(
            calls(&server, command),
            per_pair * pairs,
            "{command} per acquire+release"
        );
    }
}

/// A grant of any kind, through the Client API: a guard, or an election's leadership.
enum Taken {
    Guard(distlock_core::LockGuard),
    Leader(distlock_core::Leadership),
}

impl Taken {
    fn token(&self) -> u64 {
        match self {
            Taken::Guard(g) => g.fencing_token(),
            Taken::Leader(l) => l.fencing_token(),
        }
    }

    async fn release(self) {
        let out = match self {
            Taken::Guard(g) => g.release().await,
            Taken::Leader(l) => l.resign().await,
        };
        assert_eq!(out.expect("release"), ReleaseOutcome::Released);
    }
}

/// Takes `name` as `kind` (a semaphore: one permit of one) through `c`, waiting up to 10 s.
async fn take(c: &distlock_core::Client, kind: LockKind, name: &str) -> Taken {
    let wait = Duration::from_secs(10);
    let got = match kind {
        LockKind::Mutex => c.lock(name).expect("lock").acquire_timeout(wait).await,
        LockKind::Fair => c.fair_lock(name).expect("lock").acquire_timeout(wait).await,
        LockKind::Read => {
            c.rw_lock(name)
                .expect("rw")
                .read()
                .acquire_timeout(wait)
                .await
        }
        LockKind::Write => {
            c.rw_lock(name)
                .expect("rw")
                .write()
                .acquire_timeout(wait)
                .await
        }
        LockKind::Semaphore { .. } => {
            let sem = c.semaphore(name, 1).expect("semaphore");
            sem.acquire_timeout(1, wait).await
        }
        LockKind::Election => {
            let e = c.election(name).expect("election");
            let l = e.campaign_timeout("v", wait).await.expect("campaign");
            return Taken::Leader(l);
        }
        other => panic!("no such kind here: {other:?}"),
    };
    Taken::Guard(got.expect("acquire"))
}

/// `name`'s fencing counter as `kind` keeps it (an election's apart from the lock's).
fn fence_key(kind: LockKind, name: &str) -> String {
    match kind {
        LockKind::Election => format!("dlock:{{{name}}}:election:fence"),
        _ => format!("dlock:{{{name}}}:fence"),
    }
}

/// The kinds of grant, each with its own scripts' token path (a semaphore of one permit).
const KINDS: [LockKind; 6] = [
    LockKind::Mutex,
    LockKind::Fair,
    LockKind::Read,
    LockKind::Write,
    LockKind::Semaphore {
        permits: 1,
        limit: 1,
    },
    LockKind::Election,
];

/// A fencing counter left behind by a rollback (set back by hand to a value it had before,
/// the deterministic stand-in for a restart from an older snapshot, a lost `appendfsync`
/// window or a failover to a replica that missed the last grants): the next token of every
/// kind is still above every token issued before, on a direct grant and on a handoff (the
/// release hands the lock to a queued waiter), and every grant leaves the counter with an
/// expiry (a bounded lifetime, not a key per name forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_after_the_counter_is_set_back_by_hand() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), fast_opts()).await;
    let (b, _) = client_for(&server.url(), fast_opts()).await;
    let mut failures = Vec::new();
    for kind in KINDS {
        let name = unique_name("set-back");
        let fence = fence_key(kind, &name);
        let expiry = |what: &str, failures: &mut Vec<String>| {
            let pttl: i64 = server
                .command(&["PTTL", &fence])
                .expect("PTTL")
                .parse()
                .expect("a number");
            if pttl <= 0 {
                failures.push(format!(
                    "{kind:?}: the counter has no expiry after {what} (PTTL {pttl})"
                ));
            }
        };
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let t = take(&a, kind, &name).await;
            tokens.push(t.token());
            t.release().await;
        }
        expiry("a grant", &mut failures);
        let set_back = |to: u64| {
            let reply = server.command(&["SET", &fence, &to.to_string()]);
            assert_eq!(reply.expect("SET"), "OK");
        };
        // A direct grant.
        set_back(tokens[0]);
        let direct = take(&a, kind, &name).await;
        let (top, got) = (tokens[1], direct.token());
        if got <= top {
            failures.push(format!(
                "{kind:?}: granted token {got} after {top} (counter set back to {})",
                tokens[0]
            ));
        }
        direct.release().await;
        // A handoff: b waits in the queue (a reader behind a writer), the counter goes back,
        // a's release hands it over.
        let top = top.max(got);
        let holder = match kind {
            LockKind::Read => LockKind::Write,
            k => k,
        };
        let held = take(&a, holder, &name).await;
        let top = top.max(held.token());
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move { take(&b, kind, &name).await })
        };
        distlock_testkit::conformance::wait_for_waiters(&b, &name, kind, 1).await;
        set_back(tokens[0]);
        held.release().await;
        let next = waiter.await.expect("join");
        if next.token() <= top {
            failures.push(format!(
                "{kind:?}: handed over token {} after {top} (counter set back to {})",
                next.token(),
                tokens[0]
            ));
        }
        expiry("a handoff", &mut failures);
        next.release().await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Restarted from an RDB snapshot taken before the last grants (the default persistence of a
/// stock redis-server; `SIGKILL`, so no shutdown save): the counter comes back older than the
/// tokens issued since, and the next holder's token is still above all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_after_a_restart_from_an_older_snapshot() {
    let mut server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("snapshot");
    let first = take(&a, LockKind::Mutex, &name).await;
    let mut issued = vec![first.token()];
    first.release().await;
    assert_eq!(server.command(&["SAVE"]).expect("SAVE"), "OK");
    for _ in 0..2 {
        let t = take(&a, LockKind::Mutex, &name).await;
        issued.push(t.token());
        t.release().await;
    }
    // The last one is held at the crash.
    let held = take(&a, LockKind::Mutex, &name).await;
    issued.push(held.token());
    server.crash_restart().expect("restart");
    let (b, _) = client_for(&server.url(), fast_opts()).await;
    let next = acquire_within(&b, &name, 10)
        .await
        .expect("after the restart");
    let top = *issued.iter().max().expect("tokens");
    assert!(
        next.fencing_token() > top,
        "token {} after the restart from the snapshot, not above {top} (issued {issued:?})",
        next.fencing_token()
    );
    drop(held);
    released(next).await;
}

/// A fencing counter lives a bounded time after its last grant (it expires, so a name locked
/// once does not leave a key forever), and the tokens of a name whose counter expired are
/// still above every token issued before (the expiry is brought forward by hand here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counters_expire_and_tokens_still_rise() {
    let server = RedisServer::start().expect("redis");
    let lease = Duration::from_secs(1);
    let (a, _) = client_for(&server.url(), fast_opts().watchdog_lease(lease)).await;
    let name = unique_name("expiring-fence");
    let fence = fence_key(LockKind::Mutex, &name);
    let t = take(&a, LockKind::Mutex, &name).await;
    let first = t.token();
    t.release().await;
    let pttl: i64 = server
        .command(&["PTTL", &fence])
        .expect("PTTL")
        .parse()
        .expect("a number");
    let bound = lease + distlock_redis::FENCE_MARGIN;
    assert!(
        pttl > 0 && pttl as u128 <= bound.as_millis(),
        "the fencing counter's PTTL is {pttl} ms, not within (0, {bound:?}]"
    );
    // As if the margin had passed.
    assert_eq!(
        server.command(&["PEXPIRE", &fence, "1"]).expect("PEXPIRE"),
        "1"
    );
    let t0 = Instant::now();
    while server.command(&["EXISTS", &fence]).expect("EXISTS") != "0" {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the counter never expired"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t = take(&a, LockKind::Mutex, &name).await;
    assert!(
        t.token() > first,
        "token {} after the counter expired, not above {first}",
        t.token()
    );
    t.release().await;
}
