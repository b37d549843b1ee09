//! Session mode: `GET_LOCK` on a dedicated connection per grant, as a dialect of the shared
//! SQL session layer ([`distlock_sql`]). docs/mysql.md, "Session mode in detail", has the
//! whole argument; the invariants:
//!
//! - the lock lives as long as the holder's connection, whose `wait_timeout` (set before the
//!   `GET_LOCK`, in the same round trip) covers the lease plus a grace: a holder that stops
//!   renewing is disconnected, and loses the lock, when the lease ends;
//! - each attempt (`AttemptId`) has its own slot holding at most one connection and the
//!   grant's token; its requests run one at a time, each in a task of its own to its end even
//!   when the caller stops waiting, so a late reply takes effect exactly once and the retry
//!   finds it (same connection, same token; the lease extended, never shortened); a request
//!   unanswered within [`Common::slow_limit`] closes its connection, freeing its `GET_LOCK`;
//! - tables: `dlock_fence` (tokens), `dlock_holders` (a row counts only while its connection
//!   id holds the key), `dlock_elections`, `dlock_election_observers` ([`crate::observe`]).

use crate::common::{
    close, col, key_of, last_row, next_token, query_sets, renewed, sql_str, wait_timeout_secs,
    Call, Common, Sets,
};
use crate::error::{conn_dead, shape, INTERRUPTED, KIND};
use distlock_core::backend::Capabilities;
use distlock_core::clock;
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, GrantRef, Granted, LockInfo, LockKind,
    LostReason, LostSignal, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use distlock_sql::closewatch::CloseWatch;
use distlock_sql::lease::{micros, wait_millis, wait_or_stop};
use distlock_sql::waited::{self, Step, WaitEnd};
use distlock_sql::{Dialect, Hold, HoldMap, HoldState, Sessions};
use mysql_async::{Conn, Row};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The schema of session mode (also used by table mode, for the fencing counters).
pub(crate) const DDL: &[&str] = &[
    include_str!("../sql/session_fence.sql"),
    include_str!("../sql/session_holders.sql"),
    include_str!("../sql/session_elections.sql"),
    include_str!("../sql/session_observers.sql"),
];

/// How long a released grant is remembered: a retry of its release (whose first reply came
/// late) is reported as such ([`ReleaseOutcome::Expired`]) even after another client took the
/// lock. A retry comes within the core's retry policy, far sooner.
const RELEASED_KEEP: Duration = Duration::from_secs(60);
/// At most this many released grants are remembered (oldest forgotten first).
const RELEASED_MAX: usize = 4096;

/// The grant an attempt holds: the connection whose `GET_LOCK` it is, and its token.
pub(crate) struct Grant {
    conn: Conn,
    token: u64,
    /// The latest lease end promised by a request on this connection that set the lease (its
    /// send time plus its lease): a new `wait_timeout` never ends before it, so no later
    /// request, however short its lease, shortens what an earlier one promised.
    lease_end: clock::Instant,
    /// Fires the attempt's lost signal the moment the connection is closed from the other
    /// side (`None`: the socket could not be found; the next renewal finds out).
    watch: Option<CloseWatch>,
}

impl Grant {
    /// Closes the connection now, which frees its lock (the watch's duplicate of the socket
    /// does not keep it open).
    fn close(self) {
        self.watch.iter().for_each(CloseWatch::shutdown);
        close(self.conn);
    }
}

#[derive(Default)]
pub(crate) enum State {
    #[default]
    Free,
    Held(Grant),
}

impl HoldState for State {
    fn is_idle(&self) -> bool {
        matches!(self, State::Free)
    }

    fn is_granted(&self) -> bool {
        matches!(self, State::Held(_))
    }

    /// A connection closed from the other side (seen by its watch); otherwise a connection's
    /// death is noticed by the next statement on it.
    fn is_gone(&self) -> bool {
        matches!(self, State::Held(g) if g.watch.as_ref().is_some_and(CloseWatch::closed))
    }
}

/// One attempt's state (its entry in the engine's hold map).
type Slot = Hold<State>;

/// The MySQL/MariaDB dialect of session mode: `GET_LOCK` on dedicated connections.
pub(crate) struct MyDialect {
    common: Arc<Common>,
    /// Grants this client released recently (attempt, token, when).
    released: StdMutex<VecDeque<(AttemptId, u64, Instant)>>,
}

