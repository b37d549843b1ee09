//! The conformance suite: written once, run against every backend on a real server.
//!
//! A backend's test file implements [`Harness`] (how to make an independent client, what the
//! backend can do, how to break a lock behind its holder's back) and calls
//! [`conformance_suite!`](crate::conformance_suite), which expands to one `#[tokio::test]` per
//! case, so cases run in parallel and fail one by one.
//!
//! Every case uses its own lock names, so cases may share a server.
//!
//! The adversarial cases ([`adversarial`], expanded by
//! [`adversarial_suite!`](crate::adversarial_suite)) try to break the lock: late, lost and
//! reset replies through a proxy the case controls ([`Harness::proxied_client`]),
//! cancellation at every await, re-entrant and sibling holds, data loss, and a soak checked on
//! a fenced register and an overlap recorder.

pub mod adversarial;

use crate::{FencedRegister, OverlapRecorder, ProxyControl};
use distlock_core::{
    AcquireReply, AcquireRequest, AttemptId, Client, ClientOptions, Error, GrantRef, HoldKey,
    LockKind, LostReason, LostSignal, ReleaseOutcome, RenewOutcome,
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
    /// A new client (as [`client`](Self::client)) whose traffic goes through proxies the case
    /// controls: one per server or node, all of them in the [`ProxyControl`]. `None` (the
    /// default) when the backend has no network connection to cut (e.g. `file://`): the cases
    /// that need one are skipped, saying so.
    async fn proxied_client(&self, _opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        None
    }
    /// Loses all of the lock service's data at once, as a crash of a server without
    /// persistence would (e.g. `FLUSHALL`). Returns false (the default) if the harness cannot;
    /// the data-loss case then uses [`break_lock`](Self::break_lock).
    async fn lose_data(&self) -> bool {
        false
    }
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// Generous deadline for a state reached asynchronously (a waiter reaching the server, a
/// session or connection going away): on a loaded machine we cannot know how long it takes,
/// only that it comes.
pub const EVENTUALLY: Duration = Duration::from_secs(10);

/// Polls `probe` every 20 ms until `done` accepts its value, and returns that value; fails with
/// `what` and the last value seen if that takes longer than [`EVENTUALLY`].
pub async fn poll_until<T: std::fmt::Debug>(
    what: &str,
    mut probe: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let start = Instant::now();
    loop {
        let v = probe().await;
        if done(&v) {
            return v;
        }
        assert!(
            start.elapsed() < EVENTUALLY,
            "{what}: still {v:?} after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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

pub(crate) fn skip(case: &str, why: &str) {
    eprintln!("conformance case `{case}` skipped: {why}");
}

/// ≥32 tasks across 4 clients, each with its own handle, keep a deliberately non-atomic counter
/// exact, and the fencing tokens seen inside the critical section strictly increase; no two
/// believed holders overlap and the fenced register refuses no believed holder's write.
pub async fn mutual_exclusion<H: Harness>(h: &H) {
    let name = unique_name("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let rec = Arc::new(OverlapRecorder::new());
    let reg = Arc::new(FencedRegister::new());
    let (clients, tasks_per, rounds) = (4, 8, 3);
    let mut joins = Vec::new();
    for _ in 0..clients {
        let client = h.client(fast_opts()).await;
        for _ in 0..tasks_per {
            let (client, name, counter, tokens, rec, reg) = (
                client.clone(),
                name.clone(),
                counter.clone(),
                tokens.clone(),
                rec.clone(),
                reg.clone(),
            );
            joins.push(tokio::spawn(async move {
                let lock = client.lock(&name).expect("lock");
                let me = format!("{}/{}", client.id(), lock.owner());
                for _ in 0..rounds {
                    let g = lock
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    let visit = rec.enter(&name, &me, g.fencing_token(), g.is_lost());
                    reg.write(g.fencing_token(), &me, !g.is_lost());
                    let v = counter.load(Ordering::SeqCst);
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    rec.exit(visit, g.is_lost());
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
    rec.assert_no_overlap();
    reg.assert_no_rejected_belief();
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

/// Re-entry counts guards in the client; only the last release frees the lock; the token stays
/// the same; the server sees one grant.
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
    let intruder = GrantRef {
        key: HoldKey {
            name: name.as_str().into(),
            owner: "intruder".into(),
            kind: LockKind::Mutex,
        },
        attempt: AttemptId::new(),
        token: g.fencing_token(),
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
    // Not held up beyond the deadline by a retry or a slow reply (generous for a loaded machine).
    assert!(
        took < wait + Duration::from_secs(3),
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
    // Woken by the release, not by the holder's 20 s lease running out.
    assert!(
        latency < Duration::from_secs(5),
        "waiter woke {latency:?} after release"
    );
    drop(g);
}

/// Dropping a waiting `acquire` leaves nothing behind: the lock is free once the holder releases.
pub async fn cancelled_acquire_leaves_nothing<H: Harness>(h: &H) {
    let name = unique_name("cancel");
    let a = h.client(fast_opts()).await;
    // A long lease for the waiter: a grant leaked to its cancelled acquire would last 20 s,
    // far beyond the 5 s this case waits for the lock to come free.
    let b = h
        .client(fast_opts().watchdog_lease(Duration::from_secs(20)))
        .await;
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
    // The cancelled acquire cleans up in the background (giving up its place, or releasing a
    // grant that raced with the cancellation): promptly, not at a lease end.
    let t = Instant::now();
    loop {
        let info = a.inspect(&name).await.expect("inspect");
        if !info.held() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "cancelled waiter left a hold: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    // Released by the drop, not at the 20 s lease end.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop did not release: {:?}",
        t.elapsed()
    );
    // The background release finishes its bookkeeping right after the server call.
    let t = Instant::now();
    while a.held_count() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "the dropped hold is still tracked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    // The lease is counted from the moment the request left, so no waiter can have the lock
    // before 400 ms after this instant, however slow the replies are.
    let t = Instant::now();
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_millis(400))
        .expect("l")
        .acquire()
        .await
        .expect("acquire");
    std::mem::forget(g);
    let g = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(8))
        .await
        .expect("acquire");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(380),
        "got a held lock after {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
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
        .lease(Duration::from_secs(1))
        .expect("l")
        .acquire()
        .await
        .expect("a");
    g.extend(Duration::from_secs(5)).await.expect("extend");
    // Past the first lease's end.
    tokio::time::sleep(Duration::from_millis(1300)).await;
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
    assert!(left > Duration::from_secs(2), "lease left {left:?}");
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
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("not lost");
    assert_eq!(reason, LostReason::NotHeld);
    // At the next renewal (every 333 ms), with room for a loaded machine.
    assert!(
        t.elapsed() < Duration::from_secs(3),
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
        .lock(&"n".repeat(distlock_core::MAX_NAME_LEN + 1))
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
    let long = a
        .lock(&"n".repeat(distlock_core::MAX_NAME_LEN))
        .expect("lock");
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

/// The backend trait directly: a retried acquire of one attempt is one grant with one token and
/// never shortens the lease; another attempt of the same owner is another holder; renewals and
/// releases name the grant, never shorten, and a repeated release is reported, not repeated.
pub async fn backend_contract<H: Harness>(h: &H) {
    let name = unique_name("contract");
    let a = h.client(fast_opts()).await;
    let key = HoldKey {
        name: name.as_str().into(),
        owner: "contract-owner".into(),
        kind: LockKind::Mutex,
    };
    let b = a.backend();
    let mut req = AcquireRequest::new(key.clone(), Duration::from_secs(10), LostSignal::new());
    let t1 = match b.acquire(&req).await.expect("acquire") {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    // The same attempt again (a retry after a lost reply), asking for a shorter lease.
    req.lease = Duration::from_millis(100);
    let t2 = match b.acquire(&req).await.expect("retry") {
        AcquireReply::Granted { token } => token,
        other => panic!("a retried attempt was not granted: {other:?}"),
    };
    assert_eq!(t1, t2, "a retried attempt got a second token");
    let grant = req.grant(t1);
    // Another attempt of the *same owner* is another holder.
    let sibling = AcquireRequest::new(key.clone(), Duration::from_secs(1), LostSignal::new());
    let other = AcquireRequest::new(
        HoldKey {
            owner: "someone-else".into(),
            ..key.clone()
        },
        Duration::from_secs(1),
        LostSignal::new(),
    );
    for r in [&sibling, &other] {
        match b.acquire(r).await.expect("acquire") {
            AcquireReply::Held { ttl } => {
                if h.caps().lease_expiry {
                    let ttl = ttl.expect("ttl");
                    assert!(
                        ttl > Duration::from_secs(5),
                        "a retry shortened the lease: {ttl:?}"
                    );
                }
            }
            g => panic!("granted a held lock to another attempt: {g:?}"),
        }
        b.give_up(r).await.expect("give up");
    }
    // A short renewal never shortens.
    let out = b
        .renew(&[(grant.clone(), Duration::from_millis(100))])
        .await
        .expect("renew");
    assert_eq!(out, vec![RenewOutcome::Renewed]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        matches!(
            b.acquire(&other).await.expect("acquire"),
            AcquireReply::Held { .. }
        ),
        "a short renewal shortened the lease"
    );
    b.give_up(&other).await.expect("give up");
    // A stale address (right attempt, wrong token) touches nothing.
    let stale = GrantRef {
        token: t1.saturating_sub(1),
        ..grant.clone()
    };
    assert_ne!(
        b.release(&stale).await.expect("r"),
        ReleaseOutcome::Released,
        "a release with a stale token freed the lock"
    );
    assert!(a.inspect(&name).await.expect("inspect").held());
    assert_eq!(
        b.release(&grant).await.expect("r"),
        ReleaseOutcome::Released
    );
    assert_eq!(b.release(&grant).await.expect("r"), ReleaseOutcome::Expired);
    assert_eq!(
        b.renew(&[(grant.clone(), Duration::from_secs(1))])
            .await
            .expect("renew"),
        vec![RenewOutcome::NotHeld]
    );
}

/// Tries `f`; if the backend answers `Unsupported`, checks the error is the typed one and
/// returns `None` (the case is skipped, saying so).
async fn supported<T>(case: &str, r: distlock_core::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.is_unsupported() => {
            assert!(e.to_string().contains("not supported"), "{e}");
            skip(case, &format!("the backend says: {e}"));
            None
        }
        Err(e) => panic!("{case}: {e:?}"),
    }
}

/// Readers share the lock, a writer excludes everyone: three readers must all be inside at
/// once (a barrier only they can pass together), and no reader is ever inside with a writer.
pub async fn rw_readers_share_writer_excludes<H: Harness>(h: &H) {
    let name = unique_name("rw");
    let a = h.client(fast_opts()).await;
    let Some(g) = supported(
        "rw",
        a.rw_lock(&name).expect("rw").read().try_acquire().await,
    )
    .await
    else {
        return;
    };
    drop(g.expect("free"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let readers_in = Arc::new(AtomicU64::new(0));
    let writers_in = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    // Writers start once every reader holds the lock: a writer queued between two readers
    // would (rightly) make the later reader wait behind it, and the barrier could never open.
    let readers_holding = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let c = h.client(fast_opts()).await;
        let (name, readers_in, writers_in, violations, barrier, holding) = (
            name.clone(),
            readers_in.clone(),
            writers_in.clone(),
            violations.clone(),
            barrier.clone(),
            readers_holding.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let rw = c.rw_lock(&name).expect("rw");
            if i < 3 {
                let g = rw
                    .read()
                    .acquire_timeout(Duration::from_secs(10))
                    .await
                    .expect("read");
                readers_in.fetch_add(1, Ordering::SeqCst);
                holding.fetch_add(1, Ordering::SeqCst);
                if writers_in.load(Ordering::SeqCst) > 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                // Only possible if all three readers hold the lock at the same time.
                tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                    .await
                    .expect("readers did not share the lock");
                readers_in.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            } else {
                let t = Instant::now();
                while holding.load(Ordering::SeqCst) < 3 {
                    assert!(
                        t.elapsed() < Duration::from_secs(10),
                        "readers never got in"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                for _ in 0..3 {
                    let g = rw
                        .write()
                        .acquire_timeout(Duration::from_secs(20))
                        .await
                        .expect("write");
                    if writers_in.fetch_add(1, Ordering::SeqCst) > 0
                        || readers_in.load(Ordering::SeqCst) > 0
                    {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writers_in.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "a writer overlapped another holder"
    );
}

/// A writer may also take the read side (downgrade) without deadlock, and keep reading after
/// it lets the write side go; write grants get strictly increasing fencing tokens.
pub async fn rw_downgrade_and_tokens<H: Harness>(h: &H) {
    let name = unique_name("rwdown");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let rw = a.rw_lock(&name).expect("rw");
    let Some(w) = supported(
        "rw_downgrade",
        rw.write().acquire_timeout(Duration::from_secs(5)).await,
    )
    .await
    else {
        return;
    };
    let r = rw
        .read()
        .try_acquire()
        .await
        .expect("read")
        .expect("downgrade");
    let other = b.rw_lock(&name).expect("rw");
    assert!(
        other.read().try_acquire().await.expect("try").is_none(),
        "reader passed a writer"
    );
    let t1 = w.fencing_token();
    assert_eq!(
        w.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // Now only our read hold remains: other readers may join, writers may not.
    let r2 = other
        .read()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("reader after downgrade");
    let third = h.client(fast_opts()).await;
    let third = third.rw_lock(&name).expect("rw");
    assert!(third.write().try_acquire().await.expect("try").is_none());
    // A reader asking for the write side is refused at once (an upgrade could deadlock).
    let err = other.write().try_acquire().await.expect_err("upgrade");
    assert!(
        matches!(err, distlock_core::Error::InvalidArgument(_)),
        "{err:?}"
    );
    assert_eq!(
        r.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        r2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let w2 = other
        .write()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("write");
    assert!(w2.fencing_token() > t1);
    assert_eq!(
        w2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A stream of readers does not starve a waiting writer: once a writer waits, new readers
/// wait behind it.
pub async fn rw_writer_not_starved<H: Harness>(h: &H) {
    let name = unique_name("rwstarve");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let c = h.client(fast_opts()).await;
    let Some(r1) = supported(
        "rw_writer_not_starved",
        a.rw_lock(&name).expect("rw").read().try_acquire().await,
    )
    .await
    else {
        return;
    };
    let r1 = r1.expect("free");
    let wlock = b.rw_lock(&name).expect("rw").write();
    let writer = tokio::spawn(async move { wlock.acquire_timeout(Duration::from_secs(20)).await });
    // While r1 holds a read lock, the only thing that can turn a new reader away is the
    // waiting writer. A reader that arrives before the writer has queued rightly gets in (it
    // is let go at once); once the writer waits, new readers must be refused.
    let late_rw = c.rw_lock(&name).expect("rw");
    let t = Instant::now();
    loop {
        match late_rw.read().try_acquire().await.expect("try") {
            None => break,
            Some(early) => {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "a new reader passed a waiting writer"
                );
                early.release().await.expect("release");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(!writer.is_finished(), "writer got in with a reader inside");
    assert_eq!(
        r1.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let w = writer.await.expect("join").expect("writer got the lock");
    assert_eq!(
        w.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A fair lock serves waiters in arrival order.
pub async fn fair_lock_fifo<H: Harness>(h: &H) {
    let name = unique_name("fair");
    let a = h.client(fast_opts()).await;
    let Some(g) = supported(
        "fair",
        a.fair_lock(&name).expect("fair").try_acquire().await,
    )
    .await
    else {
        return;
    };
    let g = g.expect("free");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let c = h.client(fast_opts()).await;
        let (lock_name, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = c
                .fair_lock(&lock_name)
                .expect("fair")
                .acquire_timeout(Duration::from_secs(20))
                .await
                .expect("acquire");
            order.lock().expect("order").push(i);
            g.release().await.expect("release");
        }));
        // Let each waiter queue before the next arrives.
        wait_for_waiters(&a, &name, LockKind::Fair, i + 1).await;
    }
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4]);
}

/// A semaphore of 3 permits: a fourth waits; a release lets it in; a crashed holder's permit
/// comes back at its lease end; several permits at once.
pub async fn semaphore_permits<H: Harness>(h: &H) {
    let name = unique_name("sem");
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let sem = a.semaphore(&name, 3).expect("sem");
    let Some(g1) = supported("semaphore", sem.try_acquire(1).await).await else {
        return;
    };
    let g1 = g1.expect("permit");
    let g2 = sem.try_acquire(1).await.expect("try").expect("permit");
    // The crashed permit's lease counts from its request: it cannot come back before 400 ms
    // after this instant.
    let t = Instant::now();
    let crashed = sem
        .clone()
        .lease(Duration::from_millis(400))
        .expect("lease")
        .try_acquire(1)
        .await
        .expect("try")
        .expect("permit");
    let other = b.semaphore(&name, 3).expect("sem");
    assert!(
        other.try_acquire(1).await.expect("try").is_none(),
        "a fourth permit"
    );
    let info = b
        .inspect_kind(&name, crashed_kind())
        .await
        .expect("inspect");
    assert_eq!(info.permits_in_use(), 3);
    assert!(g1.fencing_token() < g2.fencing_token());
    // The "crashed" holder never releases: its permit comes back at lease end.
    std::mem::forget(crashed);
    let g4 = other
        .acquire_timeout(1, Duration::from_secs(8))
        .await
        .expect("permit back at lease end");
    assert!(
        t.elapsed() >= Duration::from_millis(380),
        "{:?}",
        t.elapsed()
    );
    // Two permits at once wait for two free ones.
    let two = other.clone();
    let waiter = tokio::spawn(async move { two.acquire_timeout(2, Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "took 2 permits with 0 free");
    assert_eq!(
        g1.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "took 2 permits with 1 free");
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let pair = waiter.await.expect("join").expect("two permits");
    assert_eq!(
        pair.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        g4.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        sem.try_acquire(4).await.is_err(),
        "more permits than the semaphore has"
    );
    assert!(sem.try_acquire(0).await.is_err());
}

/// Waits until the server reports at least `n` waiters on `name` (10 s at most). Where the
/// backend does not report waiters, gives a waiter a generous moment to queue instead.
pub async fn wait_for_waiters(client: &Client, name: &str, kind: LockKind, n: u32) {
    let t = Instant::now();
    loop {
        let info = client.inspect_kind(name, kind).await.expect("inspect");
        match info.waiters {
            None => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                return;
            }
            Some(w) if w >= n => return,
            Some(w) => {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{w} waiters queued on `{name}`, expected {n}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

fn crashed_kind() -> LockKind {
    LockKind::Semaphore {
        permits: 1,
        limit: 3,
    }
}

/// Two clients taking overlapping sets in opposite orders never deadlock; a multi-lock that
/// cannot get everything keeps nothing.
pub async fn multi_lock_no_deadlock<H: Harness>(h: &H) {
    let (x, y, z) = (unique_name("mx"), unique_name("my"), unique_name("mz"));
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let sets = [
        vec![x.clone(), y.clone(), z.clone()],
        vec![z.clone(), y.clone(), x.clone()],
    ];
    let mut tasks = Vec::new();
    for (c, set) in [a.clone(), b.clone()].into_iter().zip(sets) {
        tasks.push(tokio::spawn(async move {
            let names: Vec<&str> = set.iter().map(String::as_str).collect();
            let m = c.multi_lock(&names).expect("multi");
            for _ in 0..10 {
                let g = m
                    .acquire_timeout(Duration::from_secs(20))
                    .await
                    .expect("no deadlock");
                assert_eq!(g.guards().len(), 3);
                tokio::task::yield_now().await;
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    // All or nothing: with y held elsewhere, a multi-lock of x and y keeps neither.
    let gy = b.lock(&y).expect("lock").acquire().await.expect("y");
    let m = a.multi_lock(&[&x, &y]).expect("multi");
    let err = m
        .acquire_timeout(Duration::from_millis(300))
        .await
        .expect_err("y is held");
    assert!(err.is_timeout(), "{err}");
    assert!(m.try_acquire().await.expect("try").is_none());
    assert!(
        !a.inspect(&x).await.expect("inspect").held(),
        "x left locked"
    );
    gy.release().await.expect("release");
    assert!(a.multi_lock(&[]).is_err());
}

/// Expands to one `#[tokio::test]` per conformance case, each calling `$make` for a harness.
///
/// ```ignore
/// distlock_testkit::conformance_suite!(MyHarness::start());
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@cases $make;
            mutual_exclusion, try_acquire_contended, reentrancy, non_owner_cannot_release,
            fencing_tokens_increase, acquire_timeout_deadline, waiter_woken_by_release,
            cancelled_acquire_leaves_nothing, watchdog_renews, drop_releases,
            fixed_lease_expires, crashed_holder_frees_at_lease_end, extend_lease,
            lost_when_broken, invalid_input, backend_contract,
            rw_readers_share_writer_excludes, rw_downgrade_and_tokens, rw_writer_not_starved,
            fair_lock_fifo, semaphore_permits, multi_lock_no_deadlock);
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

/// Expands to one `#[tokio::test]` per adversarial case (see [`adversarial`]), each calling
/// `$make` for a harness. Kept apart from [`conformance_suite!`](crate::conformance_suite) so a
/// backend runs both and they fail one by one.
///
/// ```ignore
/// distlock_testkit::adversarial_suite!(MyHarness::start());
/// ```
#[macro_export]
macro_rules! adversarial_suite {
    ($make:expr) => {
        $crate::adversarial_suite!(@cases $make;
            late_reply_on_release, retried_acquire_is_one, late_reply_on_renew,
            extend_shorter_than_watchdog, fixed_and_watchdog_guards, sibling_waiters_handoff,
            rw_sibling_waiters, cancel_at_every_await, semaphore_edges,
            data_loss_tokens_increase, contended_soak);
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make;
                $crate::conformance::adversarial::$case(&harness).await;
            }
        )*
    };
}
