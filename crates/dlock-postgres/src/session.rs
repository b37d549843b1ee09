//! Session mode: PostgreSQL session-level advisory locks, each holder on its own connection.
//!
//! A holder's lock lives exactly as long as its dedicated connection (the *session*): when
//! the process dies, its connection closes and the server frees the lock at once. The lease
//! is enforced by the server too: the session's `idle_session_timeout` is the lease plus a
//! grace (renewals are queries on that session, which restart the timer), so a holder that
//! hangs or is cut off loses its session, and with it the lock, when the lease ends
//! (PostgreSQL 14+).
//!
//! Tables: `dlock_fence` (last fencing token per name, bumped from the sequence
//! `dlock_fence_seq`) and `dlock_holders` (one row per holding owner and kind: token, count,
//! backend pid, lease end — for `inspect` and for the `Held` ttl; rows whose pid no longer
//! holds the advisory lock are ignored and cleaned up by the next exclusive grant).

use crate::common::{channel, key_oids, kind_name, lock_key, Common};
use crate::error::{is_code, map, shape, KIND};
use dlock_core::{
    AcquireReply, AcquireRequest, Backend, Error, Granted, HoldKey, HolderInfo, LockInfo, LockKind,
    LostReason, LostSignal, ReleaseOutcome, RenewOutcome, Result,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, Row};
use tokio_util::sync::CancellationToken;

/// The schema of session mode.
pub(crate) const DDL: &str = "
CREATE SEQUENCE IF NOT EXISTS dlock_fence_seq;
CREATE TABLE IF NOT EXISTS dlock_fence (
    ns text NOT NULL,
    name text NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (ns, name)
);
CREATE TABLE IF NOT EXISTS dlock_holders (
    ns text NOT NULL,
    name text NOT NULL,
    owner text NOT NULL,
    kind text NOT NULL,
    token bigint NOT NULL,
    count integer NOT NULL,
    pid integer NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (ns, name, owner, kind)
);";

pub(crate) const TABLES: &[&str] = &["dlock_fence_seq", "dlock_fence", "dlock_holders"];

/// Grants a fencing token and records the holder; also sets the session's lease.
/// $1 ns, $2 name, $3 owner, $4 kind, $5 lease ms, $6 idle timeout, $7 exclusive, $8 GUC.
const REGISTER: &str = "
WITH f AS (
    INSERT INTO dlock_fence AS f (ns, name, token) VALUES ($1, $2, nextval('dlock_fence_seq'))
    ON CONFLICT (ns, name) DO UPDATE SET token = nextval('dlock_fence_seq')
    RETURNING f.token
), s AS MATERIALIZED (
    SELECT set_config($8, $6, false) AS v
), d AS (
    DELETE FROM dlock_holders
    WHERE ns = $1 AND name = $2 AND $7 AND pid <> pg_backend_pid()
      AND NOT (owner = $3 AND kind = $4)
)
INSERT INTO dlock_holders AS h (ns, name, owner, kind, token, count, pid, acquired_at, expires_at)
SELECT $1, $2, $3, $4, f.token, 1, pg_backend_pid(), now(), now() + $5 * interval '1 millisecond'
FROM f, s
ON CONFLICT (ns, name, owner, kind) DO UPDATE
SET token = EXCLUDED.token, count = 1, pid = EXCLUDED.pid,
    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
RETURNING h.token";
const REGISTER_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::FLOAT8,
    Type::TEXT,
    Type::BOOL,
    Type::TEXT,
];

/// Re-entry (and renewal): new count, lease never shortened here; sets the session's lease.
/// $1..$4 ids, $5 count, $6 lease ms, $7 idle timeout, $8 GUC, $9 extend only (re-entry).
const REFRESH: &str = "
WITH s AS MATERIALIZED (SELECT set_config($8, $7, false) AS v)
UPDATE dlock_holders
SET count = $5,
    expires_at = CASE WHEN $9 THEN GREATEST(expires_at, now() + $6 * interval '1 millisecond')
                      ELSE now() + $6 * interval '1 millisecond' END
FROM s
WHERE ns = $1 AND name = $2 AND owner = $3 AND kind = $4 AND pid = pg_backend_pid()
RETURNING 1";
const REFRESH_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT4,
    Type::FLOAT8,
    Type::TEXT,
    Type::TEXT,
    Type::BOOL,
];

