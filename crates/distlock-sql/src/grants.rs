//! The grants one dedicated connection carries, and their lost signals when it ends.

use distlock_core::backend::{LostReason, LostRegistry, LostSignal};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::AttemptId;
use std::collections::HashMap;
use std::sync::{Mutex as StdMutex, MutexGuard};

/// The attempts that hold (or may hold) a lock on one connection, with the local end of their
/// leases (the connection's idle timeout must cover the latest) and the lost signals of the
/// granted ones, fired by [`ConnGrants::end`] (at once for a grant armed after that).
#[derive(Default)]
pub struct ConnGrants {
    leases: StdMutex<HashMap<AttemptId, LeaseInstant>>,
    lost: LostRegistry,
}

impl ConnGrants {
    fn leases(&self) -> MutexGuard<'_, HashMap<AttemptId, LeaseInstant>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn upsert(&self, attempt: &AttemptId, lease_end: LeaseInstant) {
        let mut leases = self.leases();
        let e = leases.entry(attempt.clone()).or_insert(lease_end);
        *e = (*e).max(lease_end);
    }

    /// Counts `attempt` as possibly holding a lock here until `lease_end` (so that the
    /// connection is neither pooled nor unlocked wholesale for another attempt meanwhile).
    pub fn add(&self, attempt: &AttemptId, lease_end: LeaseInstant) {
        if self.lost.ended().is_none() {
            self.upsert(attempt, lease_end);
        }
    }

    /// `attempt` holds its grant here: its `lost` fires when this connection ends (at once if
    /// it already has). Only granted attempts: a request that failed with the connection must
    /// not fire the signal of a grant a retry then gets on another one.
    pub fn arm(&self, attempt: &AttemptId, lost: LostSignal, lease_end: LeaseInstant) {
        if self.lost.register(attempt.clone(), lost) {
            self.upsert(attempt, lease_end);
        }
    }

    /// Moves `attempt`'s lease end later (never earlier).
    pub fn extend(&self, attempt: &AttemptId, lease_end: LeaseInstant) {
        if let Some(e) = self.leases().get_mut(attempt) {
            *e = (*e).max(lease_end);
        }
    }

    /// Forgets `attempt` (its signal is not fired); returns how many attempts remain here.
    pub fn remove(&self, attempt: &AttemptId) -> usize {
        self.lost.remove(attempt);
        let mut leases = self.leases();
        leases.remove(attempt);
        leases.len()
    }

    /// How many attempts other than `attempt` this connection carries.
    pub fn others(&self, attempt: &AttemptId) -> usize {
        self.leases().keys().filter(|a| *a != attempt).count()
    }

    /// True if the connection carries no attempt.
    pub fn is_empty(&self) -> bool {
        self.leases().is_empty()
    }

    /// The latest lease end of the attempts here, `attempt`'s counted as ending at `end` if
    /// given, left out if `end` is `None`.
    pub fn latest_end(
        &self,
        attempt: &AttemptId,
        end: Option<LeaseInstant>,
    ) -> Option<LeaseInstant> {
        self.leases()
            .iter()
            .filter(|(a, _)| *a != attempt)
            .map(|(_, e)| *e)
            .chain(end)
            .max()
    }

    /// The connection ended with `reason`: fires the lost signals of its grants and forgets
    /// every attempt. Returns whether any grant was armed (for the caller's log).
    pub fn end(&self, reason: LostReason) -> bool {
        self.leases().clear();
        self.lost.fire_all(reason) > 0
    }
}