/// The statement of one try or wait for `lk`: the lease on the connection before the lock is
/// (it counts from the grant: the connection is busy, not idle, while it waits; a connection
/// this process loses track of frees the lock when the lease ends, not after the server's
/// default hours), then `GET_LOCK(lk, secs)`. The key is `dlock:` and hex digits, safe to
/// inline; inlined, it shows in `SHOW PROCESSLIST`, so operators see which lock a connection
/// waits for.
fn lock_sql(lk: &str, lease: Duration, secs: f64) -> String {
    format!(
        "SET SESSION wait_timeout = {}; SELECT GET_LOCK('{lk}', {secs:.3})",
        wait_timeout_secs(lease)
    )
}

/// The seconds of a wait of `left`, rounded up to the millisecond (the server must not give up
/// before the deadline), or an hour without a deadline (the engine waits again).
fn wait_secs(left: Option<Duration>) -> f64 {
    left.map_or(3600.0, |r| wait_millis(r) as f64 / 1000.0)
}

/// How a wait that answered `reply` (its `GET_LOCK`'s value) ended.
fn reply_end(reply: Option<i64>) -> WaitEnd {
    match reply {
        Some(1) => WaitEnd::Granted,
        Some(0) => WaitEnd::TimedOut { may_hold: false },
        other => WaitEnd::Failed(shape("GET_LOCK", format!("{other:?}"))),
    }
}

/// The first column of the row that ends a query (the value of its `GET_LOCK`, say), as an
/// integer (`None`: NULL, or no such row).
fn lock_reply(sets: &[Vec<Row>]) -> Option<i64> {
    let row = sets.last()?.first()?;
    row.get_opt::<Option<i64>, usize>(0)?.ok()?
}

impl MyDialect {
    /// The `GET_LOCK` key of `name`'s lock of `kind` (an election has its own).
    fn lk(&self, name: &str, kind: LockKind) -> String {
        key_of(&self.common.namespace, name, kind)
    }

    /// Watches `conn`, a new grant's connection, for a close from the other side (a `KILL`, a
    /// proxy closing or resetting it): the server frees the lock the moment it reads that, so
    /// `lost` fires then rather than at the next renewal, a third of a lease later.
    fn watch(&self, conn: &Conn, lost: &LostSignal) -> Option<CloseWatch> {
        let Some(fd) = crate::socket::socket_of(conn) else {
            tracing::debug!("the holder's socket is unknown: a close shows at its next renewal");
            return None;
        };
        let lost = lost.clone();
        let why = format!(
            "the connection to {} holding the lock (connection {}) was closed by the server or \
             by something between",
            self.common.endpoint,
            conn.id()
        );
        let fire = move || {
            tracing::warn!(reason = %why, "mysql session holding a lock ended");
            lost.fire(LostReason::SessionEnded(why));
        };
        CloseWatch::start(fd, fire)
            .inspect_err(|e| tracing::debug!(error = %e, "the holder's socket cannot be watched"))
            .ok()
    }

    fn record_released(&self, attempt: &AttemptId, token: u64) {
        let mut r = self.released.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while r.len() >= RELEASED_MAX
            || r.front()
                .is_some_and(|(_, _, at)| now.duration_since(*at) > RELEASED_KEEP)
        {
            r.pop_front();
        }
        r.push_back((attempt.clone(), token, now));
    }

    fn was_released(&self, attempt: &AttemptId, token: u64) -> bool {
        let r = self.released.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().any(|(a, t, _)| a == attempt && *t == token)
    }

    /// A retry of a granted attempt: its token again, the lease extended to at least `lease`
    /// from now. `None`: the slot holds nothing (any grant it had is gone).
    async fn again(&self, slot: &Slot, st: &mut State, lease: Duration) -> Result<Option<u64>> {
        let State::Held(g) = st else {
            return Ok(None);
        };
        let token = g.token;
        Ok(self.extend(slot, st, lease).await?.then_some(token))
    }

