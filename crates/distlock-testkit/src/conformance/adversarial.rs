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

mod ended;
mod holds;
mod replies;
mod stress;

pub use ended::*;
pub use holds::*;
pub use replies::*;
pub use stress::*;

use super::prelude::*;

/// A small random number below `n` (xorshift; the testkit needs no crate for jitter).
pub(super) fn rand_below(n: u64) -> u64 {
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

pub(super) const NO_PROXY: &str = "the harness has no proxied client (no network to fault)";

/// The operation timeout of [`fast_opts`].
pub(super) fn op_timeout() -> Duration {
    fast_opts().get_op_timeout()
}

/// A reply delay past the operation timeout: the client gives the request up and retries it
/// while the request has already executed on the server.
pub(super) fn late() -> Duration {
    op_timeout() + Duration::from_millis(300)
}

/// A watchdog lease long enough that seconds of faults do not cost a holder its lock, and that
/// a grant leaked by a faulted request would block others far longer than any bound below.
pub(super) fn long_lease_opts() -> ClientOptions {
    fast_opts().watchdog_lease(Duration::from_secs(20))
}

/// Polls until `probe` of the proxies is true (a request reached the server, a reply was read).
pub(super) async fn wait_proxy(
    what: &str,
    proxy: &ProxyControl,
    done: impl Fn(&crate::ProxyStats) -> bool,
) {
    poll_until(what, async || proxy.stats(), done).await;
}

/// Checks for `period` that `other` cannot take `name` while `g` believes it holds it, and that
/// `g` is not lost (when `must_hold`).
pub(super) async fn assert_excluded(
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
pub(super) async fn taken_only_after_loss(
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
pub(super) async fn comes_free(case: &str, other: &Client, name: &str) -> LockGuard {
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
pub(super) async fn settle_waiters(
    c: &Client,
    name: &str,
    kind: LockKind,
    n: u32,
    within: Duration,
) {
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
pub(super) async fn section(
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

#[derive(Debug, Clone, Copy)]
pub(super) enum ReplyFault {
    /// The reply arrives after the operation timeout.
    Late,
    /// The reply is dropped, then the connection is reset.
    Lost,
    /// The connection is reset right after the request reached the server.
    Reset,
}

/// Arms `fault` on `proxy`, runs `op`, and clears the fault once the first reply has been
/// faulted, so the core's retry gets through.
pub(super) async fn with_reply_fault<T>(
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
