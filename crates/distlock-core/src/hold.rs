//! Holds and the lease keeper (the watchdog): written once for every backend.
//!
//! A *hold* is one owner's grant of one lock in this client, shared by all re-entrant guards
//! of that owner. The keeper is one task per client: every `renew_interval` it renews all
//! watchdog-mode holds in **one** batched backend call, fires the lost signal of any hold the
//! server no longer has, and fires it too when a hold's lease runs out without a confirmed
//! renewal (fixed leases, or a server that stopped answering). It also performs the releases
//! that dropped guards schedule, so `Drop` never blocks.

use crate::backend::{Backend, GrantRef, HoldKey, RenewOutcome};
use crate::clock::Instant;
use crate::lost::{LostReason, LostSignal};
use crate::options::ClientOptions;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// One owner's grant of one lock, shared by its re-entrant guards.
#[derive(Debug)]
pub(crate) struct Hold {
    /// The grant on the server: what renewals and the release name.
    pub(crate) grant: GrantRef,
    pub(crate) lost: LostSignal,
    pub(crate) state: Mutex<HoldState>,
}

#[derive(Debug)]
pub(crate) struct HoldState {
    /// Live guards of this hold in this client.
    pub(crate) guards: u32,
    /// How many of them are in watchdog mode.
    pub(crate) watchdog_guards: u32,
    /// When the lease must be presumed gone: the latest, over every request the server
    /// confirmed (grant, renewal, extension), of its send time plus the lease it asked for,
    /// minus the drift margin. Backends never shorten a lease, so each confirmed request
    /// promises at least that much and the latest promise holds.
    pub(crate) deadline: Instant,
}

impl HoldState {
    /// Records a request sent at `sent` that the server confirmed with lease `lease`.
    pub(crate) fn confirmed(&mut self, sent: Instant, lease: Duration) {
        self.deadline = self.deadline.max(lease_deadline(sent, lease));
    }
}

/// The instant a lease of `lease` confirmed by a request sent at `sent` must be presumed gone.
pub(crate) fn lease_deadline(sent: Instant, lease: Duration) -> Instant {
    let until = sent + lease;
    until.checked_sub(drift(lease)).unwrap_or(until)
}

impl Hold {
    pub(crate) fn key(&self) -> &HoldKey {
        &self.grant.key
    }

    pub(crate) fn token(&self) -> u64 {
        self.grant.token
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, HoldState> {
        // A poisoned state mutex only means a panic elsewhere mid-update of plain numbers;
        // the numbers are still the best information we have.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the lock must be presumed gone.
    fn expires_at(&self) -> Instant {
        self.state().deadline
    }

    /// Changes the hold's state and tells its lost signal the resulting lease end, under the
    /// state lock (so concurrent changes cannot leave an older deadline behind): the one way
    /// to change a live hold, so that `is_lost()` is exact whenever the keeper runs.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut HoldState) -> R) -> R {
        let mut st = self.state();
        let r = f(&mut st);
        self.lost.set_deadline(Some(st.deadline));
        r
    }
}

/// Clock-drift allowance for a lease: 1% plus 2 ms.
pub fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

pub(crate) enum KeeperMsg {
    /// A guard was dropped without `release()`: release it in the background.
    Release { hold: Arc<Hold>, watchdog: bool },
    /// A grant nobody will use (its acquire future was dropped as it arrived, or another task
    /// of the same owner got the lock first): give it back.
    GiveBack(GrantRef),
}

/// State shared by a client, its locks, its guards and its keeper task.
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) opts: ClientOptions,
    pub(crate) holds: Mutex<HashMap<HoldKey, Arc<Hold>>>,
    /// Wakes the keeper when a hold with an earlier deadline arrives.
    pub(crate) wake: Notify,
    /// Wakes waiting acquisitions when a hold is attached, so that a task waiting on the
    /// server for a lock its own owner now holds in this client joins that hold instead.
    pub(crate) attached: Notify,
}

impl Shared {
    /// The standard [`Error::Unsupported`](crate::Error::Unsupported) unless the backend
    /// declares lock kind `kind`.
    pub(crate) fn check_kind(&self, kind: crate::LockKind) -> crate::Result<()> {
        self.backend.capabilities().check(self.backend.kind(), kind)
    }

    pub(crate) fn holds(&self) -> MutexGuard<'_, HashMap<HoldKey, Arc<Hold>>> {
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live hold of `key`, if this client has one.
    pub(crate) fn live_hold(&self, key: &HoldKey) -> Option<Arc<Hold>> {
        self.holds().get(key).filter(|h| !h.lost.is_lost()).cloned()
    }

