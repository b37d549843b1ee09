//! The conformance suite: written once, run against every backend on a real server.
//!
//! A backend's test file implements [`Harness`] (how to make an independent client, what the
//! backend can do, how to break a lock behind its holder's back) and calls
//! [`conformance_suite!`](crate::conformance_suite), which expands to one `#[tokio::test]` per
//! case, so cases run in parallel and fail one by one.
//!
//! Every case uses its own lock names, so cases may share a server.

use dlock_core::{
    AcquireReply, AcquireRequest, Client, ClientOptions, Error, HoldKey, LockKind, LostReason,
    LostSignal, ReleaseOutcome,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a backend can do; cases that need a capability the backend lacks are skipped (and say so).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// A lock whose holder stops renewing frees itself when its lease ends.
    /// (False for `file://`, where the lease is the holder process's lifetime.)
    pub lease_expiry: bool,
    /// [`Harness::break_lock`] can remove a lock's server state behind the holder's back.
    pub break_lock: bool,
}

/// How the suite reaches one backend.
#[async_trait::async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A new client with its own connections, as a separate process would have.
    async fn client(&self, opts: ClientOptions) -> Client;
    /// What this backend can do.
    fn caps(&self) -> Caps;
    /// Deletes the lock's state on the server (as an operator or another program might).
    async fn break_lock(&self, _name: &str) {}
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// A lock name no other case uses.
pub fn unique_name(case: &str) -> String {
    format!(
        "conf-{case}-{}-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// Options for tests: a 1 s watchdog lease (renewal every 333 ms, so a loaded 2-core CI
/// machine can stall a renewal by half a second without losing the lock), short timeouts.
pub fn fast_opts() -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(Duration::from_secs(1))
        .op_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
}

fn skip(case: &str, why: &str) {
    eprintln!("conformance case `{case}` skipped: {why}");
}

/// ≥32 tasks across 4 clients, each with its own handle, keep a deliberately non-atomic counter
/// exact, and the fencing tokens seen inside the critical section strictly increase.
pub async fn mutual_exclusion<H: Harness>(h: &H) {
    let name = unique_name("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let (clients, tasks_per, rounds) = (4, 8, 3);
    let mut joins = Vec::new();
    for _ in 0..clients {
        let client = h.client(fast_opts()).await;
        for _ in 0..tasks_per {
            let (client, name, counter, tokens) = (
                client.clone(),
                name.clone(),
                counter.clone(),
                tokens.clone(),
            );
            joins.push(tokio::spawn(async move {
                let lock = client.lock(&name).expect("lock");
                for _ in 0..rounds {
                    let g = lock
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    let v = counter.load(Ordering::SeqCst);
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    assert_eq!(
                        g.release().await.expect("release"),
                        ReleaseOutcome::Released
                    );
                }
            }));
        }
    }
    for j in joins {
        j.await.expect("task");
    }
    let n = (clients * tasks_per * rounds) as u64;
    assert_eq!(
        counter.load(Ordering::SeqCst),
        n,
        "lost updates: mutual exclusion broken"
    );
    let tokens = tokens.lock().expect("tokens").clone();
    assert_eq!(tokens.len() as u64, n);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {tokens:?}"
    );
}

/// `try_acquire` never waits: `Ok(None)` while another owner holds the lock.
pub async fn try_acquire_contended<H: Harness>(h: &H) {
    let name = unique_name("try");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    let t = Instant::now();
    assert!(b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    // Two handles of one client are two owners: they exclude each other too.
    assert!(a
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert!(t.elapsed() < Duration::from_secs(2), "try_acquire waited");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let g2 = b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g2.is_some(), "free after release");
}

/// Re-entry counts holds; only the last release frees the lock; the token stays the same.
pub async fn reentrancy<H: Harness>(h: &H) {
    let name = unique_name("reentry");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let lock = a.lock(&name).expect("lock");
    let g1 = lock
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("first");
    let g2 = lock
        .clone()
        .try_acquire()
        .await
        .expect("second")
        .expect("re-entry");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    let info = a.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, lock.owner());
    assert_eq!(info.holders[0].count, 2);
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert!(b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    // An explicit shared owner id re-enters across handles too.
    let same_owner = a
        .lock(&name)
        .expect("lock")
        .with_owner(lock.owner())
        .expect("owner");
    let g3 = same_owner
        .try_acquire()
        .await
        .expect("try")
        .expect("re-entry by owner id");
    assert_eq!(g3.fencing_token(), g1.fencing_token());
    assert_eq!(
        g3.release().await.expect("r"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert_eq!(
        g1.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(!a.inspect(&name).await.expect("inspect").held());
    let g = b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free now");
    assert!(g.fencing_token() > 0);
}

/// Only the owner releases: a release by another owner id changes nothing.
pub async fn non_owner_cannot_release<H: Harness>(h: &H) {
    let name = unique_name("nonowner");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let intruder = HoldKey {
        name: name.as_str().into(),
        owner: "intruder".into(),
        kind: LockKind::Mutex,
    };
    let out = b.backend().release(&intruder).await.expect("release");
    assert_eq!(out, ReleaseOutcome::TakenByOther);
    let info = a.inspect(&name).await.expect("inspect");
    assert!(info.held(), "non-owner release freed the lock");
    assert_eq!(info.holders[0].owner, g.owner());
    assert!(b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // Releasing a lock nobody holds is reported, not an error.
    assert_eq!(
        b.backend().release(&intruder).await.expect("release"),
        ReleaseOutcome::Expired
    );
}

/// Fencing tokens strictly increase across holders in different clients.
pub async fn fencing_tokens_increase<H: Harness>(h: &H) {
    let name = unique_name("fence");
    let clients = [h.client(fast_opts()).await, h.client(fast_opts()).await];
    let mut last = 0;
    for i in 0..10 {
        let g = clients[i % 2]
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        assert!(
            g.fencing_token() > last,
            "token {} after {last}",
            g.fencing_token()
        );
        last = g.fencing_token();
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let info = clients[0].inspect(&name).await.expect("inspect");
    assert_eq!(info.fencing_token, last);
    assert!(!info.held());
}

/// `acquire_timeout` gives up near its deadline with a matchable error.
pub async fn acquire_timeout_deadline<H: Harness>(h: &H) {
    let name = unique_name("deadline");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let _g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let wait = Duration::from_millis(400);
    let t = Instant::now();
    let err = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(wait)
        .await
        .unwrap_err();
    let took = t.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(took >= wait, "gave up early: {took:?}");
    assert!(
        took < wait + Duration::from_millis(1500),
        "gave up late: {took:?}"
    );
    assert!(err.to_string().contains(&name));
    // Zero wait is a single try.
    let err = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.is_timeout());
}

/// A waiter is woken by the release, long before the holder's lease would end.
pub async fn waiter_woken_by_release<H: Harness>(h: &H) {
    let name = unique_name("wake");
    // Long leases: a waiter that only woke at lease end would take 20 s.
    let opts = fast_opts().watchdog_lease(Duration::from_secs(20));
    let a = h.client(opts.clone()).await;
    let b = h.client(opts).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let lock_b = b.lock(&name).expect("lock");
    let waiter = tokio::spawn(async move {
        let g = lock_b.acquire_timeout(Duration::from_secs(15)).await;
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (g, got_at) = waiter.await.expect("waiter");
    let g = g.expect("waiter acquired");
    let latency = got_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_secs(2),
        "waiter woke {latency:?} after release"
    );
    drop(g);
}

/// Dropping a waiting `acquire` leaves nothing behind: the lock is free once the holder releases.
pub async fn cancelled_acquire_leaves_nothing<H: Harness>(h: &H) {
    let name = unique_name("cancel");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let lock_b = b.lock(&name).expect("lock");
    let r = tokio::time::timeout(Duration::from_millis(200), lock_b.acquire()).await;
    assert!(r.is_err(), "acquired a held lock");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let info = a.inspect(&name).await.expect("inspect");
    assert!(!info.held(), "cancelled waiter left a hold: {info:?}");
    let c = h.client(fast_opts()).await;
    let g = c
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g.is_some(), "lock not free after a cancelled waiter");
    assert_eq!(b.held_count(), 0);
}

/// The watchdog keeps a lock past its lease while the guard lives; it stops after release.
pub async fn watchdog_renews<H: Harness>(h: &H) {
    let name = unique_name("watchdog");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    // Two and a half leases long.
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!g.is_lost(), "lost while the watchdog should renew");
    }
    assert!(b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert_eq!(a.held_count(), 1);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(a.held_count(), 0, "watchdog still tracks a released lock");
    let g = b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g.is_some());
}

/// Dropping a guard releases in the background, promptly.
pub async fn drop_releases<H: Harness>(h: &H) {
    let name = unique_name("drop");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(20));
    let a = h.client(opts.clone()).await;
    let b = h.client(opts).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let t = Instant::now();
    drop(g);
    let g = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("acquire after drop");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "drop did not release: {:?}",
        t.elapsed()
    );
    assert_eq!(a.held_count(), 0);
    drop(g);
}

/// A fixed lease: no renewal; the lost signal fires when it ends, and the lock frees itself
/// (a crashed holder's lock comes back at lease end).
pub async fn fixed_lease_expires<H: Harness>(h: &H) {
    if !h.caps().lease_expiry {
        return skip(
            "fixed_lease_expires",
            "locks of this backend last as long as the holder process",
        );
    }
    let name = unique_name("lease");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let lease = Duration::from_millis(300);
    let t = Instant::now();
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(lease)
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost signal never fired");
    assert_eq!(reason, LostReason::LeaseExpired);
    assert!(
        t.elapsed() >= lease - Duration::from_millis(20),
        "fired early: {:?}",
        t.elapsed()
    );
    // The holder "crashed" (never released); a waiter gets the lock at lease end.
    let g2 = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("lock freed at lease end");
    assert!(g2.fencing_token() > g.fencing_token());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A crashed holder (guard leaked, never renewed or released) frees the lock at lease end.
pub async fn crashed_holder_frees_at_lease_end<H: Harness>(h: &H) {
    if !h.caps().lease_expiry {
        return skip(
            "crashed_holder",
            "covered by the backend's process-kill test",
        );
    }
    let name = unique_name("crash");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_millis(400))
        .expect("l")
        .acquire()
        .await
        .expect("acquire");
    std::mem::forget(g);
    let t = Instant::now();
    let g = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "got a held lock after {took:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "lease end not noticed: {took:?}"
    );
    drop(g);
}

/// `extend` keeps a fixed-lease lock longer; extending a lost lock fails with NotOwner.
pub async fn extend_lease<H: Harness>(h: &H) {
    if !h.caps().lease_expiry {
        return skip("extend_lease", "no leases on this backend");
    }
    let name = unique_name("extend");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_millis(300))
        .expect("l")
        .acquire()
        .await
        .expect("a");
    g.extend(Duration::from_secs(3)).await.expect("extend");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!g.is_lost(), "lost despite extend");
    assert!(b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert!(g.extend(Duration::ZERO).await.is_err());
    let info = a.inspect(&name).await.expect("inspect");
    let left = info.holders[0].lease_left.expect("lease");
    assert!(left > Duration::from_secs(1), "lease left {left:?}");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Deleting the lock's state behind the holder's back fires the lost signal at the next renewal.
pub async fn lost_when_broken<H: Harness>(h: &H) {
    if !h.caps().break_lock {
        return skip(
            "lost_when_broken",
            "the harness cannot break locks of this backend",
        );
    }
    let name = unique_name("broken");
    let a = h.client(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    assert!(!g.is_lost());
    h.break_lock(&name).await;
    let t = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("not lost");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "noticed after {:?}",
        t.elapsed()
    );
    assert!(g.is_lost());
    assert_eq!(a.held_count(), 0);
    assert_eq!(g.release().await.expect("release"), ReleaseOutcome::Expired);
    // extend on a lost lock is refused.
}

/// Bad input gives `InvalidArgument` with a message, never a panic.
pub async fn invalid_input<H: Harness>(h: &H) {
    let a = h.client(fast_opts()).await;
    let msg = |e: Error| {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        e.to_string()
    };
    assert!(msg(a.lock("").unwrap_err()).contains("empty"));
    assert!(msg(a
        .lock(&"n".repeat(dlock_core::MAX_NAME_LEN + 1))
        .unwrap_err())
    .contains("limit"));
    assert!(msg(a.lock("bad\nname").unwrap_err()).contains("control"));
    let lock = a.lock(&unique_name("invalid")).expect("lock");
    assert!(msg(lock.clone().lease(Duration::ZERO).unwrap_err()).contains("too short"));
    assert!(msg(lock.clone().with_owner("").unwrap_err()).contains("empty"));
    let e = ClientOptions::default()
        .watchdog_lease(Duration::from_millis(10))
        .validate()
        .unwrap_err();
    assert!(msg(e).contains("watchdog"));
    // The longest valid name works end to end.
    let long = a.lock(&"n".repeat(dlock_core::MAX_NAME_LEN)).expect("lock");
    let g = long.try_acquire().await.expect("try").expect("free");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // Names are opaque: braces, slashes, unicode.
    let odd = format!("{}-{{a}}/b:π", unique_name("odd"));
    let g = a
        .lock(&odd)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The backend trait directly: a re-entry never shortens the lease, and `Held` reports the TTL.
pub async fn backend_contract<H: Harness>(h: &H) {
    let name = unique_name("contract");
    let a = h.client(fast_opts()).await;
    let key = HoldKey {
        name: name.as_str().into(),
        owner: "contract-owner".into(),
        kind: LockKind::Mutex,
    };
    let req = |lease| AcquireRequest::new(key.clone(), lease, LostSignal::new());
    let b = a.backend();
    let t1 = match b
        .acquire(&req(Duration::from_secs(10)))
        .await
        .expect("acquire")
    {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    let t2 = match b
        .acquire(&req(Duration::from_millis(100)))
        .await
        .expect("re-enter")
    {
        AcquireReply::Granted { token } => token,
        other => panic!("no re-entry: {other:?}"),
    };
    assert_eq!(t1, t2);
    let other = AcquireRequest::new(
        HoldKey {
            owner: "someone-else".into(),
            ..key.clone()
        },
        Duration::from_secs(1),
        LostSignal::new(),
    );
    match b.acquire(&other).await.expect("acquire") {
        AcquireReply::Held { ttl } => {
            if h.caps().lease_expiry {
                let ttl = ttl.expect("ttl");
                assert!(
                    ttl > Duration::from_secs(5),
                    "re-entry shortened the lease: {ttl:?}"
                );
            }
        }
        g => panic!("granted a held lock: {g:?}"),
    }
    assert_eq!(
        b.release(&key).await.expect("r"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert_eq!(b.release(&key).await.expect("r"), ReleaseOutcome::Released);
    assert_eq!(b.release(&key).await.expect("r"), ReleaseOutcome::Expired);
}

/// Expands to one `#[tokio::test]` per conformance case, each calling `$make` for a harness.
///
/// ```ignore
/// dlock_testkit::conformance_suite!(MyHarness::start());
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@cases $make;
            mutual_exclusion, try_acquire_contended, reentrancy, non_owner_cannot_release,
            fencing_tokens_increase, acquire_timeout_deadline, waiter_woken_by_release,
            cancelled_acquire_leaves_nothing, watchdog_renews, drop_releases,
            fixed_lease_expires, crashed_holder_frees_at_lease_end, extend_lease,
            lost_when_broken, invalid_input, backend_contract);
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}
