//! Late requests of ended attempts: a request still on its way after its attempt ended (it
//! was answered "held", its wait ran out, or its grant was released) must not grant the lock
//! to that attempt, nor queue it for a handoff: nobody waits for it any more, and the lock
//! would be held by nobody for a whole lease.
//!
//! The proxy holds the attempt's request ([`ProxyControl::hold_next_request_with`], the next
//! request naming the lock) past the operation timeout; the client moves to a fresh
//! connection and goes on there (its retry is answered, the attempt ends); then the held
//! request is let through, and once the server answered it, a third client must get the lock
//! at once — not after a lease. Expanded by [`late_request_suite!`](crate::late_request_suite)
//! (kept apart from [`adversarial_suite!`](crate::adversarial_suite) until every backend
//! keeps a record of ended attempts).

use super::*;

/// When the held request reaches the server: while the lock is still held by another owner
/// (it could queue the ended attempt, and the release hand the lock to it), or after that
/// owner released it (it could grant the lock to the ended attempt).
#[derive(Debug, Clone, Copy)]
enum Late {
    WhileHeld,
    AfterRelease,
}

/// Whether the hold caught a request of the faulted call; if not, the case says so and is
/// weaker for this run (nothing is held any more).
fn caught(case: &str, proxy: &ProxyControl) -> bool {
    if proxy.held_connections() > 0 {
        return true;
    }
    proxy.release_held();
    skip(
        case,
        "no request naming the lock went through the proxy (nothing was held)",
    );
    false
}