    /// Records a fresh grant of `attempt` and returns the hold the new guard belongs to, or
    /// `Err(existing)` when this client already has a live hold of the same key that the new
    /// grant cannot replace (the read side: both grants are valid; the caller joins the
    /// existing hold and gives the new grant back).
    pub(crate) fn attach(
        &self,
        grant: GrantRef,
        lost: LostSignal,
        requested_at: Instant,
        lease: Duration,
        watchdog: bool,
    ) -> std::result::Result<Arc<Hold>, Arc<Hold>> {
        let mut holds = self.holds();
        if let Some(h) = holds.get(&grant.key) {
            if !h.lost.is_lost() {
                if grant.key.kind == crate::LockKind::Read {
                    return Err(h.clone());
                }
                // An exclusive grant to another attempt proves the old one is gone on the
                // server (deleted, expired, lost with the server's data).
                h.lost.fire(LostReason::NotHeld);
            }
        }
        let state = HoldState {
            guards: 1,
            watchdog_guards: u32::from(watchdog),
            deadline: lease_deadline(requested_at, lease),
        };
        lost.set_deadline(Some(state.deadline));
        let hold = Arc::new(Hold {
            grant: grant.clone(),
            lost,
            state: Mutex::new(state),
        });
        holds.insert(grant.key, hold.clone());
        drop(holds);
        // Only a fixed lease can end before the keeper's next tick; a watchdog hold's lease
        // (at least 3/4 of a lease left at grant) outlasts the tick, so no wake-up is needed.
        if !watchdog {
            self.wake.notify_one();
        }
        self.attached.notify_waiters();
        Ok(hold)
    }

    /// A guard of `hold` is gone (released or dropped). Returns how many guards remain; at 0
    /// the hold is no longer in the map (a new acquisition goes to the server).
    pub(crate) fn detach(&self, hold: &Arc<Hold>, watchdog: bool) -> u32 {
        // Under the map lock, so that a re-entry cannot join a hold whose last guard left.
        let mut holds = self.holds();
        let left = hold.update(|st| {
            st.guards = st.guards.saturating_sub(1);
            if watchdog {
                st.watchdog_guards = st.watchdog_guards.saturating_sub(1);
            }
            st.guards
        });
        if left == 0 && holds.get(hold.key()).is_some_and(|h| Arc::ptr_eq(h, hold)) {
            holds.remove(hold.key());
        }
        left
    }

    /// Adds a guard to `hold` if it is still this client's live hold of its key (under the
    /// map lock, so that it cannot race with the last guard leaving). False if it is not.
    pub(crate) fn join(&self, hold: &Arc<Hold>, watchdog: bool) -> bool {
        let holds = self.holds();
        if !holds.get(hold.key()).is_some_and(|h| Arc::ptr_eq(h, hold)) || hold.lost.is_lost() {
            return false;
        }
        hold.update(|st| {
            st.guards += 1;
            if watchdog {
                st.watchdog_guards += 1;
            }
        });
        true
    }

    /// Removes `hold` from the map if it is still the current hold of its key; true if it did.
    pub(crate) fn forget(&self, hold: &Arc<Hold>) -> bool {
        let mut holds = self.holds();
        if holds.get(hold.key()).is_some_and(|h| Arc::ptr_eq(h, hold)) {
            holds.remove(hold.key());
            return true;
        }
        false
    }

    fn mark_lost(&self, hold: &Arc<Hold>, reason: LostReason) {
        // Forget first, so that whoever wakes on the signal sees the hold gone. Reported once,
        // by whoever takes the hold out of the map (the signal itself may have fired already:
        // `is_lost()` fires it at the lease's end).
        if self.forget(hold) {
            let reason = hold.lost.reason().unwrap_or(reason.clone());
            tracing::warn!(name = %hold.key().name, owner = %hold.key().owner, %reason, "lock lost");
            metrics::counter!("dlock_locks_lost_total", "backend" => self.backend.kind())
                .increment(1);
        }
        hold.lost.fire(reason);
    }
}

