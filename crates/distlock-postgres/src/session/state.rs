//! What this backend knows about one attempt's lock, and the requests that move it: a try,
//! the resumption of an earlier request, the grant, a revocation, release, give-up, renewal.

use super::conn::Session;
use super::PgDialect;
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{AcquireRequest, Error, Granted, LockKind, Result};
use distlock_sql::{Hold, HoldMap, HoldState};
use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::Arc;
use std::time::Duration;

/// What this backend knows about one attempt's lock on the server.
#[derive(Default)]
pub(crate) enum State {
    /// Nothing held (or nothing yet).
    #[default]
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

pub(crate) struct GrantState {
    pub(crate) session: Arc<Session>,
    pub(crate) token: u64,
    /// Local estimate of when the lease ends (never moved earlier).
    pub(crate) lease_end: LeaseInstant,
}

impl HoldState for State {
    fn is_idle(&self) -> bool {
        matches!(self, State::Idle)
    }

    fn is_granted(&self) -> bool {
        matches!(self, State::Granted(_))
    }

    fn is_gone(&self) -> bool {
        match self {
            State::Idle => true,
            State::Unknown(s) => s.is_dead(),
            State::Granted(g) | State::Releasing(g) => g.session.is_dead(),
        }
    }
}

pub(crate) type Entry = Hold<State>;

impl PgDialect {
    /// A request of the attempt on `s` failed with `e`: if the session ended meanwhile (its
    /// locks went with it, its end fired the lost signals), the attempt is `Idle` and no
    /// longer counted on `s`.
    pub(crate) fn failed(entry: &Entry, st: &mut State, s: &Session, e: Error) -> Error {
        entry.settle(st);
        if st.is_idle() {
            s.grants.remove(&entry.attempt);
        }
        e
    }

