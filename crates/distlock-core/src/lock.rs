//! Lock handles and acquisition.

use crate::backend::{AcquireReply, AcquireRequest, Granted, HoldKey, LockKind};
use crate::error::{Error, Result};
use crate::guard::{extend_hold, spawn_or_drop, BoxFuture, Finish, LockGuard};
use crate::hold::{lease_deadline, Hold, KeeperMsg};
use crate::lost::LostSignal;
use crate::Client;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// A handle on one named lock for one owner.
///
/// **Owner identity.** Every handle made by [`Client::lock`] gets its own owner id
/// (`<client id>:<n>`); clones of a handle share it. Acquiring again through the same owner
/// while it holds the lock is *re-entry*: the client counts the guards of its one grant on the
/// server, and only the last release frees the lock. Two handles (two owners) exclude each
/// other even inside one process. Use [`Lock::with_owner`] to choose the id yourself, e.g. a
/// request id that several tasks of one client share. Re-entry is per client: two clients
/// (two processes) using one owner id are two holders and exclude each other.
///
/// **Lease.** By default a lock is in *watchdog mode*: its lease is the client's watchdog lease
/// (30 s) and the watchdog renews it every lease/3 while the guard lives. With
/// [`Lock::lease`] the lock instead has a fixed lease, no renewal, and the guard's lost signal
/// fires when the lease ends.
#[derive(Clone, Debug)]
pub struct Lock {
    client: Client,
    key: HoldKey,
    fixed_lease: Option<Duration>,
    /// An election candidate's value, sent with each acquisition.
    value: Option<Arc<str>>,
}

impl Lock {
    pub(crate) fn new(client: Client, name: &str, owner: String, kind: LockKind) -> Self {
        Lock {
            client,
            key: HoldKey {
                name: Arc::from(name),
                owner: Arc::from(owner),
                kind,
            },
            fixed_lease: None,
            value: None,
        }
    }

    /// The same handle, sending `value` with its acquisitions (an election's candidate).
    pub(crate) fn with_value(mut self, value: Arc<str>) -> Lock {
        self.value = Some(value);
        self
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The same lock with owner id `owner`.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Result<Lock> {
        let owner = owner.into();
        crate::name::validate_owner(&owner)?;
        self.key.owner = Arc::from(owner);
        Ok(self)
    }

    /// The same lock with a fixed lease and no watchdog (like Redisson's `lock(leaseTime)`).
    /// Fails on a zero lease or one over 30 days.
    pub fn lease(mut self, lease: Duration) -> Result<Lock> {
        crate::options::check_lease(lease)?;
        self.fixed_lease = Some(lease);
        Ok(self)
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// The kind of lock this handle takes.
    pub fn kind(&self) -> LockKind {
        self.key.kind
    }

    /// The owner id acquisitions through this handle use.
    pub fn owner(&self) -> &str {
        &self.key.owner
    }

    /// The fixed lease, or `None` in watchdog mode.
    pub fn fixed_lease(&self) -> Option<Duration> {
        self.fixed_lease
    }

    /// Takes the lock if it is free (or re-enters it); never waits.
    /// `Ok(None)` means another owner holds it.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// match client.lock("report:daily")?.try_acquire().await? {
    ///     Some(guard) => { /* we run it */ guard.release().await?; }
    ///     None => println!("another instance runs the report"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while the request is in flight and the server
    /// grants it, the grant is given back in the background. A request of the attempt that
    /// reaches the server later still (its reply timed out, the retry went to a fresh
    /// connection) is refused where the backend keeps a record of ended attempts (Redis,
    /// Redlock nodes, PostgreSQL lease mode, MySQL table mode; see `docs/core.md`), so it
    /// cannot hold the lock for nobody.
    ///
    /// # Errors
    /// [`Error::Unsupported`] if the backend lacks this lock kind; [`Error::Connection`] if the
    /// server cannot be reached (after the client's retries); [`Error::UnexpectedReply`] for
    /// foreign data under the lock's key; [`Error::InvalidArgument`] for a lease the server
    /// cannot honour.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.run(Mode::Try).await
    }

    /// Waits as long as it takes to get the lock. Connection trouble while waiting is retried
    /// (with a backoff) for as long as the wait lasts.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let guard = client.lock("orders:42")?.acquire().await?;
    /// // … write with guard.fencing_token() …
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops the wait and loses the place in the queue;
    /// nothing is left behind on the server — a grant that raced with the drop (handed over,
    /// or already on its way to this future) is given back in the background, and a late copy
    /// of one of its requests is refused where the backend records ended attempts (see
    /// `docs/core.md`).
    ///
    /// # Errors
    /// As [`Lock::try_acquire`], except that connection errors are retried while waiting;
    /// errors that retrying cannot cure end the wait.
    pub async fn acquire(&self) -> Result<LockGuard> {
        match self.run(Mode::Wait(None)).await? {
            Some(g) => Ok(g),
            None => Err(Error::Runtime("acquire ended without a grant".into())),
        }
    }

    /// Waits at most `wait` for the lock; [`Error::Timeout`] after that.
    /// `acquire_timeout(Duration::ZERO)` tries once.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use std::time::Duration;
    /// match client.lock("orders:42")?.acquire_timeout(Duration::from_secs(5)).await {
    ///     Ok(guard) => drop(guard),
    ///     Err(e) if e.is_timeout() => println!("still held after 5 s"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::acquire`].
    ///
    /// # Errors
    /// [`Error::Timeout`] when another owner held the lock until the end of the wait; the
    /// last connection error instead when the server could not be reached at the end of the
    /// wait (so the error says why); otherwise as [`Lock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<LockGuard> {
        let deadline = Instant::now().checked_add(wait);
        let mode = if wait.is_zero() {
            Mode::Try
        } else {
            Mode::Wait(deadline)
        };
        match self.run(mode).await? {
            Some(g) => Ok(g),
            None => {
                metrics::counter!("dlock_acquire_timeouts_total", "backend" => self.client.backend_kind()).increment(1);
                Err(Error::Timeout {
                    name: self.name().to_owned(),
                    waited: wait,
                })
            }
        }
    }