    /// Records the grant `conn` holds for `req` (new fencing token, holder row, in one round
    /// trip; lease promised until `lease_end`) and makes it the slot's state, watched for a
    /// close. If recording fails, `conn` is closed, which frees the lock nobody will be told
    /// of. An election's grant also stores the candidate's value (proclamation number 0) with
    /// its token, all in one transaction: the value appears with the leader, atomically.
    async fn hold(
        &self,
        slot: &Slot,
        st: &mut State,
        mut conn: Conn,
        req: &AcquireRequest,
        lease_end: clock::Instant,
    ) -> Result<u64> {
        let lk = self.lk(&slot.name, slot.kind);
        let ns = sql_str(&self.common.namespace);
        let name = sql_str(&slot.name);
        let owner = sql_str(&slot.owner);
        let us = micros(req.lease);
        let observed = crate::observe::observed_col(slot.kind, &lk);
        let election = (slot.kind, req.value.as_deref());
        let election = crate::observe::election_row(election, &lk, (&ns, &name), "@dlock_token");
        let (begin, commit) = match election.is_empty() {
            true => ("", ""),
            false => ("START TRANSACTION; ", "COMMIT; "),
        };
        // Rows of earlier holders are stale: this connection holds `GET_LOCK` now.
        let (first, next) = (next_token("0"), next_token("token"));
        let sql = format!(
            "{begin}INSERT INTO dlock_fence (lock_key, ns, name, token) \
             VALUES ('{lk}', {ns}, {name}, LAST_INSERT_ID({first})) \
             ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID({next}); \
             SET @dlock_token = LAST_INSERT_ID(); \
             DELETE FROM dlock_holders WHERE lock_key = '{lk}'; \
             INSERT INTO dlock_holders \
             (lock_key, owner, ns, name, token, count, conn_id, acquired_at, expires_at) \
             VALUES ('{lk}', {owner}, {ns}, {name}, @dlock_token, 1, CONNECTION_ID(), \
                     UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL {us} MICROSECOND); \
             {election}{commit}SELECT @dlock_token{observed}"
        );
        let c = self.common.slow_call(query_sets(&mut conn, sql)).await;
        let sets = self.common.result("recording the grant", c);
        let token = sets.and_then(|sets| {
            let row = last_row("fencing token", &sets)?;
            crate::observe::wake_if(&self.common, &lk, row, 1);
            crate::common::token(col("fencing token", row, 0)?)
        });
        let Ok(token) = token else {
            close(conn);
            return token;
        };
        let watch = self.watch(&conn, &req.lost);
        *st = State::Held(Grant {
            conn,
            token,
            lease_end,
            watch,
        });
        Ok(token)
    }

    /// The holder's lease left (for a waiter's sleep), read on `conn` as it goes back.
    async fn held_ttl(&self, conn: Conn, lk: &str) -> Option<Duration> {
        let select = format!(
            "; SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
             FROM dlock_holders WHERE lock_key = '{lk}' AND conn_id = IS_USED_LOCK('{lk}')"
        );
        let us = lock_reply(&self.give_back(conn, None, &select).await?);
        us.filter(|us| *us > 0)
            .map(|us| Duration::from_micros(us as u64))
    }

    /// Makes the held grant's lease run at least `lease` from now, never shortening it.
    /// `Ok(false)`: the grant is gone (its connection died, or an operator deleted its row),
    /// and the slot holds nothing any more.
    async fn extend(&self, slot: &Slot, st: &mut State, lease: Duration) -> Result<bool> {
        let State::Held(g) = st else {
            return Ok(false);
        };
        let name: &str = &slot.name;
        let lk = self.lk(name, slot.kind);
        let sent = clock::Instant::now();
        let end = g.lease_end.max(sent + lease);
        let secs = wait_timeout_secs(end.saturating_duration_since(sent));
        let us = micros(lease);
        let sql = format!(
            "SET SESSION wait_timeout = {secs}; \
             UPDATE dlock_holders SET expires_at = \
             GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL {us} MICROSECOND) \
             WHERE lock_key = '{lk}' AND conn_id = CONNECTION_ID(); \
             SELECT ROW_COUNT()"
        );
        let c = self.common.slow_call(query_sets(&mut g.conn, sql)).await;
        let gone = match c {
            Call::Ok(sets) => {
                let found: i64 = col("renewing", last_row("renewing", &sets)?, 0)?;
                if found >= 1 {
                    g.lease_end = end;
                    return Ok(true);
                }
                // The holder's row was deleted (an operator revoked the lock): give it up.
                tracing::warn!(name, "dlock_holders row gone: the lock was revoked");
                Ok(false)
            }
            // The session is gone, and the lock with it.
            Call::Err(e) if conn_dead(&e) => Ok(false),
            other if Common::reusable(&other) => return Err(self.common.error("renewing", other)),
            // No answer in time: the connection is unusable.
            other => Err(self.common.error("renewing", other)),
        };
        // Closing the connection frees the lock.
        if let State::Held(g) = std::mem::take(st) {
            g.close();
        }
        gone
    }