/// The last release of one kind: forget the holder, unlock, wake waiters, reset the lease.
/// $1..$4 ids, $5 key, $6 channel, $7 idle timeout, $8 GUC.
const RELEASE_EXCL: &str = "
WITH d AS (DELETE FROM dlock_holders
           WHERE ns = $1 AND name = $2 AND owner = $3 AND kind = $4 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock($5), pg_notify($6, ''), set_config($8, $7, false)";
const RELEASE_SHARED: &str = "
WITH d AS (DELETE FROM dlock_holders
           WHERE ns = $1 AND name = $2 AND owner = $3 AND kind = $4 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock_shared($5), pg_notify($6, ''), set_config($8, $7, false)";
const RELEASE_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
];

/// Live holders (rows whose backend holds the advisory key right now).
const LIVE: &str = "
EXISTS (SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid
          AND l.classid = $3 AND l.objid = $4 AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))";

/// Whether anybody holds the key. $1 classid, $2 objid.
const ANY_HOLDER: &str = "
SELECT EXISTS (SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted
                 AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))";

/// Sessions waiting for the key. $1 classid, $2 objid.
const WAITERS: &str = "
SELECT count(*) FROM pg_locks l
WHERE l.locktype = 'advisory' AND NOT l.granted
  AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())";

const FENCE: &str = "SELECT token FROM dlock_fence WHERE ns = $1 AND name = $2";

/// One connection dedicated to one (name, owner): its locks are the owner's holds.
pub(crate) struct Session {
    client: Client,
    pid: i32,
    ended: CancellationToken,
    end: Arc<StdMutex<EndState>>,
}

#[derive(Default)]
struct EndState {
    /// Lost signals of the holds on this session, fired when the connection ends.
    signals: HashMap<LockKind, LostSignal>,
    reason: Option<LostReason>,
}

impl Session {
    fn is_dead(&self) -> bool {
        self.ended.is_cancelled() || self.client.is_closed()
    }

    fn end(&self) -> std::sync::MutexGuard<'_, EndState> {
        self.end.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fires `lost` when this session ends (at once if it already has).
    fn watch_lost(&self, kind: LockKind, lost: LostSignal) {
        let mut end = self.end();
        match &end.reason {
            Some(reason) => lost.fire(reason.clone()),
            None => {
                end.signals.insert(kind, lost);
            }
        }
    }

    fn unwatch_lost(&self, kind: LockKind) {
        self.end().signals.remove(&kind);
    }

    fn unwatch_all(&self) {
        self.end().signals.clear();
    }
}

/// The holds one owner has on one name, all on one session.
struct OwnerSession {
    session: Arc<Session>,
    holds: HashMap<LockKind, HoldState>,
}

