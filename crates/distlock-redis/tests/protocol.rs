//! The grant-addressed protocol on a real redis-server, attacked where the old owner-addressed
//! one broke (issue 11): retried and late requests, one owner id in two places, re-entrant
//! guards of mixed modes, sibling waiters around a handoff, semaphore queues, lost counters and
//! replica confirmation of handoffs.

mod common;

use common::{acquire_within, acquired, client_for, released};
use distlock_core::backend::{AcquireReply, AcquireRequest, HoldKey};
use distlock_core::{
    Backend, Client, ClientOptions, Error, LockGuard, LockKind, LostSignal, ReleaseOutcome,
};
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{
    fast_opts, poll_until, unique_name, wait_for_waiters, EVENTUALLY,
};
use distlock_testkit::{DelayProxy, RedisServer};
use std::time::{Duration, Instant};

/// A watchdog lease long enough that a grant leaked by a faulted request would block others
/// far longer than any bound below.
fn long_opts() -> ClientOptions {
    fast_opts().watchdog_lease(Duration::from_secs(20))
}

/// Two clients with long leases (a holder and a waiter) and a fast one that watches.
async fn trio(server: &RedisServer) -> [Client; 3] {
    let url = server.url();
    let (h, _) = client_for(&url, long_opts()).await;
    let (w, _) = client_for(&url, long_opts()).await;
    let (r, _) = client_for(&url, fast_opts()).await;
    [h, w, r]
}

/// A reply delay past the operation timeout of `fast_opts` (500 ms): the core gives the request
/// up and retries it while it has already executed on the server.
const LATE: Duration = Duration::from_millis(800);

fn proxied(proxy: &DelayProxy) -> String {
    format!("redis://127.0.0.1:{}", proxy.port())
}

