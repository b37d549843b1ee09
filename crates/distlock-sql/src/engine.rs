//! The session engine: requests addressed by attempt, run one at a time per attempt, the
//! retrying server-side wait, and the dialect trait that speaks SQL.

use crate::errors::no_answer;
use crate::holds::{Hold, HoldMap, HoldState};
use distlock_core::backend::{
    AcquireReply, AcquireRequest, Backend, Capabilities, Deadline, GrantRef, Granted, NoWatch,
};
use distlock_core::{
    async_trait, Error, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The operations of one SQL dialect on the state of one attempt (its dedicated connection).
/// Every method runs with the attempt's state locked: no other request of the attempt runs
/// meanwhile. The engine ([`Sessions`]) keeps the map of attempts, checks kinds, runs the
/// wait loop and decides where requests run.
///
/// # Errors
/// Each operation returns the error of the statement that failed, mapped by the dialect
/// (`Connection` for a lost or unanswered connection: the engine's wait retries those).
///
/// # Cancel safety
/// An operation may be dropped at any await (a caller that stops waiting, unless the dialect
/// runs requests [detached](Dialect::detached)): it must leave the state so that the attempt's
/// retry or give-up finds what the dropped request may have done.
#[async_trait]
pub trait Dialect: Send + Sync + 'static {
    /// What the dialect keeps per attempt.
    type State: HoldState;

    /// The backend's name (`postgres`, `mysql`), for messages.
    fn backend(&self) -> &'static str;

    /// The server's `host:port`, for messages ([`Backend::endpoint`]).
    fn endpoint(&self) -> String;

    /// As [`Backend::watch`], for attempts that wait for wake-ups rather than on the server
    /// ([`Dialect::waits_on_server`]). The default never fires.
    async fn watch(&self, _req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        Ok(Box::new(NoWatch))
    }

    /// As [`Backend::observe`]. The default: observing is not supported.
    async fn observe(&self, _name: &str) -> Result<Box<dyn ReleaseWatch>> {
        Err(Error::unsupported(self.backend(), "observing elections"))
    }

    /// The kinds the dialect locks ([`Backend::capabilities`], checked again by the engine).
    fn capabilities(&self) -> Capabilities;

    /// `Some(limit)`: every request runs in a task of its own, to its end even if its caller
    /// stops waiting (for a driver whose connection breaks when a request is dropped midway),
    /// the caller waiting at most `limit`. `None` (the default): in the caller's task.
    fn detached(&self) -> Option<Duration> {
        None
    }

    /// One try without waiting (a retry of a granted attempt answers its grant again, the
    /// lease never shortened).
    async fn try_lock(
        &self,
        holds: &HoldMap<Self::State>,
        hold: &Hold<Self::State>,
        st: &mut Self::State,
        req: &AcquireRequest,
    ) -> Result<AcquireReply>;

    /// Whether `req` waits on the server ([`Dialect::wait`]); `false`: it waits for wake-ups
    /// and retries (the core's `watch_and_retry`).
    async fn waits_on_server(&self, _holds: &HoldMap<Self::State>, _req: &AcquireRequest) -> bool {
        true
    }

    /// One server-side wait, until granted, `deadline` or `cancel` (`Ok(None)`: not granted;
    /// the engine waits again while the deadline has not passed).
    async fn wait(
        &self,
        holds: &HoldMap<Self::State>,
        hold: &Hold<Self::State>,
        st: &mut Self::State,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>>;

    /// Releases exactly the grant `grant` names.
    async fn unlock(
        &self,
        hold: &Hold<Self::State>,
        st: &mut Self::State,
        grant: &GrantRef,
    ) -> Result<ReleaseOutcome>;

    /// Renews the grant: its lease runs at least `lease` from now, never shorter.
    async fn keepalive(
        &self,
        hold: &Hold<Self::State>,
        st: &mut Self::State,
        grant: &GrantRef,
        lease: Duration,
    ) -> Result<RenewOutcome>;

    /// Gives back whatever the attempt holds or may hold, and only that. Idempotent.
    async fn give_up(
        &self,
        hold: &Hold<Self::State>,
        st: &mut Self::State,
        req: &AcquireRequest,
    ) -> Result<()>;

    /// What to report for a release of an attempt this client keeps nothing of: another grant
    /// holds the lock, or nobody does.
    async fn not_held(&self, grant: &GrantRef) -> Result<ReleaseOutcome>;

    /// What the server says about `name`'s lock of `kind` (its kind already checked).
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo>;

    /// Elections: if `grant` still leads on the server and `seq` is greater than the stored
    /// one, replaces its value with `value` in one statement (or transaction) that never
    /// touches its lease or session, waking the election's observers if the value changed.
    /// `Renewed` while it leads (`seq` new or not), `NotHeld` otherwise ([`Backend::proclaim`]).
    /// Called only for an attempt this client holds a grant of. Default: unsupported.
    async fn proclaim(&self, _grant: &GrantRef, _seq: u64, _value: &str) -> Result<RenewOutcome> {
        Err(Error::unsupported(self.backend(), "elections"))
    }
}

/// A request [`Sessions::run`] runs, on the attempt's state, with its argument.
type Op<D, A, T> = for<'a> fn(
    &'a D,
    &'a HoldMap<<D as Dialect>::State>,
    &'a Hold<<D as Dialect>::State>,
    &'a mut <D as Dialect>::State,
    &'a A,
) -> BoxFuture<'a, Result<T>>;

