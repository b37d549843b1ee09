//! The guard a holder gets: fencing token, lost signal, extend, release.

use crate::backend::{GrantRef, ReleaseOutcome, RenewOutcome};
use crate::clock::Instant;
use crate::error::{Error, Result};
use crate::hold::{Hold, KeeperMsg, Shared};
use crate::lost::{LostReason, LostSignal};
use crate::options::check_lease;
use crate::Client;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Proof of holding a lock. Release it with [`LockGuard::release`]; dropping it releases in
/// the background (never blocking, never panicking).
///
/// Every guard carries a [fencing token](LockGuard::fencing_token): pass it to the resource
/// you protect and have the resource reject tokens lower than one it has seen, so a holder
/// that stalled past its lease cannot overwrite a newer holder's work.
///
/// # The rule for a fenced store
/// A token issued for a lock name is above every token issued for that name before, on every
/// backend (under each backend's stated assumption: see [`LockGuard::fencing_token`]). So a
/// store protected by one lock name keeps, per resource, the highest token it has accepted and
/// **rejects a write whose token is lower**; a write with an **equal** token is accepted: two
/// grants never share a token, so an equal token is the same grant — the same holder writing
/// again, a re-entrant guard of its hold, or a retried request of it. Check and record the
/// token atomically with the write (a compare-and-set, a conditional update, one transaction).
/// Compare tokens of one lock name only: tokens of different names are unrelated.
///
/// ```
/// /// The highest token accepted, and the value it wrote.
/// struct Fenced { highest: u64, value: String }
///
/// impl Fenced {
///     fn write(&mut self, token: u64, value: &str) -> Result<(), String> {
///         if token < self.highest {
///             return Err(format!("stale token {token}: {} was seen", self.highest));
///         }
///         self.highest = token; // equal: the same holder writing again
///         self.value = value.to_owned();
///         Ok(())
///     }
/// }
///
/// let mut store = Fenced { highest: 0, value: String::new() };
/// store.write(7, "first").unwrap();
/// store.write(7, "again, same holder").unwrap();
/// store.write(9, "the next holder").unwrap();
/// assert!(store.write(7, "the old holder, back from a pause").is_err());
/// ```
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct LockGuard {
    client: Client,
    hold: Arc<Hold>,
    watchdog: bool,
    acquired_at: Instant,
    done: bool,
}

