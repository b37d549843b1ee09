//! Failures of a real ensemble: the leader killed under a held lock, a holder cut off until
//! its session expires, a holder whose client goes away.

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, ClientOptions, HoldKey, LockKind, LostReason,
    LostSignal, ReleaseOutcome,
};
use distlock_testkit::conformance::{unique_name, wait_for_waiters};
use distlock_testkit::{DelayProxy, ZkEnsemble};
use distlock_zookeeper::ZkBackend;
use std::time::{Duration, Instant};

mod common;
use common::{client_at as client, hold, hold_within, released};

/// Options for the fault tests: a watchdog lease long enough that only the session decides.
/// One acquire of `req` straight on the backend, retried (the same attempt: idempotent) when a
/// request takes longer than the 1 s operation timeout on a loaded machine.
async fn acquire_retried(backend: &ZkBackend, req: &AcquireRequest) -> AcquireReply {
    distlock_core::backoff::retry(distlock_core::RetryPolicy::default(), || {
        backend.acquire(req)
    })
    .await
    .expect("acquire")
}

fn opts() -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(Duration::from_secs(10))
        .op_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(3))
}

/// Runs blocking test-kit calls (process control) without stalling the runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// SIGKILL of the ensemble leader while a lock is held and another client waits: the holder's
/// session survives the reconnection, so it keeps the lock (not lost, still exclusive), the
/// waiter keeps its place, and the next grant's fencing token carries the new leader epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_lock_survives() {
    let mut ensemble = blocking(ZkEnsemble::start).expect("ensemble");
    let url = format!("{}?session_timeout=10s", ensemble.url());
    let name = unique_name("leader-kill");
    let a = client(&url, opts()).await;
    let b = client(&url, opts()).await;
    let c = client(&url, opts()).await;
    let g = hold_within(&a, &name, Duration::from_secs(5), "acquire").await;
    let t1 = g.fencing_token();
    let waiter_lock = b.lock(&name).expect("lock");
    let waiter = tokio::spawn(async move {
        let g = waiter_lock.acquire_timeout(Duration::from_secs(30)).await;
        (g, Instant::now())
    });
    // The waiter queues (its node exists) before the failover.
    wait_for_waiters(&c, &name, LockKind::Mutex, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");

    let leader = ensemble.leader().expect("leader");
    let killed_at = Instant::now();
    blocking(|| ensemble.kill(leader));
    let new_leader = blocking(|| ensemble.wait_ready(Duration::from_secs(15))).expect("new leader");
    assert_ne!(new_leader, leader);
    eprintln!("new leader after {:?}", killed_at.elapsed());

    // Another client cannot take the lock (connection errors while the clients reconnect are
    // retried; the answer must be "held").
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.lock(&name).expect("lock").try_acquire().await {
            Ok(None) => break,
            Ok(Some(_)) => panic!("the lock was granted twice after the leader died"),
            Err(e) if e.is_connection() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("try_acquire after failover: {e}"),
        }
    }
    // The holder stays the holder for a while longer; the waiter keeps waiting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!g.is_lost(), "lost: {:?}", g.lost_signal().reason());
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let info = c.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, g.owner());

    // The held node is still the holder's: releasing it hands the lock to the waiter.
    let released_at = Instant::now();
    released(g).await;
    let (g2, got_at) = waiter.await.expect("waiter");
    let g2 = g2.expect("the waiter got the lock");
    // Woken by the deletion of the released node (its watch); nothing else would hand it the
    // lock before its 30 s deadline. 5 s is generous on a loaded machine.
    let latency = got_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_secs(5),
        "waiter woke {latency:?} after the release"
    );
    // The waiter queued before the failover: its token (its node's creation zxid) is of the
    // old epoch, and still above the previous holder's.
    let t2 = g2.fencing_token();
    assert!(t2 > t1, "token {t2} after {t1}");

    // The killed server comes back as a follower with its data; the lock keeps working.
    blocking(|| ensemble.restart(leader)).expect("restart");
    released(g2).await;
    let g3 = hold_within(&a, &name, Duration::from_secs(15), "acquire after restart").await;
    let t3 = g3.fencing_token();
    assert!(t3 > t2, "token {t3} after {t2}");
    assert!(
        t3 >> 32 > t1 >> 32,
        "a node created under the new leader carries its epoch (high 32 bits): {t1:#x} then {t3:#x}"
    );
    g3.release().await.expect("release");
}

