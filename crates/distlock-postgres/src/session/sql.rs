//! The statements of session mode, each on the session it concerns (the SQL is in `sql/`).

use super::conn::Session;
use super::state::Entry;
use super::{exclusive, PgDialect};
use crate::common::{channel, first, key_of, key_oids, token_u64};
use crate::common::{params, Param};
use distlock_core::{AcquireRequest, LockKind, Result};
use distlock_sql::lease::millis_f64;
use std::time::Duration;
use tokio_postgres::Row;

const REGISTER: &str = include_str!("../../sql/session_register.sql");
const REFRESH: &str = include_str!("../../sql/session_refresh.sql");
const RELEASE_EXCL: &str = include_str!("../../sql/session_release_excl.sql");
const RELEASE_SHARED: &str = include_str!("../../sql/session_release_shared.sql");
const RELEASE_ALL: &str = include_str!("../../sql/session_release_all.sql");
const HOLDS: &str = include_str!("../../sql/session_holds.sql");
const HOLDER_TTL: &str = include_str!("../../sql/session_holder_ttl.sql");
const TRY_LOCK: &str = include_str!("../../sql/session_try_lock.sql");
const TRY_LOCK_SHARED: &str = include_str!("../../sql/session_try_lock_shared.sql");
const ELECTION_REGISTER: &str = include_str!("../../sql/election_register.sql");
const ELECTION_REFRESH: &str = include_str!("../../sql/election_refresh.sql");
const ELECTION_RELEASE: &str = include_str!("../../sql/election_release.sql");
const ELECTION_RELEASE_ALL: &str = include_str!("../../sql/election_release_all.sql");
const ELECTION_HOLDER_TTL: &str = include_str!("../../sql/election_holder_ttl.sql");

