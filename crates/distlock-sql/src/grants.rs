//! The grants one dedicated connection carries, and their lost signals when it ends.

use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{AttemptId, LostReason, LostSignal};
use std::collections::HashMap;
use std::sync::{Mutex as StdMutex, MutexGuard};

#[derive(Default)]
struct Inner {
    /// The attempts on this connection that hold (or may hold) a lock on it: the lost signals
    /// of the granted ones, fired when the connection ends, and the local end of their leases.
    grants: HashMap<AttemptId, (Option<LostSignal>, LeaseInstant)>,
    reason: Option<LostReason>,
}

/// The attempts one connection carries. When the connection ends, [`ConnGrants::end`] fires
/// the lost signal of every granted one with the reason; a grant armed after that is fired at
/// once.
#[derive(Default)]
pub struct ConnGrants {
    inner: StdMutex<Inner>,
}

impl ConnGrants {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `attempt` as possibly holding a lock here until `lease_end` (so that the
    /// connection is neither pooled nor unlocked wholesale for another attempt meanwhile).
    pub fn add(&self, attempt: &AttemptId, lease_end: LeaseInstant) {
        let mut st = self.lock();
        if st.reason.is_none() {
            let e = st
                .grants
                .entry(attempt.clone())
                .or_insert((None, lease_end));
            e.1 = e.1.max(lease_end);
        }
    }

    /// `attempt` holds its grant here: its `lost` fires when this connection ends (at once if
    /// it already has). Only granted attempts: a request that failed with the connection must
    /// not fire the signal of a grant a retry then gets on another one.
    pub fn arm(&self, attempt: &AttemptId, lost: LostSignal, lease_end: LeaseInstant) {
        let mut st = self.lock();
        match &st.reason {
            Some(reason) => lost.fire(reason.clone()),
            None => {
                let e = st
                    .grants
                    .entry(attempt.clone())
                    .or_insert((None, lease_end));
                e.0 = Some(lost);
                e.1 = e.1.max(lease_end);
            }
        }
    }

    /// Moves `attempt`'s lease end later (never earlier).
    pub fn extend(&self, attempt: &AttemptId, lease_end: LeaseInstant) {
        if let Some(e) = self.lock().grants.get_mut(attempt) {
            e.1 = e.1.max(lease_end);
        }
    }

    /// Forgets `attempt`; returns how many attempts remain on this connection.
    pub fn remove(&self, attempt: &AttemptId) -> usize {
        let mut st = self.lock();
        st.grants.remove(attempt);
        st.grants.len()
    }

    /// How many attempts other than `attempt` this connection carries.
    pub fn others(&self, attempt: &AttemptId) -> usize {
        self.lock().grants.keys().filter(|a| *a != attempt).count()
    }

    /// True if the connection carries no attempt.
    pub fn is_empty(&self) -> bool {
        self.lock().grants.is_empty()
    }

    /// The latest lease end of the attempts here, `attempt`'s counted as ending at `end` if
    /// given, left out if `end` is `None`.
    pub fn latest_end(
        &self,
        attempt: &AttemptId,
        end: Option<LeaseInstant>,
    ) -> Option<LeaseInstant> {
        let st = self.lock();
        st.grants
            .iter()
            .filter(|(a, _)| *a != attempt)
            .map(|(_, (_, e))| *e)
            .chain(end)
            .max()
    }

    /// The connection ended with `reason`: fires the lost signals of its grants. Returns
    /// whether any grant was armed (for the caller's log).
    pub fn end(&self, reason: LostReason) -> bool {
        let signals = {
            let mut st = self.lock();
            st.reason = Some(reason.clone());
            std::mem::take(&mut st.grants)
        };
        let mut armed = false;
        for (lost, _) in signals.into_values() {
            if let Some(lost) = lost {
                armed = true;
                lost.fire(reason.clone());
            }
        }
        armed
    }
}