async fn try_lock(c: &Client, name: &str) -> Option<LockGuard> {
    c.lock(name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try_acquire")
}

/// Releases `g`, one of two guards of its hold.
async fn still_held(g: LockGuard) {
    assert!(matches!(
        g.release().await.expect("release"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    ));
}

/// For `period`, nobody else gets `name` and `g` is not lost.
async fn excluded(other: &Client, name: &str, g: &LockGuard, period: Duration) {
    let t = Instant::now();
    while t.elapsed() < period {
        if let Some(intruder) = try_lock(other, name).await {
            panic!(
                "another owner got `{name}` (token {}) after {:?} while our guard (token {}, lost: {}) held it",
                intruder.fencing_token(),
                t.elapsed(),
                g.fencing_token(),
                g.is_lost()
            );
        }
        assert!(!g.is_lost(), "our guard of `{name}` was lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until another owner takes `name` (no leaked grant keeps it held).
async fn comes_free(other: &Client, name: &str) -> LockGuard {
    let t = Instant::now();
    loop {
        if let Some(g) = try_lock(other, name).await {
            return g;
        }
        assert!(
            t.elapsed() < EVENTUALLY,
            "`{name}` still held: {:?}",
            other.inspect(name).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 11 #1: one owner id in two clients. P's release has late replies, so the core retries
/// it; meanwhile its first request freed the lock and handed it to Q (same owner id, another
/// grant). The retries must not touch Q's grant. (With owner-addressed holds the retry found
/// "the owner" in the hash and freed Q's lock: a third client got in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_release_never_frees_the_same_owners_next_grant() {
    let server = RedisServer::start().expect("redis");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let (p, _) = client_for(&proxied(&proxy), long_opts()).await;
    let (q, _) = client_for(&server.url(), long_opts()).await;
    let (r, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("sameowner");
    let shared = |c: &Client| {
        c.lock(&name)
            .expect("lock")
            .with_owner("shared")
            .expect("owner")
    };
    let gp = shared(&p).acquire().await.expect("acquire");
    let lq = shared(&q);
    let waiter = tokio::spawn(async move { lq.acquire_timeout(Duration::from_secs(15)).await });
    wait_for_waiters(&r, &name, LockKind::Mutex, 1).await;
    proxy.set_reply_delay(LATE);
    let release = tokio::spawn(gp.release());
    let gq = waiter.await.expect("join").expect("handed over");
    // Let the retries run into Q's grant before healing.
    tokio::time::sleep(LATE).await;
    proxy.heal();
    let out = release.await.expect("join");
    eprintln!("late release returned {out:?}");
    excluded(&r, &name, &gq, Duration::from_millis(500)).await;
    let token: String = server
        .command(&["HGET", &format!("dlock:{{{name}}}"), "token"])
        .expect("hget");
    assert_eq!(token, gq.fencing_token().to_string());
    released(gq).await;
    drop(comes_free(&r, &name).await);
}

/// Issue 11 #1: a try_acquire whose reply is late is retried with the same attempt: one grant,
/// one token, and one release frees the lock. (Counted per owner, the retry added a second
/// hold and the lock stayed held after the release.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_try_acquire_is_one_grant() {
    let server = RedisServer::start().expect("redis");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let (p, _) = client_for(&proxied(&proxy), long_opts()).await;
    let (r, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("retrytry");
    let before = proxy.stats();
    proxy.set_reply_delay(LATE);
    let lock = p.lock(&name).expect("lock");
    let attempt = tokio::spawn(async move { lock.try_acquire().await });
    // Heal once the first reply is on its way (late): the retry gets through.
    let t = Instant::now();
    while proxy.stats().replies.chunks_read == before.replies.chunks_read {
        assert!(t.elapsed() < EVENTUALLY, "no reply");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.heal();
    let g = attempt
        .await
        .expect("join")
        .expect("try_acquire")
        .expect("granted");
    let info = r.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(
        info.fencing_token,
        g.fencing_token(),
        "a second token: {info:?}"
    );
    released(g).await;
    assert!(
        try_lock(&r, &name).await.is_some(),
        "one release did not free a retried try_acquire"
    );
}

/// Issue 11 #2: `extend` shorter than the watchdog lease never shortens it. (A plain PEXPIRE
/// cut the 3 s lease to 100 ms: another owner got in 100 ms later while the guard, renewed
/// only every second, believed it held the lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_extend_never_shortens() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(
        &server.url(),
        fast_opts().watchdog_lease(Duration::from_secs(3)),
    )
    .await;
    let (b, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("shortext");
    let g = acquired(&a, &name).await;
    g.extend(Duration::from_millis(100)).await.expect("extend");
    excluded(&b, &name, &g, Duration::from_millis(600)).await;
    let pttl: i64 = server
        .command(&["PTTL", &format!("dlock:{{{name}}}")])
        .expect("pttl")
        .parse()
        .expect("number");
    assert!(pttl > 1000, "lease shortened to {pttl} ms");
    released(g).await;
}

/// Issue 11 #3: a fixed-lease guard and a watchdog guard of one hold, dropped in both orders.
/// The watchdog guard joining a 4 s fixed hold renews with its 1 s lease: that must not cut
/// the fixed lease, which the remaining fixed guard relies on once the watchdog guard is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_and_watchdog_guards_of_one_hold() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), fast_opts()).await;
    let (b, _) = client_for(&server.url(), fast_opts()).await;
    for fixed_first in [true, false] {
        let name = unique_name("mixed");
        let lock = a.lock(&name).expect("lock");
        let fixed = lock.clone().lease(Duration::from_secs(4)).expect("lease");
        let (first, second) = if fixed_first {
            let f = fixed.acquire().await.expect("fixed");
            let w = lock.acquire().await.expect("watchdog re-entry");
            (f, w)
        } else {
            let w = lock.acquire().await.expect("watchdog");
            let f = fixed.acquire().await.expect("fixed re-entry");
            (w, f)
        };
        assert_eq!(first.fencing_token(), second.fencing_token());
        // Drop the guard that came second; the first must still exclude everyone for longer
        // than the watchdog lease (1 s) — the fixed one by its lease, the watchdog one by
        // renewals.
        still_held(second).await;
        excluded(&b, &name, &first, Duration::from_millis(1500)).await;
        released(first).await;
        drop(comes_free(&b, &name).await);
    }
}

/// Issue 11 #4/#5: two waiters of one owner (clones of one Lock) in one client. The handoff
/// goes to the oldest attempt; the other one must neither claim it nor, when it gives up to
/// join its sibling's hold, give the sibling's grant away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sibling_waiters_of_one_owner() {
    let server = RedisServer::start().expect("redis");
    let [h, c, r] = trio(&server).await;
    let name = unique_name("siblings");
    let g = acquired(&h, &name).await;
    let lock = c.lock(&name).expect("lock");
    let mut waiters = Vec::new();
    for i in 0..2 {
        let l = lock.clone();
        waiters.push(tokio::spawn(async move {
            l.acquire_timeout(Duration::from_secs(15)).await
        }));
        wait_for_waiters(&r, &name, LockKind::Mutex, i + 1).await;
    }
    released(g).await;
    let mut guards = Vec::new();
    for w in waiters {
        guards.push(w.await.expect("join").expect("acquired"));
    }
    assert_eq!(guards[0].fencing_token(), guards[1].fencing_token());
    for g in &guards {
        excluded(&r, &name, g, Duration::from_millis(300)).await;
    }
    let info = r.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    // The sibling that joined the hold left the queue (its give-up runs in the background).
    poll_until(
        "the sibling's give-up",
        async || r.inspect(&name).await.expect("inspect").waiters,
        |w| *w == Some(0),
    )
    .await;
    let last = guards.pop().expect("guard");
    still_held(guards.pop().expect("guard")).await;
    excluded(&r, &name, &last, Duration::from_millis(300)).await;
    released(last).await;
    drop(comes_free(&r, &name).await);
}

/// Issue 11 #5: one RwLock handle waits for the read side and the write side at once. The read
/// grant it gets must not wake its write waiter as if the write side had been handed over
/// (handoffs used to name the owner only, with the side stripped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_read_grant_does_not_wake_the_handles_writer() {
    let server = RedisServer::start().expect("redis");
    // The reader queues just before its handle's writer, often within the same millisecond:
    // queue places are kept in arrival order (arrivals_within_one_millisecond_keep_their_order),
    // or the writer could be let in first and the reader would wait for it (15 s, then Timeout).
    let [x, c, r] = trio(&server).await;
    let name = unique_name("rwhandle");
    let w0 = x
        .rw_lock(&name)
        .expect("rw")
        .write()
        .acquire()
        .await
        .expect("write");
    let rw = c.rw_lock(&name).expect("rw");
    let read_lock = rw.read();
    let reader =
        tokio::spawn(async move { read_lock.acquire_timeout(Duration::from_secs(15)).await });
    wait_for_waiters(&r, &name, LockKind::Write, 1).await;
    let write_lock = rw.write();
    let writer =
        tokio::spawn(async move { write_lock.acquire_timeout(Duration::from_secs(15)).await });
    wait_for_waiters(&r, &name, LockKind::Write, 2).await;
    released(w0).await;
    let rg = reader.await.expect("join").expect("read");
    let read_token = rg.fencing_token();
    // The writer waits for the read grant of its own handle to go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !writer.is_finished(),
        "the write waiter got in beside a reader"
    );
    let info = r
        .inspect_kind(&name, LockKind::Write)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].side, Some(LockKind::Read), "{info:?}");
    released(rg).await;
    let wg = writer.await.expect("join").expect("write after the read");
    let info = r
        .inspect_kind(&name, LockKind::Write)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].side, Some(LockKind::Write), "{info:?}");
    assert!(wg.fencing_token() > read_token);
    released(wg).await;
}