    /// Releases the slot's grant; the slot holds nothing afterwards.
    async fn release_held(
        &self,
        slot: &Slot,
        st: &mut State,
        attempt: &AttemptId,
    ) -> Result<ReleaseOutcome> {
        let State::Held(mut g) = std::mem::take(st) else {
            return self.not_held_outcome(&slot.name, slot.kind).await;
        };
        // The release's reply tells how the grant ended.
        g.watch.iter().for_each(CloseWatch::stop);
        let lk = self.lk(&slot.name, slot.kind);
        let observed = crate::observe::observed_col(slot.kind, &lk);
        let sql = format!(
            "DELETE FROM dlock_holders WHERE lock_key = '{lk}' AND conn_id = CONNECTION_ID(); \
             SET SESSION wait_timeout = @@GLOBAL.wait_timeout; \
             SELECT RELEASE_LOCK('{lk}'){observed}"
        );
        let c = self.common.slow_call(query_sets(&mut g.conn, sql)).await;
        if let Call::Ok(sets) = c {
            self.common.idle.put(g.conn);
            if let Some(row) = sets.last().and_then(|r| r.first()) {
                crate::observe::wake_if(&self.common, &lk, row, 1);
            }
            if lock_reply(&sets) != Some(1) {
                return self.not_held_outcome(&slot.name, slot.kind).await;
            }
            self.record_released(attempt, g.token);
            return Ok(ReleaseOutcome::Released);
        }
        // A dead session ended the grant before the release. Refused or unanswered: closing
        // the connection gives the lock back all the same, so a retry of this release is told
        // it already happened.
        let dead = matches!(&c, Call::Err(e) if conn_dead(e));
        if !dead {
            self.record_released(attempt, g.token);
            g.close();
        }
        // After the close: observers then read the election without this grant.
        if slot.kind == LockKind::Election {
            crate::observe::wake(&self.common, &lk);
        }
        match c {
            _ if dead => self.not_held_outcome(&slot.name, slot.kind).await,
            Call::Timeout(_) => Err(self.common.error("releasing", c)),
            _ => Ok(ReleaseOutcome::Released),
        }
    }

    async fn not_held_outcome(&self, name: &str, kind: LockKind) -> Result<ReleaseOutcome> {
        Ok(match self.common.used_by(&self.lk(name, kind)).await? {
            Some(_) => ReleaseOutcome::TakenByOther,
            None => ReleaseOutcome::Expired,
        })
    }

    /// Runs the wait `sql` on `conn`, stopped here (`KILL QUERY`) by `cancel` or the safety
    /// net after `deadline`; how it ended.
    async fn wait_on(
        &self,
        conn: &mut Conn,
        sql: String,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> WaitEnd {
        let id = conn.id();
        let wait = query_sets(conn, sql);
        tokio::pin!(wait);
        match wait_or_stop(&mut wait, cancel, deadline).await {
            // Granted as the caller went away: given straight back.
            Some(Ok(sets)) if cancel.is_cancelled() && lock_reply(&sets) == Some(1) => {
                WaitEnd::Stopped(Some(true))
            }
            Some(Ok(sets)) => reply_end(lock_reply(&sets)),
            Some(Err(e)) => WaitEnd::Failed(self.common.failed(e)),
            None => {
                // Stop the server-side wait, then see how it ended.
                if let Err(e) = self
                    .common
                    .kill("KILL QUERY", "KILL QUERY", id.into())
                    .await
                {
                    tracing::debug!(error = %e, "KILL QUERY failed");
                }
                match tokio::time::timeout(self.common.op_timeout, &mut wait).await {
                    Ok(Ok(sets)) => WaitEnd::Stopped(Some(lock_reply(&sets) == Some(1))),
                    Ok(Err(mysql_async::Error::Server(s))) if s.code == INTERRUPTED => {
                        WaitEnd::Stopped(Some(false))
                    }
                    _ => WaitEnd::Stopped(None),
                }
            }
        }
    }

    /// Hands a connection back to the pool with the default idle timeout, releasing `lock`
    /// first if given, and running `then` last (its result sets returned); closes it if that
    /// fails (which frees the lock all the same).
    async fn give_back(&self, mut conn: Conn, lock: Option<&str>, then: &str) -> Option<Sets> {
        let release = lock.map_or(String::new(), |lk| format!("DO RELEASE_LOCK('{lk}'); "));
        let sql = format!("{release}SET SESSION wait_timeout = @@GLOBAL.wait_timeout{then}");
        let c = self.common.call(query_sets(&mut conn, sql)).await;
        self.common.dispose(conn, &c, false);
        let Call::Ok(sets) = c else { return None };
        Some(sets)
    }
}

#[async_trait]
impl Dialect for MyDialect {
    type State = State;

