//! Session mode: PostgreSQL session-level advisory locks, each grant on its own connection.
//!
//! A grant's lock lives exactly as long as its dedicated connection (the *session*): when the
//! process dies, its connection closes and the server frees the lock at once. The lease is
//! enforced by the server too: the session's `idle_session_timeout` is the lease plus a grace
//! (renewals are queries on that session, which restart the timer), so a holder that hangs or
//! is cut off loses its session, and with it the lock, when the lease ends (PostgreSQL 14+).
//!
//! Every acquisition attempt (the core's `AttemptId`) gets its own session, and this backend
//! remembers, per attempt, the session its requests ran on. A request whose answer never came
//! (a timeout, a late reply) leaves the attempt *unknown*: the session may hold the lock. The
//! attempt's retry then asks that same session (its statements run in order, after the late
//! one) whether it holds the lock and reports that grant, so a lost reply never makes a second
//! session take the lock, and a give-up unlocks (or closes) that session. The only sessions
//! that share a connection are a write grant and the read grant its owner takes beside it (a
//! downgrade: the server must see one holder).
//!
//! Tables: `dlock_fence` (last fencing token per name, bumped from the sequence
//! `dlock_fence_seq`) and `dlock_holders` (one row per grant, keyed by attempt: owner, kind,
//! token, backend pid, lease end — for `inspect`, for the `Held` ttl and for revocation; rows
//! whose pid no longer holds the advisory lock are ignored and cleaned up by the next exclusive
//! grant).

use crate::common::{channel, key_oids, kind_name, lock_key, Common};
use crate::error::{is_code, map, shape, KIND};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{
    AcquireReply, AcquireRequest, AttemptId, Backend, Error, GrantRef, Granted, HolderInfo,
    LockInfo, LockKind, LostReason, LostSignal, ReleaseOutcome, RenewOutcome, Result,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row};
use tokio_util::sync::CancellationToken;

/// The schema of session mode. The statements after the `CREATE`s bring a table of an older
/// version (one row per owner and kind, with a re-entry count) to one row per grant.
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
    attempt text NOT NULL,
    owner text NOT NULL,
    kind text NOT NULL,
    token bigint NOT NULL,
    pid integer NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (ns, name, attempt)
);
ALTER TABLE dlock_holders ADD COLUMN IF NOT EXISTS attempt text;
UPDATE dlock_holders SET attempt = 'legacy:' || owner || ':' || kind WHERE attempt IS NULL;
ALTER TABLE dlock_holders ALTER COLUMN attempt SET NOT NULL;
ALTER TABLE dlock_holders DROP COLUMN IF EXISTS count;
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
        WHERE i.indrelid = 'dlock_holders'::regclass AND i.indisprimary AND a.attname = 'attempt'
    ) THEN
        ALTER TABLE dlock_holders DROP CONSTRAINT IF EXISTS dlock_holders_pkey;
        ALTER TABLE dlock_holders ADD PRIMARY KEY (ns, name, attempt);
    END IF;
END $$;";

pub(crate) const TABLES: &[&str] = &["dlock_fence_seq", "dlock_fence", "dlock_holders"];

/// Columns this version needs (a table of an older version lacks them: the DDL migrates it).
pub(crate) const COLUMNS: &[(&str, &str)] = &[("dlock_holders", "attempt")];

/// Records the grant of attempt $3 on this session and returns its fencing token; also sets
/// the session's lease. Idempotent per attempt and session: if this session already recorded
/// the attempt's grant (a retry after the answer was lost), it returns that token and only
/// extends the lease, drawing no new token. An exclusive grant removes rows of other sessions
/// (stale: nobody else can hold the key now).
/// $1 ns, $2 name, $3 attempt, $4 owner, $5 kind, $6 lease ms, $7 idle timeout, $8 exclusive,
/// $9 GUC.
const REGISTER: &str = "
WITH old AS (
    SELECT token FROM dlock_holders
    WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid()
), f AS (
    INSERT INTO dlock_fence AS f (ns, name, token)
    SELECT $1, $2, nextval('dlock_fence_seq') WHERE NOT EXISTS (SELECT 1 FROM old)
    ON CONFLICT (ns, name) DO UPDATE SET token = nextval('dlock_fence_seq')
    RETURNING f.token
), d AS (
    DELETE FROM dlock_holders
    WHERE ns = $1 AND name = $2 AND $8 AND pid <> pg_backend_pid() AND attempt <> $3
), ins AS (
    INSERT INTO dlock_holders AS h
        (ns, name, attempt, owner, kind, token, pid, acquired_at, expires_at)
    SELECT $1, $2, $3, $4, $5, f.token, pg_backend_pid(), now(),
           now() + $6 * interval '1 millisecond'
    FROM f
    ON CONFLICT (ns, name, attempt) DO UPDATE
    SET owner = EXCLUDED.owner, kind = EXCLUDED.kind, token = EXCLUDED.token, pid = EXCLUDED.pid,
        acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
    RETURNING h.token
), ext AS (
    UPDATE dlock_holders h
    SET expires_at = GREATEST(h.expires_at, now() + $6 * interval '1 millisecond')
    WHERE h.ns = $1 AND h.name = $2 AND h.attempt = $3 AND h.pid = pg_backend_pid()
    RETURNING h.token
)
SELECT COALESCE((SELECT token FROM ins), (SELECT token FROM ext)), set_config($9, $7, false)";
const REGISTER_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::FLOAT8,
    Type::TEXT,
    Type::BOOL,
    Type::TEXT,
];