/// Lets the held requests through and waits until the server answered them (it ran the late
/// request); if it never does, the case goes on, weaker for this run.
async fn deliver_late(case: &str, proxy: &ProxyControl) {
    proxy.release_held();
    let t = Instant::now();
    while !proxy.held_requests_answered() {
        if t.elapsed() > EVENTUALLY {
            eprintln!("{case}: the held requests were not answered within {EVENTUALLY:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The holder is gone and the late request ran: `name` must be free for `other` now, on its
/// first try (a grant or a queue place left to the ended attempt would keep it for a lease).
async fn free_at_once(case: &str, other: &Client, name: &str) -> Result<(), String> {
    match try_lock(other, name).await {
        Some(g) => {
            assert_released(g).await;
            Ok(())
        }
        None => {
            let info = other.inspect(name).await;
            Err(format!(
                "{case}: `{name}` is not free after its holder released it and a late request of \
                 an ended attempt arrived (the ended attempt was granted or queued): {info:?}"
            ))
        }
    }
}

/// Fails with every message of `results` that is an error.
fn all_ok(results: &[Result<(), String>]) {
    let failed: Vec<&str> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(String::as_str))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A `try_acquire` whose first request is held past the operation timeout: its retry, on a
/// fresh connection, is answered "held"; the holder releases; then the first request arrives.
pub async fn late_request_of_a_try<H: Harness>(h: &H) {
    let case = "late_request_of_a_try";
    let Some((a, proxy)) = h.proxied_client(long_lease_opts()).await else {
        return skip(case, NO_PROXY);
    };
    let (b, c) = pair(h, long_lease_opts()).await;
    let name = unique_name("latetry");
    let held = hold(&b, &name).await;
    proxy.hold_next_request_with(name.as_bytes());
    let r = a.lock(&name).expect("lock").try_acquire().await;
    if !caught(case, &proxy) {
        return;
    }
    match r {
        Ok(Some(g)) => panic!(
            "{case}: a try got `{name}` (token {}) while another owner held it",
            g.fencing_token()
        ),
        Ok(None) => {}
        Err(e) => eprintln!("{case}: the try failed ({e}); it gave its attempt up"),
    }
    assert_released(held).await;
    deliver_late(case, &proxy).await;
    all_ok(&[free_at_once(case, &c, &name).await]);
}

/// A `try_acquire` of a free lock whose first request is held: its retry on a fresh
/// connection gets the lock, the guard is released, then the first request arrives. A late
/// duplicate of a released attempt must not grant it again.
pub async fn late_request_of_a_released_attempt<H: Harness>(h: &H) {
    let case = "late_request_of_a_released_attempt";
    let Some((a, proxy)) = h.proxied_client(long_lease_opts()).await else {
        return skip(case, NO_PROXY);
    };
    let c = h.client(long_lease_opts()).await;
    let name = unique_name("laterel");
    proxy.hold_next_request_with(name.as_bytes());
    let r = a.lock(&name).expect("lock").try_acquire().await;
    if !caught(case, &proxy) {
        return;
    }
    match r {
        Ok(Some(g)) => assert_released(g).await,
        Ok(None) => panic!("{case}: a try of the free lock `{name}` found it held"),
        Err(e) => eprintln!("{case}: the try failed ({e}); it gave its attempt up"),
    }
    deliver_late(case, &proxy).await;
    all_ok(&[free_at_once(case, &c, &name).await]);
}

/// One wait that ends without the lock while a request of it is held, the late request let
/// through `late`, the third client's try. `queued_first`: the held request is one of a
/// waiter already queued (a heartbeat's), not the wait's first.
async fn late_wait<H: Harness>(
    h: &H,
    case: &str,
    late: Late,
    queued_first: bool,
) -> Result<(), String> {
    let Some((a, proxy)) = h.proxied_client(long_lease_opts()).await else {
        skip(case, NO_PROXY);
        return Ok(());
    };
    let (b, c) = pair(h, long_lease_opts()).await;
    let name = unique_name("latewait");
    let held = hold(&b, &name).await;
    let lock = a.lock(&name).expect("lock");
    let wait = if queued_first {
        let wait = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(6)).await });
        wait_for_waiters(&c, &name, LockKind::Mutex, 1).await;
        proxy.hold_next_request_with(name.as_bytes());
        let t = Instant::now();
        // The waiter's next request (its heartbeat) comes within a second or two.
        while proxy.held_connections() == 0 && t.elapsed() < EVENTUALLY {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        wait.await.expect("join")
    } else {
        proxy.hold_next_request_with(name.as_bytes());
        lock.acquire_timeout(Duration::from_secs(3)).await
    };
    if !caught(case, &proxy) {
        return Ok(());
    }
    match wait {
        Ok(g) => panic!(
            "{case}: a wait got `{name}` (token {}) while another owner held it",
            g.fencing_token()
        ),
        Err(e) => eprintln!("{case} ({late:?}): the wait ended without the lock ({e})"),
    }
    match late {
        Late::WhileHeld => {
            deliver_late(case, &proxy).await;
            assert_released(held).await;
        }
        Late::AfterRelease => {
            assert_released(held).await;
            deliver_late(case, &proxy).await;
        }
    }
    free_at_once(&format!("{case} ({late:?})"), &c, &name).await
}

/// An `acquire_timeout` whose first request is held past the operation timeout: it goes on
/// over a fresh connection, waits, and gives up at its deadline; the held request arrives
/// while the lock is still held (and may queue the ended attempt) or after the release (and
/// may be granted).
pub async fn late_request_of_a_wait<H: Harness>(h: &H) {
    let case = "late_request_of_a_wait";
    let (a, b) = tokio::join!(
        late_wait(h, case, Late::WhileHeld, false),
        late_wait(h, case, Late::AfterRelease, false)
    );
    all_ok(&[a, b]);
}

/// As [`late_request_of_a_wait`], with the request of a waiter that is queued already held
/// (a heartbeat): a late one must not put the ended attempt back in the queue.
pub async fn late_request_of_a_queued_waiter<H: Harness>(h: &H) {
    let case = "late_request_of_a_queued_waiter";
    let (a, b) = tokio::join!(
        late_wait(h, case, Late::WhileHeld, true),
        late_wait(h, case, Late::AfterRelease, true)
    );
    all_ok(&[a, b]);
}

/// Expands to one `#[tokio::test]` per late-request case of
/// [`adversarial`](crate::conformance::adversarial) (`late_request_of_*`), each calling `$make`
/// for a harness.
///
/// ```ignore
/// distlock_testkit::late_request_suite!(MyHarness::start());
/// ```
#[macro_export]
macro_rules! late_request_suite {
    ($make:expr) => {
        $crate::adversarial_suite!(@cases $make;
            late_request_of_a_try, late_request_of_a_released_attempt, late_request_of_a_wait,
            late_request_of_a_queued_waiter);
    };
}