/// A holder cut off from the ensemble (its traffic blackholed) for longer than its session
/// timeout: its lost signal fires (before the server can expire the session, so before anyone
/// else can hold the lock), the server frees the lock for the next client, whose fencing token
/// is higher; once it can talk again, the cut-off client works with a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_fires_lost_and_fences() {
    let ensemble = ZkEnsemble::shared();
    let proxy = DelayProxy::start(ensemble.addr(0), Duration::ZERO).expect("proxy");
    let session = Duration::from_secs(6);
    let cut_url = format!("zk://127.0.0.1:{}?session_timeout=6s", proxy.port());
    let url = format!("{}?session_timeout=6s", ensemble.url());
    let name = unique_name("expiry");
    // The watchdog lease must fit in the session (connect refuses a longer one).
    let opts = opts().watchdog_lease(session);
    let holder = client(&cut_url, opts.clone()).await;
    let other = client(&url, opts).await;
    let g = hold_within(&holder, &name, Duration::from_secs(5), "acquire").await;
    let t1 = g.fencing_token();
    let lost = g.lost_signal();
    let lost_at = tokio::spawn({
        let lost = lost.clone();
        async move {
            let reason = lost.lost().await;
            (reason, Instant::now())
        }
    });
    let waiter_lock = other.lock(&name).expect("lock");
    let waiter = tokio::spawn(async move {
        let g = waiter_lock.acquire_timeout(Duration::from_secs(20)).await;
        // Looked at the moment the grant returns (not by a task that a loaded machine may run
        // late): whether the cut-off holder knew of its loss by then.
        (g, Instant::now(), lost.is_lost())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");

    let cut_at = Instant::now();
    proxy.set_blackhole(true);
    let (g2, granted_at, lost_when_granted) = waiter.await.expect("waiter");
    let g2 = g2.expect("the lock came back when the session expired");
    let waited = granted_at - cut_at;
    assert!(
        waited >= session * 3 / 4,
        "granted {waited:?} after the cut, before the session could expire"
    );
    let (reason, lost_at) = tokio::time::timeout(Duration::from_secs(5), lost_at)
        .await
        .expect("the lost signal never fired")
        .expect("join");
    assert!(
        matches!(reason, LostReason::SessionEnded(_)),
        "reason: {reason:?}"
    );
    eprintln!(
        "cut off at 0, lost signal at {:?}, next grant at {:?}",
        lost_at - cut_at,
        granted_at - cut_at
    );
    assert!(
        lost_when_granted,
        "the cut-off holder learned of the loss {:?} after the next grant",
        lost_at.saturating_duration_since(granted_at)
    );
    let t2 = g2.fencing_token();
    assert!(t2 > t1, "{t2} after {t1}");

    // It can talk again: the old guard is gone, and a new session works.
    proxy.set_blackhole(false);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    released(g2).await;
    let g3 = hold_within(
        &holder,
        &name,
        Duration::from_secs(20),
        "acquire with a new session",
    )
    .await;
    assert!(g3.fencing_token() > t2);
    g3.release().await.expect("release");
}

/// A holder and a queued waiter that crash (their traffic blackholed: to the ensemble they
/// fall silent, as a SIGKILLed or frozen process does) on sessions as short as their 1 s
/// watchdog lease (`session_timeout=1s`): a live waiter queued behind them gets the lock within
/// its 6 s wait. The session is what a dead holder's node lives on. Safety holds: the crashed
/// holder's guard is lost by the time the lock is granted again, and the token is higher.
/// (By default the session is at least MIN_SESSION_TIMEOUT, 10 s, whatever the lease: see
/// docs/zookeeper.md's *Session = lease*.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_and_waiter_free_the_lock_within_a_short_session() {
    let ensemble = ZkEnsemble::shared();
    let proxy = DelayProxy::start(ensemble.addr(0), Duration::ZERO).expect("proxy");
    let lease = Duration::from_secs(1);
    let opts = opts().watchdog_lease(lease);
    // A session as short as the lease (asked for: by default it is at least
    // MIN_SESSION_TIMEOUT, 10 s, see docs/zookeeper.md's *What is still assumed*).
    let cut_url = format!("zk://127.0.0.1:{}?session_timeout=1s", proxy.port());
    let name = unique_name("crashed");
    let holder_backend = ZkBackend::connect(&cut_url, &opts).await.expect("connect");
    let negotiated = holder_backend.session_timeout().expect("session");
    eprintln!("watchdog lease {lease:?}: session timeout {negotiated:?}");
    let holder = distlock_core::Client::new(std::sync::Arc::new(holder_backend), opts.clone())
        .expect("client");
    let doomed_waiter = client(&cut_url, opts.clone()).await;
    let live = client(&ensemble.url(), opts).await;
    let g = hold_within(&holder, &name, Duration::from_secs(5), "acquire").await;
    let t1 = g.fencing_token();
    let doomed_lock = doomed_waiter.lock(&name).expect("lock");
    let doomed = tokio::spawn(async move {
        let _ = doomed_lock.acquire_timeout(Duration::from_secs(30)).await;
    });
    wait_for_waiters(&live, &name, LockKind::Mutex, 1).await;
    let live_lock = live.lock(&name).expect("lock");
    let lost = g.lost_signal();
    let waiter = tokio::spawn(async move {
        let g = live_lock.acquire_timeout(Duration::from_secs(6)).await;
        (g, Instant::now(), lost.is_lost())
    });
    wait_for_waiters(&live, &name, LockKind::Mutex, 2).await;

    let cut_at = Instant::now();
    proxy.set_blackhole(true);
    let (g2, granted_at, lost_when_granted) = waiter.await.expect("waiter");
    let g2 = g2.unwrap_or_else(|e| {
        panic!("a crashed holder and waiter with a {lease:?} lease kept the lock: {e}")
    });
    eprintln!("crashed at 0, next grant at {:?}", granted_at - cut_at);
    assert!(
        lost_when_granted,
        "the crashed holder's guard was not lost when the lock was granted again"
    );
    assert!(g2.fencing_token() > t1, "{} after {t1}", g2.fencing_token());
    released(g2).await;
    doomed.abort();
    proxy.set_blackhole(false);
    drop(g);
}