/// Renewal (and a retried acquire of a granted attempt): the lease runs at least $4 ms from
/// now, never shorter; sets the session's lease. No row: the grant was revoked.
/// $1 ns, $2 name, $3 attempt, $4 lease ms, $5 idle timeout, $6 GUC.
const REFRESH: &str = "
WITH u AS (
    UPDATE dlock_holders
    SET expires_at = GREATEST(expires_at, now() + $4 * interval '1 millisecond')
    WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid()
    RETURNING 1
)
SELECT (SELECT count(*) FROM u), set_config($6, $5, false)";
const REFRESH_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::FLOAT8,
    Type::TEXT,
    Type::TEXT,
];

/// Releases one grant on its session: forget it, unlock once, wake waiters, set the session's
/// lease to what its other grants need. $1 ns, $2 name, $3 attempt, $4 key, $5 channel,
/// $6 idle timeout, $7 GUC.
const RELEASE_EXCL: &str = "
WITH d AS (DELETE FROM dlock_holders
           WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock($4), pg_notify($5, ''), set_config($7, $6, false)";
const RELEASE_SHARED: &str = "
WITH d AS (DELETE FROM dlock_holders
           WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock_shared($4), pg_notify($5, ''), set_config($7, $6, false)";
/// Gives back everything a session with no other grant may hold ($4 unused).
const RELEASE_ALL: &str = "
WITH d AS (DELETE FROM dlock_holders
           WHERE ns = $1 AND name = $2 AND attempt = $3 AND pid = pg_backend_pid())
SELECT pg_advisory_unlock_all(), pg_notify($5, ''), set_config($7, $6, false)";
const RELEASE_TYPES: &[Type] = &[
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
];

/// Whether this session holds the key in the mode of `kind`. $1 classid, $2 objid, $3 mode.
const HOLDS: &str = "
SELECT EXISTS (SELECT 1 FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_backend_pid()
                 AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1 AND l.mode = $3
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))";

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

type Params<'a> = Vec<(&'a (dyn ToSql + Sync), Type)>;

fn typed<'a>(params: &[&'a (dyn ToSql + Sync)], types: &[Type]) -> Params<'a> {
    params
        .iter()
        .zip(types)
        .map(|(p, t)| (*p, t.clone()))
        .collect()
}

/// One connection. It carries one grant (or one attempt whose outcome is unknown), or a write
/// grant and the read grant of its downgrade.
pub(crate) struct Session {
    client: Client,
    pid: i32,
    ended: CancellationToken,
    end: Arc<StdMutex<EndState>>,
}

#[derive(Default)]
struct EndState {
    /// The attempts on this session that hold (or may hold) a lock on it: the lost signals of
    /// the granted ones, fired when the connection ends, and the local end of their leases.
    grants: HashMap<AttemptId, (Option<LostSignal>, LeaseInstant)>,
    reason: Option<LostReason>,
}

impl Session {
    fn is_dead(&self) -> bool {
        self.ended.is_cancelled() || self.client.is_closed()
    }