    async fn run(&self, mode: Mode) -> Result<Option<LockGuard>> {
        let shared = &self.client.shared;
        shared.check_kind(self.key.kind)?;
        let span = tracing::debug_span!("dlock.acquire", name = %self.key.name, backend = shared.backend.kind());
        self.run_inner(mode).instrument(span).await
    }

    async fn run_inner(&self, mode: Mode) -> Result<Option<LockGuard>> {
        let shared = &self.client.shared;
        let watchdog = self.fixed_lease.is_none();
        let lease = self.fixed_lease.unwrap_or(shared.opts.watchdog_lease);
        let started = Instant::now();
        loop {
            // Re-entry: this client already holds the lock for this owner.
            if let Some(hold) = shared.live_hold(&self.key) {
                match self.reenter(hold).await {
                    Ok(Some(guard)) => return Ok(Some(guard)),
                    // The hold went away meanwhile: acquire afresh.
                    Ok(None) => continue,
                    Err(e) => return Err(e),
                }
            }
            let mut req = AcquireRequest::new(self.key.clone(), lease, LostSignal::new());
            req.value = self.value.clone();
            if self.key.kind == LockKind::Read {
                let write = HoldKey {
                    kind: LockKind::Write,
                    ..self.key.clone()
                };
                req.write_grant = shared.live_hold(&write).map(|h| h.grant.clone());
            }
            let mut pending = pending_grant(&self.client, req.clone(), mode);
            let granted = if matches!(mode, Mode::Try) {
                // One request, no wait on the server: nothing for a sibling's grant to cut
                // short, so no sibling watch (a Notify registration per attempt).
                Some((&mut pending).await?)
            } else {
                loop {
                    // A sibling task of this owner may get the lock while this one waits on the
                    // server: then this attempt is given up and the sibling's hold joined.
                    let attached = shared.attached.notified();
                    tokio::pin!(attached);
                    attached.as_mut().enable();
                    if shared.live_hold(&self.key).is_some() {
                        break None;
                    }
                    tokio::select! {
                        r = &mut pending => break Some(r?),
                        _ = attached => {}
                    }
                }
            };
            let Some(granted) = granted else {
                drop(pending);
                continue;
            };
            let Some(granted) = granted else {
                if shared.live_hold(&self.key).is_some() {
                    // Held by a sibling task of this owner: re-enter its hold.
                    continue;
                }
                return Ok(None);
            };
            shared.timings.acquire_wait(started.elapsed());
            let grant = req.grant(granted.token);
            match shared.attach(
                grant.clone(),
                req.lost,
                granted.requested_at,
                lease,
                watchdog,
                req.value.clone(),
            ) {
                Ok(hold) => return Ok(Some(LockGuard::new(self.client.clone(), hold, watchdog))),
                Err(_) => {
                    // A sibling's grant of the shared side got here first: use that one.
                    let _ = self.client.keeper_tx.send(KeeperMsg::GiveBack(grant));
                }
            }
        }
    }

