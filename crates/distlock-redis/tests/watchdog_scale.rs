//! The watchdog at scale on a real redis-server: thousands of holds of one client renewed in
//! chunks of one script each (`renew_many.lua`), a stale grant inside a chunk refused alone,
//! and every family (mutex, read-write lock, semaphore) in one script.

mod common;

use common::client_for;
use distlock_core::backend::{AcquireReply, AcquireRequest, GrantRef, HoldKey, RenewOutcome};
use distlock_core::{Backend, ClientOptions, LockGuard, LockKind, LostReason, LostSignal};
use distlock_testkit::conformance::{fast_opts, EVENTUALLY};
use distlock_testkit::RedisServer;
use std::time::{Duration, Instant};

const MUTEXES: usize = 2_900;
const READS: usize = 50;
const PERMITS: usize = 50;

/// Counts, on the server, the mutex keys (`NS:{m*}`), read-write hold hashes (`NS:{r*}:rw`)
/// and semaphore hold hashes (`NS:{s*}:sem`) that have a live TTL and one grant, and the
/// longest TTL among them (ms).
fn held_on_server(s: &RedisServer, ns: &str) -> (usize, usize, usize, i64) {
    const COUNT: &str = "local out, max = {}, 0
        for i, pat in ipairs({ARGV[1] .. ':{m*}', ARGV[1] .. ':{r*}:rw', ARGV[1] .. ':{s*}:sem'}) do
          local n = 0
          for _, k in ipairs(redis.call('keys', pat)) do
            local ttl = redis.call('pttl', k)
            local one = i == 1 or redis.call('hlen', k) == 1
            if ttl > 0 and one then n = n + 1 end
            if ttl > max then max = ttl end
          end
          out[i] = n
        end
        out[4] = max
        return out";
    let reply = s.command(&["EVAL", COUNT, "0", ns]).expect("EVAL");
    let v: Vec<i64> = reply
        .lines()
        .map(|l| {
            l.parse()
                .unwrap_or_else(|_| panic!("count reply {reply:?}"))
        })
        .collect();
    assert_eq!(v.len(), 4, "count reply {reply:?}");
    (v[0] as usize, v[1] as usize, v[2] as usize, v[3])
}

/// Calls of `EVALSHA` so far (`INFO commandstats`), failed ones included.
fn evalsha_calls(s: &RedisServer) -> u64 {
    s.command_calls("evalsha").expect("INFO commandstats")
}

/// Waits until the server has run `n` more `EVALSHA` than `from` (only the watchdog sends
/// any while the test waits).
async fn evalsha_after(s: &RedisServer, from: u64, n: u64) {
    let t = Instant::now();
    while evalsha_calls(s) < from + n {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the watchdog sent {} of {n} scripts",
            evalsha_calls(s) - from
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 3,000 holds of one client (2,900 mutexes, 50 read locks, 50 semaphore permits) with a 3 s
/// watchdog lease: renewed through several ticks at 3 scripts a tick, none lost, all held on
/// the server; a mutex whose grant went stale (deleted and granted to another client) is
/// refused inside its chunk — its guard is lost, the new holder's lease is not touched — while
/// the other 2,999 renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_thousand_holds_renew_in_chunks_and_a_stale_one_is_lost_alone() {
    let server = RedisServer::start().expect("redis");
    let ns = "scale";
    let lease = Duration::from_secs(3);
    let opts = ClientOptions::default().namespace(ns).watchdog_lease(lease);
    let (a, _) = client_for(&server.url(), opts).await;
    let (b, _) = client_for(&server.url(), fast_opts().namespace(ns)).await;
    let mut guards: Vec<LockGuard> = Vec::with_capacity(MUTEXES + READS + PERMITS);
    for i in 0..MUTEXES {
        guards.push(
            a.lock(&format!("m{i}"))
                .expect("lock")
                .acquire()
                .await
                .expect("acquire"),
        );
    }
    for i in 0..READS {
        let rw = a.rw_lock(&format!("r{i}")).expect("rw");
        guards.push(rw.read().acquire().await.expect("read"));
    }
    for i in 0..PERMITS {
        let sem = a.semaphore(&format!("s{i}"), 2).expect("semaphore");
        guards.push(sem.acquire(1).await.expect("permit"));
    }
    let acquired = Instant::now();
    assert_eq!(a.held_count(), 3_000);

    // Four ticks (3 scripts each: 3,000 holds in chunks of 1,000), more than a lease.
    let from = evalsha_calls(&server);
    evalsha_after(&server, from, 12).await;
    while acquired.elapsed() < lease {
        evalsha_after(&server, evalsha_calls(&server), 3).await;
    }
    assert!(guards.iter().all(|g| !g.is_lost()), "a hold was lost");
    let (m, r, s, max) = held_on_server(&server, ns);
    assert_eq!((m, r, s), (MUTEXES, READS, PERMITS), "held on the server");
    assert!(
        max <= lease.as_millis() as i64,
        "a lease longer than asked: {max} ms"
    );
    for name in ["m0", "m1499", "m2899"] {
        let g = b
            .lock(name)
            .expect("lock")
            .try_acquire()
            .await
            .expect("try");
        assert!(g.is_none(), "{name} free while held");
    }

    // A stale grant in the middle of a chunk: the lock deleted behind the holder's back and
    // granted to another client, with a lease shorter than the watchdog's.
    let stale = 1_499;
    assert_eq!(
        server
            .command(&["DEL", &format!("{ns}:{{m{stale}}}")])
            .expect("DEL"),
        "1"
    );
    let other_lease = Duration::from_millis(2_500);
    let taken = b
        .lock(&format!("m{stale}"))
        .expect("lock")
        .lease(other_lease)
        .expect("lease")
        .try_acquire()
        .await
        .expect("try")
        .expect("the deleted lock is free");
    let reason = tokio::time::timeout(EVENTUALLY * 4, guards[stale].lost())
        .await
        .expect("the stale hold was never lost");
    assert_eq!(reason, LostReason::NotHeld);
    // The refusal did not renew the new grant (a 3 s renewal would raise its TTL past 2.5 s).
    let pttl: i64 = server
        .command(&["PTTL", &format!("{ns}:{{m{stale}}}")])
        .expect("PTTL")
        .parse()
        .expect("number");
    assert!(
        pttl <= other_lease.as_millis() as i64,
        "the stale renewal extended the new holder's lease: {pttl} ms"
    );
    // The other 2,999 keep renewing (two more ticks: 3 scripts each).
    evalsha_after(&server, evalsha_calls(&server), 6).await;
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_lost(), i == stale, "guard {i}");
    }
    assert_eq!(a.held_count(), 2_999);
    // The other client's grant gone (released, or its lease over): A's 2,999 are what is left.
    taken.release().await.expect("release");
    let (m, r, s, _) = held_on_server(&server, ns);
    assert_eq!((m, r, s), (MUTEXES - 1, READS, PERMITS));
}