    fn backend(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.common.endpoint.clone()
    }

    /// `GET_LOCK` belongs to the holder's connection, which ends with its process (a hold
    /// cannot be left to run out on the server after the process exits).
    fn capabilities(&self) -> Capabilities {
        crate::common::capabilities().lease_expiry(false)
    }

    /// See [`crate::observe`].
    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        crate::observe::observe(&self.common, name).await
    }

    /// Every request runs to its end in a task of its own (see the module docs); the caller
    /// waits for the answer at most the op timeout.
    fn detached(&self) -> Option<Duration> {
        Some(self.common.op_timeout)
    }

    /// One try: a retry of the attempt that holds its grant answers that grant again (the
    /// lease extended, never shortened) with the same token; otherwise `GET_LOCK(key, 0)` on
    /// a connection of its own.
    async fn try_lock(
        &self,
        _holds: &HoldMap<State>,
        slot: &Slot,
        st: &mut State,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        if let Some(token) = self.again(slot, st, req.lease).await? {
            return Ok(AcquireReply::Granted { token });
        }
        let lk = self.lk(&slot.name, slot.kind);
        let mut conn = self.common.take().await?;
        let sent = clock::Instant::now();
        let sql = lock_sql(&lk, req.lease, 0.0);
        let got = match self.common.slow_call(query_sets(&mut conn, sql)).await {
            Call::Ok(sets) => lock_reply(&sets),
            other => {
                self.common.dispose(conn, &other, false);
                return Err(self.common.error("GET_LOCK", other));
            }
        };
        match got {
            Some(1) => {
                let token = self.hold(slot, st, conn, req, sent + req.lease).await?;
                Ok(AcquireReply::Granted { token })
            }
            Some(0) => Ok(AcquireReply::Held {
                ttl: self.held_ttl(conn, &lk).await,
            }),
            other => {
                close(conn);
                Err(shape("GET_LOCK", format!("{other:?}")))
            }
        }
    }

    /// One server-side wait of the attempt (the slot locked by the caller for all of it):
    /// `GET_LOCK(key, seconds left)` on a connection of its own.
    async fn wait(
        &self,
        _holds: &HoldMap<State>,
        slot: &Slot,
        st: &mut State,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let sent = clock::Instant::now();
        if let Some(token) = self.again(slot, st, req.lease).await? {
            return Ok(Some(Granted::new(token, sent)));
        }
        let lk = self.lk(&slot.name, slot.kind);
        let mut conn = self.common.take().await?;
        let Some(left) = waited::budget(deadline, cancel) else {
            self.common.idle.put(conn);
            return Ok(None);
        };
        let sql = lock_sql(&lk, req.lease, wait_secs(left));
        let end = self.wait_on(&mut conn, sql, deadline, cancel).await;
        let (step, answer) = waited::after(end);
        match step {
            Step::Register => {
                // The lease counts from after the grant: every statement from here on resets
                // the connection's idle time.
                let sent = clock::Instant::now();
                let token = self.hold(slot, st, conn, req, sent + req.lease).await?;
                return Ok(Some(Granted::new(token, sent)));
            }
            Step::Reuse { unlock } => {
                self.give_back(conn, unlock.then_some(&*lk), "").await;
            }
            // The wait's outcome is unknown: the connection goes, and any lock with it.
            Step::Close => close(conn),
        }
        answer.map(|()| None)
    }

