//! Table mode (`?mode=table`): the lock is a row (owner, attempt, token, lease end by the
//! server's clock) changed in short transactions that lock the row (`SELECT … FOR UPDATE`);
//! rows replicate (Galera, group replication, multiplexing proxies), and expire only by lease.
//! docs/mysql.md, "Table mode in detail", has the whole argument; the invariants:
//!
//! - every operation is one multi-statement query, `COMMIT` included, so a request whose reply
//!   is late or lost happened entirely or not at all, and its retry (same attempt, same token)
//!   finds out which from the row;
//! - an attempt that ended (the row's `last_released`, or `dlock_ended_attempts` for one that
//!   had an unanswered request: [`distlock_sql::ended`]) is never granted by a late duplicate;
//! - user text goes in as hex literals ([`sql_str`]); elections are rows of their own key, their
//!   value stored in `dlock_elections` in the grant's transaction.

use crate::common::{
    capabilities, col, key_of, last_row, next_token, renewed, sql_attempt, sql_str, Common, Sets,
};
use crate::error::{shape, KIND};
use distlock_core::backend::{Backend, Capabilities, NoWatch};
use distlock_core::{async_trait, ReleaseWatch};
use distlock_core::{
    AcquireReply, AcquireRequest, AttemptId, Error, GrantRef, LockInfo, LockKind, ReleaseOutcome,
    RenewOutcome, Result,
};
use distlock_sql::ended::{Unanswered, ENDED_KEEP};
use distlock_sql::lease::micros;
use mysql_async::prelude::Queryable;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const DDL: &[&str] = &[
    include_str!("../sql/table_schema.sql"),
    include_str!("../sql/table_ended.sql"),
];

/// Expired records of ended attempts deleted by each write of a new one.
const TRIM: usize = 100;

/// Columns added since the table's first version (made by older dlock versions without them),
/// both attempt ids as the table's SQL declares them.
const ADDED_COLUMNS: &[&str] = &["attempt", "last_released"];

/// What a free row's lease end is set to.
pub(crate) const FREE: &str = "'1970-01-02 00:00:00'";

/// Renewals per query (a batch of the watchdog may hold thousands).
const RENEW_CHUNK: usize = 200;

pub(crate) struct TableMode {
    common: Arc<Common>,
    /// Attempts with a request that got no answer: their end is recorded in
    /// `dlock_ended_attempts`.
    unanswered: Unanswered,
}

/// Whether an SQL truth value read back is true (`None`: NULL, i.e. no row was read).
fn truth(v: Option<i64>) -> Option<bool> {
    v.map(|v| v != 0)
}

impl TableMode {
    /// Table mode on `common`'s server: creates its tables if they are missing, and adds the
    /// columns a table made by an older version lacks. Concurrent clients may race to do it:
    /// a column that exists by then (error 1060) is fine.
    pub(crate) async fn start(common: Arc<Common>) -> Result<Self> {
        common.ensure_schema(DDL).await?;
        let sql = "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                   WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'dlock_table_locks'";
        let have: Vec<String> = common
            .with_conn("checking dlock_table_locks", |c| c.query(sql))
            .await?;
        for column in ADDED_COLUMNS {
            if have.iter().any(|h| h.eq_ignore_ascii_case(column)) {
                continue;
            }
            let ddl = format!(
                "ALTER TABLE dlock_table_locks \
                 ADD COLUMN {column} VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL"
            );
            let r = common
                .with_conn("upgrading dlock_table_locks", |c| c.query_drop(ddl))
                .await;
            match r {
                Ok(()) => tracing::info!(column, "added a column to dlock_table_locks"),
                Err(Error::UnexpectedReply { message, .. }) if message.contains("1060") => {}
                Err(e) => return Err(e),
            }
        }
        let unanswered = Unanswered::default();
        Ok(TableMode { common, unanswered })
    }

    /// The key of `name`'s lock of `kind`, for the kinds this backend does.
    fn key(&self, name: &str, kind: LockKind) -> Result<String> {
        capabilities().check(KIND, kind)?;
        Ok(key_of(&self.common.namespace, name, kind))
    }

