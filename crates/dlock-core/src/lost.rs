//! The lost signal: how a holder learns that its lock is gone.

use std::fmt;
use std::sync::{Arc, OnceLock};
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
#[derive(Clone, Default)]
pub struct LostSignal {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    token: CancellationToken,
    reason: OnceLock<LostReason>,
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

    /// True once the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.inner.token.is_cancelled()
    }

    /// Why the lock was lost, if it was.
    pub fn reason(&self) -> Option<LostReason> {
        self.inner.reason.get().cloned()
    }

    /// Resolves when the lock is lost (at once if it already is).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call it again.
    pub async fn lost(&self) -> LostReason {
        self.inner.token.cancelled().await;
        self.reason().unwrap_or(LostReason::NotHeld)
    }

    /// Like [`LostSignal::lost`], owning its signal (a `'static` future).
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