/// Issue 23 (the rw handle's 15 s wait): two requests that reach the server within one
/// millisecond queue in the order they arrived, on every kind with a queue. A queue sorted by
/// arrival ms alone ordered such a pair by attempt id (random), so a reader queued just before
/// its own handle's writer could be passed by it and wait for a writer that waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrivals_within_one_millisecond_keep_their_order() {
    let server = RedisServer::start().expect("redis");
    let opts = long_opts();
    let url = server.url();
    // The holder's releases hand over (strict FIFO, `handoff_after=0`): the plain mutex's
    // contended mode would free the lock for the young first waiter instead (and wake it), and
    // this case checks the queue's order, which decides both.
    let (a, b) = (
        RedisBackend::connect(&format!("{url}?handoff_after=0"), &opts)
            .await
            .expect("a"),
        RedisBackend::connect(&url, &opts).await.expect("b"),
    );
    let sem = LockKind::Semaphore {
        permits: 1,
        limit: 1,
    };
    let kinds = [
        (LockKind::Mutex, LockKind::Mutex, LockKind::Mutex),
        (LockKind::Fair, LockKind::Fair, LockKind::Fair),
        (LockKind::Write, LockKind::Read, LockKind::Write),
        (sem, sem, sem),
    ];
    for (holder_kind, first_kind, second_kind) in kinds {
        for round in 0..12 {
            let name = unique_name("samems");
            let request = |owner: &str, kind: LockKind| {
                let mut r = AcquireRequest::new(
                    HoldKey::new(name.as_str(), owner, kind),
                    Duration::from_secs(20),
                    LostSignal::new(),
                );
                r.waiter_ttl = Some(Duration::from_secs(2));
                r
            };
            let h = request("holder", holder_kind);
            let AcquireReply::Granted { token } = a.acquire(&h).await.expect("acquire") else {
                panic!("not granted");
            };
            // One connection, sent back to back: the server runs them one after the other,
            // almost always within one millisecond.
            let (w1, w2) = (request("first", first_kind), request("second", second_kind));
            let (r1, r2) = tokio::join!(b.acquire(&w1), b.acquire(&w2));
            for r in [r1, r2] {
                assert!(
                    matches!(r.expect("queue"), AcquireReply::Held { .. }),
                    "queued"
                );
            }
            a.release(&h.grant(token)).await.expect("release");
            let info = b.inspect(&name, holder_kind).await.expect("inspect");
            let owners: Vec<&str> = info.holders.iter().map(|h| h.owner.as_str()).collect();
            assert_eq!(
                owners,
                ["first"],
                "{holder_kind:?} round {round}: the second arrival was let in before the first"
            );
        }
    }
}

/// Issue 11 #7: a request for more permits than the server's count is refused, naming both
/// counts; a queued request that does not fit does not block smaller ones that do (until its
/// patience runs out); lowering the count below a queued request does not wedge the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_limits_and_head_of_line() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), long_opts()).await;
    let (b, _) = client_for(&server.url(), long_opts()).await;
    let name = unique_name("semhol");
    let kind = LockKind::Semaphore {
        permits: 1,
        limit: 3,
    };
    let sem = a.semaphore(&name, 3).expect("sem");
    let two = sem.try_acquire(2).await.expect("try").expect("two permits");
    // A big request queues: it needs all three. It arrives after `queued_after`.
    let queued_after = Instant::now();
    let big = b.semaphore(&name, 3).expect("sem");
    let big_wait =
        tokio::spawn(async move { big.acquire_timeout(3, Duration::from_secs(15)).await });
    wait_for_waiters(&a, &name, kind, 1).await;
    // A small one that fits is served beside it (no head-of-line blocking), as long as the big
    // one has waited less than its patience (1 s; a stalled machine can only make this check
    // inconclusive, never wrong).
    match sem.try_acquire(1).await.expect("try") {
        Some(one) => {
            one.release().await.expect("release");
        }
        None => {
            assert!(
                queued_after.elapsed() >= Duration::from_secs(1),
                "a fitting request was blocked by a queued one that does not fit"
            );
            eprintln!("the machine stalled past the semaphore's patience: HOL not checked");
        }
    }
    // ... until the big one has waited past its patience (1 s): then it blocks younger ones,
    // so the permits drain to it.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        sem.try_acquire(1).await.expect("try").is_none(),
        "a big request was starved past its patience"
    );
    released(two).await;
    let g3 = big_wait.await.expect("join").expect("three permits");
    released(g3).await;

    // The count lowered below a queued request: it is refused (woken, not left waiting), and a
    // request behind it that fits is served.
    let mut admin = b.semaphore(&name, 3).expect("sem");
    let all = sem.try_acquire(3).await.expect("try").expect("three");
    let big = b.semaphore(&name, 3).expect("sem");
    let big_wait =
        tokio::spawn(async move { big.acquire_timeout(3, Duration::from_secs(15)).await });
    wait_for_waiters(&a, &name, kind, 1).await;
    let small = b.semaphore(&name, 3).expect("sem");
    let small_wait =
        tokio::spawn(async move { small.acquire_timeout(1, Duration::from_secs(15)).await });
    wait_for_waiters(&a, &name, kind, 2).await;
    admin.set_permits(2).await.expect("set_permits");
    let err = big_wait
        .await
        .expect("join")
        .expect_err("3 permits of a semaphore of 2");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains('2') && msg.contains('3'), "{msg}");
    released(all).await;
    let s = small_wait
        .await
        .expect("join")
        .expect("the small request behind it");
    released(s).await;
    // A fresh request above the server's count is refused at once, naming both counts.
    let err = sem
        .try_acquire(3)
        .await
        .expect_err("over the server's count");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("is 2") && msg.contains("with 3"), "{msg}");
    let info = a.inspect_kind(&name, kind).await.expect("inspect");
    assert_eq!(info.permits, Some(2), "{info:?}");
    assert_eq!(info.waiters, Some(0), "{info:?}");
}