fn request(name: &str, kind: LockKind, lease: Duration) -> AcquireRequest {
    AcquireRequest::new(HoldKey::new(name, "owner", kind), lease, LostSignal::new())
}

async fn granted(b: &dyn Backend, req: &AcquireRequest) -> GrantRef {
    match b.acquire(req).await.expect("acquire") {
        AcquireReply::Granted { token } => req.grant(token),
        other => panic!("not granted: {other:?}"),
    }
}

fn pttl(s: &RedisServer, key: &str) -> i64 {
    s.command(&["PTTL", key])
        .expect("PTTL")
        .parse()
        .expect("number")
}

/// One `renew` of a mutex, a read lock and a semaphore grant, and of stale grants of each
/// family (wrong token, another attempt), all in one script: the live ones renewed, the stale
/// ones `NotHeld` and their locks' leases untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_renews_every_family_and_refuses_stale_grants() {
    let server = RedisServer::start().expect("redis");
    let (_, backend) = client_for(&server.url(), fast_opts()).await;
    let b: &dyn Backend = backend.as_ref();
    let short = Duration::from_millis(5_000);
    let sem = LockKind::Semaphore {
        permits: 1,
        limit: 2,
    };
    let m = granted(b, &request("fm", LockKind::Mutex, short)).await;
    let r = granted(b, &request("fr", LockKind::Read, short)).await;
    let s = granted(b, &request("fs", sem, short)).await;
    let wrong_token = |g: &GrantRef| GrantRef {
        token: g.token + 1,
        ..g.clone()
    };
    let other_attempt = |g: &GrantRef| GrantRef {
        attempt: request("x", LockKind::Mutex, short).attempt,
        ..g.clone()
    };
    let long = Duration::from_secs(60);
    let items: Vec<(GrantRef, Duration)> = [
        wrong_token(&m),
        m.clone(),
        other_attempt(&r),
        r.clone(),
        wrong_token(&s),
        s.clone(),
        other_attempt(&m),
        wrong_token(&r),
        other_attempt(&s),
    ]
    .into_iter()
    .map(|g| (g, long))
    .collect();
    let before = evalsha_calls(&server);
    let out = b.renew(&items).await.expect("renew");
    use RenewOutcome::{NotHeld, Renewed};
    assert_eq!(
        out,
        [NotHeld, Renewed, NotHeld, Renewed, NotHeld, Renewed, NotHeld, NotHeld, NotHeld]
    );
    // One script for the nine (two if the server had to load it first).
    assert!(evalsha_calls(&server) - before <= 2);
    for key in ["dlock:{fm}", "dlock:{fr}:rw", "dlock:{fs}:sem"] {
        assert!(pttl(&server, key) > 30_000, "{key} not renewed");
    }

    // Stale grants alone: nothing renewed.
    let fresh = granted(b, &request("gm", LockKind::Mutex, short)).await;
    let stale = [(wrong_token(&fresh), long), (other_attempt(&fresh), long)];
    assert_eq!(b.renew(&stale).await.expect("renew"), [NotHeld, NotHeld]);
    assert!(
        pttl(&server, "dlock:{gm}") <= 5_000,
        "a stale grant renewed the lock"
    );

    // More than one script's worth in one call: one pipeline, every outcome in order.
    let many: Vec<(GrantRef, Duration)> = (0..2_500)
        .map(|i| {
            let g = if i % 7 == 3 {
                wrong_token(&m)
            } else {
                m.clone()
            };
            (g, long)
        })
        .collect();
    let out = b.renew(&many).await.expect("renew");
    assert_eq!(out.len(), 2_500);
    for (i, o) in out.iter().enumerate() {
        assert_eq!(*o == NotHeld, i % 7 == 3, "outcome {i}");
    }
}