struct HoldState {
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

/// Idle sessions kept for reuse.
const POOL_MAX: usize = 8;

pub(crate) struct SessionMode {
    common: Arc<Common>,
    slots: StdMutex<HashMap<SlotKey, Arc<Slot>>>,
    pool: StdMutex<Vec<Arc<Session>>>,
}

fn exclusive(kind: LockKind) -> bool {
    !matches!(kind, LockKind::Read)
}

/// Session mode does mutexes, fair locks (PostgreSQL queues waiters in arrival order and a
/// newcomer queues behind a conflicting waiter) and read-write locks.
fn check_kind(kind: LockKind) -> Result<()> {
    match kind {
        LockKind::Mutex | LockKind::Fair | LockKind::Read | LockKind::Write => Ok(()),
        other => Err(Error::unsupported(
            KIND,
            format!("lock kind {}", other.as_str()),
        )),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// How long after a lease ends the server ends the holder's session: half the lease, at most
/// 5 s. The guard's lost signal fires at the lease end itself; the grace keeps a holder that
/// was merely slow to renew (a loaded machine) from losing its session while its own view
/// still says it holds the lock.
pub(crate) fn grace(lease: Duration) -> Duration {
    (lease / 2).min(Duration::from_secs(5))
}

/// The `idle_session_timeout` value for leases ending at `ends` ("0": none), grace included.
fn idle_value(ends: impl Iterator<Item = Instant>) -> String {
    let now = Instant::now();
    match ends.max() {
        None => "0".into(),
        Some(end) => {
            let left = end.saturating_duration_since(now);
            (left + grace(left))
                .as_millis()
                .clamp(1, i32::MAX as u128)
                .to_string()
        }
    }
}

impl SessionMode {
    pub(crate) fn new(common: Arc<Common>) -> Self {
        SessionMode {
            common,
            slots: StdMutex::new(HashMap::new()),
            pool: StdMutex::new(Vec::new()),
        }
    }

    /// The setting that carries the lease: `idle_session_timeout`, or a harmless custom
    /// placeholder on servers older than 14 (which cannot enforce the lease server-side).
    fn lease_guc(&self) -> &'static str {
        if self.common.has_session_timeouts() {
            "idle_session_timeout"
        } else {
            "dlock.idle_session_timeout"
        }
    }

    fn endpoint(&self) -> &str {
        &self.common.endpoint
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

    /// Forgets an empty slot nobody else is using.
    fn tidy(&self, key: &HoldKey, slot: Arc<Slot>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let k = (key.name.clone(), key.owner.clone());
        let ours = slots.get(&k).is_some_and(|s| Arc::ptr_eq(s, &slot));
        // The map and `slot` are the only references: nobody can be about to use it.
        if ours && Arc::strong_count(&slot) == 2 {
            if let Ok(st) = slot.state.try_lock() {
                if st.is_none() {
                    drop(st);
                    slots.remove(&k);
                }
            }
        }
    }

    /// Opens a session: its own connection, whose end fires the lost signals of its holds.
    async fn open_session(&self) -> Result<Arc<Session>> {
        let (client, conn) = self.common.open().await?;
        let ended = CancellationToken::new();
        let end: Arc<StdMutex<EndState>> = Arc::default();
        let (ended2, end2) = (ended.clone(), end.clone());
        let endpoint = self.common.endpoint.clone();
        tokio::spawn(async move {
            let res = conn.await;
            let reason = match &res {
                Err(e) if is_code(e, &SqlState::IDLE_SESSION_TIMEOUT) => LostReason::LeaseExpired,
                Err(e) => match e.as_db_error() {
                    Some(db) => LostReason::SessionEnded(format!(
                        "the server ended the session holding the lock: {} (SQLSTATE {})",
                        db.message(),
                        db.code().code()
                    )),
                    None => LostReason::SessionEnded(format!(
                        "the connection to {endpoint} holding the lock broke: {e}"
                    )),
                },
                Ok(()) => LostReason::SessionEnded(format!(
                    "the connection to {endpoint} holding the lock was closed by the server"
                )),
            };
            let signals = {
                let mut st = end2.lock().unwrap_or_else(|p| p.into_inner());
                st.reason = Some(reason.clone());
                std::mem::take(&mut st.signals)
            };
            ended2.cancel();
            if !signals.is_empty() {
                tracing::warn!(%reason, "postgres session holding locks ended");
            }
            for lost in signals.into_values() {
                lost.fire(reason.clone());
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
            end,
        }))
    }

    async fn take_session(&self) -> Result<Arc<Session>> {
        loop {
            let next = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match next {
                Some(s) if !s.is_dead() => return Ok(s),
                Some(_) => continue,
                None => return self.open_session().await,
            }
        }
    }

    /// Puts a session without holds back into the pool (or closes it).
    fn put_session(&self, s: Arc<Session>) {
        s.unwatch_all();
        if s.is_dead() || Arc::strong_count(&s) > 1 {
            return;
        }
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < POOL_MAX {
            pool.push(s);
        }
    }

    /// Closes a session whose state is unknown (a lock may be held): the server frees
    /// whatever it holds.
    fn discard(&self, s: Arc<Session>) {
        s.unwatch_all();
        drop(s);
    }

    async fn query(
        &self,
        s: &Session,
        what: &str,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        self.common
            .run(what, s.client.query_typed(sql, params))
            .await
    }

    async fn try_lock(&self, s: &Session, kind: LockKind, key: i64) -> Result<bool> {
        let sql = if exclusive(kind) {
            "SELECT pg_try_advisory_lock($1)"
        } else {
            "SELECT pg_try_advisory_lock_shared($1)"
        };
        let rows = self
            .query(s, "trying the lock", sql, &[(&key, Type::INT8)])
            .await?;
        rows.first()
            .and_then(|r| r.try_get::<_, bool>(0).ok())
            .ok_or_else(|| shape("pg_try_advisory_lock", format!("{} rows", rows.len())))
    }

    async fn unlock(&self, s: &Session, kind: LockKind, key: i64) -> Result<()> {
        let sql = if exclusive(kind) {
            "SELECT pg_advisory_unlock($1)"
        } else {
            "SELECT pg_advisory_unlock_shared($1)"
        };
        self.query(s, "unlocking", sql, &[(&key, Type::INT8)])
            .await
            .map(|_| ())
    }

    /// Records a grant made on `s` and returns its fencing token.
    async fn register(
        &self,
        s: &Session,
        key: &HoldKey,
        lease: Duration,
        idle: &str,
    ) -> Result<u64> {
        let ns = self.common.namespace.as_str();
        let kind = kind_name(key.kind);
        let lease_ms = ms(lease);
        let excl = exclusive(key.kind);
        let guc = self.lease_guc();
        let name: &str = &key.name;
        let owner: &str = &key.owner;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
            [&ns, &name, &owner, &kind, &lease_ms, &idle, &excl, &guc];
        let typed: Vec<_> = params
            .iter()
            .zip(REGISTER_TYPES)
            .map(|(p, t)| (*p, t.clone()))
            .collect();
        let rows = self
            .query(s, "recording the grant", REGISTER, &typed)
            .await?;
        let token: i64 = rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .ok_or_else(|| shape("recording the grant", format!("{} rows", rows.len())))?;
        u64::try_from(token).map_err(|_| shape("fencing token", token))
    }

    /// Updates a hold's row on its session: count, lease (extend only, or set), session lease.
    async fn refresh(
        &self,
        s: &Session,
        key: &HoldKey,
        count: u32,
        lease: Duration,
        idle: &str,
        extend_only: bool,
    ) -> Result<bool> {
        let ns = self.common.namespace.as_str();
        let kind = kind_name(key.kind);
        let name: &str = &key.name;
        let owner: &str = &key.owner;
        let count = i32::try_from(count).unwrap_or(i32::MAX);
        let lease_ms = ms(lease);
        let guc = self.lease_guc();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
            &ns,
            &name,
            &owner,
            &kind,
            &count,
            &lease_ms,
            &idle,
            &guc,
            &extend_only,
        ];
        let typed: Vec<_> = params
            .iter()
            .zip(REFRESH_TYPES)
            .map(|(p, t)| (*p, t.clone()))
            .collect();
        let rows = self
            .query(s, "refreshing the hold", REFRESH, &typed)
            .await?;
        Ok(!rows.is_empty())
    }

    /// The longest remaining lease among the live holders of `name`.
    async fn holder_ttl(&self, name: &str, key: i64) -> Option<Duration> {
        let (classid, objid) = key_oids(key);
        let sql = format!(
            "SELECT max(EXTRACT(EPOCH FROM (h.expires_at - now())) * 1000)::float8 \
             FROM dlock_holders h WHERE h.ns = $1 AND h.name = $2 AND {LIVE}"
        );
        let client = self.common.control().await.ok()?;
        let ns = self.common.namespace.as_str();
        let rows = self
            .common
            .run(
                "reading the holder's lease",
                client.query_typed(
                    &sql,
                    &[
                        (&ns, Type::TEXT),
                        (&name, Type::TEXT),
                        (&classid, Type::OID),
                        (&objid, Type::OID),
                    ],
                ),
            )
            .await
            .ok()?;
        let left: f64 = rows.first()?.try_get::<_, Option<f64>>(0).ok()??;
        (left.is_finite() && left > 0.0).then(|| Duration::from_secs_f64(left / 1000.0))
    }

    /// What to report when `key` is not (or no longer) held by its owner here.
    async fn not_held_outcome(&self, name: &str) -> Result<ReleaseOutcome> {
        let key = lock_key(&self.common.namespace, name);
        let (classid, objid) = key_oids(key);
        let client = self.common.control().await?;
        let rows = self
            .common
            .run(
                "checking the lock",
                client.query_typed(ANY_HOLDER, &[(&classid, Type::OID), (&objid, Type::OID)]),
            )
            .await?;
        let held: bool = rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .ok_or_else(|| shape("checking the lock", format!("{} rows", rows.len())))?;
        Ok(if held {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Forgets the owner's session if its connection is gone (its holds are lost; the
    /// session's end already fired their signals).
    fn drop_if_dead(st: &mut Option<OwnerSession>) {
        if st.as_ref().is_some_and(|os| os.session.is_dead()) {
            *st = None;
        }
    }

    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        check_kind(req.key.kind)?;
        let slot = self.slot(&req.key);
        let mut st = slot.state.lock().await;
        let r = self.attempt(&mut st, req).await;
        drop(st);
        self.tidy(&req.key, slot);
        r.map(|(reply, _)| reply)
    }

    /// One attempt; also returns the local time the grant's lease runs from.
    async fn attempt(
        &self,
        st: &mut Option<OwnerSession>,
        req: &AcquireRequest,
    ) -> Result<(AcquireReply, Instant)> {
        let key = lock_key(&self.common.namespace, &req.key.name);
        let kind = req.key.kind;
        Self::drop_if_dead(st);
        if let Some(os) = st.as_mut() {
            let sent = Instant::now();
            if let Some(h) = os.holds.get(&kind) {
                // Re-entry: count it, never shorten the lease.
                let end = h.lease_end.max(sent + req.lease);
                let count = h.count.saturating_add(1);
                let idle =
                    idle_value(
                        os.holds
                            .iter()
                            .map(|(k, h)| if *k == kind { end } else { h.lease_end }),
                    );
                let left = end.saturating_duration_since(sent);
                match self
                    .refresh(&os.session, &req.key, count, left, &idle, true)
                    .await
                {
                    Ok(_) => {
                        let token = h.token;
                        if let Some(h) = os.holds.get_mut(&kind) {
                            h.count = count;
                            h.lease_end = end;
                        }
                        return Ok((AcquireReply::Granted { token }, sent));
                    }
                    Err(e) if os.session.is_dead() => {
                        tracing::debug!(error = %e, "session gone during re-entry");
                        *st = None;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                if exclusive(kind) && !os.holds.keys().any(|k| exclusive(*k)) {
                    return Err(Error::invalid(format!(
                        "owner `{}` holds the read side of `{}` and asked for the write side: an \
                         upgrade would deadlock with other readers doing the same; release the \
                         read lock first",
                        req.key.owner, req.key.name
                    )));
                }
                // The owner holds the write side and takes the read side (a downgrade): same
                // session, so the server sees one holder.
                let s = os.session.clone();
                if !self.try_lock(&s, kind, key).await? {
                    return Ok((
                        AcquireReply::Held {
                            ttl: self.holder_ttl(&req.key.name, key).await,
                        },
                        sent,
                    ));
                }
                let end = sent + req.lease;
                let idle = idle_value(os.holds.values().map(|h| h.lease_end).chain([end]));
                match self.register(&s, &req.key, req.lease, &idle).await {
                    Ok(token) => {
                        s.watch_lost(kind, req.lost.clone());
                        os.holds.insert(
                            kind,
                            HoldState {
                                count: 1,
                                token,
                                lease_end: end,
                                release_sent: false,
                            },
                        );
                        return Ok((AcquireReply::Granted { token }, sent));
                    }
                    Err(e) => {
                        if self.unlock(&s, kind, key).await.is_err() {
                            // Unknown state: give up the whole session (its holds are lost).
                            *st = None;
                        }
                        return Err(e);
                    }
                }
            }
        }
        // A fresh grant on a session of its own.
        let s = self.take_session().await?;
        let sent = Instant::now();
        match self.try_lock(&s, kind, key).await {
            Ok(true) => {}
            Ok(false) => {
                self.put_session(s);
                return Ok((
                    AcquireReply::Held {
                        ttl: self.holder_ttl(&req.key.name, key).await,
                    },
                    sent,
                ));
            }
            Err(e) => {
                self.discard(s);
                return Err(e);
            }
        }
        let token = self.grant_on(st, s, req, sent).await?;
        Ok((AcquireReply::Granted { token }, sent))
    }

    /// Records a fresh grant whose lock `s` holds, and makes `s` the owner's session.
    async fn grant_on(
        &self,
        st: &mut Option<OwnerSession>,
        s: Arc<Session>,
        req: &AcquireRequest,
        sent: Instant,
    ) -> Result<u64> {
        let end = sent + req.lease;
        let idle = idle_value([end].into_iter());
        match self.register(&s, &req.key, req.lease, &idle).await {
            Ok(token) => {
                s.watch_lost(req.key.kind, req.lost.clone());
                let mut holds = HashMap::new();
                holds.insert(
                    req.key.kind,
                    HoldState {
                        count: 1,
                        token,
                        lease_end: end,
                        release_sent: false,
                    },
                );
                *st = Some(OwnerSession { session: s, holds });
                Ok(token)
            }
            Err(e) => {
                // Closing the connection frees the lock it may hold.
                self.discard(s);
                Err(e)
            }
        }
    }

    /// Waits server-side: a blocking `pg_advisory_lock` on the future holder's own session,
    /// bounded by `lock_timeout` (the deadline) and cancelled with a CancelRequest. The
    /// server queues waiters in arrival order and wakes exactly one per release.
    pub(crate) async fn acquire_wait(
        &self,
        outer: &dyn Backend,
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
            Self::drop_if_dead(&mut st);
            if st.is_some() {
                // This owner already has a session on this name (re-entry, or the other side
                // of a read-write lock): attempts on that session, woken by notifications.
                drop(st);
                self.tidy(&req.key, slot);
                return dlock_core::wait::watch_and_retry(outer, req, deadline, cancel).await;
            }
            let r = self.fresh_wait(&mut st, req, deadline, cancel).await;
            drop(st);
            self.tidy(&req.key, slot);
            match r {
                Ok(None)
                    if !cancel.is_cancelled() && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    // The server's timer ended the wait a hair early: wait out the rest.
                }
                Err(e) if e.is_retryable() => {
                    let pause = backoff.next_delay();
                    tracing::debug!(error = %e, ?pause, "waiting for a postgres lock failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = cancel.cancelled() => return Ok(None),
                        _ = sleep_until(deadline) => return Ok(None),
                    }
                }
                other => return other,
            }
        }
    }

    async fn fresh_wait(
        &self,
        st: &mut Option<OwnerSession>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let key = lock_key(&self.common.namespace, &req.key.name);
        let kind = req.key.kind;
        let s = self.take_session().await?;
        let sent = Instant::now();
        match self.try_lock(&s, kind, key).await {
            Ok(true) => {
                let token = self.grant_on(st, s, req, sent).await?;
                return Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }));
            }
            Ok(false) => {}
            Err(e) => {
                self.discard(s);
                return Err(e);
            }
        }
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if remaining.is_some_and(|r| r.is_zero()) || cancel.is_cancelled() {
            self.put_session(s);
            return Ok(None);
        }
        let lock_timeout = remaining.map_or_else(
            || "0".to_string(),
            // Rounded up: the server must not give up before the deadline.
            |r| {
                format!(
                    "{}ms",
                    (r.as_micros().div_ceil(1000) + 1).min(i32::MAX as u128)
                )
            },
        );
        let func = if exclusive(kind) {
            "pg_advisory_lock"
        } else {
            "pg_advisory_lock_shared"
        };
        // One round trip, one implicit transaction: `lock_timeout` bounds this wait only and
        // reverts afterwards (a session-level advisory lock outlives the transaction). The
        // key is an integer: safe to inline.
        let sql = format!("SET LOCAL lock_timeout = '{lock_timeout}'; SELECT {func}({key})");
        let end = {
            let wait = s.client.simple_query(&sql);
            tokio::pin!(wait);
            // Safety net should the server's timer be late: stop a little after the deadline.
            let net = deadline.map(|d| d + Duration::from_millis(300));
            let done = tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                r = &mut wait => Some(r),
                _ = sleep_until(net) => None,
            };
            match done {
                // Granted as the caller went away: give it straight back.
                Some(Ok(_)) if cancel.is_cancelled() => WaitEnd::StoppedGranted,
                Some(Ok(_)) => WaitEnd::Granted,
                Some(Err(e)) => WaitEnd::Failed(e),
                None => {
                    // Stopping. First queue `pg_advisory_unlock_all()` right behind the wait on
                    // this session: the server runs it the moment the wait ends, granted or
                    // not, so a grant that races with the stop is given back at once. Then
                    // stop the wait (a signal through the open control connection is much
                    // faster than a CancelRequest, which needs a new connection).
                    let limit = self.common.op_timeout;
                    let unlock = s.client.query_typed("SELECT pg_advisory_unlock_all()", &[]);
                    let stop = async {
                        if !self.cancel_backend(s.pid).await {
                            let cancel_req = s.client.cancel_token();
                            let _ =
                                tokio::time::timeout(limit, cancel_req.cancel_query(NoTls)).await;
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
                // The lease runs from the registration, which starts now.
                let sent = Instant::now();
                let token = self.grant_on(st, s, req, sent).await?;
                Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }))
            }
            WaitEnd::Failed(e) if is_code(&e, &SqlState::LOCK_NOT_AVAILABLE) => {
                // lock_timeout: the deadline passed.
                self.put_session(s);
                Ok(None)
            }
            WaitEnd::Failed(e) if is_code(&e, &SqlState::QUERY_CANCELED) => {
                // Cancelled by someone else (an operator); wait again.
                self.put_session(s);
                Err(Error::Connection {
                    backend: KIND,
                    endpoint: self.endpoint().to_owned(),
                    source: "the wait was cancelled on the server".into(),
                })
            }
            WaitEnd::Failed(e) => {
                self.discard(s);
                Err(map(self.endpoint(), e))
            }
            WaitEnd::StoppedGranted => {
                // Granted just before the cancel landed: give it back.
                if self.unlock(&s, kind, key).await.is_ok() {
                    self.put_session(s);
                } else {
                    self.discard(s);
                }
                Ok(None)
            }
            WaitEnd::StoppedClean => {
                self.put_session(s);
                Ok(None)
            }
            WaitEnd::StoppedUnknown => {
                self.discard(s);
                Ok(None)
            }
        }
    }