/// Issue 11 #10: fencing tokens keep increasing when the counter is lost (FLUSHALL, a restart
/// without persistence): a missing counter is seeded from the server clock. (It restarted at
/// 1: the second token was lower than the first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_survive_a_lost_counter() {
    let mut server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("flush");
    let mut last = 0;
    for round in 0..3 {
        for _ in 0..2 {
            let g = acquire_within(&a, &name, 5).await.expect("acquire");
            assert!(
                g.fencing_token() > last,
                "round {round}: token {} after {last}",
                g.fencing_token()
            );
            last = g.fencing_token();
            g.release().await.expect("release");
        }
        match round {
            0 => assert_eq!(server.command(&["FLUSHALL"]).expect("flushall"), "OK"),
            1 => server.restart().expect("restart"),
            _ => {}
        }
    }
    // The same for the other families, which share the counter.
    assert_eq!(server.command(&["FLUSHALL"]).expect("flushall"), "OK");
    let w = a
        .rw_lock(&name)
        .expect("rw")
        .write()
        .try_acquire()
        .await
        .expect("try")
        .expect("write");
    assert!(w.fencing_token() > last);
    last = w.fencing_token();
    w.release().await.expect("release");
    assert_eq!(server.command(&["FLUSHALL"]).expect("flushall"), "OK");
    let s = a
        .semaphore(&name, 2)
        .expect("sem")
        .try_acquire(1)
        .await
        .expect("try")
        .expect("permit");
    assert!(s.fencing_token() > last);
    s.release().await.expect("release");
}

/// The backend trait directly: a release repeated after the grant went (a retry whose first
/// request executed) reports it and leaves a newer grant of the same owner alone; a give-up
/// of one attempt never touches another attempt's grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_release_and_give_up_touch_only_their_grant() {
    let server = RedisServer::start().expect("redis");
    let b = RedisBackend::connect(&server.url(), &fast_opts())
        .await
        .expect("connect");
    let name = unique_name("repeat");
    let key = HoldKey::new(name.as_str(), "one-owner", LockKind::Mutex);
    let lease = Duration::from_secs(10);
    let granted = |r: AcquireReply| match r {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    let first = AcquireRequest::new(key.clone(), lease, LostSignal::new());
    let t1 = granted(b.acquire(&first).await.expect("acquire"));
    assert_eq!(
        b.release(&first.grant(t1)).await.expect("release"),
        ReleaseOutcome::Released
    );
    let second = AcquireRequest::new(key.clone(), lease, LostSignal::new());
    let t2 = granted(b.acquire(&second).await.expect("acquire"));
    assert!(t2 > t1);
    // The first release again (its retry), and the first attempt giving up.
    assert_eq!(
        b.release(&first.grant(t1)).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    b.give_up(&first).await.expect("give up");
    let other = AcquireRequest::new(
        HoldKey::new(name.as_str(), "other", LockKind::Mutex),
        lease,
        LostSignal::new(),
    );
    assert!(matches!(
        b.acquire(&other).await.expect("acquire"),
        AcquireReply::Held { .. }
    ));
    assert_eq!(
        b.release(&second.grant(t2)).await.expect("release"),
        ReleaseOutcome::Released
    );
    // A give-up of the attempt that holds the lock gives it back.
    let t3 = granted(b.acquire(&other).await.expect("acquire"));
    b.give_up(&other).await.expect("give up");
    assert_eq!(
        b.release(&other.grant(t3)).await.expect("release"),
        ReleaseOutcome::Expired
    );
}

/// Issue 11 #9: with `?wait_replicas=1` a handoff is confirmed by the replica too. Healthy: the
/// waiter gets the lock and the replica has its grant when it returns. Replica paused: the
/// handed-over waiter cannot confirm, gives the grant back and reports it. (A handoff used to
/// be reported at once, unreplicated.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_confirms_handoffs() {
    let master = RedisServer::start().expect("master");
    let mut replica = RedisServer::start_replica_of(&master).expect("replica");
    // Healthy path: a generous bound (a loaded machine acks slowly), within op_timeout.
    let url = format!("{}?wait_replicas=1&wait_timeout=3s", master.url());
    let opts = long_opts().op_timeout(Duration::from_secs(5));
    let (holder, _) = client_for(&url, opts.clone()).await;
    let (waiter, _) = client_for(&url, opts).await;
    let (plain, _) = client_for(&master.url(), fast_opts()).await;
    let name = unique_name("replhand");
    let g = acquired(&holder, &name).await;
    let lock = waiter.lock(&name).expect("lock");
    let owner = lock.owner().to_owned();
    let w = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await });
    wait_for_waiters(&plain, &name, LockKind::Mutex, 1).await;
    g.release().await.expect("release");
    let wg = w.await.expect("join").expect("handed over");
    assert_eq!(
        replica
            .command(&["HGET", &format!("dlock:{{{name}}}"), "owner"])
            .expect("hget"),
        owner,
        "the handoff was reported before the replica had it"
    );
    wg.release().await.expect("release");

    // Replica paused: the handoff cannot be confirmed.
    let short = format!("{}?wait_replicas=1&wait_timeout=300ms", master.url());
    let (holder, _) = client_for(&short, long_opts()).await;
    let (waiter, _) = client_for(&short, long_opts()).await;
    let name = unique_name("replhand2");
    let g = acquired(&holder, &name).await;
    let lock = waiter.lock(&name).expect("lock");
    let w = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await });
    wait_for_waiters(&plain, &name, LockKind::Mutex, 1).await;
    replica.pause();
    g.release().await.expect("release");
    let r = w.await.expect("join");
    replica.resume();
    let err = r.expect_err("an unconfirmed handoff was reported as a grant");
    assert!(err.to_string().contains("replicas"), "{err}");
    // Given back: nobody holds it.
    let info = plain.inspect(&name).await.expect("inspect");
    assert!(!info.held(), "{info:?}");
}