    /// Runs the give-up or release transaction `sql(ended, trim)` of `attempt` (quoted `a`)
    /// on lock `lk`. An attempt that had a request without an answer is ended for good:
    /// `ended` (after the lock's row was locked) records it in `dlock_ended_attempts`, so
    /// that a late copy of that request never grants it, and `trim` (after the `COMMIT`)
    /// deletes a few expired records, so a write never does unbounded work.
    async fn ending(
        &self,
        what: &str,
        (attempt, a, lk): (&AttemptId, &str, &str),
        sql: impl FnOnce(&str, &str) -> String,
    ) -> Result<Sets> {
        let record = self.unanswered.pending(attempt);
        let keep = ENDED_KEEP.as_secs();
        let (ended, trim) = match record {
            false => (String::new(), String::new()),
            true => (
                format!(
                    "INSERT INTO dlock_ended_attempts (attempt, lock_key, expires_at) \
                     VALUES ({a}, '{lk}', UTC_TIMESTAMP(6) + INTERVAL {keep} SECOND) \
                     ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at); "
                ),
                format!(
                    "DELETE FROM dlock_ended_attempts WHERE expires_at < UTC_TIMESTAMP(6) \
                     ORDER BY expires_at LIMIT {TRIM}; "
                ),
            ),
        };
        let sets = self.common.query(what, sql(&ended, &trim)).await?;
        if record {
            self.unanswered.recorded(attempt);
        }
        Ok(sets)
    }
}

/// What an acquire's transaction saw and did, as read back (`None`: NULL, no row was read):
/// the row was held, its lease not over (`live`); by this attempt (`mine`); this attempt has
/// ended, released or given up after an unanswered request (`ended`); the row's token; the
/// holder's lease left in µs (`left`); the token of the grant this transaction made (`new`).
type Seen = (
    Option<bool>,
    Option<bool>,
    Option<bool>,
    Option<u64>,
    Option<i64>,
    Option<u64>,
);

/// What an acquire answers for what its transaction saw.
fn acquired((live, mine, ended, token, left, new): Seen) -> Result<AcquireReply> {
    match (live, mine, new) {
        // A retry of the attempt that holds the lock: same grant, lease extended.
        (Some(true), Some(true), _) => {
            crate::common::token(token).map(|token| AcquireReply::Granted { token })
        }
        (Some(true), _, _) => Ok(AcquireReply::Held {
            ttl: Some(Duration::from_micros(left.unwrap_or(0).max(0) as u64)),
        }),
        (Some(false), _, Some(t)) if t > 0 => Ok(AcquireReply::Granted { token: t }),
        // A late duplicate of a request of an attempt that has ended (released or given up):
        // it must not take the lock nobody would use. Its caller is long gone.
        (Some(false), _, None) if ended == Some(true) => Ok(AcquireReply::Held { ttl: None }),
        other => Err(shape("acquiring", format!("{other:?}"))),
    }
}

/// The one round trip of an acquire of `req` on lock key `lk` in namespace `ns`. The rows are
/// created outside the transaction (autocommit), so that concurrent first users of a name
/// cannot deadlock on gap locks. Variables are reset first: the connection is pooled, and a
/// `SELECT … INTO` that finds no row leaves them as they were. An election's fresh grant
/// stores its value with its token, in the transaction.
fn acquire_sql(ns: &str, lk: &str, req: &AcquireRequest) -> Result<String> {
    let (ns, name) = (sql_str(ns), sql_str(&req.key.name));
    let owner = sql_str(&req.key.owner);
    let a = sql_attempt(&req.attempt)?;
    let us = micros(req.lease);
    let observed = crate::observe::observed_col(req.key.kind, lk);
    let election = (req.key.kind, req.value.as_deref());
    let election = crate::observe::election_row(election, lk, (&ns, &name), "@dl_new");
    let next = next_token("token");
    Ok(format!(
        "SET @dl_live = NULL, @dl_mine = NULL, @dl_ended = NULL, @dl_token = NULL, \
             @dl_left = NULL, @dl_new = NULL; \
         INSERT IGNORE INTO dlock_fence (lock_key, ns, name, token) \
             VALUES ('{lk}', {ns}, {name}, 0); \
         INSERT IGNORE INTO dlock_table_locks \
             (lock_key, ns, name, owner, count, token, acquired_at, expires_at) \
             VALUES ('{lk}', {ns}, {name}, NULL, 0, 0, NULL, {FREE}); \
         START TRANSACTION; \
         SELECT owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6), attempt <=> {a}, \
             last_released <=> {a}, token, \
             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
             INTO @dl_live, @dl_mine, @dl_ended, @dl_token, @dl_left \
             FROM dlock_table_locks WHERE lock_key = '{lk}' FOR UPDATE; \
         SELECT @dl_ended OR COUNT(*) > 0 INTO @dl_ended FROM dlock_ended_attempts \
             WHERE attempt = {a} LOCK IN SHARE MODE; \
         UPDATE dlock_table_locks SET expires_at = \
             GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL {us} MICROSECOND) \
             WHERE lock_key = '{lk}' AND @dl_live AND @dl_mine; \
         UPDATE dlock_fence SET token = LAST_INSERT_ID({next}) \
             WHERE lock_key = '{lk}' AND NOT @dl_live AND NOT @dl_ended; \
         SET @dl_new = IF(ROW_COUNT() = 1, LAST_INSERT_ID(), NULL); \
         UPDATE dlock_table_locks SET owner = {owner}, attempt = {a}, count = 1, \
             token = @dl_new, acquired_at = UTC_TIMESTAMP(6), \
             expires_at = UTC_TIMESTAMP(6) + INTERVAL {us} MICROSECOND \
             WHERE lock_key = '{lk}' AND @dl_new IS NOT NULL; \
         {election}COMMIT; \
         SELECT @dl_live, @dl_mine, @dl_ended, @dl_token, @dl_left, @dl_new{observed}"
    ))
}

