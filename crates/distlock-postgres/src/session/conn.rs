//! One dedicated session (connection) and the idle ones kept for the next grant.

use super::PgDialect;
use crate::error::shape;
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{AttemptId, LostReason, Result};
use distlock_sql::lease::with_grace;
use distlock_sql::ConnGrants;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

/// One connection. It carries one grant (or one attempt whose outcome is unknown), or a write
/// grant and the read grant of its downgrade.
pub(crate) struct Session {
    pub(crate) client: Client,
    pub(crate) pid: i32,
    ended: CancellationToken,
    /// The attempts on this session, whose lost signals fire when it ends.
    pub(crate) grants: Arc<ConnGrants>,
}

impl Session {
    pub(crate) fn is_dead(&self) -> bool {
        self.ended.is_cancelled() || self.client.is_closed()
    }

    /// The `idle_session_timeout` value that covers every lease on this session, `attempt`'s
    /// counted as ending at `end` if given, left out if `end` is `None` ("0": no lease left).
    pub(crate) fn idle_value(&self, attempt: &AttemptId, end: Option<LeaseInstant>) -> String {
        match self.grants.latest_end(attempt, end) {
            None => "0".into(),
            Some(end) => idle_for(end.saturating_duration_since(LeaseInstant::now())),
        }
    }
}

/// The `idle_session_timeout` value for a lease of `left` from now, grace included.
pub(crate) fn idle_for(left: Duration) -> String {
    with_grace(left)
        .as_millis()
        .clamp(1, i32::MAX as u128)
        .to_string()
}

impl PgDialect {
    /// Opens a session: its own connection, whose end fires the lost signals of its grants.
    async fn open_session(&self) -> Result<Arc<Session>> {
        let (client, conn) = self.common.open(None).await?;
        let ended = CancellationToken::new();
        let grants: Arc<ConnGrants> = Arc::default();
        let (ended2, grants2) = (ended.clone(), grants.clone());
        let endpoint = self.common.endpoint.clone();
        tokio::spawn(async move {
            let res = conn.await;
            let reason = match &res {
                Err(e) if e.code() == Some(&SqlState::IDLE_SESSION_TIMEOUT) => {
                    LostReason::LeaseExpired
                }
                Err(e) => LostReason::SessionEnded(match e.as_db_error() {
                    Some(db) => format!(
                        "the server ended the session holding the lock: {} (SQLSTATE {})",
                        db.message(),
                        db.code().code()
                    ),
                    None => format!("the connection to {endpoint} holding the lock broke: {e}"),
                }),
                Ok(()) => LostReason::SessionEnded(format!(
                    "the connection to {endpoint} holding the lock was closed"
                )),
            };
            ended2.cancel();
            if grants2.end(reason.clone()) {
                tracing::warn!(%reason, "postgres session holding locks ended");
            }
        });
        let init = if self.common.has_session_timeouts() {
            "SELECT pg_backend_pid(), set_config('statement_timeout', '0', false), \
             set_config('client_connection_check_interval', '1000', false)"
        } else {
            "SELECT pg_backend_pid(), set_config('statement_timeout', '0', false)"
        };
        let row = self
            .common
            .run("opening a session", client.query_one(init, &[]))
            .await?;
        let pid: i32 = row.try_get(0).map_err(|e| shape("pg_backend_pid", e))?;
        Ok(Arc::new(Session {
            client,
            pid,
            ended,
            grants,
        }))
    }

    pub(crate) async fn take_session(&self) -> Result<Arc<Session>> {
        while let Some(s) = self.pool.take() {
            if !s.is_dead() {
                return Ok(s);
            }
        }
        self.open_session().await
    }

    /// Puts a session that holds nothing back into the pool (or closes it). A session another
    /// attempt still uses (a downgrade's other side) just stays with that attempt.
    pub(crate) fn put_session(&self, s: Arc<Session>) {
        if s.is_dead() || !s.grants.is_empty() || Arc::strong_count(&s) > 1 {
            return;
        }
        self.pool.put(s);
    }
}