/// A release whose connection dies under it (its request swallowed, the connection silent
/// until the driver gives it up after 2/5 of the session timeout and reconnects within the
/// session) is retried on the new connection and frees the lock. The driver reports such a
/// failure as a custom error ("no response from connection in …ms", or an I/O error), which
/// was mapped to an unexpected reply: the core did not retry the release, the caller got an
/// error, and the node stayed in the session, which lived on: the lock was held by nobody for
/// as long as the process ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_a_connection_that_dies_is_retried() {
    let ensemble = ZkEnsemble::shared();
    let proxy = DelayProxy::start(ensemble.addr(0), Duration::ZERO).expect("proxy");
    let cut_url = format!("zk://127.0.0.1:{}?session_timeout=6s", proxy.port());
    // A per-call timeout longer than the driver's 2.4 s: the driver's own error decides.
    let opts = opts()
        .watchdog_lease(Duration::from_secs(6))
        .op_timeout(Duration::from_secs(5));
    let holder = client(&cut_url, opts.clone()).await;
    let other = client(&ensemble.url(), opts).await;
    let name = unique_name("deadconn");
    let g = hold_within(&holder, &name, Duration::from_secs(5), "acquire").await;
    // Only the release carries the token (the fence it records in the directory).
    proxy.hold_next_request_with(g.fencing_token().to_string().as_bytes());
    let r = g.release().await;
    eprintln!("release on a connection that died under it: {r:?}");
    assert_eq!(
        r.expect("the release was not retried"),
        ReleaseOutcome::Released
    );
    let g2 = hold_within(&other, &name, Duration::from_secs(5), "the released lock").await;
    released(g2).await;
    proxy.heal();
}