/// Waiters wake at the holder's lease end or their heartbeat (the core's `watch_and_retry`,
/// with a watch that never fires: MySQL has no notifications).
#[async_trait]
impl Backend for TableMode {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.common.endpoint.clone()
    }

    /// Rows expire by lease on the server, with or without their holder.
    fn capabilities(&self) -> Capabilities {
        capabilities().lease_expiry(true)
    }

    async fn watch(&self, _req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        Ok(Box::new(NoWatch))
    }

    /// See [`crate::observe`].
    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        crate::observe::observe(&self.common, name).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        let lk = self.key(&req.key.name, req.key.kind)?;
        let sql = acquire_sql(&self.common.namespace, &lk, req)?;
        // A request without an answer may still reach the server after the attempt ended:
        // remembered, so that its end is recorded (see `release` and `give_up`).
        let sets = self
            .unanswered
            .track(&req.attempt, self.common.query("acquiring", sql))
            .await?;
        let what = "acquiring";
        let row = last_row(what, &sets)?;
        let new: Option<u64> = col(what, row, 5)?;
        if new.is_some() {
            crate::observe::wake_if(&self.common, &lk, row, 6);
        }
        let flag = |i| col(what, row, i).map(truth);
        let (token, left) = (col(what, row, 3)?, col(what, row, 4)?);
        acquired((flag(0)?, flag(1)?, flag(2)?, token, left, new))
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let lk = self.key(&grant.key.name, grant.key.kind)?;
        let a = sql_attempt(&grant.attempt)?;
        let t = grant.token;
        let observed = crate::observe::observed_col(grant.key.kind, &lk);
        let sql = |ended: &str, trim: &str| {
            format!(
                "SET @dl_live = NULL, @dl_mine = NULL, @dl_ended = NULL; \
                 START TRANSACTION; \
                 SELECT owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6), \
                     attempt <=> {a} AND token = {t}, last_released <=> {a} \
                     INTO @dl_live, @dl_mine, @dl_ended \
                     FROM dlock_table_locks WHERE lock_key = '{lk}' FOR UPDATE; \
                 UPDATE dlock_table_locks SET owner = NULL, count = 0, acquired_at = NULL, \
                     expires_at = {FREE}, last_released = attempt \
                     WHERE lock_key = '{lk}' AND @dl_live AND @dl_mine; \
                 {ended}COMMIT; {trim}\
                 SELECT @dl_live, @dl_mine, @dl_ended{observed}"
            )
        };
        let what = "releasing";
        let sets = self.ending(what, (&grant.attempt, &a, &lk), sql).await?;
        let row = last_row(what, &sets)?;
        let flag = |i| col(what, row, i).map(truth);
        let (live, mine, ended) = (flag(0)?, flag(1)?, flag(2)?);
        if live == Some(true) && mine == Some(true) {
            crate::observe::wake_if(&self.common, &lk, row, 3);
        }
        Ok(match (live, mine, ended) {
            (Some(true), Some(true), _) => ReleaseOutcome::Released,
            // Not a repeated release (its first reply lost), nor expired, nor never used.
            (Some(true), _, e) if e != Some(true) => ReleaseOutcome::TakenByOther,
            _ => ReleaseOutcome::Expired,
        })
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        let lk = self.key(&req.key.name, req.key.kind)?;
        let a = sql_attempt(&req.attempt)?;
        // Frees the row only if this attempt holds it, and marks the attempt as ended either
        // way, so that a late duplicate of its last acquire cannot take the lock afterwards:
        // in the row's `last_released` (until another attempt ends), and, for an attempt
        // that had a request without an answer, in `dlock_ended_attempts` (the row's update
        // locks it first, so an acquire waiting for the row sees the record).
        // (MySQL applies the assignments left to right; `attempt` is not among them.)
        let sql = |ended: &str, trim: &str| {
            format!(
                "START TRANSACTION; \
                 UPDATE dlock_table_locks SET \
                     count = IF(attempt <=> {a}, 0, count), \
                     acquired_at = IF(attempt <=> {a}, NULL, acquired_at), \
                     expires_at = IF(attempt <=> {a}, {FREE}, expires_at), \
                     owner = IF(attempt <=> {a}, NULL, owner), \
                     last_released = {a} \
                     WHERE lock_key = '{lk}'; \
                 {ended}COMMIT; {trim}"
            )
        };
        self.ending("giving up", (&req.attempt, &a, &lk), sql)
            .await?;
        if req.key.kind == LockKind::Election {
            // Rare (a stopped campaign): whether it held the row is not read back.
            crate::observe::wake(&self.common, &lk);
        }
        Ok(())
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        let mut out = Vec::with_capacity(holds.len());
        for chunk in holds.chunks(RENEW_CHUNK) {
            let mut sql = String::new();
            for (g, lease) in chunk {
                let lk = self.key(&g.key.name, g.key.kind)?;
                let a = sql_attempt(&g.attempt)?;
                let us = micros(*lease);
                // Found rows, not changed ones (the connection asks for them): a lease that
                // already runs longer is left as it is, and still counts as renewed.
                sql.push_str(&format!(
                    "UPDATE dlock_table_locks SET expires_at = \
                         GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL {us} MICROSECOND) \
                         WHERE lock_key = '{lk}' AND attempt = {a} AND token = {t} \
                         AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6); \
                     SELECT ROW_COUNT(); ",
                    t = g.token
                ));
            }
            let sets = self.common.query("renewing", sql).await?;
            if sets.len() != chunk.len() {
                return Err(shape(
                    "renewing",
                    format!("{} answers to {} renewals", sets.len(), chunk.len()),
                ));
            }
            for rows in &sets {
                let row = rows
                    .first()
                    .ok_or_else(|| shape("renewing", "no ROW_COUNT()"))?;
                out.push(renewed(col::<i64>("renewing", row, 0)? == 1));
            }
        }
        Ok(out)
    }

    /// See [`crate::observe::proclaim`]: the leader is the attempt whose lock row is live.
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        capabilities().check(KIND, grant.key.kind)?;
        let lk = self.key(&grant.key.name, LockKind::Election)?;
        let leads = (
            "dlock_table_locks",
            "h.attempt = ? AND h.owner IS NOT NULL AND h.expires_at > UTC_TIMESTAMP(6)",
            grant.attempt.as_str().to_owned(),
        );
        crate::observe::proclaim(&self.common, lk, (grant.token, seq, value), leads).await
    }

    /// The row, if its lease runs; an election's token is its row's (the counter's, as
    /// both change in the grant's transaction).
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let lk = self.key(name, kind)?;
        let live = "h.owner IS NOT NULL AND h.expires_at > UTC_TIMESTAMP(6)";
        let holders = ("dlock_table_locks", live);
        self.common.inspect((name, kind, lk), holders, false).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_decisions() {
        let (t, f) = (Some(true), Some(false));
        let held = |us: Option<u64>| {
            Some(AcquireReply::Held {
                ttl: us.map(Duration::from_micros),
            })
        };
        let granted = |token| Some(AcquireReply::Granted { token });
        // (live, mine, ended, token, left µs, new) → the answer (`None`: an error).
        let cases = [
            // A retry of the holding attempt: its token again.
            ((t, t, f, Some(7), Some(5), None), granted(7)),
            ((t, t, None, Some(0), None, None), None),
            // Held by another: its lease left.
            ((t, f, None, Some(7), Some(1500), None), held(Some(1500))),
            // Free: granted with the new token.
            ((f, f, f, Some(7), None, Some(8)), granted(8)),
            // A late copy of an ended attempt's request: never granted.
            ((f, None, t, Some(7), None, None), held(None)),
            // No row read at all, or free and nothing granted for no reason: a wrong reply.
            ((None, None, None, None, None, None), None),
            ((f, None, f, None, None, None), None),
        ];
        for (seen, want) in cases {
            let r = acquired(seen);
            match want {
                Some(w) => assert_eq!(r.ok(), Some(w), "{seen:?}"),
                None => assert!(matches!(r, Err(Error::UnexpectedReply { .. })), "{seen:?}"),
            }
        }
    }
}