    /// A reader asking for the write side: refused (two readers doing it would deadlock).
    pub(crate) fn check_upgrade(holds: &HoldMap<State>, req: &AcquireRequest) -> Result<()> {
        if req.key.kind != LockKind::Write {
            return Ok(());
        }
        let reading = holds.any(|e| {
            e.kind == LockKind::Read
                && e.name == req.key.name
                && e.owner == req.key.owner
                && e.granted()
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
    pub(crate) async fn downgrade_session(
        holds: &HoldMap<State>,
        req: &AcquireRequest,
    ) -> Option<Arc<Session>> {
        let w = req.write_grant.as_ref()?;
        let entry = holds.existing(&w.attempt)?;
        let st = entry.state.lock().await;
        match &*st {
            State::Granted(g) if g.token == w.token && !g.session.is_dead() => {
                Some(g.session.clone())
            }
            _ => None,
        }
    }

    /// A try (or a wait's first try) of `req`: the grant an earlier request of the attempt
    /// left, or a `pg_try_advisory_lock`'s on the session to try on, the attempt `Unknown` on
    /// it (a new session — the write grant's own for a downgrade, if `downgrade` — or the
    /// one an unanswered request left). Not granted: that session, which holds nothing, the
    /// attempt still `Unknown` on it. After an error the attempt stays unknown on a live
    /// session: a retry asks it, a give-up unlocks it. Each grant is measured from before the
    /// request that made it.
    pub(crate) async fn start(
        &self,
        holds: &HoldMap<State>,
        entry: &Entry,
        st: &mut State,
        req: &AcquireRequest,
        downgrade: bool,
    ) -> Result<ControlFlow<Granted, Arc<Session>>> {
        let sent = LeaseInstant::now();
        if let Some(token) = self.resume(entry, st, req).await? {
            return Ok(Break(Granted::new(token, sent)));
        }
        let s = match &*st {
            State::Unknown(s) => s.clone(),
            _ => {
                Self::check_upgrade(holds, req)?;
                let beside = match downgrade {
                    true => Self::downgrade_session(holds, req).await,
                    false => None,
                };
                let s = match beside {
                    Some(s) => s,
                    None => self.take_session().await?,
                };
                // Counted on the session before the request goes out: if its answer is lost,
                // the session is neither pooled nor forgotten while it may hold the lock.
                s.grants.add(&req.attempt, LeaseInstant::now() + req.lease);
                entry.set(st, State::Unknown(s.clone()));
                s
            }
        };
        let sent = LeaseInstant::now();
        let idle_held = s.idle_value(&req.attempt, Some(sent + req.lease));
        let idle_free = s.idle_value(&req.attempt, None);
        match self.try_lock_on(&s, entry, &idle_held, &idle_free).await {
            Ok(true) => {
                let token = self.grant_on(entry, st, s, req, &idle_held).await?;
                Ok(Break(Granted::new(token, sent)))
            }
            Ok(false) => Ok(Continue(s)),
            Err(e) => Err(Self::failed(entry, st, &s, e)),
        }
    }

    /// Picks up where an earlier request of this attempt left off: the grant again (a retry
    /// of a granted attempt: same token, lease never shortened), or the grant an unanswered
    /// request took on its session. `None`: not held; the state is `Idle`, or `Unknown` on a
    /// session that holds nothing (to try on).
    pub(crate) async fn resume(
        &self,
        entry: &Entry,
        st: &mut State,
        req: &AcquireRequest,
    ) -> Result<Option<u64>> {
        entry.settle(st);
        match &*st {
            State::Idle => Ok(None),
            State::Releasing(_) => Err(Error::invalid(format!(
                "attempt {} on `{}` asked again for a grant it is releasing",
                req.attempt, req.key.name
            ))),
            State::Granted(g) => {
                let token = g.token;
                // Not extended: revoked by an operator before this retry, given up; try anew.
                let extended = self.extend(entry, st, req.lease);
                Ok(extended.await?.then_some(token))
            }
            State::Unknown(s) => {
                let s = s.clone();
                if !self.holds(&s, entry).await? {
                    return Ok(None);
                }
                let end = LeaseInstant::now() + req.lease;
                let idle = s.idle_value(&req.attempt, Some(end));
                self.grant_on(entry, st, s, req, &idle).await.map(Some)
            }
        }
    }

    /// Makes the granted lease run at least `lease` from now (never shorter than what the
    /// session already promises). `Ok(false)`: the grant's row is gone (revoked), and the lock
    /// was given up.
    pub(crate) async fn extend(
        &self,
        entry: &Entry,
        st: &mut State,
        lease: Duration,
    ) -> Result<bool> {
        let State::Granted(g) = &*st else {
            return Ok(false);
        };
        let s = g.session.clone();
        let end = g.lease_end.max(LeaseInstant::now() + lease);
        let idle = s.idle_value(&entry.attempt, Some(end));
        match self.refresh(&s, entry, lease, &idle).await {
            Ok(true) => {
                s.grants.extend(&entry.attempt, end);
                if let State::Granted(g) = st {
                    g.lease_end = end;
                }
                Ok(true)
            }
            Ok(false) => {
                self.revoked(entry, st).await;
                Ok(false)
            }
            Err(e) => Err(Self::failed(entry, st, &s, e)),
        }
    }

    /// Records the grant whose lock `s` holds for `req` (registering is idempotent per
    /// attempt), and makes it the attempt's state. On failure the attempt stays unknown on `s`.
    pub(crate) async fn grant_on(
        &self,
        entry: &Entry,
        st: &mut State,
        s: Arc<Session>,
        req: &AcquireRequest,
        idle: &str,
    ) -> Result<u64> {
        let end = LeaseInstant::now() + req.lease;
        s.grants.add(&req.attempt, end);
        entry.set(st, State::Unknown(s.clone()));
        match self.register(&s, req, idle).await {
            Ok(token) => {
                s.grants.arm(&req.attempt, req.lost.clone(), end);
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
            Err(e) => Err(Self::failed(entry, st, &s, e)),
        }
    }

    /// The grant's row is gone (an operator revoked it): give the lock up on its session.
    async fn revoked(&self, entry: &Entry, st: &mut State) {
        let (State::Granted(g) | State::Releasing(g)) = &*st else {
            return;
        };
        let s = g.session.clone();
        let (name, attempt) = (&entry.name, &entry.attempt);
        tracing::warn!(%name, %attempt, "dlock_holders row gone: the lock was revoked");
        entry.set(st, State::Idle);
        if let Err(e) = self.drop_on(entry, st, s).await {
            tracing::warn!(error = %e, %name, "could not unlock a revoked grant");
        }
    }

    /// Gives up what the attempt holds or may hold on `s` (everything, when no other attempt
    /// uses the session) and forgets the attempt, pooling the session. If the unlock fails
    /// and the attempt is alone on the session, it is forgotten all the same: closing the
    /// session (dropping the last handle) frees whatever it holds. Shared with a downgrade's
    /// other side, the attempt stays counted on the session, which is then never pooled and
    /// closes when that side is done: the error is returned.
    pub(crate) async fn drop_on(
        &self,
        entry: &Entry,
        st: &mut State,
        s: Arc<Session>,
    ) -> Result<()> {
        let all = s.grants.others(&entry.attempt) == 0;
        match self.unlock_on(&s, entry, all).await {
            Ok(_) => self.forget_on(entry, st, s, true),
            Err(_) if all => self.forget_on(entry, st, s, false),
            Err(e) => return Err(Self::failed(entry, st, &s, e)),
        }
        Ok(())
    }

    /// The attempt holds nothing on its dedicated session `s` (or `s` is closed): forget it,
    /// and pool the session if `reuse` (else it closes when the last handle goes, which frees
    /// whatever it might hold).
    pub(crate) fn forget_on(&self, entry: &Entry, st: &mut State, s: Arc<Session>, reuse: bool) {
        s.grants.remove(&entry.attempt);
        // The state's handle goes first: a pooled session has no other.
        entry.set(st, State::Idle);
        if reuse {
            self.put_session(s);
        }
    }
}