/// A holder whose backend goes away without releasing (the driver closes the session) frees
/// the lock at once — its ephemeral node goes with the session — instead of after the session
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_session_frees_at_once() {
    let ensemble = ZkEnsemble::shared();
    let url = format!("{}?session_timeout=20s", ensemble.url());
    let name = unique_name("closed");
    let other = client(&url, opts()).await;
    let holder = ZkBackend::connect(&url, &opts()).await.expect("connect");
    let key = HoldKey {
        name: name.as_str().into(),
        owner: "short-lived".into(),
        kind: LockKind::Mutex,
    };
    let req = AcquireRequest::new(key, Duration::from_secs(10), LostSignal::new());
    assert!(matches!(
        acquire_retried(&holder, &req).await,
        AcquireReply::Granted { .. }
    ));
    assert!(other.inspect(&name).await.expect("inspect").held());
    drop(holder);
    let t = Instant::now();
    let g = hold_within(&other, &name, Duration::from_secs(15), "acquire").await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "freed only after {:?}",
        t.elapsed()
    );
    g.release().await.expect("release");
}

/// The lost signal is for losses only: a hold released normally never fires it (the watch on
/// the node sees our own delete), while a fixed-lease hold — which the watchdog does not
/// renew — still learns at once that its node was deleted behind its back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_only_for_losses() {
    let ensemble = ZkEnsemble::shared();
    // A watchdog lease longer than the waits below (a released hold's signal reports the end
    // of its lease once it has passed: `is_lost` compares with the clock).
    let opts = distlock_testkit::conformance::fast_opts().watchdog_lease(Duration::from_secs(5));
    // A session long enough for the fixed lease below (a lease must fit in the session).
    let a = client(
        &format!("{}?session_timeout=30s", ensemble.url()),
        opts.clone(),
    )
    .await;
    let name = unique_name("signals");
    let g = hold(&a, &name).await;
    let lost = g.lost_signal();
    released(g).await;
    tokio::time::sleep(opts.renew_interval() + opts.get_op_timeout() + Duration::from_millis(300))
        .await;
    assert!(
        !lost.is_lost(),
        "a released hold was reported lost: {:?}",
        lost.reason()
    );

    // A fixed lease far longer than the wait below: no renewals, yet the deletion is noticed.
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_secs(30))
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    let operator = zookeeper_client::Client::connect(&ensemble.connect_string())
        .await
        .expect("operator");
    let dir = distlock_zookeeper::lock_dir("dlock", &name, LockKind::Mutex).expect("dir");
    for c in operator.list_children(&dir).await.expect("list") {
        operator
            .delete(&format!("{dir}/{c}"), None)
            .await
            .expect("delete");
    }
    let t = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("never noticed");
    assert_eq!(reason, LostReason::NotHeld);
    // Noticed through the watch on the node, not at the end of the 30 s lease: 5 s is
    // generous on a loaded machine.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "noticed after {:?}",
        t.elapsed()
    );
    assert_eq!(g.release().await.expect("release"), ReleaseOutcome::Expired);
}

