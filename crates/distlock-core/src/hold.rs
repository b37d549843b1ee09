//! Holds and the lease keeper (the watchdog): written once for every backend.
//!
//! A *hold* is one owner's grant of one lock in this client, shared by all re-entrant guards
//! of that owner. The keeper is one task per client: every `renew_interval` it renews all
//! watchdog-mode holds in batched backend calls of at most 1,000 holds each, spread over the
//! first quarter of the interval (`keeper.rs`), fires the lost signal of any hold
//! the server no longer has, and fires it too when a hold's lease runs out without a confirmed
//! renewal (fixed leases, or a server that stopped answering). It also performs the releases
//! that dropped guards schedule, so `Drop` never blocks.

mod keeper;
#[cfg(test)]
mod tests;

pub(crate) use keeper::keeper;
#[cfg(test)]
pub(crate) use keeper::RENEW_CHUNK;

use crate::backend::{Backend, GrantRef, HoldKey};
use crate::clock::Instant;
use crate::fasthash::FastMap;
use crate::lost::{LostReason, LostSignal};
use crate::options::ClientOptions;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

/// One owner's grant of one lock, shared by its re-entrant guards.
#[derive(Debug)]
pub(crate) struct Hold {
    /// The grant on the server: what renewals and the release name.
    pub(crate) grant: GrantRef,
    pub(crate) lost: LostSignal,
    pub(crate) state: Mutex<HoldState>,
    /// For an election's leadership: what it advertises.
    pub(crate) proclaimed: Proclaimed,
}

/// An election leadership's advertised value, shared by the handles of one hold.
#[derive(Debug, Default)]
pub(crate) struct Proclaimed {
    /// The last value the server confirmed (the one granted with, at first).
    pub(crate) value: Mutex<Option<Arc<str>>>,
    /// The sequence number of the last proclamation sent (0: the value granted with).
    pub(crate) seq: std::sync::atomic::AtomicU64,
    /// Proclamations one at a time, so a retried one never lands after a later one.
    pub(crate) one: tokio::sync::Mutex<()>,
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
    /// The send time of the latest request the server confirmed: the lock was held on the
    /// server at least until then. What a hold whose session ended can still vouch for (see
    /// [`HoldState::deadline_after`]).
    pub(crate) confirmed_at: Instant,
}

impl HoldState {
    /// Records a request sent at `sent` that the server confirmed with lease `lease`.
    pub(crate) fn confirmed(&mut self, sent: Instant, lease: Duration) {
        self.deadline = self.deadline.max(lease_deadline(sent, lease));
        self.confirmed_at = self.confirmed_at.max(sent);
    }

    /// The lease deadline once the lock's fate is `lost` says: unchanged while held, and for
    /// a lock whose session ended the send time of the last confirmed request. A session
    /// lock (an SQL connection's, a ZooKeeper session's) is freed by the server when the
    /// session ends, which may be any time after that request and before the client hears
    /// of it; its lease promised nothing past the session.
    pub(crate) fn deadline_after(&self, lost: &LostSignal) -> Instant {
        match lost.reason_fired() {
            Some(LostReason::SessionEnded(_)) => self.deadline.min(self.confirmed_at),
            _ => self.deadline,
        }
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
    pub(crate) holds: Mutex<FastMap<HoldKey, Arc<Hold>>>,
    /// Wakes the keeper when a hold with an earlier deadline arrives.
    pub(crate) wake: Notify,
    /// Wakes waiting acquisitions when a hold is attached, so that a task waiting on the
    /// server for a lock its own owner now holds in this client joins that hold instead.
    pub(crate) attached: Notify,
    /// The per-pair histograms' keys, made once (see [`Timings`]).
    pub(crate) timings: Timings,
}

/// The keys of the histograms every acquire + release records, labelled with the backend:
/// made once per client instead of per record (the metrics macros build a label vector and
/// hash the key each time). Recorded through the recorder installed at the time of each record,
/// as the macros do.
pub(crate) struct Timings {
    acquire_wait: metrics::Key,
    hold: metrics::Key,
}

/// The metadata the macros give a metric of this crate.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl Timings {
    pub(crate) fn new(backend: &'static str) -> Self {
        let key = |name: &'static str| {
            metrics::Key::from_parts(name, vec![metrics::Label::new("backend", backend)])
        };
        Timings {
            acquire_wait: key("dlock_acquire_wait_seconds"),
            hold: key("dlock_hold_seconds"),
        }
    }

    /// `dlock_acquire_wait_seconds`: how long an acquisition waited for its grant.
    pub(crate) fn acquire_wait(&self, d: Duration) {
        Self::record(&self.acquire_wait, d);
    }

    /// `dlock_hold_seconds`: how long a guard held its lock before its release.
    pub(crate) fn hold(&self, d: Duration) {
        Self::record(&self.hold, d);
    }

    fn record(key: &metrics::Key, d: Duration) {
        metrics::with_recorder(|r| r.register_histogram(key, &METADATA)).record(d.as_secs_f64());
    }
}

impl Shared {
    /// The standard [`Error::Unsupported`](crate::Error::Unsupported) unless the backend
    /// declares lock kind `kind`.
    pub(crate) fn check_kind(&self, kind: crate::LockKind) -> crate::Result<()> {
        self.backend.capabilities().check(self.backend.kind(), kind)
    }

    pub(crate) fn holds(&self) -> MutexGuard<'_, FastMap<HoldKey, Arc<Hold>>> {
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
        value: Option<Arc<str>>,
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
            confirmed_at: requested_at,
        };
        lost.set_deadline(Some(state.deadline));
        let hold = Arc::new(Hold {
            grant: grant.clone(),
            lost,
            state: Mutex::new(state),
            proclaimed: Proclaimed {
                value: Mutex::new(value),
                ..Proclaimed::default()
            },
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
