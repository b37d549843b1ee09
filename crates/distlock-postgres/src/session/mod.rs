//! Session mode: PostgreSQL session-level advisory locks, each grant on its own connection,
//! as a dialect of the shared SQL session layer ([`distlock_sql`]); docs/postgres.md
//! (*Session mode in detail*) has the protocol in full.
//!
//! A grant's lock lives exactly as long as its dedicated session, whose
//! `idle_session_timeout` is the lease plus a grace (PostgreSQL 14+). A request whose answer
//! never came leaves the attempt *unknown* on its session: the attempt's retry asks that same
//! session (its statements run in order, after the late one), and a give-up unlocks (or
//! closes) it, so a lost reply never makes a second session take the lock. Only a write grant
//! and the read grant of its downgrade share a session (the server must see one holder).
//! Statements: `sql/session_*.sql`.

mod conn;
mod sql;
mod state;
mod wait;

use crate::common::params;
use crate::common::{
    cols, election_key, first, key_of, key_oids, lease_left, side, token_u64, Common,
};
use crate::error::KIND;
use crate::listen::Listener;
use distlock_core::backend::Capabilities;
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, GrantRef, Granted, HolderInfo, LockInfo, LockKind,
    ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use distlock_sql::waited::{self, Step};
use distlock_sql::{Dialect, Hold, HoldMap, HoldState, IdlePool, Sessions};
use state::{Entry, State};
use std::ops::ControlFlow::{Break, Continue};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The schema of session mode (with the migration of an older table).
pub(crate) const DDL: &str = concat!(
    include_str!("../../sql/session_schema.sql"),
    include_str!("../../sql/election_schema.sql")
);

pub(crate) const TABLES: &[&str] = &[
    "dlock_fence_seq",
    "dlock_fence",
    "dlock_holders",
    "dlock_elections",
];

/// Columns this version needs (a table of an older version lacks them: the DDL migrates it).
pub(crate) const COLUMNS: &[(&str, &str)] = &[("dlock_holders", "attempt")];

const INSPECT: &str = include_str!("../../sql/session_inspect.sql");
const FENCE: &str = include_str!("../../sql/fence.sql");
const WAITERS: &str = include_str!("../../sql/session_waiters.sql");
const ANY_HOLDER: &str = include_str!("../../sql/session_any_holder.sql");
const ELECTION_INSPECT: &str = include_str!("../../sql/election_inspect.sql");
const ELECTION_PROCLAIM: &str = include_str!("../../sql/election_proclaim.sql");

/// Idle sessions kept for reuse.
const POOL_MAX: usize = 8;

/// Session mode does mutexes, fair locks (PostgreSQL queues waiters in arrival order and a
/// newcomer queues behind a conflicting waiter), read-write locks and elections (a mutex on
/// the election's own key, its leader and value in `dlock_elections`).
pub(crate) fn capabilities() -> Capabilities {
    Capabilities::kinds(&[
        LockKind::Mutex,
        LockKind::Fair,
        LockKind::Read,
        LockKind::Write,
        LockKind::Election,
    ])
    // An advisory lock belongs to the holder's session, which ends with its process (a hold
    // cannot be left to run out on the server after the process exits).
    .lease_expiry(false)
}

fn exclusive(kind: LockKind) -> bool {
    !matches!(kind, LockKind::Read)
}

/// The PostgreSQL dialect of session mode: advisory locks on dedicated sessions.
pub(crate) struct PgDialect {
    common: Arc<Common>,
    listener: Arc<Listener>,
    /// Idle sessions kept for the next grant.
    pub(crate) pool: IdlePool<Arc<conn::Session>>,
}

#[async_trait]
impl Dialect for PgDialect {
    type State = State;

    fn backend(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.common.endpoint.clone()
    }