    fn end(&self) -> std::sync::MutexGuard<'_, EndState> {
        self.end.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `attempt` as possibly holding a lock here until `lease_end` (so that the session
    /// is neither pooled nor unlocked wholesale for another attempt meanwhile).
    fn add(&self, attempt: &AttemptId, lease_end: LeaseInstant) {
        let mut end = self.end();
        if end.reason.is_none() {
            let e = end
                .grants
                .entry(attempt.clone())
                .or_insert((None, lease_end));
            e.1 = e.1.max(lease_end);
        }
    }

    /// `attempt` holds its grant here: its `lost` fires when this session ends (at once if it
    /// already has). Only granted attempts: a request that failed with the session must not
    /// fire the signal of a grant a retry then gets on another session.
    fn arm(&self, attempt: &AttemptId, lost: LostSignal, lease_end: LeaseInstant) {
        let mut end = self.end();
        match &end.reason {
            Some(reason) => lost.fire(reason.clone()),
            None => {
                let e = end
                    .grants
                    .entry(attempt.clone())
                    .or_insert((None, lease_end));
                e.0 = Some(lost);
                e.1 = e.1.max(lease_end);
            }
        }
    }

    fn extend(&self, attempt: &AttemptId, lease_end: LeaseInstant) {
        if let Some(e) = self.end().grants.get_mut(attempt) {
            e.1 = e.1.max(lease_end);
        }
    }

    /// Forgets `attempt`; returns how many attempts remain on this session.
    fn remove(&self, attempt: &AttemptId) -> usize {
        let mut end = self.end();
        end.grants.remove(attempt);
        end.grants.len()
    }

    fn others(&self, attempt: &AttemptId) -> usize {
        self.end().grants.keys().filter(|a| *a != attempt).count()
    }

    /// The `idle_session_timeout` value that covers every lease on this session, `attempt`'s
    /// counted as ending at `end` if given, left out if `end` is `None` ("0": no lease left).
    fn idle_value(&self, attempt: &AttemptId, end: Option<LeaseInstant>) -> String {
        let st = self.end();
        let ends = st
            .grants
            .iter()
            .filter(|(a, _)| *a != attempt)
            .map(|(_, (_, e))| *e)
            .chain(end);
        idle_value(ends)
    }
}

/// What this backend knows about one attempt's lock on the server.
enum State {
    /// Nothing held (or nothing yet).
    Idle,
    /// A request that may have taken the lock on this session got no answer: the session may
    /// hold it. The attempt's retry asks the session; a give-up unlocks or closes it.
    Unknown(Arc<Session>),
    /// Granted on this session.
    Granted(GrantState),
    /// A release of the grant got no answer: it ran, or will run, on this session, before any
    /// later statement there. A retry runs it again (the second finds the lock released).
    Releasing(GrantState),
}

struct GrantState {
    session: Arc<Session>,
    token: u64,
    /// Local estimate of when the lease ends (never moved earlier).
    lease_end: LeaseInstant,
}

struct Entry {
    name: Arc<str>,
    owner: Arc<str>,
    kind: LockKind,
    state: tokio::sync::Mutex<State>,
    /// True while `state` is `Granted` (read without the async lock, by the upgrade check).
    granted: AtomicBool,
}

impl Entry {
    fn set(&self, st: &mut State, new: State) {
        self.granted
            .store(matches!(new, State::Granted(_)), Ordering::SeqCst);
        *st = new;
    }
}

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

/// Sweep finished attempts out of the map once it grows past this many entries.
const SWEEP_AT: usize = 256;

pub(crate) struct SessionMode {
    common: Arc<Common>,
    attempts: StdMutex<HashMap<AttemptId, Arc<Entry>>>,
    pool: StdMutex<Vec<Arc<Session>>>,
}

fn exclusive(kind: LockKind) -> bool {
    !matches!(kind, LockKind::Read)
}

/// The `pg_locks.mode` of an advisory lock of `kind`.
fn lock_mode(kind: LockKind) -> &'static str {
    if exclusive(kind) {
        "ExclusiveLock"
    } else {
        "ShareLock"
    }
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
fn idle_value(ends: impl Iterator<Item = LeaseInstant>) -> String {
    let now = LeaseInstant::now();
    match ends.max() {
        None => "0".into(),
        Some(end) => idle_for(end.saturating_duration_since(now)),
    }
}

/// The `idle_session_timeout` value for a lease of `left` from now, grace included.
fn idle_for(left: Duration) -> String {
    (left + grace(left))
        .as_millis()
        .clamp(1, i32::MAX as u128)
        .to_string()
}

impl SessionMode {
    pub(crate) fn new(common: Arc<Common>) -> Self {
        SessionMode {
            common,
            attempts: StdMutex::new(HashMap::new()),
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

    fn attempts(&self) -> std::sync::MutexGuard<'_, HashMap<AttemptId, Arc<Entry>>> {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry of `req`'s attempt, made if new.
    fn entry(&self, req: &AcquireRequest) -> Arc<Entry> {
        let mut map = self.attempts();
        if map.len() >= SWEEP_AT && !map.contains_key(&req.attempt) {
            Self::sweep(&mut map);
        }
        map.entry(req.attempt.clone())
            .or_insert_with(|| {
                Arc::new(Entry {
                    name: req.key.name.clone(),
                    owner: req.key.owner.clone(),
                    kind: req.key.kind,
                    state: tokio::sync::Mutex::new(State::Idle),
                    granted: AtomicBool::new(false),
                })
            })
            .clone()
    }

    fn existing(&self, attempt: &AttemptId) -> Option<Arc<Entry>> {
        self.attempts().get(attempt).cloned()
    }

    /// Drops entries nobody uses whose session is gone (its locks went with it): what is left
    /// of attempts whose caller stopped asking (a release that kept failing).
    fn sweep(map: &mut HashMap<AttemptId, Arc<Entry>>) {
        map.retain(|_, e| {
            if Arc::strong_count(e) > 1 {
                return true;
            }
            let Ok(st) = e.state.try_lock() else {
                return true;
            };
            match &*st {
                State::Idle => false,
                State::Unknown(s) => !s.is_dead(),
                State::Granted(g) | State::Releasing(g) => !g.session.is_dead(),
            }
        });
    }

    /// Forgets an idle entry nobody else is using.
    fn tidy(&self, attempt: &AttemptId, entry: Arc<Entry>) {
        let mut map = self.attempts();
        let ours = map.get(attempt).is_some_and(|e| Arc::ptr_eq(e, &entry));
        // The map and `entry` are the only references: nobody can be about to use it (a new
        // user clones it under the map lock, which we hold).
        if ours && Arc::strong_count(&entry) == 2 {
            if let Ok(st) = entry.state.try_lock() {
                if matches!(*st, State::Idle) {
                    drop(st);
                    map.remove(attempt);
                }
            }
        }
    }

    /// Moves an attempt whose session ended to `Idle` (its locks went with the session, whose
    /// end already fired the lost signals).
    fn settle(entry: &Entry, st: &mut State) {
        let dead = match &*st {
            State::Idle => false,
            State::Unknown(s) => s.is_dead(),
            State::Granted(g) | State::Releasing(g) => g.session.is_dead(),
        };
        if dead {
            entry.set(st, State::Idle);
        }
    }

    /// Opens a session: its own connection, whose end fires the lost signals of its grants.
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
                    "the connection to {endpoint} holding the lock was closed"
                )),
            };
            let signals = {
                let mut st = end2.lock().unwrap_or_else(|p| p.into_inner());
                st.reason = Some(reason.clone());
                std::mem::take(&mut st.grants)
            };
            ended2.cancel();
            if signals.values().any(|(lost, _)| lost.is_some()) {
                tracing::warn!(%reason, "postgres session holding locks ended");
            }
            for (lost, _) in signals.into_values() {
                if let Some(lost) = lost {
                    lost.fire(reason.clone());
                }
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

    /// Puts a session that holds nothing back into the pool (or closes it). A session another
    /// attempt still uses (a downgrade's other side) just stays with that attempt.
    fn put_session(&self, s: Arc<Session>) {
        if s.is_dead() || !s.end().grants.is_empty() || Arc::strong_count(&s) > 1 {
            return;
        }
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < POOL_MAX {
            pool.push(s);
        }
    }

    async fn query(
        &self,
        s: &Session,
        what: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        self.common
            .run(what, s.client.query_typed(sql, params))
            .await
    }

    /// `pg_try_advisory_lock` on `s`, setting the session's lease in the same statement when
    /// granted (`idle_held`, so that a grant whose answer is lost frees itself when that lease
    /// ends even if nobody ever asks again) and `idle_free` otherwise.
    async fn try_lock(
        &self,
        s: &Session,
        kind: LockKind,
        key: i64,
        idle_held: &str,
        idle_free: &str,
    ) -> Result<bool> {
        let sql = if exclusive(kind) {
            "SELECT t.l, set_config($4, CASE WHEN t.l THEN $2 ELSE $3 END, false) \
             FROM (SELECT pg_try_advisory_lock($1) AS l) t"
        } else {
            "SELECT t.l, set_config($4, CASE WHEN t.l THEN $2 ELSE $3 END, false) \
             FROM (SELECT pg_try_advisory_lock_shared($1) AS l) t"
        };
        let guc = self.lease_guc();
        let rows = self
            .query(
                s,
                "trying the lock",
                sql,
                &[
                    (&key, Type::INT8),
                    (&idle_held, Type::TEXT),
                    (&idle_free, Type::TEXT),
                    (&guc, Type::TEXT),
                ],
            )
            .await?;
        rows.first()
            .and_then(|r| r.try_get::<_, bool>(0).ok())
            .ok_or_else(|| shape("pg_try_advisory_lock", format!("{} rows", rows.len())))
    }

    /// Whether `s` holds the key in `kind`'s mode (read after every earlier statement there).
    async fn holds(&self, s: &Session, kind: LockKind, key: i64) -> Result<bool> {
        let (classid, objid) = key_oids(key);
        let mode = lock_mode(kind);
        let rows = self
            .query(
                s,
                "checking the session's lock",
                HOLDS,
                &[
                    (&classid, Type::OID),
                    (&objid, Type::OID),
                    (&mode, Type::TEXT),
                ],
            )
            .await?;
        rows.first()
            .and_then(|r| r.try_get::<_, bool>(0).ok())
            .ok_or_else(|| {
                shape(
                    "checking the session's lock",
                    format!("{} rows", rows.len()),
                )
            })
    }

    /// Records the grant `s` holds for `req` and returns its fencing token (the recorded one
    /// if this session recorded it before).
    async fn register(&self, s: &Session, req: &AcquireRequest, idle: &str) -> Result<u64> {
        let ns = self.common.namespace.as_str();
        let name: &str = &req.key.name;
        let attempt = req.attempt.as_str();
        let owner: &str = &req.key.owner;
        let kind = kind_name(req.key.kind);
        let lease_ms = ms(req.lease);
        let excl = exclusive(req.key.kind);
        let guc = self.lease_guc();
        let params = typed(
            &[
                &ns, &name, &attempt, &owner, &kind, &lease_ms, &idle, &excl, &guc,
            ],
            REGISTER_TYPES,
        );
        let rows = self
            .query(s, "recording the grant", REGISTER, &params)
            .await?;
        let token: i64 = rows
            .first()
            .and_then(|r| r.try_get::<_, Option<i64>>(0).ok().flatten())
            .ok_or_else(|| shape("recording the grant", format!("{} rows", rows.len())))?;
        u64::try_from(token).map_err(|_| shape("fencing token", token))
    }

    /// Makes the grant's row and the session's lease run at least `lease` from now. False if
    /// the row is gone (an operator revoked the grant).
    async fn refresh(
        &self,
        s: &Session,
        name: &str,
        attempt: &AttemptId,
        lease: Duration,
        idle: &str,
    ) -> Result<bool> {
        let ns = self.common.namespace.as_str();
        let attempt = attempt.as_str();
        let lease_ms = ms(lease);
        let guc = self.lease_guc();
        let params = typed(
            &[&ns, &name, &attempt, &lease_ms, &idle, &guc],
            REFRESH_TYPES,
        );
        let rows = self
            .query(s, "refreshing the grant", REFRESH, &params)
            .await?;
        let n: i64 = rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .ok_or_else(|| shape("refreshing the grant", format!("{} rows", rows.len())))?;
        Ok(n > 0)
    }

    /// Gives up what `attempt` holds (or may hold) on `s` and forgets its row: one unlock of
    /// `kind`'s mode, or everything when no other attempt uses the session. True if the
    /// session held the lock (for a single unlock; an unlock-all does not tell).
    async fn unlock(
        &self,
        s: &Session,
        name: &str,
        attempt: &AttemptId,
        kind: LockKind,
        all: bool,
    ) -> Result<bool> {
        let ns = self.common.namespace.as_str();
        let key = lock_key(&self.common.namespace, name);
        let chan = channel(key);
        let a = attempt.as_str();
        let idle = s.idle_value(attempt, None);
        let guc = self.lease_guc();
        let sql = if all {
            RELEASE_ALL
        } else if exclusive(kind) {
            RELEASE_EXCL
        } else {
            RELEASE_SHARED
        };
        let params = typed(&[&ns, &name, &a, &key, &chan, &idle, &guc], RELEASE_TYPES);
        let rows = self.query(s, "releasing", sql, &params).await?;
        if all {
            return Ok(true);
        }
        rows.first()
            .and_then(|r| r.try_get::<_, bool>(0).ok())
            .ok_or_else(|| shape("releasing", format!("{} rows", rows.len())))
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

    /// What to report for a release of a grant this backend does not (or no longer) have:
    /// another grant holds the lock, or nobody does.
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

    /// A reader asking for the write side: refused (two readers doing it would deadlock).
    fn check_upgrade(&self, req: &AcquireRequest) -> Result<()> {
        if req.key.kind != LockKind::Write {
            return Ok(());
        }
        let reading = self.attempts().values().any(|e| {
            e.kind == LockKind::Read
                && e.name == req.key.name
                && e.owner == req.key.owner
                && e.granted.load(Ordering::SeqCst)
        });
        if reading {
            return Err(Error::invalid(format!(
                "owner `{}` holds the read side of `{}` and asked for the write side: an \
                 upgrade would deadlock with other readers doing the same; release the read \
                 lock first",
                req.key.owner, req.key.name
            )));
        }
        Ok(())
    }

    /// For a read request beside this owner's live write grant (a downgrade): the session of
    /// that grant, where the read side is granted at once (the server sees one holder).
    async fn downgrade_session(&self, req: &AcquireRequest) -> Option<Arc<Session>> {
        let w = req.write_grant.as_ref()?;
        let entry = self.existing(&w.attempt)?;
        let st = entry.state.lock().await;
        match &*st {
            State::Granted(g) if g.token == w.token && !g.session.is_dead() => {
                Some(g.session.clone())
            }
            _ => None,
        }
    }

    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        check_kind(req.key.kind)?;
        let entry = self.entry(req);
        let mut st = entry.state.lock().await;
        let r = self.attempt(&entry, &mut st, req).await;
        drop(st);
        self.tidy(&req.attempt, entry);
        r
    }

    /// One try for `req`'s attempt, without waiting.
    async fn attempt(
        &self,
        entry: &Entry,
        st: &mut State,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        let key = lock_key(&self.common.namespace, &req.key.name);
        match self.resume(entry, st, req).await? {
            Some(token) => return Ok(AcquireReply::Granted { token }),
            None if matches!(st, State::Unknown(_)) => {}
            None => {
                self.check_upgrade(req)?;
                let s = match self.downgrade_session(req).await {
                    Some(s) => s,
                    None => self.take_session().await?,
                };
                // Counted on the session before the request goes out: if its answer is lost,
                // the session is neither pooled nor forgotten while it may hold the lock.
                let end = LeaseInstant::now() + req.lease;
                s.add(&req.attempt, end);
                entry.set(st, State::Unknown(s));
            }
        }
        let State::Unknown(s) = &*st else {
            return Err(shape("acquire", "attempt state"));
        };
        let s = s.clone();
        let end = LeaseInstant::now() + req.lease;
        let idle_held = s.idle_value(&req.attempt, Some(end));
        let idle_free = s.idle_value(&req.attempt, None);
        match self
            .try_lock(&s, req.key.kind, key, &idle_held, &idle_free)
            .await
        {
            Ok(true) => self
                .grant_on(entry, st, s, req, &idle_held)
                .await
                .map(|token| AcquireReply::Granted { token }),
            Ok(false) => {
                s.remove(&req.attempt);
                entry.set(st, State::Idle);
                self.put_session(s);
                Ok(AcquireReply::Held {
                    ttl: self.holder_ttl(&req.key.name, key).await,
                })
            }
            Err(e) => {
                if s.is_dead() {
                    s.remove(&req.attempt);
                    entry.set(st, State::Idle);
                }
                // Otherwise the attempt stays unknown on `s`: a retry asks `s`, a give-up
                // unlocks it.
                Err(e)
            }
        }
    }

    /// Picks up where an earlier request of this attempt left off: the grant again (a retry
    /// of a granted attempt: same token, lease never shortened), or the grant an unanswered
    /// request took on its session. `None`: not held; the state is `Idle`, or `Unknown` on a
    /// session that holds nothing (to try on).
    async fn resume(
        &self,
        entry: &Entry,
        st: &mut State,
        req: &AcquireRequest,
    ) -> Result<Option<u64>> {
        Self::settle(entry, st);
        let key = lock_key(&self.common.namespace, &req.key.name);
        match &*st {
            State::Idle => Ok(None),
            State::Releasing(_) => Err(Error::invalid(format!(
                "attempt {} on `{}` asked again for a grant it is releasing",
                req.attempt, req.key.name
            ))),
            State::Granted(g) => {
                let s = g.session.clone();
                let token = g.token;
                let end = g.lease_end.max(LeaseInstant::now() + req.lease);
                let idle = s.idle_value(&req.attempt, Some(end));
                match self
                    .refresh(&s, &req.key.name, &req.attempt, req.lease, &idle)
                    .await
                {
                    Ok(true) => {
                        s.extend(&req.attempt, end);
                        if let State::Granted(g) = st {
                            g.lease_end = end;
                        }
                        Ok(Some(token))
                    }
                    Ok(false) => {
                        // Revoked by an operator before this retry: give it up, then try anew.
                        self.revoked(entry, st, req.key.kind, &req.key.name, &req.attempt)
                            .await;
                        Ok(None)
                    }
                    Err(e) => {
                        Self::settle(entry, st);
                        Err(e)
                    }
                }
            }
            State::Unknown(s) => {
                let s = s.clone();
                if !self.holds(&s, req.key.kind, key).await? {
                    return Ok(None);
                }
                let end = LeaseInstant::now() + req.lease;
                let idle = s.idle_value(&req.attempt, Some(end));
                self.grant_on(entry, st, s, req, &idle).await.map(Some)
            }
        }
    }

    /// Records the grant whose lock `s` holds for `req` (registering is idempotent per
    /// attempt), and makes it the attempt's state. On failure the attempt stays unknown on `s`.
    async fn grant_on(
        &self,
        entry: &Entry,
        st: &mut State,
        s: Arc<Session>,
        req: &AcquireRequest,
        idle: &str,
    ) -> Result<u64> {
        let sent = LeaseInstant::now();
        let end = sent + req.lease;
        s.add(&req.attempt, end);
        entry.set(st, State::Unknown(s.clone()));
        match self.register(&s, req, idle).await {
            Ok(token) => {
                s.arm(&req.attempt, req.lost.clone(), end);
                entry.set(
                    st,
                    State::Granted(GrantState {
                        session: s,
                        token,
                        lease_end: end,
                    }),
                );
                Ok(token)
            }
            Err(e) => {
                Self::settle(entry, st);
                if matches!(st, State::Idle) {
                    s.remove(&req.attempt);
                }
                Err(e)
            }
        }
    }

    /// The grant's row is gone (an operator revoked it): give the lock up on its session.
    async fn revoked(
        &self,
        entry: &Entry,
        st: &mut State,
        kind: LockKind,
        name: &str,
        attempt: &AttemptId,
    ) {
        let (State::Granted(g) | State::Releasing(g)) = &*st else {
            return;
        };
        let s = g.session.clone();
        tracing::warn!(%name, %attempt, "dlock_holders row gone: the lock was revoked");
        entry.set(st, State::Idle);
        let all = s.others(attempt) == 0;
        match self.unlock(&s, name, attempt, kind, all).await {
            Ok(_) => {
                s.remove(attempt);
                self.put_session(s);
            }
            // Unknown state. Alone on the session: closing it (dropping the last handle)
            // frees the lock. Shared with a downgrade's other side: the attempt stays counted
            // on the session, which is then never pooled and closes when that side is done.
            Err(e) => {
                if all {
                    s.remove(attempt);
                }
                tracing::warn!(error = %e, %name, "could not unlock a revoked grant");
            }
        }
    }

    /// Waits server-side: a blocking `pg_advisory_lock` on the attempt's own session, bounded
    /// by `lock_timeout` (the deadline) and cancelled with a CancelRequest. The server queues
    /// waiters in arrival order and wakes exactly one per release.
    pub(crate) async fn acquire_wait(
        &self,
        outer: &dyn Backend,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        check_kind(req.key.kind)?;
        if self.downgrade_session(req).await.is_some() {
            // A downgrade is granted beside the write side, on its session: never a blocking
            // wait there (it would hold up that session's renewals).
            return distlock_core::wait::watch_and_retry(outer, req, deadline, cancel).await;
        }
        let r = self.wait_loop(req, deadline, cancel).await;
        if matches!(r, Ok(None)) && self.existing(&req.attempt).is_some() {
            // Stopped after a request whose answer was lost: whatever it took goes back (the
            // core only gives up attempts that end in an error).
            if let Err(e) = self.give_up(req).await {
                tracing::debug!(error = %e, name = %req.key.name, "could not give up a stopped wait; its session's lease frees the lock");
            }
        }
        r
    }

    async fn wait_loop(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let mut backoff = distlock_core::backoff::Backoff::default();
        loop {
            let entry = self.entry(req);
            let mut st = tokio::select! {
                g = entry.state.lock() => g,
                _ = cancel.cancelled() => return Ok(None),
                _ = sleep_until(deadline) => return Ok(None),
            };
            let r = self.wait_in(&entry, &mut st, req, deadline, cancel).await;
            drop(st);
            self.tidy(&req.attempt, entry);
            match r {
                Ok(None)
                    if !cancel.is_cancelled() && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    // The server's timer ended the wait a hair early: wait out the rest.
                }
                Err(e) if e.is_retryable() => {
                    // The attempt's state stays with it: the next round resumes on the same
                    // session if the failed request may have taken the lock there.
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

    async fn wait_in(
        &self,
        entry: &Entry,
        st: &mut State,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let key = lock_key(&self.common.namespace, &req.key.name);
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
                self.check_upgrade(req)?;
                let s = self.take_session().await?;
                s.add(&req.attempt, sent + req.lease);
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
        match self.try_lock(&s, kind, key, &idle_held, &idle_free).await {
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
                // lease setting).
                self.forget_on(entry, st, s, &req.attempt, true);
                Ok(None)
            }
            WaitEnd::Failed(e) if is_code(&e, &SqlState::QUERY_CANCELED) => {
                // Cancelled by someone else (an operator); wait again.
                self.forget_on(entry, st, s, &req.attempt, true);
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
                match self
                    .unlock(&s, &req.key.name, &req.attempt, kind, true)
                    .await
                {
                    Ok(_) => self.forget_on(entry, st, s, &req.attempt, true),
                    Err(_) => self.forget_on(entry, st, s, &req.attempt, false),
                }
                Ok(None)
            }
            WaitEnd::StoppedClean => {
                self.forget_on(entry, st, s, &req.attempt, true);
                Ok(None)
            }
            WaitEnd::StoppedUnknown => {
                self.forget_on(entry, st, s, &req.attempt, false);
                Ok(None)
            }
        }
    }

    /// The attempt holds nothing on its dedicated session `s` (or `s` is closed): forget it,
    /// and pool the session if `reuse` (else it closes when the last handle goes, which frees
    /// whatever it might hold).
    fn forget_on(
        &self,
        entry: &Entry,
        st: &mut State,
        s: Arc<Session>,
        attempt: &AttemptId,
        reuse: bool,
    ) {
        s.remove(attempt);
        // The state's handle goes first: a pooled session has no other.
        entry.set(st, State::Idle);
        if reuse {
            self.put_session(s);
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

    pub(crate) async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        check_kind(grant.key.kind)?;
        let Some(entry) = self.existing(&grant.attempt) else {
            return self.not_held_outcome(&grant.key.name).await;
        };
        let mut st = entry.state.lock().await;
        let r = self.release_in(&entry, &mut st, grant).await;
        drop(st);
        self.tidy(&grant.attempt, entry);
        r
    }

    /// Releases exactly the grant `grant` names. A release whose answer was lost leaves the
    /// attempt `Releasing`: its retry runs the release again on the same session, after the
    /// first (which then finds it released: `Expired`, which the core reports as released).
    async fn release_in(
        &self,
        entry: &Entry,
        st: &mut State,
        grant: &GrantRef,
    ) -> Result<ReleaseOutcome> {
        Self::settle(entry, st);
        let (again, s) = match &*st {
            State::Granted(g) if g.token == grant.token => (false, g.session.clone()),
            State::Releasing(g) if g.token == grant.token => (true, g.session.clone()),
            _ => return self.not_held_outcome(&grant.key.name).await,
        };
        let name: &str = &grant.key.name;
        match self
            .unlock(&s, name, &grant.attempt, grant.key.kind, false)
            .await
        {
            Ok(unlocked) => {
                s.remove(&grant.attempt);
                entry.set(st, State::Idle);
                self.put_session(s);
                match (unlocked, again) {
                    (true, _) => Ok(ReleaseOutcome::Released),
                    (false, true) => Ok(ReleaseOutcome::Expired),
                    // The session did not hold it (an operator unlocked it there).
                    (false, false) => self.not_held_outcome(name).await,
                }
            }
            Err(e) => {
                Self::settle(entry, st);
                if matches!(st, State::Idle) {
                    // The session ended: the lock went with it.
                    s.remove(&grant.attempt);
                    return if again {
                        Ok(ReleaseOutcome::Expired)
                    } else {
                        self.not_held_outcome(name).await
                    };
                }
                if let State::Granted(g) = std::mem::replace(st, State::Idle) {
                    entry.set(st, State::Releasing(g));
                } else if let State::Releasing(g) = std::mem::replace(st, State::Idle) {
                    entry.set(st, State::Releasing(g));
                }
                Err(e)
            }
        }
    }

    /// Gives back whatever `req`'s attempt holds or may hold (a grant whose answer was lost,
    /// or one it never heard of), and only that. Idempotent.
    pub(crate) async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        check_kind(req.key.kind)?;
        let Some(entry) = self.existing(&req.attempt) else {
            return Ok(());
        };
        let mut st = entry.state.lock().await;
        let r = self.give_up_in(&entry, &mut st, req).await;
        drop(st);
        self.tidy(&req.attempt, entry);
        r
    }

    async fn give_up_in(&self, entry: &Entry, st: &mut State, req: &AcquireRequest) -> Result<()> {
        Self::settle(entry, st);
        match &*st {
            State::Idle => Ok(()),
            State::Granted(g) | State::Releasing(g) => {
                let grant = req.grant(g.token);
                self.release_in(entry, st, &grant).await.map(|_| ())
            }
            State::Unknown(s) => {
                let s = s.clone();
                let all = s.others(&req.attempt) == 0;
                match self
                    .unlock(&s, &req.key.name, &req.attempt, req.key.kind, all)
                    .await
                {
                    Ok(_) => {
                        self.forget_on(entry, st, s, &req.attempt, true);
                        Ok(())
                    }
                    Err(_) if all => {
                        // Closing the session (this drops the last handle) frees whatever
                        // it holds.
                        self.forget_on(entry, st, s, &req.attempt, false);
                        Ok(())
                    }
                    Err(e) => {
                        Self::settle(entry, st);
                        Err(e)
                    }
                }
            }
        }
    }

    pub(crate) async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        for (g, _) in holds {
            check_kind(g.key.kind)?;
        }
        let all = futures_util::future::join_all(
            holds
                .iter()
                .map(|(grant, lease)| self.renew_one(grant, *lease)),
        )
        .await;
        all.into_iter().collect()
    }

    async fn renew_one(&self, grant: &GrantRef, lease: Duration) -> Result<RenewOutcome> {
        let Some(entry) = self.existing(&grant.attempt) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let mut st = entry.state.lock().await;
        let r = self.renew_in(&entry, &mut st, grant, lease).await;
        drop(st);
        self.tidy(&grant.attempt, entry);
        r
    }

    async fn renew_in(
        &self,
        entry: &Entry,
        st: &mut State,
        grant: &GrantRef,
        lease: Duration,
    ) -> Result<RenewOutcome> {
        Self::settle(entry, st);
        // `Releasing`: the grant is, or is about to be, given back.
        let State::Granted(g) = &*st else {
            return Ok(RenewOutcome::NotHeld);
        };
        if g.token != grant.token {
            return Ok(RenewOutcome::NotHeld);
        }
        let s = g.session.clone();
        // Never shorter than what the session already promises.
        let end = g.lease_end.max(LeaseInstant::now() + lease);
        let idle = s.idle_value(&grant.attempt, Some(end));
        match self
            .refresh(&s, &grant.key.name, &grant.attempt, lease, &idle)
            .await
        {
            Ok(true) => {
                s.extend(&grant.attempt, end);
                if let State::Granted(g) = st {
                    g.lease_end = end;
                }
                Ok(RenewOutcome::Renewed)
            }
            Ok(false) => {
                self.revoked(entry, st, grant.key.kind, &grant.key.name, &grant.attempt)
                    .await;
                Ok(RenewOutcome::NotHeld)
            }
            Err(e) => {
                Self::settle(entry, st);
                if matches!(st, State::Idle) {
                    s.remove(&grant.attempt);
                    return Ok(RenewOutcome::NotHeld);
                }
                Err(e)
            }
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
            "SELECT h.owner, 1::int4, \
                    GREATEST(EXTRACT(EPOCH FROM (h.expires_at - now())) * 1000, 0)::float8, \
                    h.kind \
             FROM dlock_holders h \
             WHERE h.ns = $1 AND h.name = $2 AND h.kind = ANY($5) AND {LIVE} \
             ORDER BY h.acquired_at, h.owner, h.attempt"
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
        let entries: Vec<Arc<Entry>> = self
            .attempts()
            .values()
            .filter(|e| &*e.name == name && &*e.owner == owner)
            .cloned()
            .collect();
        for e in entries {
            if let State::Granted(g) = &*e.state.lock().await {
                if !g.session.is_dead() {
                    return Some(g.session.pid);
                }
            }
        }
        None
    }

    /// Idle sessions kept for the next grant.
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
