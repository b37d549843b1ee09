//! Waiting on the server: a blocking `pg_advisory_lock` on the attempt's own session, bounded
//! by `lock_timeout` (the deadline) and stopped with `pg_cancel_backend` (or a CancelRequest).
//! The server queues waiters in arrival order and wakes exactly one per release. What the
//! wait's end means for the attempt is decided in [`distlock_sql::waited`].

use super::conn::{idle_for, Session};
use crate::common::params;

use super::{exclusive, PgDialect};
use crate::common::key_of;
use crate::error::{map, KIND};
use distlock_core::{AcquireRequest, Error, LockKind};
use distlock_sql::lease::{wait_millis, wait_or_stop};
use distlock_sql::waited::WaitEnd;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

/// The statement of one wait for `key` in `kind`'s mode: `lock_timeout` set for this
/// statement only (`left`, rounded up: the server must not give up before the deadline; `0`:
/// no deadline), and the session's lease (`guc` set to `lease_idle`) set in the same
/// statement, so a grant whose answer never arrives frees itself at lease end. One round
/// trip, one implicit transaction: `lock_timeout` reverts afterwards (a session-level
/// advisory lock outlives the transaction). The key, the setting's name and its values are
/// an integer, a constant and digits: safe to inline.
fn wait_sql(
    kind: LockKind,
    key: i64,
    left: Option<Duration>,
    guc: &str,
    lease_idle: &str,
) -> String {
    let lock_timeout = left.map_or_else(
        || "0".to_string(),
        |r| format!("{}ms", wait_millis(r).min(i32::MAX as u128)),
    );
    let func = ["pg_advisory_lock_shared", "pg_advisory_lock"][usize::from(exclusive(kind))];
    format!(
        "SET LOCAL lock_timeout = '{lock_timeout}'; \
         SELECT {func}({key}), set_config('{guc}', '{lease_idle}', false)"
    )
}

/// How a wait that returned an error ended.
fn failed(endpoint: &str, e: tokio_postgres::Error) -> WaitEnd {
    if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
        // lock_timeout: the deadline passed (the transaction's rollback undid the lease
        // setting). The server may have granted the lock all the same: a grant that lands
        // while the timeout is being handled is kept (LockErrorCleanup), and a session-level
        // advisory lock outlives the aborted transaction.
        return WaitEnd::TimedOut { may_hold: true };
    }
    WaitEnd::Failed(if e.code() == Some(&SqlState::QUERY_CANCELED) {
        // Cancelled by someone else (an operator), or by a late signal of ours: wait again,
        // on another session.
        Error::connection(KIND, endpoint, "the wait was cancelled on the server")
    } else {
        map(endpoint, e)
    })
}

impl PgDialect {
    /// The blocking wait of `req` on `s` for at most `left` on the server, stopped here by
    /// `cancel` or the safety net after `deadline`; how it ended.
    pub(super) async fn wait_on(
        &self,
        s: &Session,
        req: &AcquireRequest,
        left: Option<Duration>,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> WaitEnd {
        let key = key_of(&self.common.namespace, &req.key.name, req.key.kind);
        let guc = self.lease_guc();
        let sql = wait_sql(req.key.kind, key, left, guc, &idle_for(req.lease));
        let wait = s.client.simple_query(&sql);
        tokio::pin!(wait);
        match wait_or_stop(&mut wait, cancel, deadline).await {
            // Granted as the caller went away: given straight back.
            Some(Ok(_)) if cancel.is_cancelled() => WaitEnd::Stopped(Some(true)),
            Some(Ok(_)) => WaitEnd::Granted,
            Some(Err(e)) => failed(&self.common.endpoint, e),
            None => {
                self.stop(s, guc, wait).await;
                WaitEnd::Stopped(None)
            }
        }
    }

    /// Stops the wait `wait` on `s`. First the unlock is queued right behind the wait on this
    /// session: the server runs it the moment the wait ends, granted or not, so a grant that
    /// races with the stop is given back at once. Then the wait is stopped (a signal through
    /// the open control connection is much faster than a CancelRequest, which needs a new
    /// connection). The session is closed afterwards whatever happened.
    async fn stop<F: Future + Unpin>(&self, s: &Session, guc: &str, wait: F) {
        let limit = self.common.op_timeout;
        let reset = params![guc];
        let unlock = s.client.query_typed(
            "SELECT pg_advisory_unlock_all(), set_config($1, '0', false)",
            &reset,
        );
        let stop = async {
            if !self.cancel_backend(s.pid).await {
                // A CancelRequest: a new connection, with the backend's TLS settings.
                let token = s.client.cancel_token();
                let cancel_req = token.cancel_query(self.common.tls.connector());
                let _ = tokio::time::timeout(limit, cancel_req).await;
            }
        };
        let _ = tokio::join!(
            tokio::time::timeout(limit, wait),
            tokio::time::timeout(limit, unlock),
            stop
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_statements() {
        let guc = "idle_session_timeout";
        let sql = wait_sql(LockKind::Mutex, -7, None, guc, "4500");
        assert_eq!(
            sql,
            "SET LOCAL lock_timeout = '0'; \
             SELECT pg_advisory_lock(-7), set_config('idle_session_timeout', '4500', false)"
        );
        // Rounded up and one more: the server never gives up before the deadline.
        let sql = wait_sql(
            LockKind::Read,
            42,
            Some(Duration::from_micros(1500)),
            guc,
            "1",
        );
        assert!(sql.starts_with("SET LOCAL lock_timeout = '3ms'; "), "{sql}");
        assert!(sql.contains("pg_advisory_lock_shared(42)"), "{sql}");
        let sql = wait_sql(LockKind::Write, 1, Some(Duration::MAX), guc, "1");
        assert!(sql.contains(&format!("'{}ms'", i32::MAX)), "{sql}");
    }
}