/// Session mode of an SQL backend: the attempts of one client and the dialect that keeps
/// their locks, each on a dedicated connection.
pub struct Sessions<D: Dialect> {
    dialect: Arc<D>,
    holds: Arc<HoldMap<D::State>>,
}

impl<D: Dialect> Sessions<D> {
    /// The engine of `dialect`.
    pub fn new(dialect: D) -> Self {
        Sessions {
            dialect: Arc::new(dialect),
            holds: Arc::default(),
        }
    }

    /// The dialect.
    pub fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The attempts of `owner` on `name` (for look-ups of the holder's connection).
    pub fn holds_of(&self, name: &str, owner: &str) -> Vec<Arc<Hold<D::State>>> {
        self.holds
            .matching(|h| &*h.name == name && &*h.owner == owner)
    }

    /// `Ok` if the dialect does locks of `kind`; the standard [`Error::Unsupported`] otherwise.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a kind the dialect does not do.
    pub fn check_kind(&self, kind: LockKind) -> Result<()> {
        let d = &self.dialect;
        d.capabilities().check(d.backend(), kind)
    }

    /// Runs `op` with `arg` on `hold`, its state locked, through [`Sessions::detach`].
    async fn run<A: Send + Sync + 'static, T: Send + 'static>(
        &self,
        hold: Arc<Hold<D::State>>,
        what: &'static str,
        arg: A,
        op: Op<D, A, T>,
    ) -> Result<T> {
        let (dialect, holds) = (self.dialect.clone(), self.holds.clone());
        let work = async move {
            let mut st = hold.state.lock().await;
            let r = op(&*dialect, &holds, &hold, &mut st, &arg).await;
            hold.sync(&st);
            drop(st);
            holds.tidy(hold);
            r
        };
        self.detach(what, work).await
    }

    /// Runs `work` as [`Dialect::detached`] says: in the caller's task or in a task of its own.
    async fn detach<T: Send + 'static>(
        &self,
        what: &str,
        work: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let Some(limit) = self.dialect.detached() else {
            return work.await;
        };
        let backend = self.dialect.backend();
        match tokio::time::timeout(limit, tokio::spawn(work)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(Error::Runtime(format!(
                "the {backend} task {what} ended without an answer: {e}"
            ))),
            Err(_) => Err(no_answer(backend, &self.dialect.endpoint(), what, limit)),
        }
    }

    /// One round: the attempt's state locked (while the deadline and `cancel` allow), one
    /// server-side wait. The attempt's state stays with it after a failure: the next round
    /// resumes on the same connection if the failed request may have taken the lock there.
    async fn wait_round(
        &self,
        req: &AcquireRequest,
        d: Deadline,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let hold = self.holds.entry(&req.attempt, &req.key);
        let mut st = tokio::select! {
            g = hold.state.lock() => g,
            _ = cancel.cancelled() => return Ok(None),
            _ = d.reached() => return Ok(None),
        };
        let r = self
            .dialect
            .wait(&self.holds, &hold, &mut st, req, d.into(), cancel)
            .await;
        hold.sync(&st);
        drop(st);
        self.holds.tidy(hold);
        r
    }
}