    /// `pg_cancel_backend(pid)` through the control connection; false if that failed.
    async fn cancel_backend(&self, pid: i32) -> bool {
        let Ok(client) = self.common.control().await else {
            return false;
        };
        let rows = self
            .common
            .run(
                "cancelling a wait",
                client.query_typed("SELECT pg_cancel_backend($1)", &[(&pid, Type::INT4)]),
            )
            .await;
        matches!(
            rows.as_deref()
                .map(|r| r.first().and_then(|r| r.try_get::<_, bool>(0).ok())),
            Ok(Some(true))
        )
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
        Self::drop_if_dead(st);
        let Some(os) = st.as_mut() else {
            return self.not_held_outcome(&key.name).await;
        };
        let kind = key.kind;
        let Some(h) = os.holds.get(&kind) else {
            return self.not_held_outcome(&key.name).await;
        };
        let s = os.session.clone();
        if h.count > 1 {
            let remaining = h.count - 1;
            let left = h.lease_end.saturating_duration_since(Instant::now());
            let idle = idle_value(os.holds.values().map(|h| h.lease_end));
            return match self.refresh(&s, key, remaining, left, &idle, true).await {
                Ok(_) => {
                    if let Some(h) = os.holds.get_mut(&kind) {
                        h.count = remaining;
                    }
                    Ok(ReleaseOutcome::StillHeld { remaining })
                }
                Err(_) if s.is_dead() => {
                    *st = None;
                    self.not_held_outcome(&key.name).await
                }
                Err(e) => Err(e),
            };
        }
        let lock = lock_key(&self.common.namespace, &key.name);
        let idle = idle_value(
            os.holds
                .iter()
                .filter(|(k, _)| **k != kind)
                .map(|(_, h)| h.lease_end),
        );
        let ns = self.common.namespace.as_str();
        let kname = kind_name(kind);
        let chan = channel(lock);
        let guc = self.lease_guc();
        let name: &str = &key.name;
        let owner: &str = &key.owner;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
            [&ns, &name, &owner, &kname, &lock, &chan, &idle, &guc];
        let typed: Vec<_> = params
            .iter()
            .zip(RELEASE_TYPES)
            .map(|(p, t)| (*p, t.clone()))
            .collect();
        let sql = if exclusive(kind) {
            RELEASE_EXCL
        } else {
            RELEASE_SHARED
        };
        let sent_before = h.release_sent;
        match self.query(&s, "releasing", sql, &typed).await {
            Ok(rows) => {
                s.unwatch_lost(kind);
                let unlocked = rows
                    .first()
                    .and_then(|r| r.try_get::<_, bool>(0).ok())
                    .unwrap_or(false);
                os.holds.remove(&kind);
                if os.holds.is_empty() {
                    if let Some(os) = st.take() {
                        drop(s);
                        self.put_session(os.session);
                    }
                }
                if unlocked || sent_before {
                    Ok(ReleaseOutcome::Released)
                } else {
                    self.not_held_outcome(&key.name).await
                }
            }
            Err(_) if s.is_dead() => {
                *st = None;
                if sent_before {
                    Ok(ReleaseOutcome::Released)
                } else {
                    self.not_held_outcome(&key.name).await
                }
            }
            Err(e) => {
                if let Some(h) = os.holds.get_mut(&kind) {
                    h.release_sent = true;
                }
                Err(e)
            }
        }
    }