/// The keeper task. Ends when `stop` fires, after performing the releases still queued.
pub(crate) async fn keeper(
    shared: Arc<Shared>,
    mut rx: mpsc::UnboundedReceiver<KeeperMsg>,
    stop: CancellationToken,
) {
    let interval = shared.opts.renew_interval();
    let mut next_renewal = Instant::now() + interval;
    loop {
        let next_expiry = next_expiry_of(&shared);
        let wake_at = next_expiry.map_or(next_renewal, |e| e.min(next_renewal));
        tokio::select! {
            _ = stop.cancelled() => break,
            msg = rx.recv() => match msg {
                Some(msg) => handle(&shared, msg),
                None => break,
            },
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep_until(wake_at.to_tokio()) => {}
        }
        let now = Instant::now();
        if now >= next_renewal {
            // A renewal can take up to its timeout (a paused or cut-off server): leases that
            // end meanwhile are still declared lost on time.
            let renewal = renew_all(&shared, interval);
            tokio::pin!(renewal);
            let confirmed = loop {
                let Some(next_expiry) = next_expiry_of(&shared) else {
                    break renewal.as_mut().await;
                };
                tokio::select! {
                    ok = renewal.as_mut() => break ok,
                    _ = tokio::time::sleep_until(next_expiry.to_tokio()) => expire_overdue(&shared),
                }
            };
            // A renewal that was not confirmed is tried again soon (a quarter interval), not a
            // whole interval later: one lost or late reply must not cost the lease.
            next_renewal = Instant::now() + if confirmed { interval } else { interval / 4 };
        }
        expire_overdue(&shared);
    }
    rx.close();
    while let Ok(msg) = rx.try_recv() {
        handle(&shared, msg);
    }
}

/// The earliest instant a hold of this client must be presumed gone.
fn next_expiry_of(shared: &Shared) -> Option<Instant> {
    shared.holds().values().map(|h| h.expires_at()).min()
}

fn handle(shared: &Arc<Shared>, msg: KeeperMsg) {
    match msg {
        KeeperMsg::Release { hold, watchdog } => {
            let shared = shared.clone();
            tokio::spawn(async move {
                let r = crate::guard::release_hold(&shared, &hold, watchdog).await;
                if let Err(e) = r {
                    tracing::warn!(name = %hold.key().name, error = %e,
                        "background release of a dropped guard failed; the lock frees when its lease ends");
                }
            });
        }
        KeeperMsg::GiveBack(grant) => {
            let shared = shared.clone();
            tokio::spawn(async move { crate::guard::give_back(&shared, &grant).await });
        }
    }
}

/// One batched renewal of every watchdog hold; false if the batch could not be confirmed.
async fn renew_all(shared: &Arc<Shared>, interval: Duration) -> bool {
    let batch: Vec<Arc<Hold>> = shared
        .holds()
        .values()
        .filter(|h| !h.lost.is_lost() && h.state().watchdog_guards > 0)
        .cloned()
        .collect();
    if batch.is_empty() {
        return true;
    }
    let lease = shared.opts.watchdog_lease;
    let items: Vec<(GrantRef, Duration)> = batch.iter().map(|h| (h.grant.clone(), lease)).collect();
    let started = Instant::now();
    let timeout = shared.opts.op_timeout.min(interval);
    let span = tracing::debug_span!(
        "dlock.renew",
        backend = shared.backend.kind(),
        holds = items.len()
    );
    let res = tokio::time::timeout(timeout, shared.backend.renew(&items))
        .instrument(span)
        .await;
    let backend = shared.backend.kind();
    match res {
        Ok(Ok(outcomes)) if outcomes.len() == batch.len() => {
            for (hold, out) in batch.iter().zip(outcomes) {
                match out {
                    RenewOutcome::Renewed => {
                        metrics::counter!("dlock_renewals_total", "backend" => backend)
                            .increment(1);
                        hold.update(|st| st.confirmed(started, lease));
                    }
                    RenewOutcome::NotHeld => shared.mark_lost(hold, LostReason::NotHeld),
                }
            }
            true
        }
        Ok(Ok(outcomes)) => {
            tracing::error!(
                expected = batch.len(),
                got = outcomes.len(),
                "backend renewed a batch of the wrong size"
            );
            metrics::counter!("dlock_renewal_failures_total", "backend" => backend).increment(1);
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "renewal failed; retrying soon, the lock is lost if its lease runs out first");
            metrics::counter!("dlock_renewal_failures_total", "backend" => backend).increment(1);
            false
        }
        Err(_) => {
            tracing::warn!(?timeout, "renewal timed out; retrying soon");
            metrics::counter!("dlock_renewal_failures_total", "backend" => backend).increment(1);
            false
        }
    }
}

/// Fires the lost signal of every hold whose lease has run out without confirmation.
fn expire_overdue(shared: &Arc<Shared>) {
    let now = Instant::now();
    let overdue: Vec<Arc<Hold>> = shared
        .holds()
        .values()
        .filter(|h| h.expires_at() <= now)
        .cloned()
        .collect();
    for h in overdue {
        shared.mark_lost(&h, LostReason::LeaseExpired);
    }
}
