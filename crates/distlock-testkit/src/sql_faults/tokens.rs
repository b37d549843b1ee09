//! Fencing tokens after the counters were rolled back: a restore from a backup, a crash that
//! lost the last commits, an asynchronous failover to a replica that missed them. Set back by
//! hand here (the deterministic stand-in for all of them).

use super::{SqlMode, SqlServer};
use crate::conformance::{fast_opts, unique_name};
use crate::grant::try_grant;
use distlock_core::{Backend, LockKind};

/// Three grants of `name` of `kind` one after another (tokens t1 < t2 < t3); after the first,
/// `snapshot(server, name, kind)` returns the SQL that puts the backend's counters back where
/// they are then (the rollback); it is run after the third. The next grant's token must be
/// above t3: a token handed out before the rollback is never handed out again, nor a lower one
/// (a fenced store that rejects lower tokens would otherwise refuse the real holder and keep
/// accepting the deposed one).
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is a whole test.
pub async fn tokens_rise_after_a_rollback<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    kind: LockKind,
    snapshot: impl Fn(&S, &str, LockKind) -> String,
) {
    let name = unique_name("rollback");
    let c = mode.client_with(fast_opts()).await;
    let mut tokens = Vec::new();
    let mut rollback = None;
    for _ in 0..3 {
        let g = try_grant(&c, &name, kind)
            .await
            .expect("try")
            .expect("free");
        tokens.push(g.token());
        g.release().await;
        rollback.get_or_insert_with(|| snapshot(&mode.server, &name, kind));
    }
    let script = rollback.expect("a snapshot");
    mode.server.sql(&script).expect("set the counters back");
    let g = try_grant(&c, &name, kind)
        .await
        .expect("try")
        .expect("free");
    let last = tokens[2];
    assert!(
        g.token() > last,
        "{kind:?}: token {} after {tokens:?} and the counters set back to after the first: \
         a token handed out before was handed out again (or a lower one)",
        g.token()
    );
    g.release().await;
}