impl PgDialect {
    /// The setting that carries the lease: `idle_session_timeout`, or a harmless custom
    /// placeholder on servers older than 14 (which cannot enforce the lease server-side).
    pub(crate) fn lease_guc(&self) -> &'static str {
        match self.common.has_session_timeouts() {
            true => "idle_session_timeout",
            false => "dlock.idle_session_timeout",
        }
    }

    async fn query(
        &self,
        s: &Session,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>> {
        self.common
            .run(what, s.client.query_typed(sql, params))
            .await
    }

    /// `pg_try_advisory_lock` on `s`, setting the session's lease in the same statement when
    /// granted (`idle_held`, so that a grant whose answer is lost frees itself when that lease
    /// ends even if nobody ever asks again) and `idle_free` otherwise.
    pub(crate) async fn try_lock_on(
        &self,
        s: &Session,
        entry: &Entry,
        idle_held: &str,
        idle_free: &str,
    ) -> Result<bool> {
        let key = key_of(&self.common.namespace, &entry.name, entry.kind);
        let sql = [TRY_LOCK_SHARED, TRY_LOCK][usize::from(exclusive(entry.kind))];
        let guc = self.lease_guc();
        let params = params![key, idle_held, idle_free, guc];
        let what = "trying the lock";
        first(what, &self.query(s, what, sql, &params).await?)
    }

    /// Whether `s` holds the attempt's key in its kind's mode (read after every earlier statement there).
    pub(crate) async fn holds(&self, s: &Session, entry: &Entry) -> Result<bool> {
        let (classid, objid) = key_oids(key_of(&self.common.namespace, &entry.name, entry.kind));
        // The `pg_locks.mode` of the advisory lock.
        let mode = ["ShareLock", "ExclusiveLock"][usize::from(exclusive(entry.kind))];
        let params = params![classid, objid, mode];
        let what = "checking the session's lock";
        first(what, &self.query(s, what, HOLDS, &params).await?)
    }

    /// Records the grant `s` holds for `req` and returns its fencing token (the recorded one
    /// if this session recorded it before). An election's leadership is recorded with its
    /// value (`dlock_elections`), and the election's observers are woken.
    pub(crate) async fn register(
        &self,
        s: &Session,
        req: &AcquireRequest,
        idle: &str,
    ) -> Result<u64> {
        let (ns, name) = (self.common.namespace.as_str(), &*req.key.name);
        let (owner, attempt) = (&*req.key.owner, req.attempt.as_str());
        let lease_ms = millis_f64(req.lease);
        let guc = self.lease_guc();
        let (kind, excl) = (req.key.kind.as_str(), exclusive(req.key.kind));
        let value: &str = req.value.as_deref().unwrap_or("");
        let chan = channel(key_of(ns, name, LockKind::Election));
        let mut params = params![ns, name, attempt, owner, lease_ms, idle, guc].to_vec();
        let (what, sql) = if req.key.kind == LockKind::Election {
            params.extend(params![value, chan]);
            ("recording the leadership", ELECTION_REGISTER)
        } else {
            params.extend(params![kind, excl]);
            ("recording the grant", REGISTER)
        };
        token_u64(first(what, &self.query(s, what, sql, &params).await?)?)
    }

    /// Makes the grant's row and the session's lease run at least `lease` from now. False if
    /// the row is gone (an operator revoked the grant).
    pub(crate) async fn refresh(
        &self,
        s: &Session,
        entry: &Entry,
        lease: Duration,
        idle: &str,
    ) -> Result<bool> {
        let ns = self.common.namespace.as_str();
        let (name, attempt) = (&*entry.name, entry.attempt.as_str());
        let lease_ms = millis_f64(lease);
        let guc = self.lease_guc();
        let params = params![ns, name, attempt, lease_ms, idle, guc];
        let sql = match entry.kind {
            LockKind::Election => ELECTION_REFRESH,
            _ => REFRESH,
        };
        let what = "refreshing the grant";
        Ok(first::<i64>(what, &self.query(s, what, sql, &params).await?)? > 0)
    }

    /// Gives up what `attempt` holds (or may hold) on `s` and forgets its row: one unlock of
    /// `kind`'s mode, or everything when no other attempt uses the session. True if the
    /// session held the lock (for a single unlock; an unlock-all does not tell).
    pub(crate) async fn unlock_on(&self, s: &Session, entry: &Entry, all: bool) -> Result<bool> {
        let ns = self.common.namespace.as_str();
        let (name, kind) = (&*entry.name, entry.kind);
        let key = key_of(ns, name, kind);
        let chan = channel(key);
        let a = entry.attempt.as_str();
        let idle = s.idle_value(&entry.attempt, None);
        let guc = self.lease_guc();
        let sql = match (kind, all) {
            (LockKind::Election, true) => ELECTION_RELEASE_ALL,
            (LockKind::Election, false) => ELECTION_RELEASE,
            (_, true) => RELEASE_ALL,
            (kind, false) if exclusive(kind) => RELEASE_EXCL,
            (_, false) => RELEASE_SHARED,
        };
        let params = params![ns, name, a, key, chan, idle, guc];
        let rows = self.query(s, "releasing", sql, &params).await?;
        // An unlock-all does not tell.
        Ok(all || first("releasing", &rows)?)
    }

    /// The longest remaining lease among the live holders of `name`.
    pub(crate) async fn holder_ttl(&self, name: &str, kind: LockKind) -> Option<Duration> {
        let (classid, objid) = key_oids(key_of(&self.common.namespace, name, kind));
        let ns = self.common.namespace.as_str();
        let params = params![ns, name, classid, objid];
        let sql = match kind {
            LockKind::Election => ELECTION_HOLDER_TTL,
            _ => HOLDER_TTL,
        };
        let what = "reading the holder's lease";
        let rows = self.common.query(what, sql, &params).await.ok()?;
        let left: f64 = rows.first()?.try_get::<_, Option<f64>>(0).ok()??;
        (left.is_finite() && left > 0.0).then(|| Duration::from_secs_f64(left / 1000.0))
    }

    /// `pg_cancel_backend(pid)` through the control connection; false if that failed.
    pub(crate) async fn cancel_backend(&self, pid: i32) -> bool {
        let (what, sql) = ("cancelling a wait", "SELECT pg_cancel_backend($1)");
        let rows = self.common.query(what, sql, &params![pid]).await;
        matches!(rows.map(|r| first(what, &r)), Ok(Ok(true)))
    }
}
