//! Session mode: `GET_LOCK` on a dedicated connection per holder.
//!
//! The lock lives as long as the holder's connection: when the process dies, its connection
//! closes and the server frees the lock. The lease is enforced by the server too: the
//! connection's `wait_timeout` is the lease (rounded up to whole seconds), renewals are
//! statements on that connection, so a holder that stops renewing is disconnected, and loses
//! the lock, when the lease ends. Waiting is server-side: `GET_LOCK(name, seconds left)`,
//! stopped with `KILL QUERY`.
//!
//! Tables: `dlock_fence` (last fencing token per lock key, bumped with
//! `LAST_INSERT_ID(token + 1)` while the lock is held) and `dlock_holders` (holder, count,
//! connection id, lease end — for `inspect` and the `Held` ttl; a row counts only while its
//! connection id is the one `IS_USED_LOCK` reports).

use crate::common::{lock_key, micros, wait_timeout_secs, Call, Common};
use crate::error::{conn_dead, shape, KIND};
use dlock_core::{
    AcquireReply, AcquireRequest, Error, Granted, HoldKey, HolderInfo, LockInfo, LockKind,
    ReleaseOutcome, RenewOutcome, Result,
};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub(crate) const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS dlock_fence (
        lock_key CHAR(38) CHARACTER SET ascii NOT NULL PRIMARY KEY,
        ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        token BIGINT UNSIGNED NOT NULL
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS dlock_holders (
        lock_key CHAR(38) CHARACTER SET ascii NOT NULL,
        owner VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        token BIGINT UNSIGNED NOT NULL,
        count INT UNSIGNED NOT NULL,
        conn_id BIGINT UNSIGNED NOT NULL,
        acquired_at DATETIME(6) NOT NULL,
        expires_at DATETIME(6) NOT NULL,
        PRIMARY KEY (lock_key, owner)
    ) ENGINE=InnoDB",
];

/// Bumps the name's fencing counter; `LAST_INSERT_ID()` then returns the new token.
pub(crate) const BUMP_FENCE: &str = "INSERT INTO dlock_fence (lock_key, ns, name, token) \
     VALUES (?, ?, ?, LAST_INSERT_ID(1)) \
     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)";

/// One owner's hold on one name, on its own connection.
struct OwnerSession {
    conn: Conn,
    count: u32,
    token: u64,
    /// Local estimate of when the server-side lease ends.
    lease_end: Instant,
    /// A final release was sent but its answer never came (timeout): if the lock turns out
    /// to be gone on the next try, that release did it.
    release_sent: bool,
}

#[derive(Default)]
struct Slot {
    state: tokio::sync::Mutex<Option<OwnerSession>>,
}

type SlotKey = (Arc<str>, Arc<str>);

pub(crate) struct SessionMode {
    common: Arc<Common>,
    slots: StdMutex<HashMap<SlotKey, Arc<Slot>>>,
}

fn check_kind(kind: LockKind) -> Result<()> {
    match kind {
        LockKind::Mutex => Ok(()),
        other => Err(Error::unsupported(
            KIND,
            format!(
                "lock kind {} (GET_LOCK has no shared mode; MySQL/MariaDB do mutexes only)",
                other.as_str()
            ),
        )),
    }
}

/// How a server-side wait ended.
enum WaitEnd {
    Got(i64),
    Failed(mysql_async::Error),
    /// Stopped (cancel or deadline); whether the lock was granted before the stop landed.
    Stopped(Option<bool>),
}

impl SessionMode {
    pub(crate) fn new(common: Arc<Common>) -> Self {
        SessionMode {
            common,
            slots: StdMutex::new(HashMap::new()),
        }
    }

