//! A blocking facade for callers without an async runtime.
//!
//! The blocking client owns a small tokio runtime (one worker thread) that runs the
//! connection, the watchdog and background releases; each call blocks the calling thread
//! until the async call it wraps completes. Do not call it from inside an async context: it
//! returns [`Error::Runtime`] there instead of deadlocking.

use crate::backend::{LockInfo, ReleaseOutcome};
use crate::error::{Error, Result};
use crate::lost::LostReason;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

/// Blocking counterpart of [`crate::Client`].
#[derive(Clone, Debug)]
pub struct Client {
    inner: crate::Client,
    rt: Arc<Rt>,
}

/// The owned runtime. On drop it gives queued background releases a moment to finish, and it
/// never panics, even when dropped inside an async context.
#[derive(Debug)]
struct Rt(Option<Runtime>);

impl std::ops::Deref for Rt {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        // Always Some until Drop.
        self.0.as_ref().expect("runtime present until drop")
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(Duration::from_secs(1));
            }
        }
    }
}

fn in_async_context() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::Runtime(
            "the blocking dlock API was called from inside an async runtime; use the async API there"
                .into(),
        ));
    }
    Ok(())
}

fn block_on<F: Future>(rt: &Runtime, f: F) -> Result<F::Output> {
    in_async_context()?;
    Ok(rt.block_on(f))
}

impl Client {
    /// Builds a runtime and runs `connect` on it, e.g.
    /// `Client::new(|| distlock::connect("redis://127.0.0.1:6379"))`.
    pub fn new<F, Fut>(connect: F) -> Result<Client>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<crate::Client>>,
    {
        in_async_context()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime(format!("cannot start the dlock runtime: {e}")))?;
        let rt = Rt(Some(rt));
        let inner = block_on(&rt, connect())??;
        Ok(Client {
            inner,
            rt: Arc::new(rt),
        })
    }

    /// See [`crate::Client::lock`].
    pub fn lock(&self, name: &str) -> Result<Lock> {
        Ok(Lock {
            inner: self.inner.lock(name)?,
            rt: self.rt.clone(),
        })
    }

    /// See [`crate::Client::inspect`].
    pub fn inspect(&self, name: &str) -> Result<LockInfo> {
        block_on(&self.rt, self.inner.inspect(name))?
    }

    /// The async client inside.
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }
}

/// Blocking counterpart of [`crate::Lock`].
#[derive(Clone, Debug)]
pub struct Lock {
    inner: crate::Lock,
    rt: Arc<Rt>,
}

impl Lock {
    /// See [`crate::Lock::with_owner`].
    pub fn with_owner(self, owner: impl Into<String>) -> Result<Lock> {
        Ok(Lock {
            inner: self.inner.with_owner(owner)?,
            rt: self.rt,
        })
    }

    /// See [`crate::Lock::lease`].
    pub fn lease(self, lease: Duration) -> Result<Lock> {
        Ok(Lock {
            inner: self.inner.lease(lease)?,
            rt: self.rt,
        })
    }

    /// The owner id acquisitions through this handle use.
    pub fn owner_id(&self) -> &str {
        self.inner.owner()
    }

    /// See [`crate::Lock::try_acquire`].
    pub fn try_acquire(&self) -> Result<Option<LockGuard>> {
        let g = block_on(&self.rt, self.inner.try_acquire())??;
        Ok(g.map(|g| self.wrap(g)))
    }

    /// See [`crate::Lock::acquire`].
    pub fn acquire(&self) -> Result<LockGuard> {
        let g = block_on(&self.rt, self.inner.acquire())??;
        Ok(self.wrap(g))
    }

    /// See [`crate::Lock::acquire_timeout`].
    pub fn acquire_timeout(&self, wait: Duration) -> Result<LockGuard> {
        let g = block_on(&self.rt, self.inner.acquire_timeout(wait))??;
        Ok(self.wrap(g))
    }

    fn wrap(&self, g: crate::LockGuard) -> LockGuard {
        LockGuard {
            inner: Some(g),
            rt: self.rt.clone(),
        }
    }
}

/// Blocking counterpart of [`crate::LockGuard`]; dropping it releases in the background.
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct LockGuard {
    inner: Option<crate::LockGuard>,
    rt: Arc<Rt>,
}

impl LockGuard {
    fn get(&self) -> Result<&crate::LockGuard> {
        self.inner
            .as_ref()
            .ok_or_else(|| Error::Runtime("guard already released".into()))
    }

    /// See [`crate::LockGuard::fencing_token`].
    pub fn fencing_token(&self) -> u64 {
        self.inner.as_ref().map_or(0, |g| g.fencing_token())
    }

    /// See [`crate::LockGuard::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.inner.as_ref().is_none_or(|g| g.is_lost())
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.inner.as_ref().and_then(|g| g.lost_signal().reason())
    }

    /// See [`crate::LockGuard::extend`].
    pub fn extend(&self, lease: Duration) -> Result<()> {
        block_on(&self.rt, self.get()?.extend(lease))?
    }

    /// See [`crate::LockGuard::release`].
    pub fn release(mut self) -> Result<ReleaseOutcome> {
        let g = self
            .inner
            .take()
            .ok_or_else(|| Error::Runtime("guard already released".into()))?;
        block_on(&self.rt, g.release())?
    }
}