    /// A downgrade's wake-ups (it waits for them, beside the write side's session).
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.listener.lock_watch(req).await
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.listener.election_watch(name).await
    }

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    /// One try for `req`'s attempt, without waiting.
    async fn try_lock(
        &self,
        holds: &HoldMap<State>,
        entry: &Entry,
        st: &mut State,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        let s = match self.start(holds, entry, st, req, true).await? {
            Break(g) => return Ok(AcquireReply::Granted { token: g.token }),
            Continue(s) => s,
        };
        self.forget_on(entry, st, s, true);
        let ttl = self.holder_ttl(&req.key.name, req.key.kind).await;
        Ok(AcquireReply::Held { ttl })
    }

    /// A downgrade is granted beside the write side, on its session: never a blocking wait
    /// there (it would hold up that session's renewals).
    async fn waits_on_server(&self, holds: &HoldMap<State>, req: &AcquireRequest) -> bool {
        Self::downgrade_session(holds, req).await.is_none()
    }

    /// One server-side wait of the attempt (its state locked by the caller for all of it):
    /// a try first, then the blocking wait on the attempt's own session ([`wait`]).
    async fn wait(
        &self,
        holds: &HoldMap<State>,
        hold: &Hold<State>,
        st: &mut State,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let s = match self.start(holds, hold, st, req, false).await? {
            Break(g) => return Ok(Some(g)),
            Continue(s) => s,
        };
        let Some(left) = waited::budget(deadline, cancel) else {
            self.forget_on(hold, st, s, true);
            return Ok(None);
        };
        let (step, answer) = waited::after(self.wait_on(&s, req, left, deadline, cancel).await);
        match step {
            Step::Register => {
                // The server's lease restarts with the registration, which starts now.
                let sent = LeaseInstant::now();
                let idle = s.idle_value(&req.attempt, Some(sent + req.lease));
                let token = self.grant_on(hold, st, s, req, &idle).await?;
                return Ok(Some(Granted::new(token, sent)));
            }
            // The attempt's dedicated wait session (a wait never shares its session): all of
            // it is given back, and the session closed if that fails.
            Step::Reuse { unlock: true } => {
                let _ = self.drop_on(hold, st, s).await;
            }
            Step::Reuse { unlock: false } => self.forget_on(hold, st, s, true),
            // Never pooled after a stop: its `pg_cancel_backend` may still be on its way (its
            // call timed out on a loaded control connection, so the statement runs later). On
            // a reused session it would cancel another attempt's statement and fail a waiter
            // that must not give up.
            Step::Close => self.forget_on(hold, st, s, false),
        }
        answer.map(|()| None)
    }

    /// Releases exactly the grant `grant` names. A release whose answer was lost leaves the
    /// attempt `Releasing`: its retry runs the release again on the same session, after the
    /// first (which then finds it released: `Expired`, which the core reports as released).
    async fn unlock(
        &self,
        entry: &Entry,
        st: &mut State,
        grant: &GrantRef,
    ) -> Result<ReleaseOutcome> {
        entry.settle(st);
        let (again, s) = match &*st {
            State::Granted(g) if g.token == grant.token => (false, g.session.clone()),
            State::Releasing(g) if g.token == grant.token => (true, g.session.clone()),
            _ => return self.not_held(grant).await,
        };
        let unlocked = match self.unlock_on(&s, entry, false).await {
            Ok(unlocked) => {
                self.forget_on(entry, st, s, true);
                unlocked
            }
            Err(e) => {
                let e = Self::failed(entry, st, &s, e);
                if let State::Granted(g) | State::Releasing(g) = std::mem::take(st) {
                    entry.set(st, State::Releasing(g));
                    return Err(e);
                }
                // The session ended: the lock went with it (the attempt `Idle`).
                false
            }
        };
        match (unlocked, again) {
            (true, _) => Ok(ReleaseOutcome::Released),
            (false, true) => Ok(ReleaseOutcome::Expired),
            // The session did not hold it (an operator unlocked it there), or ended.
            (false, false) => self.not_held(grant).await,
        }
    }

    async fn keepalive(
        &self,
        entry: &Entry,
        st: &mut State,
        grant: &GrantRef,
        lease: Duration,
    ) -> Result<RenewOutcome> {
        entry.settle(st);
        // `Releasing`: the grant is, or is about to be, given back.
        if !matches!(&*st, State::Granted(g) if g.token == grant.token) {
            return Ok(RenewOutcome::NotHeld);
        }
        match self.extend(entry, st, lease).await {
            Ok(true) => Ok(RenewOutcome::Renewed),
            Ok(false) => Ok(RenewOutcome::NotHeld),
            // The session ended: the lock went with it.
            Err(_) if st.is_idle() => Ok(RenewOutcome::NotHeld),
            Err(e) => Err(e),
        }
    }

    /// Gives back whatever `req`'s attempt holds or may hold (a grant whose answer was lost,
    /// or one it never heard of), and only that. Idempotent.
    async fn give_up(&self, entry: &Entry, st: &mut State, req: &AcquireRequest) -> Result<()> {
        entry.settle(st);
        match &*st {
            State::Idle => Ok(()),
            State::Granted(g) | State::Releasing(g) => {
                let grant = req.grant(g.token);
                self.unlock(entry, st, &grant).await.map(|_| ())
            }
            State::Unknown(s) => {
                let s = s.clone();
                self.drop_on(entry, st, s).await
            }
        }
    }

    async fn not_held(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let key = key_of(&self.common.namespace, &grant.key.name, grant.key.kind);
        let (classid, objid) = key_oids(key);
        let params = params![classid, objid];
        let what = "checking the lock";
        let rows = self.common.query(what, ANY_HOLDER, &params).await?;
        Ok(match first(what, &rows)? {
            true => ReleaseOutcome::TakenByOther,
            false => ReleaseOutcome::Expired,
        })
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        let (classid, objid) = key_oids(election_key(&self.common.namespace, &grant.key.name));
        let leads = params![classid, objid];
        let sql = ELECTION_PROCLAIM;
        self.common.proclaim(sql, grant, (seq, value), &leads).await
    }

    /// A lock's live holders, fencing token and waiters; an election's leader (the row whose
    /// backend holds the election's key) with its value and token, waiting candidates counted
    /// as waiters, never as holders.
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let common = &self.common;
        let ns = common.namespace.as_str();
        let (classid, objid) = key_oids(key_of(ns, name, kind));
        let kinds: Vec<&str> = match kind {
            LockKind::Read | LockKind::Write => vec!["read", "write"],
            _ => vec![kind.as_str()],
        };
        let election = kind == LockKind::Election;
        let client = common.control().await?;
        // The holders' ($1-$5; the leader's: $1-$4), a lock's fence's ($1, $2; an election's
        // token is in its row) and the waiters' ($1, $2 = classid, objid).
        let params = params![ns, name, classid, objid, kinds];
        let (sql, n, what) = [
            (INSPECT, 5, "inspecting"),
            (ELECTION_INSPECT, 4, "inspecting the election"),
        ][usize::from(election)];
        let fence = async {
            match election {
                true => Ok(Vec::new()),
                false => client.query_typed(FENCE, &params[..2]).await,
            }
        };
        let (rows, fence, waiting) = common
            .run(what, async {
                tokio::try_join!(
                    client.query_typed(sql, &params[..n]),
                    fence,
                    client.query_typed(WAITERS, &params[2..4]),
                )
            })
            .await?;
        let waiters: i64 = first("inspect", &waiting)?;
        let info =
            LockInfo::new(name).with_waiters(Some(u32::try_from(waiters).unwrap_or(u32::MAX)));
        let lease_note = common.has_session_timeouts();
        let left = |ms| lease_left(Some(ms)).filter(|_| lease_note);
        if election {
            let Some(r) = rows.first() else {
                return Ok(info);
            };
            let (owner, value, token, ms, leads): (String, String, i64, f64, bool) = cols(r, what)?;
            let leader = HolderInfo::new(owner, 1).with_value(Some(value));
            let leader = leads.then(|| leader.with_lease_left(left(ms)));
            return Ok(info
                .with_fencing_token(token_u64(token)?)
                .with_holders(leader.into_iter().collect()));
        }
        let holder = |r| {
            let (owner, count, ms, row_kind): (String, i32, f64, &str) = cols(r, "inspect")?;
            Ok(HolderInfo::new(owner, u32::try_from(count).unwrap_or(0))
                .with_lease_left(left(ms))
                .with_side(side(row_kind)))
        };
        let holders = rows.iter().map(holder).collect::<Result<_>>()?;
        let token = |r| token_u64(cols::<(i64,)>(r, "fencing token")?.0);
        let fencing_token = fence.first().map_or(Ok(0), token)?;
        Ok(info.with_holders(holders).with_fencing_token(fencing_token))
    }
}

/// Session mode: the shared engine with the PostgreSQL dialect (its server-side wait: [`wait`]).
pub(crate) type SessionMode = Sessions<PgDialect>;

/// Session mode on `common`'s server.
pub(crate) fn new_mode(common: Arc<Common>, listener: Arc<Listener>) -> SessionMode {
    Sessions::new(PgDialect {
        common,
        listener,
        pool: IdlePool::new(POOL_MAX),
    })
}

/// [`PostgresBackend::holder_pid`](crate::PostgresBackend::holder_pid).
pub(crate) async fn holder_pid(mode: &SessionMode, name: &str, owner: &str) -> Option<i32> {
    for e in mode.holds_of(name, owner) {
        if let State::Granted(g) = &*e.state.lock().await {
            if !g.session.is_dead() {
                return Some(g.session.pid);
            }
        }
    }
    None
}
