//! One grant of any kind, for the cases that run on several kinds.

use distlock_core::{Client, LockKind, Result};
use std::time::Duration;

/// A grant of a lock, a side of a read-write lock, or an election.
pub(super) enum Grant {
    Lock(distlock_core::LockGuard),
    Lead(distlock_core::Leadership),
}

impl Grant {
    /// The grant's fencing token.
    pub(super) fn token(&self) -> u64 {
        match self {
            Grant::Lock(g) => g.fencing_token(),
            Grant::Lead(l) => l.fencing_token(),
        }
    }

    /// Releases (resigns) it; panics if that fails.
    pub(super) async fn release(self) {
        let r = match self {
            Grant::Lock(g) => g.release().await,
            Grant::Lead(l) => l.resign().await,
        };
        r.expect("release");
    }
}

/// One try for `name` of `kind` (a mutex, a side of a read-write lock, or a campaign in an
/// election).
pub(super) async fn try_grant(c: &Client, name: &str, kind: LockKind) -> Result<Option<Grant>> {
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
        _ => Ok(c.lock(name)?.try_acquire().await?.map(Grant::Lock)),
    }
}

/// A wait of at most `d` for `name` of `kind`.
pub(super) async fn wait_grant(
    c: &Client,
    name: &str,
    kind: LockKind,
    d: Duration,
) -> Result<Grant> {
    match kind {
        LockKind::Election => Ok(Grant::Lead(
            c.election(name)?.campaign_timeout("v", d).await?,
        )),
        _ => Ok(Grant::Lock(c.lock(name)?.acquire_timeout(d).await?)),
    }
}
