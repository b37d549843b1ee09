//! The adversarial cases: they try to break the lock, as a hostile network and careless
//! callers would, and check invariants (not only the outcomes a case predicted).
//!
//! Faults come from the proxy a case controls ([`Harness::proxied_client`]): a *late reply*
//! (the request executes on the server, its reply arrives after the client's operation timeout,
//! so the core retries it), a *lost reply* (dropped, then the connection reset), and a *reset*
//! right after a request reached the server. The core's answer to all three is the same
//! retried request; the server must give it the effect of one. Other cases cancel `acquire` at
//! every await, mix re-entrant fixed and watchdog guards, race sibling waiters of one owner
//! around a handoff, and soak the lock with random delays while a [`FencedRegister`] and an
//! [`OverlapRecorder`] watch the critical sections.
//!
//! Every bound is generous (a loaded 2-core machine), and every wait polls for a state; a fault
//! the machine's timing makes miss (e.g. a reply that raced the fault being set) makes a case
//! weaker for that run, never fail.

use super::{fast_opts, poll_until, skip, unique_name, Harness, EVENTUALLY};
use crate::{FencedRegister, OverlapRecorder, ProxyControl};
use distlock_core::{Client, ClientOptions, Error, LockGuard, LockKind, ReleaseOutcome};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A small random number below `n` (xorshift; the testkit needs no crate for jitter).
fn rand_below(n: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    x % n.max(1)
}

const NO_PROXY: &str = "the harness has no proxied client (no network to fault)";

/// The operation timeout of [`fast_opts`].
fn op_timeout() -> Duration {
    fast_opts().get_op_timeout()
}

/// A reply delay past the operation timeout: the client gives the request up and retries it
/// while the request has already executed on the server.
fn late() -> Duration {
    op_timeout() + Duration::from_millis(300)
}

/// A watchdog lease long enough that seconds of faults do not cost a holder its lock, and that
/// a grant leaked by a faulted request would block others far longer than any bound below.
fn long_lease_opts() -> ClientOptions {
    fast_opts().watchdog_lease(Duration::from_secs(20))
}

