//! The guard a holder gets: fencing token, lost signal, extend, release.

use crate::backend::{ReleaseOutcome, RenewOutcome};
use crate::error::{Error, Result};
use crate::hold::{Hold, KeeperMsg, Shared};
use crate::lost::{LostReason, LostSignal};
use crate::Client;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Proof of holding a lock. Release it with [`LockGuard::release`]; dropping it releases in
/// the background (never blocking, never panicking).
///
/// Every guard carries a [fencing token](LockGuard::fencing_token): pass it to the resource
/// you protect and have the resource reject tokens lower than one it has seen, so a holder
/// that stalled past its lease cannot overwrite a newer holder's work.
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
        &self.hold.key.name
    }

    /// The owner id this guard holds the lock for.
    pub fn owner(&self) -> &str {
        &self.hold.key.owner
    }

    /// The fencing token of this grant: strictly greater than every token handed out for this
    /// name before it. Re-entrant guards of one hold share the token.
    pub fn fencing_token(&self) -> u64 {
        self.hold.token
    }

    /// True once the lock is known to be lost (renewal failed, lease ran out, session ended).
    pub fn is_lost(&self) -> bool {
        self.hold.lost.is_lost()
    }

    /// Resolves when the lock is lost. Use it to stop work that must not go on unprotected:
    ///
    /// ```no_run
    /// # async fn f(guard: dlock_core::LockGuard) {
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
    pub async fn lost(&self) -> LostReason {
        self.hold.lost.lost().await
    }

    /// A handle to the lost signal that outlives the guard borrow (e.g. to move into a task).
    pub fn lost_signal(&self) -> LostSignal {
        self.hold.lost.clone()
    }

    /// True if the guard was acquired with the watchdog (no fixed lease).
    pub fn is_watchdog(&self) -> bool {
        self.watchdog
    }

    /// Sets the lease to run `lease` from now. Useful with fixed leases; in watchdog mode the
    /// watchdog goes on renewing to the watchdog lease at its next tick.
    ///
    /// Fails with [`Error::NotOwner`] (and fires the lost signal) if the lock is no longer ours.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        crate::options::check_lease(lease)?;
        let shared = &self.client.shared;
        let started = Instant::now();
        let item = [(self.hold.key.clone(), lease)];
        let out = crate::backoff::retry(shared.opts.retry, || shared.backend.renew(&item)).await?;
        match out.first() {
            Some(RenewOutcome::Renewed) => {
                self.hold.update(shared.opts.watchdog_lease, |st| {
                    if st.watchdog_guards > 0 {
                        st.confirmed_at = st.confirmed_at.max(started);
                    } else {
                        st.confirmed_at = started;
                        st.fixed_until = Some(started + lease);
                    }
                });
                shared.wake.notify_one();
                Ok(())
            }
            Some(RenewOutcome::NotHeld) => {
                self.hold.lost.fire(LostReason::NotHeld);
                Err(Error::NotOwner {
                    name: self.name().to_owned(),
                    owner: self.owner().to_owned(),
                })
            }
            None => Err(Error::UnexpectedReply {
                backend: shared.backend.kind(),
                message: "renewal of one lock returned no outcome".into(),
            }),
        }
    }

    /// Releases this guard's hold and tells what happened:
    /// [`ReleaseOutcome::Released`], [`StillHeld`](ReleaseOutcome::StillHeld) (other
    /// re-entrant holds of this owner remain), [`Expired`](ReleaseOutcome::Expired) or
    /// [`TakenByOther`](ReleaseOutcome::TakenByOther). Connection errors are retried
    /// (bounded by the client's retry policy); if they persist the error is returned and the
    /// lock frees itself when its lease ends.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release still happens in the background.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.done = true;
        let hold = self.hold.clone();
        let shared = self.client.shared.clone();
        let watchdog = self.watchdog;
        metrics::histogram!("dlock_hold_seconds", "backend" => shared.backend.kind())
            .record(self.acquired_at.elapsed().as_secs_f64());
        // Run detached so that cancelling this future cannot leave the lock behind.
        let task = tokio::spawn(async move { release_hold(&shared, &hold, watchdog).await });
        match task.await {
            Ok(r) => r,
            Err(e) => Err(Error::Runtime(format!("release task failed: {e}"))),
        }
    }
}

/// Releases one guard's share of `hold` on the server and detaches it locally.
pub(crate) async fn release_hold(
    shared: &Arc<Shared>,
    hold: &Arc<Hold>,
    watchdog: bool,
) -> Result<ReleaseOutcome> {
    // A lost hold that this client has since re-acquired must not decrement the new grant.
    if hold.lost.is_lost() && shared.superseded(hold) {
        shared.detach(hold, watchdog);
        return Ok(ReleaseOutcome::Expired);
    }
    let span = tracing::debug_span!("dlock.release", name = %hold.key.name, backend = shared.backend.kind());
    let r = crate::backoff::retry(shared.opts.retry, || shared.backend.release(&hold.key))
        .instrument(span)
        .await;
    let last_local = shared.detach(hold, watchdog);
    match &r {
        Ok(ReleaseOutcome::Released) => {}
        Ok(ReleaseOutcome::StillHeld { .. }) if !last_local => {}
        Ok(ReleaseOutcome::StillHeld { .. }) => {
            // Another client shares this owner id and holds the lock; we stop renewing it.
        }
        Ok(ReleaseOutcome::Expired) | Ok(ReleaseOutcome::TakenByOther) => {
            hold.lost.fire(LostReason::NotHeld);
        }
        Err(e) => {
            tracing::warn!(name = %hold.key.name, error = %e, "release failed");
        }
    }
    r
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
