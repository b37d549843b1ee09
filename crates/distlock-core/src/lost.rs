//! The lost signal: how a holder learns that its lock is gone.

use crate::clock::Instant;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use tokio_util::sync::CancellationToken;

/// Why a held lock was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out before a renewal was confirmed (fixed lease reached its end, or the
    /// server could not be reached for a whole lease).
    LeaseExpired,
    /// A renewal reached the server and found the lock no longer ours (deleted, expired, or
    /// taken by another owner).
    NotHeld,
    /// The backend's session holding the lock ended (ZooKeeper session, SQL connection, …).
    SessionEnded(String),
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::LeaseExpired => {
                write!(f, "the lease ran out before a renewal was confirmed")
            }
            LostReason::NotHeld => write!(
                f,
                "the server no longer has the lock for this owner (deleted, expired or taken over)"
            ),
            LostReason::SessionEnded(why) => write!(f, "the session holding the lock ended: {why}"),
        }
    }
}

/// Fires once, when a held lock is gone. Cheap to clone; every clone sees the same state.
///
/// Backends whose server tells them about loss (a session that ends, a connection that drops)
/// call [`LostSignal::fire`]; the core's watchdog fires it when a renewal fails or a lease
/// runs out.
///
/// A held lock's signal also knows the instant its lease must be presumed gone (the start of
/// the last confirmed renewal plus the lease, minus a clock-drift margin). [`is_lost`] and
/// [`reason`] compare with the clock, so they are exact at that instant even if the task that
/// would fire the signal runs late (a loaded machine, a renewal still in flight).
///
/// [`is_lost`]: LostSignal::is_lost
/// [`reason`]: LostSignal::reason
#[derive(Clone, Default)]
pub struct LostSignal {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    token: CancellationToken,
    reason: OnceLock<LostReason>,
    /// When the lease must be presumed gone; `None` while unknown (not held yet, or no lease).
    deadline: Mutex<Option<Instant>>,
}

impl LostSignal {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the lock lost. The first reason wins; later calls do nothing.
    pub fn fire(&self, reason: LostReason) {
        if self.inner.reason.set(reason).is_ok() {
            self.inner.token.cancel();
        }
    }

    /// Sets (or clears) the instant the lease must be presumed gone. Called by the core as the
    /// lease is granted, renewed or changed.
    pub(crate) fn set_deadline(&self, deadline: Option<Instant>) {
        *self.deadline_slot() = deadline;
    }

    /// The reason it fired with, if it has (not checked against the lease's end).
    pub(crate) fn reason_fired(&self) -> Option<&LostReason> {
        self.inner.reason.get()
    }

    fn deadline(&self) -> Option<Instant> {
        *self.deadline_slot()
    }

    fn deadline_slot(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // Poisoning can only come from a panic while copying an `Option<Instant>`: the value
        // is still whole.
        self.inner
            .deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// True once the lock is lost, or once its lease has run out without a confirmed renewal
    /// (then the signal fires with [`LostReason::LeaseExpired`] on the spot).
    pub fn is_lost(&self) -> bool {
        if self.inner.token.is_cancelled() {
            return true;
        }
        if self.deadline().is_some_and(|d| Instant::now() >= d) {
            self.fire(LostReason::LeaseExpired);
            return true;
        }
        false
    }

    /// Why the lock was lost, if it was (checked against the lease's end as [`is_lost`] is).
    ///
    /// [`is_lost`]: LostSignal::is_lost
    pub fn reason(&self) -> Option<LostReason> {
        if !self.is_lost() {
            return None;
        }
        self.inner.reason.get().cloned()
    }

    /// Resolves when the lock is lost (at once if it already is), at the latest when its lease
    /// runs out without a confirmed renewal. After a suspend of the machine that outlived the
    /// lease it resolves within a second of the resume (the client's keeper looks at the
    /// boot-time clock at least that often while it has holds; tokio's timers slept through the
    /// suspend).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use distlock_core::{LostReason, LostSignal};
    /// let lost = LostSignal::new();
    /// let watcher = tokio::spawn(lost.clone().lost_owned());
    /// lost.fire(LostReason::NotHeld);
    /// assert_eq!(watcher.await.unwrap(), LostReason::NotHeld);
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call it again.
    ///
    /// # Errors
    /// None: it resolves with the reason, and only when the lock is lost.
    pub async fn lost(&self) -> LostReason {
        loop {
            if let Some(reason) = self.reason() {
                return reason;
            }
            match self.deadline() {
                // A renewal may move the deadline on while this sleeps: look again then.
                Some(d) => {
                    tokio::select! {
                        _ = self.inner.token.cancelled() => {}
                        _ = tokio::time::sleep_until(d.to_tokio()) => {}
                    }
                }
                None => self.inner.token.cancelled().await,
            }
        }
    }

    /// Like [`LostSignal::lost`], owning its signal (a `'static` future).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LostSignal::lost`].
    ///
    /// # Errors
    /// None, as [`LostSignal::lost`].
    pub async fn lost_owned(self) -> LostReason {
        self.lost().await
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("reason", &self.reason())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn past_deadline_is_lost_at_once() {
        let s = LostSignal::new();
        assert!(!s.is_lost());
        assert_eq!(s.reason(), None);
        s.set_deadline(Some(Instant::now() + Duration::from_secs(3600)));
        assert!(!s.is_lost());
        s.set_deadline(Instant::now().checked_sub(Duration::from_millis(1)));
        assert!(s.is_lost());
        assert_eq!(s.reason(), Some(LostReason::LeaseExpired));
        // The first reason stays.
        s.fire(LostReason::NotHeld);
        assert_eq!(s.reason(), Some(LostReason::LeaseExpired));
        // A later deadline cannot bring a lost lock back.
        s.set_deadline(Some(Instant::now() + Duration::from_secs(3600)));
        assert!(s.is_lost());
    }

    #[test]
    fn fired_reason_wins_over_a_later_deadline() {
        let s = LostSignal::new();
        s.set_deadline(Some(Instant::now() + Duration::from_secs(3600)));
        s.fire(LostReason::SessionEnded("closed".into()));
        assert_eq!(s.reason(), Some(LostReason::SessionEnded("closed".into())));
    }

    #[tokio::test]
    async fn lost_resolves_at_the_deadline_without_a_fire() {
        let s = LostSignal::new();
        let start = Instant::now();
        s.set_deadline(Some(start + Duration::from_millis(50)));
        let reason = tokio::time::timeout(Duration::from_secs(10), s.lost())
            .await
            .expect("lost() never resolved at the deadline");
        assert_eq!(reason, LostReason::LeaseExpired);
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    #[tokio::test]
    async fn lost_follows_a_moved_deadline() {
        let s = LostSignal::new();
        let start = Instant::now();
        // The first deadline is far enough that the move below comes before it, however
        // slowly this test runs.
        s.set_deadline(Some(start + Duration::from_secs(2)));
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.lost().await }
        });
        // A renewal moves the lease end far away before the first deadline.
        s.set_deadline(Some(start + Duration::from_secs(3600)));
        tokio::time::sleep_until((start + Duration::from_millis(2300)).to_tokio()).await;
        assert!(
            !waiter.is_finished(),
            "lost() fired at a deadline that had moved"
        );
        s.fire(LostReason::NotHeld);
        let reason = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("lost() never resolved")
            .expect("task");
        assert_eq!(reason, LostReason::NotHeld);
    }
}