/// The per-operation path runs in the caller's task (no spawned task per acquire or release):
/// a release or an acquisition whose future is dropped half-way (its request sent) or before
/// its first poll is still finished in the background. Nothing stays held for the 20 s lease,
/// and the dropped release's hold leaves the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_operation_futures_leave_nothing_held() {
    let server = RedisServer::start().expect("redis");
    let [h, _, r] = trio(&server).await;
    for step in 0..5 {
        let name = unique_name("dropfut");
        let what = format!("step {step}");
        match step {
            // A release polled once (its request went out), then dropped.
            0 => {
                let g = try_lock(&h, &name).await.expect("free");
                let _ = tokio::time::timeout(Duration::ZERO, g.release()).await;
            }
            // A release never polled.
            1 => {
                let g = try_lock(&h, &name).await.expect("free");
                drop(g.release());
            }
            // A try_acquire polled once, then dropped: a grant it got is given back.
            2 => {
                let lock = h.lock(&name).expect("lock");
                let _ = tokio::time::timeout(Duration::ZERO, lock.try_acquire()).await;
            }
            // An acquire polled once, then dropped.
            3 => {
                let lock = h.lock(&name).expect("lock");
                let _ = tokio::time::timeout(Duration::ZERO, lock.acquire()).await;
            }
            // An acquire dropped while it waits in the queue; the holder's release hands the
            // lock over to it at once, so the give-back is what frees it.
            _ => {
                let holder = try_lock(&r, &name).await.expect("free");
                let lock = h.lock(&name).expect("lock");
                let wait = tokio::spawn(async move { lock.acquire().await.map(drop) });
                wait_for_waiters(&r, &name, LockKind::Mutex, 1).await;
                wait.abort();
                let _ = wait.await;
                released(holder).await;
            }
        }
        drop(comes_free(&r, &name).await);
        poll_until(&what, async || h.held_count(), |n| *n == 0).await;
    }
}

