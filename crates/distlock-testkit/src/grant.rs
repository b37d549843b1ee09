//! One grant of any kind (a mutex, a side of a read-write lock, a leadership), for tests that
//! run on several kinds.

use distlock_core::{Client, LockKind, Result};
use std::time::Duration;

/// A grant of a lock, a side of a read-write lock, or an election.
pub enum Grant {
    /// A lock's guard (a mutex or a side of a read-write lock).
    Lock(distlock_core::LockGuard),
    /// A leadership.
    Lead(distlock_core::Leadership),
}

impl Grant {
    /// The grant's fencing token.
    pub fn token(&self) -> u64 {
        match self {
            Grant::Lock(g) => g.fencing_token(),
            Grant::Lead(l) => l.fencing_token(),
        }
    }

    /// Releases (resigns) it; panics if that fails.
    ///
    /// # Cancel safety
    /// As the guard's `release`.
    pub async fn release(self) {
        let r = match self {
            Grant::Lock(g) => g.release().await,
            Grant::Lead(l) => l.resign().await,
        };
        r.expect("release");
    }
}

/// One try for `name` of `kind` (a mutex, a fair lock, a side of a read-write lock, or a
/// campaign in an election, with the value `v`; any other kind: a mutex).
///
/// # Errors
/// The client's.
///
/// # Cancel safety
/// As the client's `try_acquire`.
pub async fn try_grant(c: &Client, name: &str, kind: LockKind) -> Result<Option<Grant>> {
    match kind {
        LockKind::Election => Ok(c.election(name)?.try_campaign("v").await?.map(Grant::Lead)),
        LockKind::Read => Ok(c
            .rw_lock(name)?
            .read()
            .try_acquire()
            .await?
            .map(Grant::Lock)),
        LockKind::Write => Ok(c
            .rw_lock(name)?
            .write()
            .try_acquire()
            .await?
            .map(Grant::Lock)),
        LockKind::Fair => Ok(c.fair_lock(name)?.try_acquire().await?.map(Grant::Lock)),
        _ => Ok(c.lock(name)?.try_acquire().await?.map(Grant::Lock)),
    }
}

/// A wait of at most `d` for `name` of `kind` (a mutex, or a campaign with the value `v`).
///
/// # Errors
/// The client's (`Timeout` when the wait ran out).
///
/// # Cancel safety
/// As the client's `acquire_timeout`.
pub async fn wait_grant(c: &Client, name: &str, kind: LockKind, d: Duration) -> Result<Grant> {
    match kind {
        LockKind::Election => Ok(Grant::Lead(
            c.election(name)?.campaign_timeout("v", d).await?,
        )),
        _ => Ok(Grant::Lock(c.lock(name)?.acquire_timeout(d).await?)),
    }
}