/// An election's leader cut off from the ensemble (its traffic blackholed) for longer than its
/// session timeout: its lost signal fires (before the server can expire the session, so before
/// the next candidate can lead), the waiting candidate leads once the session expired, with a
/// higher fencing token; the old leadership cannot proclaim any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_leader_cut_off_loses_and_is_replaced() {
    let ensemble = ZkEnsemble::shared();
    let proxy = DelayProxy::start(ensemble.addr(0), Duration::ZERO).expect("proxy");
    let session = Duration::from_secs(6);
    let cut_url = format!("zk://127.0.0.1:{}?session_timeout=6s", proxy.port());
    let url = format!("{}?session_timeout=6s", ensemble.url());
    let name = unique_name("el-expiry");
    let opts = opts().watchdog_lease(session);
    let leader_client = client(&cut_url, opts.clone()).await;
    let other = client(&url, opts).await;
    let leader = leader_client
        .election(&name)
        .expect("election")
        .campaign_timeout("old", Duration::from_secs(5))
        .await
        .expect("campaign");
    let t1 = leader.fencing_token();
    let lost = leader.lost_signal();
    let lost_at = tokio::spawn({
        let lost = lost.clone();
        async move {
            let reason = lost.lost().await;
            (reason, Instant::now())
        }
    });
    let candidate = other.election(&name).expect("election");
    let waiting = tokio::spawn({
        let candidate = candidate.clone();
        async move {
            let l = candidate
                .campaign_timeout("new", Duration::from_secs(20))
                .await;
            (l, Instant::now(), lost.is_lost())
        }
    });
    wait_for_waiters(&other, &name, LockKind::Election, 1).await;
    assert!(!waiting.is_finished(), "two leaders");

    let cut_at = Instant::now();
    proxy.set_blackhole(true);
    let (l2, led_at, lost_when_led) = waiting.await.expect("join");
    let l2 = l2.expect("the waiting candidate leads once the session expired");
    let waited = led_at - cut_at;
    assert!(
        waited >= session * 3 / 4,
        "led {waited:?} after the cut, before the session could expire"
    );
    let (reason, lost_at) = tokio::time::timeout(Duration::from_secs(5), lost_at)
        .await
        .expect("the lost signal never fired")
        .expect("join");
    assert!(
        matches!(reason, LostReason::SessionEnded(_)),
        "reason: {reason:?}"
    );
    eprintln!(
        "cut off at 0, lost signal at {:?}, new leader at {:?}",
        lost_at - cut_at,
        led_at - cut_at
    );
    assert!(
        lost_when_led,
        "the cut-off leader learned of its loss {:?} after the next one led",
        lost_at.saturating_duration_since(led_at)
    );
    assert!(l2.fencing_token() > t1, "{} after {t1}", l2.fencing_token());
    let now = candidate.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (now.value.as_str(), now.fencing_token),
        ("new", l2.fencing_token())
    );

    // It can talk again: the old leadership is gone for good.
    proxy.set_blackhole(false);
    assert!(leader.proclaim("still me?").await.is_err());
    assert_eq!(
        candidate.leader().await.expect("leader").map(|l| l.value),
        Some("new".to_owned())
    );
    l2.resign().await.expect("resign");
}

/// An election leader whose backend goes away without resigning (its session closes) is
/// replaced at once — its node goes with the session — not after the session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_leader_gone_replaced_at_once() {
    let ensemble = ZkEnsemble::shared();
    let url = format!("{}?session_timeout=20s", ensemble.url());
    let name = unique_name("el-closed");
    let other = client(&url, opts()).await;
    let leader = ZkBackend::connect(&url, &opts()).await.expect("connect");
    let key = HoldKey {
        name: name.as_str().into(),
        owner: "short-lived".into(),
        kind: LockKind::Election,
    };
    let mut req = AcquireRequest::new(key, Duration::from_secs(10), LostSignal::new());
    req.value = Some("gone soon".into());
    let t1 = match acquire_retried(&leader, &req).await {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    let election = other.election(&name).expect("election");
    let l = election.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (l.owner.as_str(), l.value.as_str()),
        ("short-lived", "gone soon")
    );
    let waiting = tokio::spawn({
        let election = election.clone();
        async move {
            election
                .campaign_timeout("next", Duration::from_secs(15))
                .await
        }
    });
    wait_for_waiters(&other, &name, LockKind::Election, 1).await;
    drop(leader);
    let t = Instant::now();
    let next = waiting.await.expect("join").expect("the candidate leads");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "replaced only after {:?}",
        t.elapsed()
    );
    assert!(next.fencing_token() > t1);
    next.resign().await.expect("resign");
}