async fn try_lock(c: &Client, name: &str) -> Option<LockGuard> {
    c.lock(name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try_acquire")
}

/// Polls until `probe` of the proxies is true (a request reached the server, a reply was read).
async fn wait_proxy(what: &str, proxy: &ProxyControl, done: impl Fn(&crate::ProxyStats) -> bool) {
    poll_until(what, async || proxy.stats(), done).await;
}

/// Checks for `period` that `other` cannot take `name` while `g` believes it holds it, and that
/// `g` is not lost (when `must_hold`).
async fn assert_excluded(
    case: &str,
    other: &Client,
    name: &str,
    g: &LockGuard,
    period: Duration,
    must_hold: bool,
) {
    let t = Instant::now();
    while t.elapsed() < period {
        if let Some(intruder) = try_lock(other, name).await {
            let lost = g.is_lost();
            assert!(
                lost,
                "{case}: another owner got `{name}` (token {}) after {:?} while our guard (token {}) \
                 believed it held it",
                intruder.fencing_token(),
                t.elapsed(),
                g.fencing_token()
            );
            assert!(!must_hold, "{case}: our guard of `{name}` was lost");
            drop(intruder);
            return;
        }
        if must_hold {
            assert!(
                !g.is_lost(),
                "{case}: our guard of `{name}` was lost after {:?} ({:?})",
                t.elapsed(),
                g.lost_signal().reason()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls (up to `within`) until `other` takes `name`; at that moment `g` must know it is lost.
async fn taken_only_after_loss(
    case: &str,
    other: &Client,
    name: &str,
    g: &LockGuard,
    within: Duration,
) -> LockGuard {
    let t = Instant::now();
    loop {
        if let Some(taken) = try_lock(other, name).await {
            assert!(
                g.is_lost(),
                "{case}: another owner got `{name}` (token {}) after {:?} while our unconfirmed \
                 guard (token {}) still believed it held it",
                taken.fencing_token(),
                t.elapsed(),
                g.fencing_token()
            );
            return taken;
        }
        assert!(
            t.elapsed() < within,
            "{case}: `{name}` never came free after {:?} (our guard lost: {})",
            t.elapsed(),
            g.is_lost()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until a new owner takes `name` and returns its guard: a lock that should be free
/// must come free well before the 20 s lease of [`long_lease_opts`] (no leaked grant).
async fn comes_free(case: &str, other: &Client, name: &str) -> LockGuard {
    let t = Instant::now();
    loop {
        if let Some(g) = try_lock(other, name).await {
            return g;
        }
        let info = other.inspect(name).await;
        assert!(
            t.elapsed() < EVENTUALLY,
            "{case}: `{name}` is still held after {:?} although no guard holds it: {info:?}",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most `within`, without failing) for `n` waiters on `name`, where the backend
/// reports them; the cases that use it are valid either way, only sharper once all queue.
async fn settle_waiters(c: &Client, name: &str, kind: LockKind, n: u32, within: Duration) {
    let t = Instant::now();
    loop {
        match c.inspect_kind(name, kind).await.map(|i| i.waiters) {
            Ok(Some(w)) if w < n && t.elapsed() < within => {}
            Ok(None) => {
                tokio::time::sleep(within.min(Duration::from_millis(300))).await;
                return;
            }
            _ => return,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A critical section: recorded, two fenced writes, a short stay.
async fn section(
    rec: &OverlapRecorder,
    reg: &FencedRegister,
    g: &LockGuard,
    holder: &str,
    stay: Duration,
) {
    let visit = rec.enter(g.name(), holder, g.fencing_token(), g.is_lost());
    reg.write(g.fencing_token(), holder, !g.is_lost());
    tokio::time::sleep(stay).await;
    reg.write(g.fencing_token(), holder, !g.is_lost());
    rec.exit(visit, g.is_lost());
}

/// Late replies on release. (1) Two re-entrant guards of one hold: releasing the first while
/// replies are late must not free the lock (the core keeps the count; a backend that counted
/// re-entry itself would see the retried decrement twice). (2) A single guard's release whose
/// reply is late: it executed, so another owner gets in; the release's retries must not touch
/// that owner's grant.
pub async fn late_reply_on_release<H: Harness>(h: &H) {
    let case = "late_reply_on_release";
    let Some((p, proxy)) = h.proxied_client(long_lease_opts()).await else {
        return skip(case, NO_PROXY);
    };
    let b = h.client(fast_opts()).await;
    let name = unique_name("laterel2");
    let lock = p.lock(&name).expect("lock");
    let g1 = lock
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    let g2 = lock
        .try_acquire()
        .await
        .expect("re-enter")
        .expect("re-entry");
    proxy.set_reply_delay(late());
    // Whatever the release sends has reached the server by the time it returns (requests are
    // not delayed), retries included.
    let r1 = g1.release().await;
    proxy.heal();
    // What matters first: the lock is still ours and only ours.
    assert!(!g2.is_lost(), "{case}: the remaining guard was lost");
    assert_excluded(case, &b, &name, &g2, Duration::from_millis(300), true).await;
    assert!(
        matches!(r1, Ok(ReleaseOutcome::StillHeld { remaining: 1 })),
        "{case}: the first of two guards released: {r1:?}"
    );
    let info = b.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{case}: {info:?}");
    assert_eq!(info.holders[0].owner, lock.owner(), "{case}: {info:?}");
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    drop(comes_free(case, &b, &name).await);

    // (2) One guard; the release executes, its replies come late.
    let name = unique_name("laterel1");
    let g = p
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    let token = g.fencing_token();
    proxy.set_reply_delay(late());
    let release = tokio::spawn(g.release());
    let gb = comes_free(case, &b, &name).await;
    let r = release.await.expect("join");
    proxy.heal();
    assert!(
        !matches!(r, Ok(ReleaseOutcome::StillHeld { .. })),
        "{case}: a single guard's release said {r:?}"
    );
    eprintln!("{case}: the late release of token {token} returned {r:?}");
    // The release's retries reached the server while `gb` held the lock.
    let c = h.client(fast_opts()).await;
    assert_excluded(case, &c, &name, &gb, Duration::from_millis(300), true).await;
    let info = c.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{case}: {info:?}");
    assert_eq!(info.holders[0].owner, gb.owner(), "{case}: {info:?}");
    assert_eq!(
        gb.release().await.expect("release"),
        ReleaseOutcome::Released,
        "{case}: a retried release freed the next holder's grant"
    );
}

#[derive(Debug, Clone, Copy)]
enum ReplyFault {
    /// The reply arrives after the operation timeout.
    Late,
    /// The reply is dropped, then the connection is reset.
    Lost,
    /// The connection is reset right after the request reached the server.
    Reset,
}

/// Arms `fault` on `proxy`, runs `op`, and clears the fault once the first reply has been
/// faulted, so the core's retry gets through.
async fn with_reply_fault<T>(
    proxy: &ProxyControl,
    fault: ReplyFault,
    op: impl std::future::Future<Output = T>,
) -> T {
    let before = proxy.stats();
    match fault {
        ReplyFault::Late => proxy.set_reply_delay(late()),
        ReplyFault::Lost => proxy.set_drop_replies(true),
        ReplyFault::Reset => proxy.reset_after_request_bytes(1),
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    // Clears the fault once it hit a reply (or the call ended without touching the faulted
    // node, e.g. a cluster client that talks to another member).
    let clear = async {
        loop {
            let s = proxy.stats();
            let hit = match fault {
                ReplyFault::Late | ReplyFault::Lost => {
                    s.replies.chunks_read > before.replies.chunks_read
                }
                ReplyFault::Reset => s.resets > before.resets,
            };
            if hit || done.load(std::sync::atomic::Ordering::SeqCst) {
                proxy.heal();
                if hit && matches!(fault, ReplyFault::Lost) {
                    // The reply was lost with its connection.
                    proxy.reset_all();
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let op = async {
        let r = op.await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    };
    let (r, ()) = tokio::join!(op, clear);
    r
}

/// A `try_acquire` or `acquire` whose reply is late, lost, or cut by a reset: the core retries
/// it, and the retried request has the effect of one. The lock holds one grant, and once the
/// single guard is released (or the failed call gave up) another owner takes it at once.
pub async fn retried_acquire_is_one<H: Harness>(h: &H) {
    let case = "retried_acquire_is_one";
    let b = h.client(fast_opts()).await;
    // Where the client talks to several nodes, the fault hits all of them, then only one.
    let nodes = match h.proxied_client(long_lease_opts()).await {
        Some((_, proxy)) => proxy.proxies().len(),
        None => return skip(case, NO_PROXY),
    };
    let focuses: Vec<Option<usize>> = if nodes > 1 {
        vec![None, Some(0)]
    } else {
        vec![None]
    };
    for (wait, focus) in [false, true]
        .into_iter()
        .flat_map(|w| focuses.iter().map(move |f| (w, *f)))
    {
        for fault in [ReplyFault::Late, ReplyFault::Lost, ReplyFault::Reset] {
            // A fresh client each time: no traffic of earlier rounds through its proxy.
            let Some((p, proxy)) = h.proxied_client(long_lease_opts()).await else {
                return skip(case, NO_PROXY);
            };
            // One node: one the client is connected to (a ZooKeeper or etcd client may talk
            // to a single member; faulting an idle one would test nothing).
            let focus = focus.map(|_| {
                proxy
                    .proxies()
                    .iter()
                    .position(|x| x.stats().connections > 0)
                    .unwrap_or(0)
            });
            proxy.focus(focus);
            let name = unique_name(if wait { "retrywait" } else { "retrytry" });
            let lock = p.lock(&name).expect("lock");
            let r = with_reply_fault(&proxy, fault, async {
                if wait {
                    lock.acquire_timeout(Duration::from_secs(10))
                        .await
                        .map(Some)
                } else {
                    lock.try_acquire().await
                }
            })
            .await;
            let what = format!("{case} (wait: {wait}, {fault:?}, node: {focus:?})");
            match r {
                Ok(Some(g)) => {
                    let info = b.inspect(&name).await.expect("inspect");
                    assert_eq!(info.holders.len(), 1, "{what}: {info:?}");
                    assert_eq!(info.holders[0].owner, lock.owner(), "{what}: {info:?}");
                    assert!(
                        info.holders[0].count <= 1,
                        "{what}: a retried acquire counted twice: {info:?}"
                    );
                    assert!(try_lock(&b, &name).await.is_none(), "{what}: not exclusive");
                    assert_eq!(
                        g.release().await.expect("release"),
                        ReleaseOutcome::Released,
                        "{what}"
                    );
                }
                Ok(None) => {
                    panic!("{what}: a try_acquire of a free lock found it held (by its own retry?)")
                }
                Err(e) => eprintln!("{what}: the faulted call failed ({e}); it must have given up"),
            }
            // Free right away: not held by a second grant of the retried request.
            drop(comes_free(&what, &b, &name).await);
        }
    }
}

/// Late replies on renewal. A watchdog tick (and an `extend`) whose reply is late but comes:
/// no loss. One whose confirmation never comes (requests lost, or only replies lost): the guard
/// learns it is lost before another owner can get the lock.
pub async fn late_reply_on_renew<H: Harness>(h: &H) {
    let case = "late_reply_on_renew";
    // A 3 s watchdog renews every second: a tick retried after a late reply is still
    // confirmed well inside the lease.
    let opts = fast_opts().watchdog_lease(Duration::from_secs(3));
    let Some((p, proxy)) = h.proxied_client(opts.clone()).await else {
        return skip(case, NO_PROXY);
    };
    let b = h.client(fast_opts()).await;
    let name = unique_name("laterenew");
    let g = p
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    for _ in 0..2 {
        let before = proxy.stats();
        proxy.set_reply_delay(late());
        wait_proxy("a renewal's reply", &proxy, |s| {
            s.replies.chunks_read > before.replies.chunks_read
        })
        .await;
        proxy.heal();
        // Let the next renewal (the retry, or the next tick) be confirmed before faulting
        // again: two faulted ticks in a row may rightly cost a lease renewed at a third of it.
        let healed = proxy.stats();
        let what = format!("{case}: a renewal after a late reply");
        poll_until(
            &what,
            async || (proxy.stats(), g.lost_signal().reason()),
            |(s, lost)| {
                assert!(
                    lost.is_none(),
                    "{case}: lost on a late renewal reply: {lost:?}, {s:?}"
                );
                s.replies.chunks_read > healed.replies.chunks_read
            },
        )
        .await;
        let read = proxy.stats().replies.chunks_read;
        wait_proxy("the renewal replies delivered", &proxy, |s| {
            s.replies.chunks_forwarded >= read
        })
        .await;
        assert!(!g.is_lost(), "{case}: lost on a late renewal reply");
    }
    assert_excluded(case, &b, &name, &g, Duration::from_millis(1500), true).await;

    // extend with a late reply: retried, confirmed.
    let before = proxy.stats();
    proxy.set_reply_delay(late());
    let (r, ()) = tokio::join!(g.extend(Duration::from_secs(6)), async {
        wait_proxy("an extend's reply", &proxy, |s| {
            s.replies.chunks_read > before.replies.chunks_read
        })
        .await;
        proxy.heal();
    });
    let confirmed = r.is_ok();
    match r {
        Ok(()) => assert!(!g.is_lost(), "{case}: lost after a confirmed extend"),
        Err(e) => eprintln!("{case}: the late extend failed ({e})"),
    }
    assert_excluded(case, &b, &name, &g, Duration::from_millis(500), confirmed).await;
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );

    if !h.caps().lease_expiry {
        return skip(
            &format!("{case} (unconfirmed renewals)"),
            "locks of this backend do not end with a lease",
        );
    }
    // Renewals never confirmed: requests lost (blackhole), or executed with replies lost.
    for requests_lost in [true, false] {
        let Some((p, proxy)) = h.proxied_client(fast_opts()).await else {
            return skip(case, NO_PROXY);
        };
        let name = unique_name("unconfirmed");
        let g = p
            .lock(&name)
            .expect("lock")
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("acquire");
        if requests_lost {
            proxy.set_blackhole(true);
        } else {
            proxy.set_drop_replies(true);
        }
        let what = format!("{case} (requests lost: {requests_lost})");
        let taken = taken_only_after_loss(&what, &b, &name, &g, Duration::from_secs(20)).await;
        proxy.heal();
        drop(taken);
        drop(g);
    }

    // extend never confirmed, on a fixed lease.
    for requests_lost in [true, false] {
        let Some((p, proxy)) = h.proxied_client(fast_opts()).await else {
            return skip(case, NO_PROXY);
        };
        let name = unique_name("unconfext");
        let g = p
            .lock(&name)
            .expect("lock")
            .lease(Duration::from_millis(1500))
            .expect("lease")
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("acquire");
        if requests_lost {
            proxy.set_blackhole(true);
        } else {
            proxy.set_drop_replies(true);
        }
        let r = g.extend(Duration::from_secs(4)).await;
        assert!(r.is_err(), "{case}: an extend nobody answered succeeded");
        let what = format!("{case} (extend, requests lost: {requests_lost})");
        let taken = taken_only_after_loss(&what, &b, &name, &g, Duration::from_secs(20)).await;
        proxy.heal();
        drop(taken);
        drop(g);
    }
}

/// `extend(lease / 10)` on a watchdog guard never shortens its lease: for more than two
/// watchdog leases, while the guard lives and is not lost, nobody else gets the lock.
pub async fn extend_shorter_than_watchdog<H: Harness>(h: &H) {
    let case = "extend_shorter_than_watchdog";
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let name = unique_name("shortext");
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    let lease = fast_opts().get_watchdog_lease();
    g.extend(lease / 10).await.expect("extend");
    assert_excluded(case, &b, &name, &g, lease * 2 + lease / 2, true).await;
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A fixed-lease guard and a watchdog guard of one hold (the same lock, `.lease(long)` and the
/// default), dropped in both orders: while either lives, no other owner gets in, and the
/// remaining guard's `is_lost()` is truthful (not lost ⇒ the other owner is refused).
pub async fn fixed_and_watchdog_guards<H: Harness>(h: &H) {
    let case = "fixed_and_watchdog_guards";
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let long = Duration::from_secs(3);
    for watchdog_first in [true, false] {
        for fixed_first in [true, false] {
            let what = format!("{case} (fixed taken first: {fixed_first}, watchdog dropped first: {watchdog_first})");
            let name = unique_name("mixed");
            let lock = a.lock(&name).expect("lock");
            let fixed = lock.clone().lease(long).expect("lease");
            let (gw, gf) = if fixed_first {
                let gf = fixed
                    .acquire_timeout(Duration::from_secs(5))
                    .await
                    .expect("fixed");
                let gw = lock.try_acquire().await.expect("try").expect("re-entry");
                (gw, gf)
            } else {
                let gw = lock
                    .acquire_timeout(Duration::from_secs(5))
                    .await
                    .expect("watchdog");
                let gf = fixed.try_acquire().await.expect("try").expect("re-entry");
                (gw, gf)
            };
            assert!(gw.is_watchdog() && !gf.is_watchdog());
            assert_excluded(&what, &b, &name, &gf, Duration::from_millis(300), true).await;
            if watchdog_first {
                drop(gw);
                // The fixed guard's lease runs `long` from its grant or re-entry: it holds
                // until then, and the lock frees itself after (where leases end).
                assert_excluded(&what, &b, &name, &gf, long / 2, true).await;
                if h.caps().lease_expiry {
                    let taken =
                        taken_only_after_loss(&what, &b, &name, &gf, long + EVENTUALLY).await;
                    drop(taken);
                }
                drop(gf);
            } else {
                drop(gf);
                // The watchdog guard keeps renewing beyond the fixed lease.
                assert_excluded(&what, &b, &name, &gw, long + Duration::from_secs(1), true).await;
                assert_eq!(
                    gw.release().await.expect("release"),
                    ReleaseOutcome::Released,
                    "{what}"
                );
            }
            drop(comes_free(&what, &b, &name).await);
        }
    }
}

/// Two waiters of one owner (clones of one `Lock` in one client, or `with_owner(same)` in two
/// clients) queue behind a holder, with a third owner contending; one of the two is cancelled,
/// or runs out of time, while the handoff may be on its way to it or its sibling. Nobody is
/// inside the critical section while another holder believes it holds the lock.
pub async fn sibling_waiters_handoff<H: Harness>(h: &H) {
    let case = "sibling_waiters_handoff";
    let holder = h.client(fast_opts()).await;
    let p = h.client(fast_opts()).await;
    let q = h.client(fast_opts()).await;
    let c = h.client(fast_opts()).await;
    let rec = Arc::new(OverlapRecorder::new());
    let offsets = [0u64, 1, 2, 5, 10, 20];
    for (round, &offset) in offsets.iter().enumerate() {
        for same_client in [true, false] {
            let by_deadline = round % 2 == 1;
            let name = unique_name("siblings");
            let reg = Arc::new(FencedRegister::new());
            let gh = holder
                .lock(&name)
                .expect("lock")
                .acquire_timeout(Duration::from_secs(5))
                .await
                .expect("holder");
            let lock1 = p.lock(&name).expect("lock");
            let (lock2, label2) = if same_client {
                (lock1.clone(), "p")
            } else {
                (
                    q.lock(&name)
                        .expect("lock")
                        .with_owner(lock1.owner())
                        .expect("owner"),
                    "q",
                )
            };
            let spawn_section = |lock: distlock_core::Lock, label: &'static str| {
                let (rec, reg, lock_client) = (rec.clone(), reg.clone(), holder.clone());
                tokio::spawn(async move {
                    let name = lock.name().to_owned();
                    let g = match lock.acquire_timeout(Duration::from_secs(30)).await {
                        Ok(g) => g,
                        Err(e) => {
                            let info = lock_client.inspect(&name).await;
                            panic!("{label}: a waiter that never gives up: {e}; the lock: {info:?}")
                        }
                    };
                    section(&rec, &reg, &g, label, Duration::from_millis(20)).await;
                    drop(g);
                })
            };
            let w1 = spawn_section(lock1, "p");
            let third = spawn_section(c.lock(&name).expect("lock"), "c");
            // The sibling waits until it is cancelled, or until its deadline, set to fall
            // `offset` ms after the holder's release starts.
            let cancel = Arc::new(tokio::sync::Notify::new());
            let queued_for = Duration::from_millis(800);
            let wait2 = if by_deadline {
                queued_for + Duration::from_millis(offset)
            } else {
                Duration::from_secs(30)
            };
            let started = Instant::now();
            let w2 = {
                let (rec, reg, cancel) = (rec.clone(), reg.clone(), cancel.clone());
                tokio::spawn(async move {
                    let g = tokio::select! {
                        g = lock2.acquire_timeout(wait2) => g,
                        _ = cancel.notified() => return,
                    };
                    if let Ok(g) = g {
                        section(&rec, &reg, &g, label2, Duration::from_millis(20)).await;
                    }
                })
            };
            settle_waiters(&holder, &name, LockKind::Mutex, 3, queued_for / 2).await;
            tokio::time::sleep_until((started + queued_for).into()).await;
            let release = tokio::spawn(gh.release());
            if !by_deadline {
                tokio::time::sleep(Duration::from_millis(offset)).await;
                cancel.notify_one();
            }
            release.await.expect("join").expect("release");
            for t in [w1, third, w2] {
                t.await.expect("task");
            }
            reg.assert_no_rejected_belief();
            drop(comes_free(case, &holder, &name).await);
        }
    }
    rec.assert_no_overlap();
}

/// Read and write waiters of one `RwLock` handle behind another owner's writer: the read grant
/// (which may be granted beside our own write grant) must not make our write waiter believe it
/// holds the write side. While our writer holds, a third owner can neither read nor write.
pub async fn rw_sibling_waiters<H: Harness>(h: &H) {
    let case = "rw_sibling_waiters";
    let a = h.client(fast_opts()).await;
    let p = h.client(fast_opts()).await;
    let t = h.client(fast_opts()).await;
    for read_first in [true, false] {
        let name = unique_name("rwsiblings");
        let w = match a.rw_lock(&name).expect("rw").write().try_acquire().await {
            Ok(w) => w.expect("free"),
            Err(e) if e.is_unsupported() => return skip(case, &format!("{e}")),
            Err(e) => panic!("{case}: {e:?}"),
        };
        let rw = p.rw_lock(&name).expect("rw");
        let (read, write) = (rw.read(), rw.write());
        let spawn_read = || {
            let read = read.clone();
            tokio::spawn(async move {
                let g = read.acquire_timeout(Duration::from_secs(20)).await;
                // Hold the read side a moment, then let it go so the writer can get in.
                tokio::time::sleep(Duration::from_millis(300)).await;
                g.map(drop)
            })
        };
        let spawn_write = || {
            let write = write.clone();
            tokio::spawn(async move { write.acquire_timeout(Duration::from_secs(20)).await })
        };
        let (rt, wt) = if read_first {
            let r = spawn_read();
            settle_waiters(&a, &name, LockKind::Read, 1, Duration::from_secs(2)).await;
            (r, spawn_write())
        } else {
            let w = spawn_write();
            settle_waiters(&a, &name, LockKind::Write, 1, Duration::from_secs(2)).await;
            (spawn_read(), w)
        };
        settle_waiters(&a, &name, LockKind::Write, 2, Duration::from_secs(2)).await;
        assert_eq!(
            w.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        let what = format!("{case} (read waiter first: {read_first})");
        let wr = wt.await.expect("join");
        eprintln!(
            "{what}: the write waiter got {:?}",
            wr.as_ref().map(|g| g.fencing_token())
        );
        match wr {
            Ok(gw) => {
                let other = t.rw_lock(&name).expect("rw");
                for _ in 0..5 {
                    let r = other.read().try_acquire().await.expect("try read");
                    let lost = gw.is_lost();
                    assert!(
                        r.is_none() || lost,
                        "{what}: a third owner read while our writer (token {}) believed it held the write side",
                        gw.fencing_token()
                    );
                    let w2 = other.write().try_acquire().await.expect("try write");
                    assert!(
                        w2.is_none() || gw.is_lost(),
                        "{what}: a third owner wrote while our writer believed it held the write side"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drop(gw);
            }
            Err(e) => assert!(
                matches!(e, Error::InvalidArgument(_)) || e.is_timeout(),
                "{what}: {e:?}"
            ),
        }
        rt.await.expect("join").expect("read side");
        let free = t.rw_lock(&name).expect("rw").write();
        let t0 = Instant::now();
        loop {
            if let Some(g) = free.try_acquire().await.expect("try") {
                drop(g);
                break;
            }
            if t0.elapsed() >= EVENTUALLY {
                let r = t.inspect_kind(&name, LockKind::Read).await;
                let w = t.inspect_kind(&name, LockKind::Write).await;
                panic!("{what}: the rw lock never came free: read side {r:?}, write side {w:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `acquire` dropped at each of its awaits (timeouts of 0 to 50 ms, and a `select!` racing the
/// holder's release) while another owner releases: afterwards the lock is free, or held by a
/// live guard, never by nobody's guard: a third owner gets it long before the cancelled
/// waiter's 20 s lease could end.
pub async fn cancel_at_every_await<H: Harness>(h: &H) {
    let case = "cancel_at_every_await";
    let a = h.client(fast_opts()).await;
    let p = h.client(long_lease_opts()).await;
    let c = h.client(fast_opts()).await;
    let mut steps: Vec<Option<u64>> = [0u64, 1, 2, 5, 10, 20, 50].into_iter().map(Some).collect();
    steps.push(None);
    for step in steps {
        let name = unique_name("cancelawait");
        let what = format!("{case} (timeout {step:?} ms; None: select! with the release)");
        let gh = a
            .lock(&name)
            .expect("lock")
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("holder");
        let lock = p.lock(&name).expect("lock");
        let got = match step {
            Some(ms) => {
                let release = tokio::spawn(gh.release());
                let r = tokio::time::timeout(Duration::from_millis(ms), lock.acquire()).await;
                release.await.expect("join").expect("release");
                r.ok().map(|g| g.expect("acquire"))
            }
            None => {
                let release = gh.release();
                tokio::pin!(release);
                tokio::select! {
                    g = lock.acquire() => {
                        let g = g.expect("acquire");
                        release.await.expect("release");
                        Some(g)
                    }
                    r = &mut release => {
                        r.expect("release");
                        None
                    }
                }
            }
        };
        if let Some(g) = got {
            // It won: a live guard, exclusive.
            assert!(try_lock(&c, &name).await.is_none(), "{what}: not exclusive");
            drop(g);
        }
        drop(comes_free(&what, &c, &name).await);
        poll_until(&what, async || p.held_count(), |n| *n == 0).await;
    }
}

/// Semaphore edge cases: a request above the limit is `InvalidArgument`; a client that
/// believes in a larger limit than the semaphore has does not get permits beyond it; after
/// `set_permits` lowers the limit below a queued demand, smaller requests that fit still get
/// permits.
pub async fn semaphore_edges<H: Harness>(h: &H) {
    let case = "semaphore_edges";
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let name = unique_name("semedge");
    let sem = a.semaphore(&name, 2).expect("sem");
    let g1 = match sem.try_acquire(1).await {
        Ok(g) => g.expect("permit"),
        Err(e) if e.is_unsupported() => return skip(case, &format!("{e}")),
        Err(e) => panic!("{case}: {e:?}"),
    };
    let e = sem.try_acquire(3).await.expect_err("above the limit");
    assert!(matches!(e, Error::InvalidArgument(_)), "{case}: {e:?}");
    let g2 = sem.try_acquire(1).await.expect("try").expect("permit");
    // The semaphore has the 2 permits of its first use; a client that says 5 gets none now.
    let big = b.semaphore(&name, 5).expect("sem");
    match big.try_acquire(1).await {
        Ok(None) => {}
        Ok(Some(g)) => panic!(
            "{case}: a third permit of a 2-permit semaphore to a client that said 5 (token {})",
            g.fencing_token()
        ),
        Err(e) => assert!(matches!(e, Error::InvalidArgument(_)), "{case}: {e:?}"),
    }
    let info = b
        .inspect_kind(
            &name,
            LockKind::Semaphore {
                permits: 1,
                limit: 5,
            },
        )
        .await
        .expect("inspect");
    assert_eq!(info.permits_in_use(), 2, "{case}: {info:?}");
    drop(g1);
    drop(g2);

    // set_permits below queued demand.
    let name = unique_name("semshrink");
    let mut sem = a.semaphore(&name, 4).expect("sem");
    let h1 = sem.try_acquire(1).await.expect("try").expect("permit");
    let h2 = sem.try_acquire(1).await.expect("try").expect("permit");
    let big_wait = {
        let s = b.semaphore(&name, 4).expect("sem");
        tokio::spawn(async move { s.acquire_timeout(3, Duration::from_secs(3)).await })
    };
    settle_waiters(
        &a,
        &name,
        LockKind::Semaphore {
            permits: 3,
            limit: 4,
        },
        1,
        Duration::from_secs(2),
    )
    .await;
    sem.set_permits(2).await.expect("set_permits");
    let small_wait = {
        let s = b.semaphore(&name, 2).expect("sem");
        tokio::spawn(async move { s.acquire_timeout(1, Duration::from_secs(15)).await })
    };
    settle_waiters(
        &a,
        &name,
        LockKind::Semaphore {
            permits: 1,
            limit: 2,
        },
        2,
        Duration::from_secs(2),
    )
    .await;
    drop(h1);
    let small = small_wait.await.expect("join").unwrap_or_else(|e| {
        panic!("{case}: a request that fits waited behind one that cannot: {e}")
    });
    let big = big_wait.await.expect("join");
    assert!(
        big.is_err(),
        "{case}: 3 permits granted of a semaphore lowered to 2"
    );
    drop(small);
    drop(h2);
}

/// The lock service loses its data (`FLUSHALL` where the harness can, else the lock's state is
/// deleted): fencing tokens still increase, and the old holder learns it lost the lock.
pub async fn data_loss_tokens_increase<H: Harness>(h: &H) {
    let case = "data_loss_tokens_increase";
    let a = h.client(fast_opts()).await;
    let b = h.client(fast_opts()).await;
    let name = unique_name("dataloss");
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    let t1 = g.fencing_token();
    let how = if h.lose_data().await {
        "lose_data"
    } else if h.caps().break_lock {
        h.break_lock(&name).await;
        "break_lock"
    } else {
        return skip(case, "the harness can neither lose data nor break locks");
    };
    let g2 = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(EVENTUALLY)
        .await
        .expect("acquire after the loss");
    let t2 = g2.fencing_token();
    assert!(
        t2 > t1,
        "{case} ({how}): token {t2} after {t1}: fencing tokens went back after data loss"
    );
    let reg = FencedRegister::new();
    reg.write(t2, "b", !g2.is_lost());
    // The old holder's write is refused; it learns at its next renewal that it lost the lock.
    reg.write(t1, "a", false);
    let reason = tokio::time::timeout(EVENTUALLY, g.lost())
        .await
        .unwrap_or_else(|_| {
            panic!("{case} ({how}): the old holder never learned it lost the lock")
        });
    eprintln!("{case} ({how}): tokens {t1} -> {t2}, old holder lost: {reason:?}");
    drop(g);
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// 3 clients × 4 tasks take one lock with short leases (a 1 s watchdog, and fixed 400 ms
/// leases on every other round), through proxies that inject random small delays; every
/// critical section writes to a fenced register. No two believed holders overlap, and no write
/// of a holder that believed it held the lock is refused.
pub async fn contended_soak<H: Harness>(h: &H) {
    let case = "contended_soak";
    let name = unique_name("soak");
    let rec = Arc::new(OverlapRecorder::new());
    let reg = Arc::new(FencedRegister::new());
    let mut proxies = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        match h.proxied_client(fast_opts()).await {
            Some((c, p)) => {
                clients.push(c);
                proxies.push(p);
            }
            None => clients.push(h.client(fast_opts()).await),
        }
    }
    if proxies.is_empty() {
        skip(
            &format!("{case} (delays)"),
            "no proxied client: soaking without network delays",
        );
    }
    let proxies = Arc::new(proxies);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let jitter = {
        let (proxies, stop) = (proxies.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for p in proxies.iter() {
                    p.set_delay(Duration::from_millis(rand_below(15)));
                }
                tokio::time::sleep(Duration::from_millis(10 + rand_below(50))).await;
            }
            for p in proxies.iter() {
                p.heal();
            }
        })
    };
    let mut tasks = Vec::new();
    let granted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for (ci, c) in clients.iter().enumerate() {
        for ti in 0..4 {
            let (c, name, rec, reg, granted) = (
                c.clone(),
                name.clone(),
                rec.clone(),
                reg.clone(),
                granted.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let me = format!("client{ci}/task{ti}");
                let lock = c.lock(&name).expect("lock");
                for round in 0..4 {
                    let lock = if round % 2 == 1 {
                        lock.clone()
                            .lease(Duration::from_millis(400))
                            .expect("lease")
                    } else {
                        lock.clone()
                    };
                    let g = match lock.acquire_timeout(Duration::from_secs(60)).await {
                        Ok(g) => g,
                        // A faulted connection may fail an attempt; the invariants are about
                        // those who got in.
                        Err(e) if e.is_connection() => continue,
                        Err(e) => panic!("{me}: {e:?}"),
                    };
                    granted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    section(&rec, &reg, &g, &me, Duration::from_millis(rand_below(5))).await;
                    let _ = g.release().await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    jitter.await.expect("jitter");
    let n = granted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(n >= 24, "{case}: only {n} of 48 acquisitions succeeded");
    rec.assert_no_overlap();
    reg.assert_no_rejected_belief();
    eprintln!(
        "{case}: {n} critical sections, {} fenced writes, {} rejected (from holders that knew they had lost)",
        reg.writes().len(),
        reg.rejected().len()
    );
}