/// The release script publishes only to the attempt it hands the lock to, and nothing with
/// nobody queued. A waiter is queued by its first attempt, before it subscribes: a release in
/// between hands it the lock with a message nobody hears. The waiter's next attempt (the one
/// right after it subscribed) must find the handoff; and once subscribed, the handoff message
/// itself must reach it. A release with no waiter queued publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_between_queueing_and_subscribing_is_not_lost() {
    let server = RedisServer::start().expect("redis");
    let opts = long_opts();
    // Releases hand over (the contended mode would free the lock for a young waiter instead:
    // tests/contended.rs).
    let url = format!("{}?handoff_after=0", server.url());
    let a = RedisBackend::connect(&url, &opts).await.expect("connect");
    let b = RedisBackend::connect(&url, &opts).await.expect("connect");
    let publishes = || {
        let stats = server
            .command(&["INFO", "commandstats"])
            .expect("commandstats");
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let name = unique_name("race");
    let lease = Duration::from_secs(20);
    let request = |owner: &str, wait: bool| {
        let mut r = AcquireRequest::new(
            HoldKey::new(name.as_str(), owner, LockKind::Mutex),
            lease,
            LostSignal::new(),
        );
        r.waiter_ttl = wait.then_some(Duration::from_secs(2));
        r
    };
    let granted = |reply: AcquireReply| match reply {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };

    // Nobody queued: a release publishes nothing.
    let h = request("holder", false);
    let t1 = granted(a.acquire(&h).await.expect("acquire"));
    server.command(&["CONFIG", "RESETSTAT"]).expect("resetstat");
    assert_eq!(
        a.release(&h.grant(t1)).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(publishes(), 0, "a release with nobody queued published");

    // Queued, not yet subscribed: the release hands over, its message is lost.
    let h = request("holder", false);
    let t2 = granted(a.acquire(&h).await.expect("acquire"));
    let w = request("waiter", true);
    assert!(matches!(
        b.acquire(&w).await.expect("queue"),
        AcquireReply::Held { .. }
    ));
    assert_eq!(
        a.release(&h.grant(t2)).await.expect("release"),
        ReleaseOutcome::Released
    );
    let _watch = b.watch(&w).await.expect("watch");
    // The attempt after subscribing finds the lock already handed to it.
    let t3 = granted(b.acquire(&w).await.expect("retry"));
    assert!(t3 > t2, "handoff token {t3} not above {t2}");
    let info = b.inspect(&name, LockKind::Mutex).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].owner, "waiter", "{info:?}");

    // Subscribed first: the handoff message names this attempt and carries its token.
    let w2 = request("second", true);
    assert!(matches!(
        a.acquire(&w2).await.expect("queue"),
        AcquireReply::Held { .. }
    ));
    let mut watch = a.watch(&w2).await.expect("watch");
    assert_eq!(
        b.release(&w.grant(t3)).await.expect("release"),
        ReleaseOutcome::Released
    );
    let wake = tokio::time::timeout(EVENTUALLY, watch.changed())
        .await
        .expect("no handoff message")
        .expect("watch");
    // The notice follows the waiter's latest request, answered "held": the client vouches
    // for it as the grant (src/requests.rs).
    let t4 = match wake {
        distlock_core::backend::Wake::Granted { token, .. } => token,
        other => panic!("expected a handoff, got {other:?}"),
    };
    assert!(t4 > t3);
    // Its next attempt confirms the same grant (a retry has the effect of one).
    assert_eq!(granted(a.acquire(&w2).await.expect("confirm")), t4);
    assert_eq!(
        a.release(&w2.grant(t4)).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A handoff notice is a grant only when it follows the waiter's latest request, answered
/// "held", and a lease from that request's send time is still mostly ahead. Here the notice
/// is read late (as by a waiter stopped past the lease: `dlock torture` seed 12): the grant it
/// announced ran out, another client took the lock, and the waiter's next request was
/// answered "held". The old notice must be confirmed, not taken: taken as a grant it would
/// make two holders (the check fails with a notice taken as the grant, as a spike of this
/// change that skipped it did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_notice_older_than_the_waiters_latest_request_is_confirmed_not_taken() {
    use distlock_core::backend::Wake;
    let server = RedisServer::start().expect("redis");
    let opts = long_opts();
    let url = format!("{}?handoff_after=0", server.url());
    let a = RedisBackend::connect(&url, &opts).await.expect("connect");
    let b = RedisBackend::connect(&url, &opts).await.expect("connect");
    let c = RedisBackend::connect(&url, &opts).await.expect("connect");
    let name = unique_name("stale-notice");
    let request = |owner: &str, lease: Duration| {
        let mut r = AcquireRequest::new(
            HoldKey::new(name.as_str(), owner, LockKind::Mutex),
            lease,
            LostSignal::new(),
        );
        r.waiter_ttl = Some(Duration::from_secs(5));
        r
    };
    let granted = |reply: AcquireReply| match reply {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    let holder = request("holder", Duration::from_secs(20));
    let t1 = granted(a.acquire(&holder).await.expect("acquire"));
    // The waiter's grant, when it comes by handoff, lasts 300 ms.
    let waiter = request("waiter", Duration::from_millis(300));
    let mut watch = b.watch(&waiter).await.expect("watch");
    assert!(matches!(
        b.acquire(&waiter).await.expect("queue"),
        AcquireReply::Held { .. }
    ));
    a.release(&holder.grant(t1)).await.expect("release");
    // The waiter does not read its notice; its handed grant runs out, and another takes it.
    let other = request("other", Duration::from_secs(20));
    let t3 = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let AcquireReply::Granted { token } = c.acquire(&other).await.expect("other") {
            break token;
        }
    };
    // The waiter asks again: held (by the other), and it queues again.
    assert!(matches!(
        b.acquire(&waiter).await.expect("again"),
        AcquireReply::Held { .. }
    ));
    let wake = tokio::time::timeout(EVENTUALLY, watch.changed())
        .await
        .expect("no notice")
        .expect("watch");
    assert!(
        matches!(wake, Wake::HandedOver { token } if token > t1 && token < t3),
        "a notice older than the waiter's latest request was not confirmed: {wake:?}"
    );
    // The confirmation finds the lock the other's.
    assert!(matches!(
        b.acquire(&waiter).await.expect("confirm"),
        AcquireReply::Held { .. }
    ));
    b.give_up(&waiter).await.expect("give up");
    c.release(&other.grant(t3)).await.expect("release");
}

/// A handoff wakes exactly the waiter it names: with two waiters of two clients subscribed, the
/// holder's release publishes one message, on the wake channel of the head waiter's client
/// (which its queue entry names), and nothing on the lock's channel nor on the other client's
/// wake channel. A spy pattern subscription sees every message; its PING reply comes after
/// whatever was published before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_is_one_message_to_the_head_waiter() {
    let server = RedisServer::start().expect("redis");
    let opts = long_opts();
    // Releases hand over (the contended mode's wake-up of a young waiter is one message to it
    // too, `w ATTEMPT`: tests/contended.rs).
    let url = format!("{}?handoff_after=0", server.url());
    let connect = || RedisBackend::connect(&url, &opts);
    let (a, b, c) = (
        connect().await.expect("a"),
        connect().await.expect("b"),
        connect().await.expect("c"),
    );
    let name = unique_name("direct");
    let request = |owner: &str| {
        let mut r = AcquireRequest::new(
            HoldKey::new(name.as_str(), owner, LockKind::Mutex),
            Duration::from_secs(20),
            LostSignal::new(),
        );
        r.waiter_ttl = Some(Duration::from_secs(2));
        r
    };
    let h = request("holder");
    let AcquireReply::Granted { token } = a.acquire(&h).await.expect("acquire") else {
        panic!("not granted");
    };
    let (w1, w2) = (request("first"), request("second"));
    for (backend, w) in [(&b, &w1), (&c, &w2)] {
        assert!(matches!(
            backend.acquire(w).await.expect("queue"),
            AcquireReply::Held { .. }
        ));
    }
    let mut watches = [
        b.watch(&w1).await.expect("watch"),
        c.watch(&w2).await.expect("watch"),
    ];
    let mut spy = server.spy("dlock:*").expect("spy");

    assert_eq!(
        a.release(&h.grant(token)).await.expect("release"),
        ReleaseOutcome::Released
    );
    // The head: the older arrival.
    let info = b.inspect(&name, LockKind::Mutex).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].owner, "first", "{info:?}");
    let [watch, other] = &mut watches;
    let head = &w1;
    let wake = tokio::time::timeout(EVENTUALLY, watch.changed())
        .await
        .expect("the head waiter heard nothing")
        .expect("watch");
    assert!(
        matches!(wake, distlock_core::backend::Wake::Granted { token: t, .. } if t > token),
        "{wake:?}"
    );
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert_eq!(seen.len(), 1, "one handoff, one message: {seen:?}");
    assert!(seen[0].0.starts_with("dlock:wake:"), "{seen:?}");
    assert!(
        seen[0].1.starts_with("h ") && seen[0].1.split(' ').nth(2) == Some(head.attempt.as_str()),
        "{seen:?}"
    );
    // The other client's waiter is not woken.
    let r = tokio::time::timeout(Duration::from_millis(200), other.changed()).await;
    assert!(r.is_err(), "the other waiter woke: {r:?}");
}

