//! A holder's connection closed from the other side between two renewals: by a proxy between
//! client and server (a load balancer's reset, a pooler's timeout), in session modes. The
//! server frees the lock the moment it reads the close, and a waiter gets it at once; the
//! holder must be told then too, not at its next renewal a third of a lease later (until
//! then both believed they held the lock: `dlock torture`'s `reset` nemesis found that
//! overlap on MySQL).

use super::{SqlMode, SqlServer};
use crate::conformance::{fast_opts, unique_name};
use crate::DelayProxy;
use distlock_core::{Backend, Client, LostReason};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Holder A (through a proxy) holds a lock with a 60 s lease, so its first renewal comes
/// 20 s after the grant; B waits for the lock on the server. The proxy resets A's
/// connections (both sides at once). A's lost signal must fire with `SessionEnded` within
/// 10 s — far below the renewal, the other way A could learn of it — and B gets the lock
/// with a higher token. (Printed: how long after the reset A was told and B was granted.)
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test.
pub async fn reset_holder_connection_fires_lost_at_once<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
) {
    let name = unique_name("reset-holder");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(60));
    let proxy = DelayProxy::start(mode.server.addr(), Duration::ZERO).expect("proxy");
    let backend = mode.backend_via(&proxy.addr().to_string(), &opts).await;
    let a = Client::new(Arc::new(backend), opts.clone()).expect("client");
    let b = mode.client_with(opts).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try_acquire")
        .expect("a fresh name is free");
    let granted_b: Arc<Mutex<Option<Instant>>> = Arc::default();
    let waiter = {
        let (name, granted_b) = (name.clone(), granted_b.clone());
        tokio::spawn(async move {
            let g2 = b
                .lock(&name)
                .expect("lock")
                .acquire_timeout(Duration::from_secs(30))
                .await;
            *granted_b.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            g2
        })
    };
    let reset = Instant::now();
    proxy.reset_all();
    let reason = match tokio::time::timeout(Duration::from_secs(10), g.lost()).await {
        Ok(r) => r,
        Err(_) => {
            let b_at = *granted_b.lock().unwrap_or_else(|p| p.into_inner());
            panic!(
                "the holder was not told its lock was lost 10 s after a proxy reset its \
                 connection; the other client {}",
                match b_at {
                    Some(t) => format!("has held the lock since {:?} after the reset", t - reset),
                    None => "has not got the lock yet".to_owned(),
                }
            )
        }
    };
    let told = reset.elapsed();
    assert!(matches!(reason, LostReason::SessionEnded(_)), "{reason:?}");
    let g2 = waiter
        .await
        .expect("waiter task")
        .expect("the lock is freed with the holder's connection");
    let b_at = granted_b
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map(|t| t - reset);
    eprintln!(
        "holder told {told:?} after the reset ({reason}); the waiter was granted {b_at:?} after it"
    );
    assert!(
        g2.fencing_token() > g.fencing_token(),
        "{} after {}",
        g2.fencing_token(),
        g.fencing_token()
    );
    g2.release().await.expect("release");
    // The lost guard's release touches nothing of the new holder's.
    let _ = g.release().await;
}