    fn slot(&self, key: &HoldKey) -> Arc<Slot> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((key.name.clone(), key.owner.clone()))
            .or_default()
            .clone()
    }

    fn existing_slot(&self, key: &HoldKey) -> Option<Arc<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(key.name.clone(), key.owner.clone()))
            .cloned()
    }

    fn tidy(&self, key: &HoldKey, slot: Arc<Slot>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let k = (key.name.clone(), key.owner.clone());
        let ours = slots.get(&k).is_some_and(|s| Arc::ptr_eq(s, &slot));
        if ours && Arc::strong_count(&slot) == 2 {
            if let Ok(st) = slot.state.try_lock() {
                if st.is_none() {
                    drop(st);
                    slots.remove(&k);
                }
            }
        }
    }

    /// Hands a connection that holds no lock back to the pool, with the default idle timeout.
    async fn give_back(&self, mut conn: Conn) {
        let c = self
            .common
            .call(conn.query_drop("SET SESSION wait_timeout = @@GLOBAL.wait_timeout"))
            .await;
        if Common::reusable(&c) {
            self.common.put(conn);
        }
    }

    /// Records a grant `conn` holds and returns its fencing token. On error the connection
    /// is closed (freeing the lock).
    async fn register(&self, conn: &mut Conn, key: &HoldKey, lease: Duration) -> Result<u64> {
        let lk = lock_key(&self.common.namespace, &key.name);
        let ns = self.common.namespace.as_str();
        let name: &str = &key.name;
        let owner: &str = &key.owner;
        let secs = wait_timeout_secs(lease);
        let us = micros(lease);
        let c = self
            .common
            .call(async {
                conn.query_drop(format!("SET SESSION wait_timeout = {secs}"))
                    .await?;
                conn.exec_drop(BUMP_FENCE, (lk.as_str(), ns, name)).await?;
                let token: Option<u64> = conn.query_first("SELECT LAST_INSERT_ID()").await?;
                conn.exec_drop(
                    "DELETE FROM dlock_holders WHERE lock_key = ? AND owner <> ?",
                    (lk.as_str(), owner),
                )
                .await?;
                conn.exec_drop(
                    "REPLACE INTO dlock_holders \
                     (lock_key, owner, ns, name, token, count, conn_id, acquired_at, expires_at) \
                     VALUES (?, ?, ?, ?, ?, 1, CONNECTION_ID(), UTC_TIMESTAMP(6), \
                             UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)",
                    (lk.as_str(), owner, ns, name, token.unwrap_or(0), us),
                )
                .await?;
                Ok(token)
            })
            .await;
        match self.common.result("recording the grant", c)? {
            Some(t) if t > 0 => Ok(t),
            other => Err(shape("fencing token", format!("{other:?}"))),
        }
    }

    async fn holder_ttl(&self, lk: &str) -> Option<Duration> {
        let lk = lk.to_owned();
        let us: Option<i64> = self
            .common
            .with_conn("reading the holder's lease", move |c| {
                Box::pin(async move {
                    c.exec_first(
                        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
                         FROM dlock_holders WHERE lock_key = ? AND conn_id = IS_USED_LOCK(?)",
                        (lk.as_str(), lk.as_str()),
                    )
                    .await
                })
            })
            .await
            .ok()??;
        let us = us?;
        (us > 0).then(|| Duration::from_micros(us as u64))
    }

    async fn not_held_outcome(&self, name: &str) -> Result<ReleaseOutcome> {
        let lk = lock_key(&self.common.namespace, name);
        let used: Option<Option<u64>> = self
            .common
            .with_conn("checking the lock", move |c| {
                Box::pin(async move { c.exec_first("SELECT IS_USED_LOCK(?)", (lk,)).await })
            })
            .await?;
        Ok(if used.flatten().is_some() {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        check_kind(req.key.kind)?;
        let slot = self.slot(&req.key);
        let mut st = slot.state.lock().await;
        let r = self.attempt(&mut st, req).await;
        drop(st);
        self.tidy(&req.key, slot);
        r
    }

    /// Re-entry, or one try on a connection of its own.
    async fn attempt(
        &self,
        st: &mut Option<OwnerSession>,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        if let Some(os) = st.as_mut() {
            if let Some(token) = self.reenter(os, req).await? {
                return Ok(AcquireReply::Granted { token });
            }
            // The connection is gone, and the lock with it.
            *st = None;
        }
        let lk = lock_key(&self.common.namespace, &req.key.name);
        let mut conn = self.common.take().await?;
        let c = self
            .common
            .call(conn.exec_first::<Option<i64>, _, _>("SELECT GET_LOCK(?, 0)", (lk.as_str(),)))
            .await;
        match c {
            Call::Ok(Some(Some(1))) => {}
            Call::Ok(Some(Some(0))) => {
                self.common.put(conn);
                return Ok(AcquireReply::Held {
                    ttl: self.holder_ttl(&lk).await,
                });
            }
            Call::Ok(other) => return Err(shape("GET_LOCK", format!("{other:?}"))),
            other => {
                if matches!(&other, Call::Err(e) if conn_dead(e)) {
                    self.common.forget_idle();
                }
                return Err(self.common.error("GET_LOCK", other));
            }
        }
        let token = self.grant_on(st, conn, req, Instant::now()).await?;
        Ok(AcquireReply::Granted { token })
    }

    /// Re-entry on the owner's connection. `Ok(None)`: that connection is gone.
    async fn reenter(&self, os: &mut OwnerSession, req: &AcquireRequest) -> Result<Option<u64>> {
        let now = Instant::now();
        let end = os.lease_end.max(now + req.lease);
        let count = os.count.saturating_add(1);
        let left = end.saturating_duration_since(now);
        let lk = lock_key(&self.common.namespace, &req.key.name);
        let owner: &str = &req.key.owner;
        let secs = wait_timeout_secs(left);
        let us = micros(left);
        let conn = &mut os.conn;
        let c = self
            .common
            .call(async {
                conn.query_drop(format!("SET SESSION wait_timeout = {secs}"))
                    .await?;
                conn.exec_drop(
                    "UPDATE dlock_holders SET count = ?, \
                     expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                     WHERE lock_key = ? AND owner = ? AND conn_id = CONNECTION_ID()",
                    (count, us, lk.as_str(), owner),
                )
                .await
            })
            .await;
        match c {
            Call::Ok(()) => {
                os.count = count;
                os.lease_end = end;
                Ok(Some(os.token))
            }
            Call::Err(e) if conn_dead(&e) => Ok(None),
            other => Err(self.common.error("re-entering", other)),
        }
    }

    async fn grant_on(
        &self,
        st: &mut Option<OwnerSession>,
        mut conn: Conn,
        req: &AcquireRequest,
        sent: Instant,
    ) -> Result<u64> {
        // Closing the connection on error frees the lock.
        let token = self.register(&mut conn, &req.key, req.lease).await?;
        *st = Some(OwnerSession {
            conn,
            count: 1,
            token,
            lease_end: sent + req.lease,
            release_sent: false,
        });
        Ok(token)
    }

    pub(crate) async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        check_kind(req.key.kind)?;
        let mut backoff = dlock_core::backoff::Backoff::default();
        loop {
            let slot = self.slot(&req.key);
            let mut st = tokio::select! {
                g = slot.state.lock() => g,
                _ = cancel.cancelled() => return Ok(None),
                _ = sleep_until(deadline) => return Ok(None),
            };
            let r = self.wait_in(&mut st, req, deadline, cancel).await;
            drop(st);
            self.tidy(&req.key, slot);
            match r {
                Err(e) if e.is_retryable() => {
                    let pause = backoff.next_delay();
                    tracing::debug!(error = %e, ?pause, "waiting for a mysql lock failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = cancel.cancelled() => return Ok(None),
                        _ = sleep_until(deadline) => return Ok(None),
                    }
                }
                Ok(None)
                    if !cancel.is_cancelled() && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    // A bounded server-side wait (an hour without a deadline) ended before
                    // the deadline: wait out the rest.
                }
                other => return other,
            }
        }
    }

    async fn wait_in(
        &self,
        st: &mut Option<OwnerSession>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let sent = Instant::now();
        if let Some(os) = st.as_mut() {
            if let Some(token) = self.reenter(os, req).await? {
                return Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }));
            }
            *st = None;
        }
        let lk = lock_key(&self.common.namespace, &req.key.name);
        let mut conn = self.common.take().await?;
        let id = conn.id();
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if remaining.is_some_and(|r| r.is_zero()) || cancel.is_cancelled() {
            self.common.put(conn);
            return Ok(None);
        }
        // Without a deadline, wait in bounded rounds of an hour.
        // Rounded up to the millisecond: the server must not give up before the deadline.
        let secs = remaining.map_or(3600.0, |r| {
            (r.as_micros().div_ceil(1000) + 1) as f64 / 1000.0
        });
        let end = {
            // The key is `dlock:` and hex digits, safe to inline; inlined, it shows in
            // SHOW PROCESSLIST, so operators see which lock a connection waits for.
            let wait =
                conn.query_first::<Option<i64>, _>(format!("SELECT GET_LOCK('{lk}', {secs:.3})"));
            tokio::pin!(wait);
            let net = deadline.map(|d| d + Duration::from_millis(300));
            let done = tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                r = &mut wait => Some(r),
                _ = sleep_until(net) => None,
            };
            match done {
                // Granted as the caller went away: give it straight back.
                Some(Ok(Some(Some(1)))) if cancel.is_cancelled() => WaitEnd::Stopped(Some(true)),
                Some(Ok(Some(Some(v)))) => WaitEnd::Got(v),
                Some(Ok(_)) => WaitEnd::Got(-1),
                Some(Err(e)) => WaitEnd::Failed(e),
                None => {
                    // Stop the server-side wait, then see how it ended.
                    if let Err(e) = self.common.kill_query(id).await {
                        tracing::debug!(error = %e, "KILL QUERY failed");
                    }
                    match tokio::time::timeout(self.common.op_timeout, &mut wait).await {
                        Ok(Ok(Some(Some(1)))) => WaitEnd::Stopped(Some(true)),
                        Ok(Ok(_)) => WaitEnd::Stopped(Some(false)),
                        Ok(Err(mysql_async::Error::Server(s))) if s.code == 1317 => {
                            WaitEnd::Stopped(Some(false))
                        }
                        _ => WaitEnd::Stopped(None),
                    }
                }
            }
        };
        match end {
            WaitEnd::Got(1) => {
                let sent = Instant::now();
                let token = self.grant_on(st, conn, req, sent).await?;
                Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }))
            }
            WaitEnd::Got(0) => {
                self.common.put(conn);
                Ok(None)
            }
            WaitEnd::Got(_) => Err(shape("GET_LOCK", "NULL")),
            WaitEnd::Failed(e) => {
                if !conn_dead(&e) {
                    self.common.put(conn);
                }
                Err(crate::error::map(&self.common.endpoint, e))
            }
            WaitEnd::Stopped(Some(true)) => {
                let c = self
                    .common
                    .call(conn.exec_drop("DO RELEASE_LOCK(?)", (lk.as_str(),)))
                    .await;
                if Common::reusable(&c) {
                    self.common.put(conn);
                }
                Ok(None)
            }
            WaitEnd::Stopped(Some(false)) => {
                self.common.put(conn);
                Ok(None)
            }
            WaitEnd::Stopped(None) => Ok(None),
        }
    }

    pub(crate) async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        check_kind(key.kind)?;
        let Some(slot) = self.existing_slot(key) else {
            return self.not_held_outcome(&key.name).await;
        };
        let mut st = slot.state.lock().await;
        let r = self.release_in(&mut st, key).await;
        drop(st);
        self.tidy(key, slot);
        r
    }

    async fn release_in(
        &self,
        st: &mut Option<OwnerSession>,
        key: &HoldKey,
    ) -> Result<ReleaseOutcome> {
        let Some(os) = st.as_mut() else {
            return self.not_held_outcome(&key.name).await;
        };
        let lk = lock_key(&self.common.namespace, &key.name);
        let owner: &str = &key.owner;
        if os.count > 1 {
            let remaining = os.count - 1;
            let conn = &mut os.conn;
            let c = self
                .common
                .call(conn.exec_drop(
                    "UPDATE dlock_holders SET count = ? \
                     WHERE lock_key = ? AND owner = ? AND conn_id = CONNECTION_ID()",
                    (remaining, lk.as_str(), owner),
                ))
                .await;
            return match c {
                Call::Ok(()) => {
                    os.count = remaining;
                    Ok(ReleaseOutcome::StillHeld { remaining })
                }
                Call::Err(e) if conn_dead(&e) => {
                    *st = None;
                    self.not_held_outcome(&key.name).await
                }
                other => Err(self.common.error("releasing", other)),
            };
        }
        let sent_before = os.release_sent;
        let conn = &mut os.conn;
        let c = self
            .common
            .call(async {
                conn.exec_drop(
                    "DELETE FROM dlock_holders \
                     WHERE lock_key = ? AND owner = ? AND conn_id = CONNECTION_ID()",
                    (lk.as_str(), owner),
                )
                .await?;
                conn.exec_first::<Option<i64>, _, _>("SELECT RELEASE_LOCK(?)", (lk.as_str(),))
                    .await
            })
            .await;
        match c {
            Call::Ok(v) => {
                if let Some(os) = st.take() {
                    self.give_back(os.conn).await;
                }
                if v.flatten() == Some(1) || sent_before {
                    Ok(ReleaseOutcome::Released)
                } else {
                    self.not_held_outcome(&key.name).await
                }
            }
            Call::Err(e) if conn_dead(&e) => {
                *st = None;
                if sent_before {
                    Ok(ReleaseOutcome::Released)
                } else {
                    self.not_held_outcome(&key.name).await
                }
            }
            other => {
                os.release_sent = true;
                Err(self.common.error("releasing", other))
            }
        }
    }

    pub(crate) async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        for (k, _) in holds {
            check_kind(k.kind)?;
        }
        let all =
            futures_util::future::join_all(holds.iter().map(|(k, l)| self.renew_one(k, *l))).await;
        all.into_iter().collect()
    }

    async fn renew_one(&self, key: &HoldKey, lease: Duration) -> Result<RenewOutcome> {
        let Some(slot) = self.existing_slot(key) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let mut st = slot.state.lock().await;
        let r = self.renew_in(&mut st, key, lease).await;
        drop(st);
        self.tidy(key, slot);
        r
    }

    async fn renew_in(
        &self,
        st: &mut Option<OwnerSession>,
        key: &HoldKey,
        lease: Duration,
    ) -> Result<RenewOutcome> {
        let Some(os) = st.as_mut() else {
            return Ok(RenewOutcome::NotHeld);
        };
        if os.release_sent {
            // A release is under way (its answer was lost; the core is retrying it): the lock
            // is, or is about to be, given back. Leave the state to that release.
            return Ok(RenewOutcome::NotHeld);
        }
        let lk = lock_key(&self.common.namespace, &key.name);
        let owner: &str = &key.owner;
        let sent = Instant::now();
        let secs = wait_timeout_secs(lease);
        let us = micros(lease);
        let conn = &mut os.conn;
        let c = self
            .common
            .call(async {
                conn.query_drop(format!("SET SESSION wait_timeout = {secs}"))
                    .await?;
                conn.exec_drop(
                    "UPDATE dlock_holders \
                     SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                     WHERE lock_key = ? AND owner = ? AND conn_id = CONNECTION_ID()",
                    (us, lk.as_str(), owner),
                )
                .await?;
                Ok(conn.affected_rows())
            })
            .await;
        match c {
            Call::Ok(1) => {
                os.lease_end = sent + lease;
                Ok(RenewOutcome::Renewed)
            }
            Call::Ok(_) => {
                // The holder's row was deleted (an operator revoked the lock): give it up.
                tracing::warn!(name = %key.name, owner = %key.owner, "dlock_holders row gone: the lock was revoked");
                if let Some(mut os) = st.take() {
                    let c = self
                        .common
                        .call(os.conn.exec_drop("DO RELEASE_LOCK(?)", (lk.as_str(),)))
                        .await;
                    if Common::reusable(&c) {
                        self.give_back(os.conn).await;
                    }
                }
                Ok(RenewOutcome::NotHeld)
            }
            Call::Err(e) if conn_dead(&e) => {
                *st = None;
                Ok(RenewOutcome::NotHeld)
            }
            other => Err(self.common.error("renewing", other)),
        }
    }

    pub(crate) async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        check_kind(kind)?;
        let lk = lock_key(&self.common.namespace, name);
        let (rows, token) = self
            .common
            .with_conn("inspecting", move |c| {
                Box::pin(async move {
                    let rows: Vec<(String, u32, Option<i64>)> = c
                        .exec(
                            "SELECT owner, count, \
                             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
                             FROM dlock_holders WHERE lock_key = ? AND conn_id = IS_USED_LOCK(?)",
                            (lk.as_str(), lk.as_str()),
                        )
                        .await?;
                    let token: Option<u64> = c
                        .exec_first("SELECT token FROM dlock_fence WHERE lock_key = ?", (lk,))
                        .await?;
                    Ok((rows, token))
                })
            })
            .await?;
        Ok(LockInfo {
            name: name.to_owned(),
            holders: rows
                .into_iter()
                .map(|(owner, count, us)| HolderInfo {
                    owner,
                    count,
                    lease_left: us.map(|us| Duration::from_micros(us.max(0) as u64)),
                    side: None,
                })
                .collect(),
            fencing_token: token.unwrap_or(0),
            ..Default::default()
        })
    }

    /// The connection id holding `name` for `owner` in this client (`KILL id` revokes it).
    pub(crate) async fn holder_connection(&self, name: &str, owner: &str) -> Option<u32> {
        let key = HoldKey {
            name: Arc::from(name),
            owner: Arc::from(owner),
            kind: LockKind::Mutex,
        };
        let slot = self.existing_slot(&key)?;
        let st = slot.state.lock().await;
        st.as_ref().map(|os| os.conn.id())
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
