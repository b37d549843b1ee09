//! Waiting on the server: a blocking `pg_advisory_lock` on the attempt's own session, bounded
//! by `lock_timeout` (the deadline) and stopped with `pg_cancel_backend` (or a CancelRequest).
//! The server queues waiters in arrival order and wakes exactly one per release.

use super::conn::{idle_for, Session};
use super::state::{Entry, State};
use super::{exclusive, PgDialect};
use crate::common::key_of;
use crate::error::{is_code, map, shape, KIND};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{AcquireRequest, Error, Granted, Result};
use distlock_sql::lease::{wait_millis, wait_or_stop};
use distlock_sql::HoldMap;
use std::sync::Arc;
use std::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_util::sync::CancellationToken;

/// How a server-side wait ended.
enum WaitEnd {
    Granted,
    Failed(tokio_postgres::Error),
    /// Stopped (cancel or deadline), but the lock was granted before the cancel landed.
    StoppedGranted,
    /// Stopped; the session holds nothing.
    StoppedClean,
    /// Stopped; the session's state is unknown.
    StoppedUnknown,
}

impl PgDialect {
    /// One server-side wait of the attempt (its state locked by the caller for all of it).
    pub(crate) async fn wait_in(
        &self,
        holds: &HoldMap<State>,
        entry: &Entry,
        st: &mut State,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let key = key_of(&self.common.namespace, &req.key.name, req.key.kind);
        let kind = req.key.kind;
        let sent = LeaseInstant::now();
        match self.resume(entry, st, req).await? {
            Some(token) => {
                return Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }))
            }
            None if matches!(st, State::Unknown(_)) => {}
            None => {
                Self::check_upgrade(holds, req)?;
                let s = self.take_session().await?;
                s.grants.add(&req.attempt, sent + req.lease);
                entry.set(st, State::Unknown(s));
            }
        }
        let State::Unknown(s) = &*st else {
            return Err(shape("acquire", "attempt state"));
        };
        let s = s.clone();
        let sent = LeaseInstant::now();
        let idle_held = s.idle_value(&req.attempt, Some(sent + req.lease));
        let idle_free = s.idle_value(&req.attempt, None);
        match self
            .try_lock_on(&s, kind, key, &idle_held, &idle_free)
            .await
        {
            Ok(true) => {
                let token = self.grant_on(entry, st, s, req, &idle_held).await?;
                return Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }));
            }
            Ok(false) => {}
            Err(e) => {
                Self::settle(entry, st);
                return Err(e);
            }
        }
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if remaining.is_some_and(|r| r.is_zero()) || cancel.is_cancelled() {
            self.forget_on(entry, st, s, &req.attempt, true);
            return Ok(None);
        }
        let lock_timeout = remaining.map_or_else(
            || "0".to_string(),
            // Rounded up: the server must not give up before the deadline.
            |r| format!("{}ms", wait_millis(r).min(i32::MAX as u128)),
        );
        let func = if exclusive(kind) {
            "pg_advisory_lock"
        } else {
            "pg_advisory_lock_shared"
        };
        // One round trip, one implicit transaction: `lock_timeout` bounds this wait only and
        // reverts afterwards (a session-level advisory lock outlives the transaction). The
        // session's lease is set in the same statement, so a grant whose answer never arrives
        // frees itself at lease end. The key, the setting's name and its value are an integer,
        // a constant and digits: safe to inline.
        let guc = self.lease_guc();
        let lease_idle = idle_for(req.lease);
        let sql = format!(
            "SET LOCAL lock_timeout = '{lock_timeout}'; \
             SELECT {func}({key}), set_config('{guc}', '{lease_idle}', false)"
        );
        let end = {
            let wait = s.client.simple_query(&sql);
            tokio::pin!(wait);
            // With a safety net should the server's timer be late.
            match wait_or_stop(&mut wait, cancel, deadline).await {
                // Granted as the caller went away: give it straight back.
                Some(Ok(_)) if cancel.is_cancelled() => WaitEnd::StoppedGranted,
                Some(Ok(_)) => WaitEnd::Granted,
                Some(Err(e)) => WaitEnd::Failed(e),
                None => {
                    // Stopping. First queue the unlock right behind the wait on this session:
                    // the server runs it the moment the wait ends, granted or not, so a grant
                    // that races with the stop is given back at once. Then stop the wait (a
                    // signal through the open control connection is much faster than a
                    // CancelRequest, which needs a new connection).
                    let limit = self.common.op_timeout;
                    let reset = [(&guc as &(dyn ToSql + Sync), Type::TEXT)];
                    let unlock = s.client.query_typed(
                        "SELECT pg_advisory_unlock_all(), set_config($1, '0', false)",
                        &reset,
                    );
                    let stop = async {
                        if !self.cancel_backend(s.pid).await {
                            let cancel_req = s.client.cancel_token();
                            let _ =
                                tokio::time::timeout(limit, self.common.cancel(cancel_req)).await;
                        }
                    };
                    let (waited, unlocked, ()) = tokio::join!(
                        tokio::time::timeout(limit, &mut wait),
                        tokio::time::timeout(limit, unlock),
                        stop
                    );
                    let wait_clean = match waited {
                        Ok(Ok(_)) => true,
                        Ok(Err(e)) => {
                            is_code(&e, &SqlState::QUERY_CANCELED)
                                || is_code(&e, &SqlState::LOCK_NOT_AVAILABLE)
                        }
                        Err(_) => false,
                    };
                    if wait_clean && matches!(unlocked, Ok(Ok(_))) {
                        WaitEnd::StoppedClean
                    } else {
                        WaitEnd::StoppedUnknown
                    }
                }
            }
        };
        match end {
            WaitEnd::Granted => {
                // The server's lease restarts with the registration, which starts now.
                let sent = LeaseInstant::now();
                let idle = s.idle_value(&req.attempt, Some(sent + req.lease));
                let token = self.grant_on(entry, st, s, req, &idle).await?;
                Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }))
            }
            WaitEnd::Failed(e) if is_code(&e, &SqlState::LOCK_NOT_AVAILABLE) => {
                // lock_timeout: the deadline passed (the transaction's rollback undid the
                // lease setting). The server may have granted the lock all the same: a grant
                // that lands while the timeout is being handled is kept (LockErrorCleanup),
                // and a session-level advisory lock outlives the aborted transaction. So give
                // back whatever the session holds before it is pooled.
                self.give_back(entry, st, s, req).await;
                Ok(None)
            }
            WaitEnd::Failed(e) if is_code(&e, &SqlState::QUERY_CANCELED) => {
                // Cancelled by someone else (an operator), or by a late signal of ours: wait
                // again, on another session (see `StoppedClean`).
                self.forget_on(entry, st, s, &req.attempt, false);
                Err(Error::Connection {
                    backend: KIND,
                    endpoint: self.endpoint().to_owned(),
                    source: "the wait was cancelled on the server".into(),
                })
            }
            WaitEnd::Failed(e) => {
                self.forget_on(entry, st, s, &req.attempt, false);
                Err(map(self.endpoint(), e))
            }
            WaitEnd::StoppedGranted => {
                // Granted just before the cancel landed: give it back.
                self.give_back(entry, st, s, req).await;
                Ok(None)
            }
            WaitEnd::StoppedClean => {
                // Not pooled: the stop's `pg_cancel_backend` may still be on its way (its call
                // timed out on a loaded control connection, so the statement runs later). On a
                // reused session it would cancel another attempt's statement — its wait, its
                // try or its grant's registration — and fail a waiter that must not give up.
                self.forget_on(entry, st, s, &req.attempt, false);
                Ok(None)
            }
            WaitEnd::StoppedUnknown => {
                self.forget_on(entry, st, s, &req.attempt, false);
                Ok(None)
            }
        }
    }

    /// Gives back everything the attempt's dedicated wait session `s` holds (a wait never
    /// shares its session) and forgets the attempt: the session is pooled if that worked, and
    /// closed otherwise (which frees whatever it holds).
    async fn give_back(
        &self,
        entry: &Entry,
        st: &mut State,
        s: Arc<Session>,
        req: &AcquireRequest,
    ) {
        let unlocked = self
            .unlock_on(&s, &req.key.name, &req.attempt, req.key.kind, true)
            .await
            .is_ok();
        self.forget_on(entry, st, s, &req.attempt, unlocked);
    }
}