/// Issue 28's lean release skips the queue when the grant's hash has no `q` field, so every
/// grant that may have waiters behind it must carry one — also a grant made while the lock was
/// free and waiters were queued (here: the contended mode freed it and woke the head waiter,
/// which stays queued, and a barging try took it first; then the head waiter's own). Each of
/// their releases or give-ups must wake the queue: one `w` message to the head waiter's wake
/// channel, seen by a spy. (With the slow path's grant written without `q`, the barger's
/// release deleted the lock in silence and the spy saw nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_with_a_queue_behind_them_wake_it_on_release() {
    let server = RedisServer::start().expect("redis");
    let opts = long_opts();
    // Releases free the lock and wake the head waiter for the next 60 s: nothing is handed over.
    let url = format!("{}?handoff_after=60s", server.url());
    let connect = || RedisBackend::connect(&url, &opts);
    let (a, b, c) = (
        connect().await.expect("a"),
        connect().await.expect("b"),
        connect().await.expect("c"),
    );
    let name = unique_name("q-marker");
    let request = |owner: &str, waits: bool| {
        let mut r = AcquireRequest::new(
            HoldKey::new(name.as_str(), owner, LockKind::Mutex),
            Duration::from_secs(20),
            LostSignal::new(),
        );
        r.waiter_ttl = waits.then_some(Duration::from_secs(10));
        r
    };
    let granted = |r: AcquireReply| match r {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    let holder = request("holder", false);
    let token = granted(a.acquire(&holder).await.expect("acquire"));
    let (w1, w2) = (request("first", true), request("second", true));
    for w in [&w1, &w2] {
        assert!(matches!(
            b.acquire(w).await.expect("queue"),
            AcquireReply::Held { .. }
        ));
    }
    let mut spy = server.spy("dlock:*").expect("spy");
    let mut woken = |what: &str| {
        let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
        assert_eq!(
            seen.len(),
            1,
            "{what}: one message to the head waiter: {seen:?}"
        );
        assert!(
            seen[0].0.starts_with("dlock:wake:") && seen[0].1.ends_with(w1.attempt.as_str()),
            "{what}: {seen:?}"
        );
    };
    a.release(&holder.grant(token)).await.expect("release");
    woken("the fast-path grant's release");
    // The lock is free, both waiters still queued: a barging try takes it (the slow path).
    let barger = request("barger", false);
    let token = granted(c.acquire(&barger).await.expect("barge"));
    assert_eq!(
        c.release(&barger.grant(token)).await.expect("release"),
        ReleaseOutcome::Released
    );
    woken("the barger's release");
    // Free again: the head waiter asks and gets it (granted with a queue behind it) ...
    let token = granted(b.acquire(&w1).await.expect("head asks"));
    // ... and gives the attempt up: nobody else holds, so the release side hands over or wakes
    // the next (w2): its grant, too, must wake whoever queues behind it.
    b.give_up(&w1).await.expect("give up");
    let _ = token;
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert_eq!(seen.len(), 1, "the give-up wakes the next waiter: {seen:?}");
    assert!(seen[0].1.ends_with(w2.attempt.as_str()), "{seen:?}");
    let w3 = request("third", true);
    let token = granted(b.acquire(&w2).await.expect("next asks"));
    assert!(matches!(
        c.acquire(&w3).await.expect("queue"),
        AcquireReply::Held { .. }
    ));
    b.release(&w2.grant(token)).await.expect("release");
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert_eq!(seen.len(), 1, "a release with a waiter queued: {seen:?}");
    assert!(seen[0].1.ends_with(w3.attempt.as_str()), "{seen:?}");
}

