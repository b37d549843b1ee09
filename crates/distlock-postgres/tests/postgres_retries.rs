//! Retried and late requests against a real server, in both modes: a release or acquire whose
//! reply comes after the client's operation timeout is retried by the core with the same grant
//! address (or attempt id), and must have the effect of one request; a short `extend` never
//! shortens a lease; guards of one hold with different leases can be dropped in any order.
//!
//! Late replies come from a `DelayProxy` between the client and the server: the request
//! executes on the server at once, its reply is held back past the client's timeout, and the
//! replies after it (the retry's) queue behind it.

mod support;

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, ClientOptions, HoldKey, LockKind, LostSignal,
    ReleaseOutcome,
};
use distlock_postgres::PostgresBackend;
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name, EVENTUALLY};
use distlock_testkit::sql_faults::{late_request_of_an_ended_attempt, Ended};
use distlock_testkit::DelayProxy;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Modes, Pg};

/// The client's per-call timeout in these tests.
const OP_TIMEOUT: Duration = Duration::from_millis(500);
/// How late a late reply is: past `OP_TIMEOUT`, and short enough that the core's first retry
/// (sent a few ms after the timeout; its reply queues behind the late one) gets its answer
/// within its own timeout even on a loaded machine.
const LATE: Duration = Duration::from_millis(750);

/// Options with a long watchdog lease: no renewal runs during a test (its replies could be
/// the ones delayed instead of the request under test).
fn opts() -> ClientOptions {
    fast_opts()
        .watchdog_lease(Duration::from_secs(30))
        .op_timeout(OP_TIMEOUT)
}

/// A backend connected to `pg`'s server through a fresh proxy.
async fn proxied(pg: &Pg, opts: &ClientOptions) -> (PostgresBackend, DelayProxy) {
    let proxy = DelayProxy::start(pg.server.addr(), Duration::ZERO).expect("proxy");
    let url = pg.url().replace(
        &format!("127.0.0.1:{}", pg.server.port()),
        &proxy.addr().to_string(),
    );
    let backend = PostgresBackend::connect(&url, opts)
        .await
        .expect("connect through the proxy");
    (backend, proxy)
}

/// Runs `f` with the next reply through `proxy` held back by [`LATE`]: the delay is set before
/// `f` starts and lifted as soon as the proxy has read that reply (later replies still queue
/// behind it). Returns `f`'s output and how long it took.
async fn with_late_reply<T>(proxy: &DelayProxy, f: impl Future<Output = T>) -> (T, Duration) {
    let before = proxy.stats().replies.chunks_read;
    proxy.set_reply_delay(LATE);
    let lift = async {
        let t = Instant::now();
        while proxy.stats().replies.chunks_read == before {
            assert!(
                t.elapsed() < EVENTUALLY,
                "no reply ever came through the proxy"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        proxy.set_reply_delay(Duration::ZERO);
    };
    let t = Instant::now();
    let (out, ()) = tokio::join!(f, lift);
    (out, t.elapsed())
}

fn modes() -> [Pg; 2] {
    [Pg::session(), Pg::lease()]
}

fn mode_name(pg: &Pg) -> &'static str {
    if pg.params.is_empty() {
        "session"
    } else {
        "lease"
    }
}

/// Advisory locks on `name`'s key granted to some session right now (session mode).
fn sessions_holding(pg: &Pg, name: &str) -> String {
    let key = distlock_postgres::lock_key("dlock", name) as u64;
    pg.server
        .sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = {} AND objid = {} AND objsubid = 1",
            key >> 32,
            key & 0xffff_ffff
        ))
        .expect("sql")
}