impl LockGuard {
    pub(crate) fn new(client: Client, hold: Arc<Hold>, watchdog: bool) -> Self {
        LockGuard {
            client,
            hold,
            watchdog,
            acquired_at: Instant::now(),
            done: false,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.key().name
    }

    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The owner id this guard holds the lock for.
    pub fn owner(&self) -> &str {
        &self.hold.key().owner
    }

    /// The fencing token of this grant: strictly greater than every token handed out for this
    /// name before it, so no two grants of a name share one. Re-entrant guards of one hold
    /// share the token (see [the rule for a fenced store](LockGuard#the-rule-for-a-fenced-store)).
    ///
    /// What it rests on, per backend: etcd and ZooKeeper issue the commit order of their
    /// consensus log (a create revision, a creation zxid), which no crash, restart or failover
    /// rolls back — only a restore of the cluster from an older backup does (their pages say how
    /// to restore without it). The Redis family, PostgreSQL, MySQL and the file backend keep a
    /// counter and floor every grant's token at the server's clock in microseconds, so a counter
    /// rolled back (a restart from an older snapshot, a failover to a replica that missed the
    /// last grants, a crash in the fsync window) still hands out tokens above every earlier one,
    /// as long as that clock does not step back by more than the backend's page states.
    pub fn fencing_token(&self) -> u64 {
        self.hold.token()
    }

    /// True once the lock is known to be lost (renewal failed, lease ran out, session ended).
    pub fn is_lost(&self) -> bool {
        self.hold.lost.is_lost()
    }

    /// Resolves when the lock is lost. Use it to stop work that must not go on unprotected:
    ///
    /// ```no_run
    /// # async fn f(guard: distlock_core::LockGuard) {
    /// tokio::select! {
    ///     reason = guard.lost() => eprintln!("lock lost: {reason}"),
    ///     _ = do_the_work() => {}
    /// }
    /// # }
    /// # async fn do_the_work() {}
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// # Errors
    /// None: it resolves with the reason, and only when the lock is lost.
    pub async fn lost(&self) -> LostReason {
        self.hold.lost.lost().await
    }

    /// The instant this guard must presume the lock gone unless a renewal is confirmed first:
    /// the latest promise the server confirmed (send time of the request + its lease − drift),
    /// on the lease clock. It moves on with every confirmed renewal. Use it to stop work in
    /// time, e.g. to stop a child process before anyone else could be granted the lock.
    ///
    /// Once the session holding the lock ended ([`LostReason::SessionEnded`]), it is the send
    /// time of the last request the server confirmed: the server frees a session's locks when
    /// the session ends, which may be before the client hears of it.
    pub fn lease_deadline(&self) -> crate::clock::Instant {
        self.hold.state().deadline_after(&self.hold.lost)
    }

    /// How long the confirmed lease has left (zero once it ran out): see
    /// [`LockGuard::lease_deadline`].
    pub fn lease_left(&self) -> Duration {
        self.lease_deadline()
            .saturating_duration_since(crate::clock::Instant::now())
    }

    /// A handle to the lost signal that outlives the guard borrow (e.g. to move into a task).
    pub fn lost_signal(&self) -> LostSignal {
        self.hold.lost.clone()
    }

    /// True if the guard was acquired with the watchdog (no fixed lease).
    pub fn is_watchdog(&self) -> bool {
        self.watchdog
    }

    /// Makes the lease run at least `lease` from now, on the server and in this guard's view
    /// of it. It never shortens the lease: a shorter `lease` than what is left (or than the
    /// watchdog lease other guards of this hold rely on) changes nothing on the server. To give
    /// the lock up early, release it. Useful with fixed leases; in watchdog mode the watchdog
    /// goes on renewing at its next tick.
    ///
    /// Fails with [`Error::NotOwner`] (and fires the lost signal) if the lock is no longer ours.
    /// Connection errors are retried (bounded by the client's retry policy): the request names
    /// this grant and never shortens, so a retry has the effect of one request.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use std::time::Duration;
    /// let guard = client.lock("batch")?.lease(Duration::from_secs(10))?.acquire().await?;
    /// // … more work than planned …
    /// guard.extend(Duration::from_secs(10)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped, the extension may or may not have reached the
    /// server; the guard's view of the lease stays the one last confirmed (never longer than
    /// the server's), so nothing is promised that the server did not grant.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero lease or one over 30 days; [`Error::NotOwner`]
    /// when the server no longer has this grant; [`Error::Connection`] when the server could
    /// not be reached (after the retries; the lease is then what was last confirmed).
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        check_lease(lease)?;
        extend_hold(&self.client.shared, &self.hold, lease).await
    }

    /// Releases this guard's hold and tells what happened:
    /// [`ReleaseOutcome::Released`], [`StillHeld`](ReleaseOutcome::StillHeld) (other
    /// re-entrant holds of this owner remain), [`Expired`](ReleaseOutcome::Expired) or
    /// [`TakenByOther`](ReleaseOutcome::TakenByOther). Connection errors are retried
    /// (bounded by the client's retry policy); if they persist the error is returned and the
    /// lock frees itself when its lease ends.
    ///
    /// Re-entrant guards of one hold share one grant on the server: releasing one of several
    /// only counts it down in this client ([`StillHeld`](ReleaseOutcome::StillHeld)); the last
    /// one releases the grant. The request names the grant, so a retry after a lost reply has
    /// the effect of one release and can never touch a newer grant of the same owner.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use distlock_core::ReleaseOutcome;
    /// let guard = client.lock("orders:42")?.acquire().await?;
    /// if guard.release().await? == ReleaseOutcome::Expired {
    ///     eprintln!("the lease ran out before the release: check the fenced writes");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release still happens in the
    /// background: nothing is left held.
    ///
    /// # Errors
    /// [`Error::Connection`] when the server could not be reached (after the retries; the lock
    /// frees itself at its lease end); [`Error::UnexpectedReply`]; [`Error::Runtime`] if the
    /// runtime shuts down under it.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.done = true;
        let hold = self.hold.clone();
        let shared = self.client.shared.clone();
        let watchdog = self.watchdog;
        shared.timings.hold(self.acquired_at.elapsed());
        // Run in this task (no spawn, no wake-up of another thread), but finished in the
        // background if this future is dropped: cancelling it cannot leave the lock behind.
        let keeper = self.client.keeper_tx.clone();
        let (h, w) = (hold.clone(), watchdog);
        Finish::new(
            Box::pin(async move { release_hold(&shared, &hold, watchdog).await }),
            move |fut| match fut {
                // Never polled: nothing was counted down yet; the keeper releases the guard as
                // it does for a dropped one.
                None => {
                    let _ = keeper.send(KeeperMsg::Release {
                        hold: h,
                        watchdog: w,
                    });
                }
                Some(fut) => spawn_or_drop(async move {
                    let _ = fut.await;
                }),
            },
        )
        .await
    }
}

