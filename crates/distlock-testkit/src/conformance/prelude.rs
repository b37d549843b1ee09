//! What every case file uses: the common imports, the bounds and the small helpers.

pub(crate) use super::harness::Harness;
pub(crate) use crate::{FencedRegister, OverlapRecorder, ProxyControl};
pub(crate) use distlock_core::{
    AcquireReply, AcquireRequest, AttemptId, Client, ClientOptions, Error, GrantRef, HoldKey,
    LockGuard, LockKind, LostReason, LostSignal, ReleaseOutcome, RenewOutcome,
};
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::{Duration, Instant};

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

/// Tries `f`; if the backend answers `Unsupported`, checks the error is the typed one and
/// returns `None` (the case is skipped, saying so).
pub(crate) async fn supported<T>(case: &str, r: distlock_core::Result<T>) -> Option<T> {
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

pub(crate) fn crashed_kind() -> LockKind {
    LockKind::Semaphore {
        permits: 1,
        limit: 3,
    }
}

/// Two independent clients with the same options.
pub(crate) async fn pair<H: Harness>(h: &H, opts: ClientOptions) -> (Client, Client) {
    (h.client(opts.clone()).await, h.client(opts).await)
}

/// `acquire()` of `name` on `c`.
pub(crate) async fn acquired(c: &Client, name: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire")
}

/// `acquire_timeout(5 s)` of `name` on `c`.
pub(crate) async fn hold(c: &Client, name: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire")
}

/// `try_acquire()` of `name` on `c`: `None` while another owner holds it.
pub(crate) async fn try_lock(c: &Client, name: &str) -> Option<LockGuard> {
    c.lock(name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try_acquire")
}

/// Releases `g` and checks that this freed the lock.
pub(crate) async fn assert_released(g: LockGuard) {
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// `guards` are watchdog holds of one client (renewed in one batch) with watchdog lease
/// `lease`, and the renewal of `guards[bad]` now fails on the server (its key's data
/// overwritten, say): every other guard's lease is confirmed on through two more leases and
/// none of them is lost, while `guards[bad]` is lost at its lease end, not refused (its
/// renewal was neither confirmed nor refused). Fails with the guards' state if not.
pub async fn others_renew_while_one_fails(guards: &[LockGuard], bad: usize, lease: Duration) {
    let from = distlock_core::clock::Instant::now();
    let others = || guards.iter().enumerate().filter(move |(i, _)| *i != bad);
    let state = poll_until(
        "the other holds of the batch renewed through two leases: (name, lost, lease deadline past)",
        async || {
            others()
                .map(|(_, g)| {
                    let past = g.lease_deadline() > from + lease * 2;
                    (g.name().to_owned(), g.lost_signal().reason(), past)
                })
                .collect::<Vec<_>>()
        },
        |s| s.iter().all(|(_, lost, past)| lost.is_none() && *past),
    )
    .await;
    assert!(state.iter().all(|(_, lost, _)| lost.is_none()), "{state:?}");
    let reason = tokio::time::timeout(EVENTUALLY, guards[bad].lost())
        .await
        .expect("the hold whose renewal fails was never lost");
    assert_eq!(reason, LostReason::LeaseExpired);
    for (i, g) in others() {
        assert!(
            !g.is_lost(),
            "guard {i} lost: {:?}",
            g.lost_signal().reason()
        );
    }
}