    /// Adds a guard to this client's live hold; `Ok(None)` if the hold went away meanwhile.
    /// The lease is made to cover what the new guard relies on (a fixed lease longer than what
    /// is left, or a watchdog guard joining a hold nobody renews yet) before it is returned.
    async fn reenter(&self, hold: Arc<Hold>) -> Result<Option<LockGuard>> {
        let shared = &self.client.shared;
        let watchdog = self.fixed_lease.is_none();
        let renewed_before = hold.state().watchdog_guards > 0;
        if !shared.join(&hold, watchdog) {
            return Ok(None);
        }
        let guard = LockGuard::new(self.client.clone(), hold.clone(), watchdog);
        let need = self.fixed_lease.unwrap_or(shared.opts.watchdog_lease);
        let covered = if watchdog {
            renewed_before
        } else {
            hold.state().deadline >= lease_deadline(crate::clock::Instant::now(), need)
        };
        if !covered {
            match extend_hold(shared, &hold, need).await {
                Ok(()) => {}
                // Gone on the server: this guard's drop gives its share back; acquire afresh.
                Err(e) if e.is_not_owner() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(guard))
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Try,
    Wait(Option<Instant>),
}

type GrantResult = Result<Option<Granted>>;

/// An acquisition, run in the caller's task, that dropping the caller's future cannot strand:
/// a drop cancels the wait and hands the rest (`D`, what a dropped acquisition does with the
/// rest of its future) to a background task that gives back any grant it gets (in flight as
/// the future was dropped, or granted as the wait was cancelled).
struct PendingGrant<D: FnOnce(Option<BoxFuture<GrantResult>>)> {
    inner: Finish<GrantResult, D>,
    _cancel: tokio_util::sync::DropGuard,
}

/// Starts an acquisition of `req` in `mode` as a [`PendingGrant`].
fn pending_grant(
    client: &Client,
    req: AcquireRequest,
    mode: Mode,
) -> PendingGrant<impl FnOnce(Option<BoxFuture<GrantResult>>) + Send + Unpin> {
    let shared = client.shared.clone();
    let cancel = CancellationToken::new();
    let task_cancel = cancel.clone();
    let (back, back_req) = (shared.clone(), req.clone());
    let fut: BoxFuture<GrantResult> = Box::pin(async move {
        let backend = &shared.backend;
        // Whether a request of this attempt failed without an answer (a timeout, a reset):
        // it may still reach the server after the attempt ends.
        let ambiguous = std::sync::atomic::AtomicBool::new(false);
        let res = match mode {
            Mode::Try => {
                // Every retry carries the same attempt id: a grant whose reply was lost is
                // returned again, not taken twice.
                crate::backoff::retry(shared.opts.retry, || async {
                    let requested_at = crate::clock::Instant::now();
                    let reply = backend.acquire(&req).await.inspect_err(|_| {
                        ambiguous.store(true, std::sync::atomic::Ordering::Relaxed)
                    })?;
                    Ok(match reply {
                        AcquireReply::Granted { token } => Some(Granted {
                            token,
                            requested_at,
                        }),
                        AcquireReply::Held { .. } => None,
                    })
                })
                .await
            }
            Mode::Wait(deadline) => backend.acquire_wait(&req, deadline, &task_cancel).await,
        };
        let ended_unsure =
            matches!(res, Ok(None)) && ambiguous.load(std::sync::atomic::Ordering::Relaxed);
        if res.is_err() || ended_unsure {
            // The last request may have been granted with its reply lost, or an unanswered
            // earlier one may still be on its way (a retry on a fresh connection was
            // answered "held"): give up the attempt, which gives back whatever it holds
            // and (on backends that keep a record of ended attempts) keeps a late request
            // from granting or queueing it. The request names the attempt; nothing else
            // is touched.
            if let Err(e) = backend.give_up(&req).await {
                tracing::debug!(error = %e, name = %req.key.name, "could not give up a failed attempt; any grant frees at lease end");
            }
        }
        res
    });
    let on_drop = move |rest: Option<BoxFuture<GrantResult>>| {
        // Never polled: no request was sent, nothing to give back.
        let Some(rest) = rest else { return };
        spawn_or_drop(async move {
            // Nobody is waiting for this grant any more.
            if let Ok(Some(g)) = rest.await {
                crate::guard::give_back(&back, &back_req.grant(g.token)).await;
            }
        });
    };
    PendingGrant {
        inner: Finish::new(fut, on_drop),
        // Dropped after `inner` (field order): the wait sees the cancellation when the
        // background task polls it next.
        _cancel: cancel.drop_guard(),
    }
}

impl<D: FnOnce(Option<BoxFuture<GrantResult>>) + Unpin> Future for PendingGrant<D> {
    type Output = GrantResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<GrantResult> {
        Pin::new(&mut self.inner).poll(cx)
    }
}