    pub(crate) async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        for (k, _) in holds {
            check_kind(k.kind)?;
        }
        let all = futures_util::future::join_all(
            holds.iter().map(|(key, lease)| self.renew_one(key, *lease)),
        )
        .await;
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
        Self::drop_if_dead(st);
        let Some(os) = st.as_mut() else {
            return Ok(RenewOutcome::NotHeld);
        };
        let kind = key.kind;
        let Some(h) = os.holds.get(&kind) else {
            return Ok(RenewOutcome::NotHeld);
        };
        if h.release_sent {
            // A release is under way (its answer was lost; the core is retrying it): the lock
            // is, or is about to be, given back. Leave the state to that release.
            return Ok(RenewOutcome::NotHeld);
        }
        let s = os.session.clone();
        let sent = Instant::now();
        let end = sent + lease;
        let idle = idle_value(
            os.holds
                .iter()
                .map(|(k, h)| if *k == kind { end } else { h.lease_end }),
        );
        match self.refresh(&s, key, h.count, lease, &idle, false).await {
            Ok(true) => {
                if let Some(h) = os.holds.get_mut(&kind) {
                    h.lease_end = end;
                }
                Ok(RenewOutcome::Renewed)
            }
            Ok(false) => {
                // The holder's row was deleted (an operator broke the lock): give it up.
                tracing::warn!(name = %key.name, owner = %key.owner, "dlock_holders row gone: the lock was revoked");
                s.unwatch_lost(kind);
                os.holds.remove(&kind);
                let lock = lock_key(&self.common.namespace, &key.name);
                if self.unlock(&s, kind, lock).await.is_err() {
                    if let Some(os) = st.take() {
                        drop(s);
                        self.discard(os.session);
                    }
                } else if os.holds.is_empty() {
                    if let Some(os) = st.take() {
                        drop(s);
                        self.put_session(os.session);
                    }
                }
                Ok(RenewOutcome::NotHeld)
            }
            Err(_) if s.is_dead() => {
                *st = None;
                Ok(RenewOutcome::NotHeld)
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        check_kind(kind)?;
        let key = lock_key(&self.common.namespace, name);
        let (classid, objid) = key_oids(key);
        let kinds: Vec<&str> = match kind {
            LockKind::Read | LockKind::Write => vec!["read", "write"],
            _ => vec![kind_name(kind)],
        };
        let sql = format!(
            "SELECT h.owner, h.count, \
                    GREATEST(EXTRACT(EPOCH FROM (h.expires_at - now())) * 1000, 0)::float8, \
                    h.kind \
             FROM dlock_holders h \
             WHERE h.ns = $1 AND h.name = $2 AND h.kind = ANY($5) AND {LIVE} \
             ORDER BY h.acquired_at, h.owner"
        );
        let client = self.common.control().await?;
        let ns = self.common.namespace.as_str();
        let holder_params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 5] = [
            (&ns, Type::TEXT),
            (&name, Type::TEXT),
            (&classid, Type::OID),
            (&objid, Type::OID),
            (&kinds, Type::TEXT_ARRAY),
        ];
        let fence_params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
            [(&ns, Type::TEXT), (&name, Type::TEXT)];
        let waiter_params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
            [(&classid, Type::OID), (&objid, Type::OID)];
        let (rows, fence, waiting) = self
            .common
            .run("inspecting", async {
                tokio::try_join!(
                    client.query_typed(&sql, &holder_params),
                    client.query_typed(FENCE, &fence_params),
                    client.query_typed(WAITERS, &waiter_params),
                )
            })
            .await?;
        let waiters: i64 = waiting
            .first()
            .and_then(|r| r.try_get(0).ok())
            .ok_or_else(|| shape("inspect", "no waiter count"))?;
        let lease_note = self.common.has_session_timeouts();
        let mut holders = Vec::with_capacity(rows.len());
        for r in &rows {
            let owner: String = r.try_get(0).map_err(|e| shape("inspect", e))?;
            let count: i32 = r.try_get(1).map_err(|e| shape("inspect", e))?;
            let left: f64 = r.try_get(2).map_err(|e| shape("inspect", e))?;
            let side = match r.try_get::<_, &str>(3).map_err(|e| shape("inspect", e))? {
                "read" => Some(LockKind::Read),
                "write" => Some(LockKind::Write),
                _ => None,
            };
            holders.push(HolderInfo {
                owner,
                count: u32::try_from(count).unwrap_or(0),
                lease_left: (lease_note && left.is_finite())
                    .then(|| Duration::from_secs_f64(left.max(0.0) / 1000.0)),
                side,
            });
        }
        let fencing_token = match fence.first() {
            None => 0,
            Some(r) => {
                let t: i64 = r.try_get(0).map_err(|e| shape("fencing token", e))?;
                u64::try_from(t).map_err(|_| shape("fencing token", t))?
            }
        };
        Ok(LockInfo {
            name: name.to_owned(),
            holders,
            fencing_token,
            waiters: Some(u32::try_from(waiters).unwrap_or(u32::MAX)),
            ..Default::default()
        })
    }

    /// The backend pid of the session holding `name` for `owner` here, if any (for tests
    /// and operators: `pg_terminate_backend(pid)` revokes the lock at once).
    pub(crate) async fn holder_pid(&self, name: &str, owner: &str) -> Option<i32> {
        let key = HoldKey {
            name: Arc::from(name),
            owner: Arc::from(owner),
            kind: LockKind::Mutex,
        };
        let slot = self.existing_slot(&key)?;
        let st = slot.state.lock().await;
        st.as_ref()
            .filter(|os| !os.session.is_dead())
            .map(|os| os.session.pid)
    }

    /// Sessions open right now: idle in the pool, and holding.
    pub(crate) fn idle_sessions(&self) -> usize {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