/// Two re-entrant guards; the last one's release gets its reply late and is retried: the
/// caller hears `Released` (not `Expired` or an error), the lock stayed held while one guard
/// remained, and it is free for the next owner at once. (Lease mode counted re-entry on the
/// server: the retried release of the inner guard decremented the count twice and freed the
/// lock under the outer guard.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_release_after_late_reply_with_reentrant_guards() {
    for pg in modes() {
        let mode = mode_name(&pg);
        let name = unique_name("late-release");
        let (backend, proxy) = proxied(&pg, &opts()).await;
        let a = Client::new(Arc::new(backend), opts()).expect("client");
        let b = pg.client_with(opts()).await;
        let lock = a.lock(&name).expect("lock");
        let g1 = lock.acquire().await.expect("acquire");
        let g2 = lock.try_acquire().await.expect("try").expect("re-entry");
        assert_eq!(g1.fencing_token(), g2.fencing_token());
        // Counted down in the client: nothing goes to the server.
        let before = proxy.stats().requests.chunks_read;
        assert_eq!(
            g2.release().await.expect("release"),
            ReleaseOutcome::StillHeld { remaining: 1 },
            "{mode}"
        );
        assert_eq!(proxy.stats().requests.chunks_read, before, "{mode}");
        let other = b.lock(&name).expect("lock");
        assert!(
            other.try_acquire().await.expect("try").is_none(),
            "{mode}: the inner guard's release freed the lock under the outer one"
        );
        assert!(!g1.is_lost(), "{mode}");
        let t1 = g1.fencing_token();
        let (out, took) = with_late_reply(&proxy, g1.release()).await;
        // The first release timed out (its reply was late) and was retried.
        assert!(
            took >= OP_TIMEOUT,
            "{mode}: the reply was not late ({took:?})"
        );
        assert_eq!(out.expect("release"), ReleaseOutcome::Released, "{mode}");
        let g = other
            .try_acquire()
            .await
            .expect("try")
            .expect("free after the release");
        assert!(g.fencing_token() > t1, "{mode}");
        if mode == "session" {
            assert_eq!(sessions_holding(&pg, &name), "1", "{mode}");
        }
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// On the backend trait: a release whose reply is late runs on the server; meanwhile another
/// client *with the same owner id* takes the lock; the release's retry must not free that
/// grant. (An owner-addressed release freed it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_release_never_frees_a_later_grant_of_the_same_owner() {
    for pg in modes() {
        let mode = mode_name(&pg);
        let name = unique_name("late-release-owner");
        let (a, proxy) = proxied(&pg, &opts()).await;
        let b = pg.backend(&opts()).await;
        let key = HoldKey {
            name: name.as_str().into(),
            owner: "shared-owner".into(),
            kind: LockKind::Mutex,
        };
        let req = AcquireRequest::new(key.clone(), Duration::from_secs(30), LostSignal::new());
        let AcquireReply::Granted { token } = a.acquire(&req).await.expect("acquire") else {
            panic!("{mode}: not granted");
        };
        let grant = req.grant(token);
        let (first, took) = with_late_reply(&proxy, a.release(&grant)).await;
        assert!(
            first.is_err(),
            "{mode}: the reply was not late ({took:?}): {first:?}"
        );
        // The release ran on the server: the other client (same owner id) gets the lock.
        let breq = AcquireRequest::new(key.clone(), Duration::from_secs(30), LostSignal::new());
        let t = Instant::now();
        let btoken = loop {
            match b.acquire(&breq).await.expect("acquire") {
                AcquireReply::Granted { token } => break token,
                _ => {
                    assert!(
                        t.elapsed() < EVENTUALLY,
                        "{mode}: the late release never ran"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        assert!(btoken > token, "{mode}");
        // The retry of the first release: reported, and it frees nothing.
        let again = a.release(&grant).await.expect("retried release");
        assert_ne!(again, ReleaseOutcome::Released, "{mode}");
        let info = b.inspect(&name, LockKind::Mutex).await.expect("inspect");
        assert!(
            info.held(),
            "{mode}: the retried release freed the other client's grant"
        );
        let third = AcquireRequest::new(
            HoldKey {
                owner: "third".into(),
                ..key.clone()
            },
            Duration::from_secs(1),
            LostSignal::new(),
        );
        assert!(
            matches!(
                b.acquire(&third).await.expect("acquire"),
                AcquireReply::Held { .. }
            ),
            "{mode}"
        );
        b.give_up(&third).await.expect("give up");
        assert_eq!(
            b.release(&breq.grant(btoken)).await.expect("release"),
            ReleaseOutcome::Released,
            "{mode}"
        );
    }
}

/// A `try_acquire` whose reply is late is retried with the same attempt: it is granted once —
/// one token, one session holding the lock, nothing left behind after the release.
/// (Lease mode counted the retry as a re-entry, so the release left the lock held; a second
/// session for the retry would strand the first one's lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_try_acquire_is_one_grant() {
    for pg in modes() {
        let mode = mode_name(&pg);
        let name = unique_name("late-try");
        let (backend, proxy) = proxied(&pg, &opts()).await;
        let backend = Arc::new(backend);
        let a = Client::new(backend.clone(), opts()).expect("client");
        let b = pg.client_with(opts()).await;
        let lock = a.lock(&name).expect("lock");
        // A session in the pool (session mode), so that the late reply is the lock's, not
        // the connection's start-up.
        let warm = lock.try_acquire().await.expect("try").expect("free");
        assert_eq!(
            warm.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        let (g, took) = with_late_reply(&proxy, lock.try_acquire()).await;
        assert!(
            took >= OP_TIMEOUT,
            "{mode}: the reply was not late ({took:?})"
        );
        let g = g.expect("try").expect("the retry reports the grant");
        let info = b.inspect(&name).await.expect("inspect");
        assert_eq!(info.holders.len(), 1, "{mode}: {info:?}");
        assert_eq!(info.holders[0].count, 1, "{mode}: {info:?}");
        assert_eq!(
            info.fencing_token,
            g.fencing_token(),
            "{mode}: a second token was drawn"
        );
        if mode == "session" {
            assert_eq!(sessions_holding(&pg, &name), "1", "{mode}");
        }
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released,
            "{mode}"
        );
        let g2 = b
            .lock(&name)
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .expect("free after the one release: nothing left behind");
        assert_eq!(
            g2.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        if mode == "session" {
            assert!(
                backend.idle_sessions() >= 1,
                "{mode}: the session was not reused"
            );
        }
    }
}

/// A failed `try_acquire` (every reply late, retries exhausted) gives back what its requests
/// took: the lock is free for another owner soon after, not at the end of the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_try_acquire_leaves_nothing_held() {
    for pg in modes() {
        let mode = mode_name(&pg);
        let name = unique_name("failed-try");
        let (backend, proxy) = proxied(&pg, &opts()).await;
        let a = Client::new(Arc::new(backend), opts()).expect("client");
        let b = pg.client_with(opts()).await;
        let lock = a.lock(&name).expect("lock");
        let warm = lock.try_acquire().await.expect("try").expect("free");
        assert_eq!(
            warm.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        // Every reply 3 s late: each of the core's tries times out.
        proxy.set_reply_delay(Duration::from_secs(3));
        let r = lock.try_acquire().await;
        assert!(r.is_err(), "{mode}: {r:?}");
        proxy.set_reply_delay(Duration::ZERO);
        // The give-up (unlock, or closing the session) frees it; the 30 s lease is not waited
        // out.
        let other = b.lock(&name).expect("lock");
        let g = poll_until(
            &format!("{mode}: the failed attempt kept the lock"),
            async || other.try_acquire().await.expect("try"),
            |g| g.is_some(),
        )
        .await
        .expect("free");
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// `extend` with less than the lease left changes nothing on the server: a watchdog guard
/// extended by 100 ms still keeps every other owner out long after. (Both modes set the lease
/// to the short value: lease mode's row, session mode's `idle_session_timeout`, which ended
/// the holder's session.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_extend_never_shortens_the_lease() {
    for pg in modes() {
        let mode = mode_name(&pg);
        let name = unique_name("short-extend");
        let a = pg.client_with(opts()).await;
        let b = pg.client_with(opts()).await;
        let g = a
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        g.extend(Duration::from_millis(100)).await.expect("extend");
        // Well past the short lease and its grace; the watchdog renews only every 10 s.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let other = b.lock(&name).expect("lock");
        assert!(
            other.try_acquire().await.expect("try").is_none(),
            "{mode}: another owner got in after a short extend"
        );
        assert!(!g.is_lost(), "{mode}");
        let info = b.inspect(&name).await.expect("inspect");
        let left = info.holders.first().and_then(|h| h.lease_left);
        assert!(
            left.is_some_and(|l| l > Duration::from_secs(20)),
            "{mode}: lease left {left:?}"
        );
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released,
            "{mode}"
        );
    }
}

/// A fixed-lease guard and a watchdog guard of one hold, dropped in both orders: while one is
/// alive (and not lost) nobody else gets in, past the end of the other's lease; once both are
/// dropped the lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_and_watchdog_guards_dropped_in_both_orders() {
    // A 1 s watchdog lease (renewed every 333 ms) and a 5 s fixed lease.
    let opts = fast_opts();
    let fixed = Duration::from_secs(5);
    for pg in modes() {
        let mode = mode_name(&pg);
        for fixed_first in [true, false] {
            let name = unique_name("fixed-watchdog");
            let a = pg.client_with(opts.clone()).await;
            let b = pg.client_with(opts.clone()).await;
            let lock = a.lock(&name).expect("lock");
            let timed = lock.clone().lease(fixed).expect("lease");
            let (gf, gw) = if fixed_first {
                let gf = timed.acquire().await.expect("fixed");
                let gw = lock.try_acquire().await.expect("try").expect("re-entry");
                (gf, gw)
            } else {
                let gw = lock.acquire().await.expect("watchdog");
                let gf = timed.try_acquire().await.expect("try").expect("re-entry");
                (gf, gw)
            };
            assert_eq!(gf.fencing_token(), gw.fencing_token());
            let other = b.lock(&name).expect("lock");
            // Drop the guard whose lease is *not* the one that lasts: the fixed one first when
            // the watchdog renews; the watchdog one first when only the 5 s lease remains.
            let case = format!(
                "{mode}, {} dropped first",
                if fixed_first { "watchdog" } else { "fixed" }
            );
            let remaining = if fixed_first {
                drop(gw);
                gf
            } else {
                drop(gf);
                gw
            };
            // Past the dropped guard's lease (and the watchdog lease: the join must not have
            // shortened the 5 s lease), well inside the remaining one.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let intruder = other.try_acquire().await.expect("try");
            assert!(
                intruder.is_none() || remaining.is_lost(),
                "{case}: another owner got in while the remaining guard was not lost"
            );
            assert!(
                intruder.is_none(),
                "{case}: the remaining guard lost the lock"
            );
            assert!(!remaining.is_lost(), "{case}");
            let released = Instant::now();
            drop(remaining);
            let g = poll_until(
                &format!("{case}: not free after both guards were dropped"),
                async || other.try_acquire().await.expect("try"),
                |g| g.is_some(),
            )
            .await
            .expect("free");
            assert!(released.elapsed() < EVENTUALLY, "{case}");
            assert_eq!(
                g.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
    }
}

/// Two waiting attempts of one owner id on one backend are two waiters: the released lock goes
/// to one of them, and the other's give-up (its deadline passed) gives back nothing of that
/// grant. (A backend keyed by owner treated the second as a re-entry of the first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_owner_waiters_are_separate_attempts() {
    for pg in modes() {
        let mode = mode_name(&pg);
        let name = unique_name("same-owner-waiters");
        let backend = Arc::new(pg.backend(&opts()).await);
        let holder = pg.backend(&opts()).await;
        let key = HoldKey {
            name: name.as_str().into(),
            owner: "one-owner".into(),
            kind: LockKind::Mutex,
        };
        let hreq = AcquireRequest::new(
            HoldKey {
                owner: "holder".into(),
                ..key.clone()
            },
            Duration::from_secs(30),
            LostSignal::new(),
        );
        let AcquireReply::Granted { token: ht } = holder.acquire(&hreq).await.expect("acquire")
        else {
            panic!("{mode}: not granted");
        };
        let lease = Duration::from_secs(30);
        let spawn_waiter = |wait: Duration| {
            let backend = backend.clone();
            let req = AcquireRequest::new(key.clone(), lease, LostSignal::new());
            tokio::spawn(async move {
                let cancel = tokio_util::sync::CancellationToken::new();
                let got = backend
                    .acquire_wait(&req, Some(Instant::now() + wait), &cancel)
                    .await;
                (req, got)
            })
        };
        // One of them gets the released lock, the other waits out its deadline.
        let first = spawn_waiter(Duration::from_secs(5));
        let second = spawn_waiter(Duration::from_secs(5));
        if mode == "session" {
            poll_until(
                "both waiters queued on the server",
                async || {
                    backend
                        .inspect(&name, LockKind::Mutex)
                        .await
                        .expect("inspect")
                        .waiters
                },
                |w| *w == Some(2),
            )
            .await;
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert_eq!(
            holder.release(&hreq.grant(ht)).await.expect("release"),
            ReleaseOutcome::Released
        );
        let (r1, g1) = first.await.expect("task");
        let (r2, g2) = second.await.expect("task");
        let (g1, g2) = (g1.expect("wait"), g2.expect("wait"));
        let (wreq, won, lreq) = match (g1, g2) {
            (Some(g), None) => (r1, g, r2),
            (None, Some(g)) => (r2, g, r1),
            other => panic!("{mode}: exactly one attempt must get the lock: {other:?}"),
        };
        // The loser gives up (again: idempotent); the winner's grant stays.
        backend.give_up(&lreq).await.expect("give up");
        let other = AcquireRequest::new(
            HoldKey {
                owner: "other".into(),
                ..key.clone()
            },
            Duration::from_secs(1),
            LostSignal::new(),
        );
        assert!(
            matches!(
                holder.acquire(&other).await.expect("acquire"),
                AcquireReply::Held { .. }
            ),
            "{mode}: the loser's give-up freed the winner's grant"
        );
        holder.give_up(&other).await.expect("give up");
        let grant = wreq.grant(won.token);
        assert_eq!(
            backend
                .renew(&[(grant.clone(), Duration::from_secs(30))])
                .await
                .expect("renew"),
            vec![distlock_core::RenewOutcome::Renewed],
            "{mode}"
        );
        assert_eq!(
            backend.release(&grant).await.expect("release"),
            ReleaseOutcome::Released,
            "{mode}"
        );
    }
}

/// Session mode: the server grants a blocked waiter's `pg_advisory_lock`, and the reply is lost
/// with the connection. The server frees what the dead session held; the waiter goes on
/// waiting on a new session and ends with exactly one grant, and nothing is left held after
/// its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_wait_whose_reply_is_lost_with_the_connection() {
    let pg = Pg::session();
    let name = unique_name("lost-wait-reply");
    let (backend, proxy) = proxied(&pg, &opts()).await;
    let w = Client::new(Arc::new(backend), opts()).expect("client");
    let h = pg.client_with(opts()).await;
    let held = h
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let ht = held.fencing_token();
    let lock = w.lock(&name).expect("lock");
    let waiter = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await });
    let waiting = |pg: &Pg| {
        let key = distlock_postgres::lock_key("dlock", &name) as u64;
        pg.server
            .sql(&format!(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND classid = {} AND objid = {} AND objsubid = 1",
                key >> 32,
                key & 0xffff_ffff
            ))
            .expect("sql")
    };
    poll_until(
        "the waiter never waited on the server",
        async || waiting(&pg),
        |n| n == "1",
    )
    .await;
    proxy.set_drop_replies(true);
    assert_eq!(
        held.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // The waiter's session holds the lock on the server; it never hears of it.
    poll_until(
        "the waiter's session was never granted",
        async || (waiting(&pg), sessions_holding(&pg, &name)),
        |(w, h)| w == "0" && h == "1",
    )
    .await;
    proxy.reset_all();
    proxy.set_drop_replies(false);
    let g = tokio::time::timeout(EVENTUALLY, waiter)
        .await
        .expect("the waiter never got the lock")
        .expect("task")
        .expect("acquire after the lost reply");
    assert!(g.fencing_token() > ht);
    assert_eq!(sessions_holding(&pg, &name), "1", "one session holds it");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let again = h
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("nothing left held");
    assert_eq!(
        again.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A `try_acquire` whose request reaches the server and whose reply is lost with the
/// connection: the retry (same attempt, new connection) is the same grant in lease mode (same
/// token); in session mode the dead session's lock goes with it, and the retry either gets the
/// lock or finds it held by that session for a moment. Either way one grant at most, and
/// nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_whose_reply_is_lost_with_the_connection() {
    for pg in modes() {
        let mode = mode_name(&pg);
        let name = unique_name("lost-try-reply");
        let (backend, proxy) = proxied(&pg, &opts()).await;
        let a = Client::new(Arc::new(backend), opts()).expect("client");
        let b = pg.client_with(opts()).await;
        let lock = a.lock(&name).expect("lock");
        let warm = lock.try_acquire().await.expect("try").expect("free");
        assert_eq!(
            warm.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        proxy.reset_after_request_bytes(1);
        let got = lock.try_acquire().await.expect("try");
        assert!(
            !proxy.reset_pending(),
            "{mode}: the connection was not reset"
        );
        let info = b.inspect(&name).await.expect("inspect");
        match &got {
            Some(g) => {
                assert_eq!(info.holders.len(), 1, "{mode}: {info:?}");
                assert_eq!(info.fencing_token, g.fencing_token(), "{mode}: {info:?}");
            }
            None => assert_eq!(mode, "session", "lease mode: the retry is the same grant"),
        }
        if mode == "session" {
            let want = if got.is_some() { "1" } else { "0" };
            poll_until(
                &format!("{mode}: the dead session's lock was not freed"),
                async || sessions_holding(&pg, &name),
                |n| n == want,
            )
            .await;
        }
        if let Some(g) = got {
            assert_eq!(
                g.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        let other = b.lock(&name).expect("lock");
        let g = poll_until(
            &format!("{mode}: the lock stayed held"),
            async || other.try_acquire().await.expect("try"),
            |g| g.is_some(),
        )
        .await
        .expect("free");
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// The first request of an attempt is held in a proxy past the operation timeout; the client
/// moves to a fresh control connection (lease mode), its retry is answered "held" (a try, a
/// wait that runs out) or granted and then released, and the attempt ends. The held request
/// reaches the server only after the holder released: it must not grant the lock to the
/// ended attempt (lease mode did: nobody held it for a whole lease, a third client got
/// nothing). Session mode is run too: there a late grant dies with its session, which the
/// client closes (or unlocks behind the late statement).
async fn late(pg: Pg, extra: &str, kind: LockKind, ended: Ended) {
    let at_once = mode_name(&pg) == "lease";
    late_request_of_an_ended_attempt(&pg, extra, kind, ended, at_once).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_try_of_an_ended_attempt_lease() {
    late(Pg::lease(), "", LockKind::Mutex, Ended::Try).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_try_of_a_released_attempt_lease() {
    late(Pg::lease(), "", LockKind::Mutex, Ended::Released).await;
}

/// A waiter with `listen=off`: its only connection is the control connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_wait_of_an_ended_attempt_lease() {
    late(Pg::lease(), "&listen=off", LockKind::Mutex, Ended::Wait).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_campaign_of_an_ended_attempt_lease() {
    late(Pg::lease(), "", LockKind::Election, Ended::Try).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_campaign_wait_of_an_ended_attempt_lease() {
    late(Pg::lease(), "&listen=off", LockKind::Election, Ended::Wait).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_try_of_an_ended_attempt_session() {
    late(Pg::session(), "", LockKind::Mutex, Ended::Try).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_wait_of_an_ended_attempt_session() {
    late(Pg::session(), "", LockKind::Mutex, Ended::Wait).await;
}