    /// Releases exactly the grant `grant` names: a stale address (this attempt's grant now is
    /// another one: its old connection died and a retry took the lock again) never releases
    /// that one.
    async fn unlock(
        &self,
        slot: &Slot,
        st: &mut State,
        grant: &GrantRef,
    ) -> Result<ReleaseOutcome> {
        match st {
            State::Held(g) if g.token == grant.token => {
                self.release_held(slot, st, &grant.attempt).await
            }
            State::Held(_) => Ok(ReleaseOutcome::TakenByOther),
            State::Free => self.not_held(grant).await,
        }
    }

    async fn keepalive(
        &self,
        slot: &Slot,
        st: &mut State,
        grant: &GrantRef,
        lease: Duration,
    ) -> Result<RenewOutcome> {
        let held = matches!(st, State::Held(g) if g.token == grant.token);
        Ok(renewed(held && self.extend(slot, st, lease).await?))
    }

    async fn give_up(&self, slot: &Slot, st: &mut State, req: &AcquireRequest) -> Result<()> {
        if matches!(st, State::Held(_)) {
            self.release_held(slot, st, &req.attempt).await?;
        }
        Ok(())
    }

    async fn not_held(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        if self.was_released(&grant.attempt, grant.token) {
            return Ok(ReleaseOutcome::Expired);
        }
        self.not_held_outcome(&grant.key.name, grant.key.kind).await
    }

    /// See [`crate::observe::proclaim`]: the leader is the holder row whose connection holds
    /// the election's key.
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        let lk = self.lk(&grant.key.name, LockKind::Election);
        let leads = ("dlock_holders", "h.conn_id = IS_USED_LOCK(?)", lk.clone());
        crate::observe::proclaim(&self.common, lk, (grant.token, seq, value), leads).await
    }

    /// The holder rows whose connection holds the key, with the value stored with the token
    /// (an election's leader; NULL for a lock). A connection holding the key without a row
    /// (between its grant and its registration, or a grant being given back) is reported as
    /// a nameless holder, for an election too: nobody else can lead while it holds the key.
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let lk = self.lk(name, kind);
        let holders = ("dlock_holders", "h.conn_id = IS_USED_LOCK(h.lock_key)");
        self.common.inspect((name, kind, lk), holders, true).await
    }
}

/// Session mode: the shared engine with the MySQL dialect.
pub(crate) type SessionMode = Sessions<MyDialect>;

/// Session mode on `common`'s server.
pub(crate) fn new_mode(common: Arc<Common>) -> SessionMode {
    Sessions::new(MyDialect {
        common,
        released: StdMutex::new(VecDeque::new()),
    })
}

/// The connection id holding `name` for `owner` in this client (`KILL id` revokes it).
pub(crate) async fn holder_connection(mode: &SessionMode, name: &str, owner: &str) -> Option<u32> {
    for slot in mode.holds_of(name, owner) {
        // A slot busy for longer is an attempt waiting in `GET_LOCK`, not a holder.
        let limit = mode.dialect().common.op_timeout;
        let st = tokio::time::timeout(limit, slot.state.lock()).await;
        if let Ok(State::Held(g)) = st.as_deref() {
            return Some(g.conn.id());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::Error;

    #[test]
    fn wait_statements_and_replies() {
        let lk = "dlock:00ff";
        let wait = |lease, left| lock_sql(lk, Duration::from_secs(lease), wait_secs(left));
        assert_eq!(
            wait(30, None),
            "SET SESSION wait_timeout = 35; SELECT GET_LOCK('dlock:00ff', 3600.000)"
        );
        // Rounded up and one more millisecond: the server never gives up before the deadline.
        assert_eq!(
            wait(2, Some(Duration::from_micros(1500))),
            "SET SESSION wait_timeout = 3; SELECT GET_LOCK('dlock:00ff', 0.003)"
        );
        assert_eq!(
            lock_sql(lk, Duration::from_secs(2), 0.0),
            "SET SESSION wait_timeout = 3; SELECT GET_LOCK('dlock:00ff', 0.000)"
        );
        assert!(matches!(reply_end(Some(1)), WaitEnd::Granted));
        assert!(matches!(
            reply_end(Some(0)),
            WaitEnd::TimedOut { may_hold: false }
        ));
        for odd in [None, Some(2), Some(-1)] {
            assert!(
                matches!(
                    reply_end(odd),
                    WaitEnd::Failed(Error::UnexpectedReply { .. })
                ),
                "{odd:?}"
            );
        }
    }
}