/// Issue 23 #3, on every kind: a request of an attempt held in a proxy past the operation
/// timeout reaches the server after the attempt ended over a fresh connection — it gave up
/// while the lock was held, and the request comes while it is still held (it would queue, and
/// the release hand the lock to it) or after the release (it would be granted); or its retry
/// got the lock and released it (the late duplicate would be granted again). It must do none
/// of these: another owner's try gets the lock at once, not after the ended attempt's 20 s
/// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_requests_of_ended_attempts_of_every_kind() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Case {
        GaveUpLateWhileHeld,
        GaveUpLateAfterRelease,
        Released,
    }
    let server = RedisServer::start().expect("redis");
    let direct = RedisBackend::connect(&server.url(), &fast_opts())
        .await
        .expect("connect");
    let lease = Duration::from_secs(20);
    let request = |name: &str, owner: &str, kind: LockKind, waiter_ttl: Option<Duration>| {
        let mut r = AcquireRequest::new(HoldKey::new(name, owner, kind), lease, LostSignal::new());
        r.waiter_ttl = waiter_ttl;
        if kind == LockKind::Election {
            r.value = Some(owner.into());
        }
        r
    };
    let granted = |kind: LockKind, r: AcquireReply| match r {
        AcquireReply::Granted { token } => token,
        other => panic!("{kind:?}: not granted: {other:?}"),
    };
    let sem = LockKind::Semaphore {
        permits: 1,
        limit: 1,
    };
    let kinds = [
        LockKind::Mutex,
        LockKind::Fair,
        LockKind::Election,
        LockKind::Read,
        LockKind::Write,
        sem,
    ];
    let mut failures = Vec::new();
    for kind in kinds {
        for case in [
            Case::GaveUpLateWhileHeld,
            Case::GaveUpLateAfterRelease,
            Case::Released,
        ] {
            let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
            let late = RedisBackend::connect(&proxied(&proxy), &fast_opts())
                .await
                .expect("connect");
            let name = unique_name("ended-kinds");
            // A writer excludes the late reader (and another reader would share with it).
            let exclusive = match kind {
                LockKind::Read => LockKind::Write,
                k => k,
            };
            let holder = request(&name, "holder", exclusive, None);
            let held = match case {
                Case::Released => None,
                _ => Some(granted(
                    kind,
                    direct.acquire(&holder).await.expect("acquire"),
                )),
            };
            // A waiter's request (it would queue while the lock is held), held in the proxy.
            let req = request(&name, "late", kind, Some(Duration::from_secs(2)));
            proxy.hold_next_request_with(name.as_bytes());
            let r = late.acquire(&req).await;
            assert!(r.is_err(), "{kind:?}: the held request was answered: {r:?}");
            assert_eq!(proxy.held_connections(), 1, "{kind:?}: nothing held");
            // The attempt ends over a fresh connection; then its request arrives.
            match case {
                Case::Released => {
                    let token = granted(kind, late.acquire(&req).await.expect("retry"));
                    assert_eq!(
                        late.release(&req.grant(token)).await.expect("release"),
                        ReleaseOutcome::Released
                    );
                }
                _ => late.give_up(&req).await.expect("give up"),
            }
            let deliver = async {
                proxy.release_held();
                poll_until(
                    "the held request answered",
                    async || proxy.held_requests_answered(),
                    |done| *done,
                )
                .await;
            };
            let release = async {
                if let Some(token) = held {
                    assert_eq!(
                        direct.release(&holder.grant(token)).await.expect("release"),
                        ReleaseOutcome::Released
                    );
                }
            };
            if case == Case::GaveUpLateWhileHeld {
                deliver.await;
                release.await;
            } else {
                release.await;
                deliver.await;
            }
            let other = request(&name, "other", exclusive, None);
            match direct.acquire(&other).await.expect("acquire") {
                AcquireReply::Granted { token } => {
                    direct.release(&other.grant(token)).await.expect("release");
                }
                held => {
                    let info = direct.inspect(&name, kind).await;
                    failures.push(format!("{kind:?} ({case:?}): {held:?}, {info:?}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "not free after a late request of an ended attempt:\n{}",
        failures.join("\n")
    );
}

/// Issue 23 #3 on a Redlock node: a vote held in a proxy past the operation timeout reaches
/// the node after its attempt ended there over a fresh connection — given up (a plain vote
/// and a waiter's vote, which would queue) or granted by a retry and released. The late vote
/// must leave no hold and no queue entry of the ended attempt on the node: as a hold it would
/// count toward a majority for nobody for the whole 20 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_votes_of_ended_attempts_on_a_redlock_node() {
    use distlock_core::backend::AttemptId;
    use distlock_redis::{QuorumReply, RedisNode};
    let server = RedisServer::start().expect("redis");
    let direct = RedisNode::connect(&server.url(), &fast_opts())
        .await
        .expect("connect");
    let (info, _) = direct.node_epoch().await.expect("node epoch");
    let epoch = direct
        .create_epoch("test", &info.run_id, Duration::ZERO)
        .await
        .expect("create epoch")
        .expect("same run id")
        .0;
    let lease = Duration::from_secs(20);
    let mut failures = Vec::new();
    for (queued, released) in [(false, false), (true, false), (false, true)] {
        let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
        let late = RedisNode::connect(&proxied(&proxy), &fast_opts())
            .await
            .expect("connect");
        let name = unique_name("ended-vote");
        let key = HoldKey::new(name.as_str(), "late", LockKind::Mutex);
        let attempt = AttemptId::new();
        let vote = || async {
            match queued {
                true => {
                    let at = (Duration::from_secs(2), 1);
                    late.vote(&key, &attempt, lease, &epoch, None, Some(at))
                        .await
                }
                false => late.vote(&key, &attempt, lease, &epoch, None, None).await,
            }
        };
        proxy.hold_next_request_with(name.as_bytes());
        let r = vote().await;
        assert!(r.is_err(), "the held vote was answered: {r:?}");
        assert_eq!(proxy.held_connections(), 1, "nothing held");
        // Over a fresh connection: the attempt ends on this node.
        if released {
            let v = vote().await.expect("retry");
            let QuorumReply::Granted { counter } = v.reply else {
                panic!("the retry was not granted: {v:?}");
            };
            let out = late
                .release(&name, LockKind::Mutex, &attempt, Some(counter))
                .await
                .expect("release");
            assert_eq!(out, Ok(ReleaseOutcome::Released));
        } else {
            late.give_up(&name, LockKind::Mutex, &attempt)
                .await
                .expect("give up")
                .expect("no other token");
        }
        proxy.release_held();
        poll_until(
            "the held vote answered",
            async || proxy.held_requests_answered(),
            |done| *done,
        )
        .await;
        let (hold, _) = direct.hold(&name, LockKind::Mutex).await.expect("hold");
        let queue = server
            .command(&["ZCARD", &format!("dlock:{{{name}}}:rlq")])
            .expect("ZCARD");
        if hold.is_some() || queue != "0" {
            failures.push(format!(
                "queued vote: {queued}, released: {released}: hold {hold:?}, {queue} queued"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "a late vote of an ended attempt left state on the node:\n{}",
        failures.join("\n")
    );
}