impl LockGuard {
    /// Gives the lock up, but not before it has been held `at_least` since it was acquired:
    /// a job lock (ShedLock's "lock at least for"). A job that ran on one host keeps its name
    /// locked for `at_least` even when it ends early, so a host whose clock or scheduler fires
    /// the same job a little later finds it taken and skips it, instead of running it again.
    ///
    /// Held `at_least` already: the same as [`LockGuard::release`]. Otherwise, on a backend
    /// whose leases expire, the lease is extended to end no sooner than the rest of
    /// `at_least` from now ([`LockGuard::extend`], never shortened), renewals stop, and the
    /// grant is left to expire on the server: the call returns at once with
    /// [`ReleaseOutcome::Released`], and the process may exit. Where a hold lasts as long as
    /// the process or session that holds it (`file://`, ZooKeeper, the session modes of
    /// PostgreSQL and MySQL: [`Capabilities::expires_leases`](crate::backend::Capabilities::expires_leases)
    /// is false) the call sleeps out the
    /// rest of `at_least` and then releases; the process must live until it returns.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use std::time::Duration;
    /// let Ok(guard) = client.lock("nightly-report")?.acquire_timeout(Duration::ZERO).await
    /// else {
    ///     return Ok(()); // another host runs it, or ran it less than 5 minutes ago
    /// };
    /// // … the job …
    /// guard.release_after(Duration::from_secs(300)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the future while it sleeps (backends without lease expiry) releases the lock
    /// at once, as dropping the guard does.
    ///
    /// # Errors
    /// As [`LockGuard::extend`] and [`LockGuard::release`]. If the extension fails, nothing
    /// was left held past the lease already confirmed, and the lock is released as by
    /// dropping the guard, except on [`Error::NotOwner`], which is reported as
    /// [`ReleaseOutcome::Expired`].
    pub async fn release_after(mut self, at_least: Duration) -> Result<ReleaseOutcome> {
        let left = at_least.saturating_sub(self.acquired_at.elapsed());
        if left.is_zero() {
            return self.release().await;
        }
        if !self.client.shared.backend.capabilities().expires_leases() {
            tokio::time::sleep_until((Instant::now() + left).to_tokio()).await;
            return self.release().await;
        }
        match self.extend(left).await {
            Ok(()) => {}
            Err(e) if e.is_not_owner() => {
                self.done = true;
                self.client.shared.detach(&self.hold, self.watchdog);
                return Ok(ReleaseOutcome::Expired);
            }
            Err(e) => return Err(e),
        }
        // No release: the last guard of the hold leaves the client's map, so the keeper stops
        // renewing it, and the server frees it when the extended lease ends.
        self.done = true;
        let others = self.client.shared.detach(&self.hold, self.watchdog);
        Ok(match others {
            0 => ReleaseOutcome::Released,
            remaining => ReleaseOutcome::StillHeld { remaining },
        })
    }
}

/// A boxed future of this crate's per-operation path.
pub(crate) type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Runs `fut` in the caller's task; if the caller drops it before it completes, `on_drop`
/// gets the rest (`None` if it was never polled) to finish it in the background. This is what
/// a spawned task gives (cancelling the caller cannot strand a grant or a release) without
/// a spawn, a channel and a cross-thread wake-up per operation.
pub(crate) struct Finish<T, D: FnOnce(Option<BoxFuture<T>>)> {
    fut: Option<BoxFuture<T>>,
    polled: bool,
    on_drop: Option<D>,
}

impl<T, D: FnOnce(Option<BoxFuture<T>>)> Finish<T, D> {
    pub(crate) fn new(fut: BoxFuture<T>, on_drop: D) -> Self {
        Finish {
            fut: Some(fut),
            polled: false,
            on_drop: Some(on_drop),
        }
    }
}

impl<T, D: FnOnce(Option<BoxFuture<T>>) + Unpin> std::future::Future for Finish<T, D> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        self.polled = true;
        let Some(fut) = self.fut.as_mut() else {
            // Polled after completion: a caller bug; never completes again.
            return std::task::Poll::Pending;
        };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        self.fut = None;
        self.on_drop = None;
        std::task::Poll::Ready(out)
    }
}

