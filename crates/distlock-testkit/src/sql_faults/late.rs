//! Late requests of attempts that already ended: the first request of an attempt is held in
//! a proxy past the client's operation timeout, the client moves on (a retry on a fresh
//! connection, a give-up, a release), and the held copy reaches the server only afterwards.
//! It must not grant the lock to the attempt nobody waits for any more.

use super::{SqlMode, SqlServer};
use crate::conformance::{fast_opts, unique_name, EVENTUALLY};
use crate::grant::{try_grant, wait_grant};
use crate::DelayProxy;
use distlock_core::{Backend, Client, LockKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the attempt whose first request is held ends before that request reaches the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// A try: its retry (on a fresh connection) is answered "held", the core gives it up.
    Try,
    /// A wait: it runs out while another client holds, and gives up.
    Wait,
    /// A try whose retry is granted; it then releases, and another client takes the lock
    /// and releases it too.
    Released,
}

/// Waits (at most [`EVENTUALLY`]) until `probe` is true.
async fn until(what: &str, probe: impl Fn() -> bool) {
    let t = Instant::now();
    while !probe() {
        assert!(t.elapsed() < EVENTUALLY, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The first request of an attempt of client A (through a proxy, URL parameters `extra`
/// added to the mode's) is held in the proxy past the client's operation timeout; the attempt
/// ends as `ended` says; then the holder (if any) releases and the held request reaches the
/// server. A third client must get the lock at once (`at_once`), or, where a grant lives on
/// the connection that carried the request (session modes: the client closed that connection
/// or queued the attempt's give-up behind the late request on it), within a few seconds —
/// far less than the 60 s lease a late grant would keep: the late request of the ended
/// attempt granted nothing that outlives its connection. (Before lease and table modes kept a
/// record of ended attempts, it granted the lock to that attempt, which nobody would release:
/// the lock was held by nobody for a lease.)
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is a whole test.
pub async fn late_request_of_an_ended_attempt<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    extra: &str,
    kind: LockKind,
    ended: Ended,
    at_once: bool,
) {
    let name = unique_name("late-ended");
    // A long lease: nothing here is explained by a lease running out, and no renewal runs.
    let opts = fast_opts()
        .watchdog_lease(Duration::from_secs(60))
        .op_timeout(Duration::from_millis(500));
    let holder = mode.client_with(opts.clone()).await;
    let third = mode.client_with(opts.clone()).await;
    let proxy = DelayProxy::start(mode.server.addr(), Duration::ZERO).expect("proxy");
    let url = format!("{}{extra}", mode.url()).replace(
        &format!("127.0.0.1:{}", mode.server.addr().port()),
        &proxy.addr().to_string(),
    );
    let backend = (mode.connect)(url, opts.clone())
        .await
        .expect("connect through the proxy");
    let a = Client::new(Arc::new(backend), opts).expect("client");
    // A connection of A's is open and idle (pooled), so the held request is a lock request,
    // not a connection's handshake.
    let warm = unique_name("late-warm");
    if let Some(g) = try_grant(&a, &warm, kind).await.expect("warm up") {
        g.release().await;
    }
    let held = match ended {
        Ended::Released => None,
        _ => Some(
            try_grant(&holder, &name, kind)
                .await
                .expect("try")
                .expect("free"),
        ),
    };
    proxy.hold_next_request();
    match ended {
        Ended::Try => {
            // Held, or an error if every retry went to the old connection: either way the
            // attempt is over and given up.
            let r = try_grant(&a, &name, kind).await;
            assert!(!matches!(r, Ok(Some(_))), "granted while held");
        }
        Ended::Wait => {
            let r = wait_grant(&a, &name, kind, Duration::from_millis(1500)).await;
            assert!(r.is_err(), "granted while held");
        }
        Ended::Released => {
            let g = try_grant(&a, &name, kind)
                .await
                .expect("try")
                .expect("granted by the retry");
            g.release().await;
            // Another grant comes and goes after it: the ended attempt is not the last one
            // released.
            let g = try_grant(&holder, &name, kind)
                .await
                .expect("try")
                .expect("free");
            g.release().await;
        }
    }
    assert_eq!(
        proxy.held_connections(),
        1,
        "the first request was not held"
    );
    if let Some(g) = held {
        g.release().await;
    }
    // The late request goes to the server now; its answer coming back says it ran.
    let answered = proxy.stats().replies.chunks_read;
    proxy.release_held();
    until("the held request was never answered", || {
        proxy.stats().replies.chunks_read > answered
    })
    .await;
    let t = Instant::now();
    let got = loop {
        let got = try_grant(&third, &name, kind).await.expect("try");
        if got.is_some() || at_once || t.elapsed() > Duration::from_secs(5) {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let Some(g) = got else {
        let info = third.inspect_kind(&name, kind).await.expect("inspect");
        panic!(
            "{kind:?} after {ended:?}: a late request of the ended attempt took the lock: {:?}",
            info.holders
        );
    };
    g.release().await;
}