/// Session mode as a backend: every lock operation on the attempt's own connection, through
/// the dialect. A dropped request leaves the attempt's state for its retry or give-up; a
/// request that failed keeps what it may have taken (a retry finds it, a give-up returns it).
#[async_trait]
impl<D: Dialect> Backend for Sessions<D> {
    fn kind(&self) -> &'static str {
        self.dialect.backend()
    }

    fn endpoint(&self) -> String {
        self.dialect.endpoint()
    }

    fn capabilities(&self) -> Capabilities {
        self.dialect.capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.check_kind(req.key.kind)?;
        let hold = self.holds.entry(&req.attempt, &req.key);
        let op: Op<D, _, _> = |d, holds, h, st, r| d.try_lock(holds, h, st, r);
        self.run(hold, "acquiring", req.clone(), op).await
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.dialect.watch(req).await
    }

    /// Waits on the server ([`Dialect::wait`]) unless the dialect says this attempt waits for
    /// wake-ups. A wait stopped after a request whose answer was lost gives back whatever
    /// that request took (the core only gives up attempts that end in an error).
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        self.check_kind(req.key.kind)?;
        if !self.dialect.waits_on_server(&self.holds, req).await {
            return distlock_core::wait::watch_and_retry(self, req, deadline, cancel).await;
        }
        let d = Deadline::from(deadline);
        let round = || self.wait_round(req, d, cancel);
        let r = distlock_core::wait::retrying(d, cancel, Default::default(), round).await;
        if matches!(r, Ok(None)) && self.holds.existing(&req.attempt).is_some() {
            if let Err(e) = self.give_up(req).await {
                tracing::debug!(error = %e, name = %req.key.name, "could not give up a stopped wait; its connection's lease frees the lock");
            }
        }
        r
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.check_kind(req.key.kind)?;
        let Some(hold) = self.holds.existing(&req.attempt) else {
            return Ok(());
        };
        let op: Op<D, _, _> = |d, _, h, st, r| d.give_up(h, st, r);
        self.run(hold, "giving up", req.clone(), op).await
    }

    /// A retry of a release whose answer was lost runs it again, after the first.
    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.check_kind(grant.key.kind)?;
        let Some(hold) = self.holds.existing(&grant.attempt) else {
            return self.dialect.not_held(grant).await;
        };
        let op: Op<D, _, _> = |d, _, h, st, g| d.unlock(h, st, g);
        self.run(hold, "releasing", grant.clone(), op).await
    }

    /// Every grant at once, each on its connection.
    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        holds
            .iter()
            .try_for_each(|(g, _)| self.check_kind(g.key.kind))?;
        let op: Op<D, _, _> = |d, _, h, st, (g, lease)| d.keepalive(h, st, g, *lease);
        let all = holds.iter().map(|(g, lease)| async move {
            let Some(hold) = self.holds.existing(&g.attempt) else {
                return Ok(RenewOutcome::NotHeld);
            };
            self.run(hold, "renewing", (g.clone(), *lease), op).await
        });
        futures_util::future::join_all(all)
            .await
            .into_iter()
            .collect()
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.check_kind(kind)?;
        self.dialect.inspect(name, kind).await
    }

    /// `NotHeld` at once if this client keeps no live grant of that attempt (released, given
    /// up, or its connection gone), otherwise [`Dialect::proclaim`]'s answer. Takes no lock on
    /// the attempt's state (a proclamation must not wait behind a renewal, nor hold one up);
    /// detached like the other requests if the dialect says so.
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.check_kind(grant.key.kind)?;
        if grant.key.kind != LockKind::Election {
            return Err(Error::invalid(format!(
                "proclaim on `{}`, a lock of kind {}: only election grants advertise a value",
                grant.key.name,
                grant.key.kind.as_str()
            )));
        }
        let hold = self.holds.existing(&grant.attempt);
        if !hold.is_some_and(|h| h.granted()) {
            return Ok(RenewOutcome::NotHeld);
        }
        let (dialect, g, v) = (self.dialect.clone(), grant.clone(), value.to_owned());
        self.detach(
            "proclaiming",
            async move { dialect.proclaim(&g, seq, &v).await },
        )
        .await
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.dialect.observe(name).await
    }
}