impl<T, D: FnOnce(Option<BoxFuture<T>>)> Drop for Finish<T, D> {
    fn drop(&mut self) {
        let (Some(fut), Some(on_drop)) = (self.fut.take(), self.on_drop.take()) else {
            return;
        };
        on_drop(self.polled.then_some(fut));
    }
}

/// Spawns `fut` on the current runtime; outside one (the runtime is shutting down) it is
/// dropped, and whatever it held frees at its lease end.
pub(crate) fn spawn_or_drop(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(fut);
        }
        Err(_) => tracing::debug!("no runtime to finish a cancelled operation in"),
    }
}

/// Renews `hold` so that its lease runs at least `lease` from now (never shortening it).
pub(crate) async fn extend_hold(
    shared: &Arc<Shared>,
    hold: &Arc<Hold>,
    lease: Duration,
) -> Result<()> {
    let item = [(hold.grant.clone(), lease)];
    let mut sent = Instant::now();
    let held = crate::backoff::retry(shared.opts.retry, || {
        sent = Instant::now();
        async {
            match shared.backend.renew(&item).await?.first() {
                Some(RenewOutcome::Renewed) => Ok(true),
                Some(RenewOutcome::NotHeld) => Ok(false),
                // Neither confirmed nor refused: retried like an unknown outcome.
                Some(RenewOutcome::Unconfirmed) => Err(Error::connection(
                    shared.backend.kind(),
                    shared.backend.endpoint(),
                    "the renewal was neither confirmed nor refused",
                )),
                None => Err(Error::UnexpectedReply {
                    backend: shared.backend.kind(),
                    message: "renewal of one lock returned no outcome".into(),
                }),
            }
        }
    })
    .await?;
    if !held {
        shared.forget(hold);
        hold.lost.fire(LostReason::NotHeld);
        return Err(Error::NotOwner {
            name: hold.key().name.to_string(),
            owner: hold.key().owner.to_string(),
        });
    }
    // Measured from the send of the attempt that was confirmed: the server applied it no
    // earlier.
    hold.update(|st| st.confirmed(sent, lease));
    shared.wake.notify_one();
    Ok(())
}

/// Releases one guard's share of `hold`: counted down in this client, and the grant released
/// on the server when it was the last guard.
pub(crate) async fn release_hold(
    shared: &Arc<Shared>,
    hold: &Arc<Hold>,
    watchdog: bool,
) -> Result<ReleaseOutcome> {
    let left = shared.detach(hold, watchdog);
    if left > 0 {
        return Ok(ReleaseOutcome::StillHeld { remaining: left });
    }
    let span = tracing::debug_span!("dlock.release", name = %hold.key().name, backend = shared.backend.kind());
    let r = release_grant(shared, &hold.grant).instrument(span).await;
    match &r {
        Ok(ReleaseOutcome::Released) | Ok(ReleaseOutcome::StillHeld { .. }) => {}
        Ok(ReleaseOutcome::Expired) | Ok(ReleaseOutcome::TakenByOther) => {
            hold.lost.fire(LostReason::NotHeld);
        }
        Err(e) => {
            tracing::warn!(name = %hold.key().name, error = %e, "release failed");
        }
    }
    r
}

/// Releases `grant` on the server, retrying connection errors. A retry after an attempt whose
/// outcome is unknown (the reply was lost) may find the grant gone because that attempt went
/// through: then it is reported released, which is the one outcome both cases share for the
/// lock's other users.
pub(crate) async fn release_grant(
    shared: &Arc<Shared>,
    grant: &GrantRef,
) -> Result<ReleaseOutcome> {
    let mut ambiguous = false;
    let r = crate::backoff::retry(shared.opts.retry, || {
        let was_ambiguous = ambiguous;
        ambiguous = true;
        async move {
            let r = shared.backend.release(grant).await;
            match r {
                Ok(ReleaseOutcome::Expired) if was_ambiguous => Ok(ReleaseOutcome::Released),
                other => other,
            }
        }
    })
    .await;
    r
}

/// Gives back a grant nobody will use.
pub(crate) async fn give_back(shared: &Arc<Shared>, grant: &GrantRef) {
    if let Err(e) = release_grant(shared, grant).await {
        tracing::warn!(name = %grant.key.name, error = %e,
            "could not give back an unused grant; it frees when its lease ends");
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let msg = KeeperMsg::Release {
            hold: self.hold.clone(),
            watchdog: self.watchdog,
        };
        if self.client.keeper_tx.send(msg).is_err() {
            // The client is shutting down; the lease frees the lock.
            self.client.shared.detach(&self.hold, self.watchdog);
        }
    }
}
