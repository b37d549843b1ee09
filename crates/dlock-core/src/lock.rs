//! Lock handles and acquisition.

use crate::backend::{AcquireReply, AcquireRequest, Granted, HoldKey, LockKind};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::Client;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// A handle on one named lock for one owner.
///
/// **Owner identity.** Every handle made by [`Client::lock`] gets its own owner id
/// (`<client id>:<n>`); clones of a handle share it. Acquiring again through the same owner
/// while it holds the lock is *re-entry*: the server counts holds, and only the last release
/// frees the lock. Two handles (two owners) exclude each other even inside one process. Use
/// [`Lock::with_owner`] to choose the id yourself, e.g. a request id that several tasks share.
///
/// **Lease.** By default a lock is in *watchdog mode*: its lease is the client's watchdog lease
/// (30 s) and the watchdog renews it every lease/3 while the guard lives. With
/// [`Lock::lease`] the lock instead has a fixed lease, no renewal, and the guard's lost signal
/// fires when the lease ends.
#[derive(Clone, Debug)]
pub struct Lock {
    client: Client,
    key: HoldKey,
    fixed_lease: Option<Duration>,
}

impl Lock {
    pub(crate) fn new(client: Client, name: &str, owner: String, kind: LockKind) -> Self {
        Lock {
            client,
            key: HoldKey {
                name: Arc::from(name),
                owner: Arc::from(owner),
                kind,
            },
            fixed_lease: None,
        }
    }

    /// The same lock with owner id `owner`.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Result<Lock> {
        let owner = owner.into();
        crate::name::validate_owner(&owner)?;
        self.key.owner = Arc::from(owner);
        Ok(self)
    }

    /// The same lock with a fixed lease and no watchdog (like Redisson's `lock(leaseTime)`).
    /// Fails on a zero lease or one over 30 days.
    pub fn lease(mut self, lease: Duration) -> Result<Lock> {
        crate::options::check_lease(lease)?;
        self.fixed_lease = Some(lease);
        Ok(self)
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// The kind of lock this handle takes.
    pub fn kind(&self) -> LockKind {
        self.key.kind
    }

    /// The owner id acquisitions through this handle use.
    pub fn owner(&self) -> &str {
        &self.key.owner
    }

    /// The fixed lease, or `None` in watchdog mode.
    pub fn fixed_lease(&self) -> Option<Duration> {
        self.fixed_lease
    }

    /// Takes the lock if it is free (or re-enters it); never waits.
    /// `Ok(None)` means another owner holds it.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while the request is in flight and the server
    /// grants it, the grant is released in the background.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.run(Mode::Try).await
    }

    /// Waits as long as it takes to get the lock.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops the wait and leaves nothing behind on the server.
    pub async fn acquire(&self) -> Result<LockGuard> {
        match self.run(Mode::Wait(None)).await? {
            Some(g) => Ok(g),
            None => Err(Error::Runtime("acquire ended without a grant".into())),
        }
    }

    /// Waits at most `wait` for the lock; [`Error::Timeout`] after that.
    /// `acquire_timeout(Duration::ZERO)` tries once.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<LockGuard> {
        let deadline = Instant::now().checked_add(wait);
        let mode = if wait.is_zero() {
            Mode::Try
        } else {
            Mode::Wait(deadline)
        };
        match self.run(mode).await? {
            Some(g) => Ok(g),
            None => {
                metrics::counter!("dlock_acquire_timeouts_total", "backend" => self.client.backend_kind()).increment(1);
                Err(Error::Timeout {
                    name: self.name().to_owned(),
                    waited: wait,
                })
            }
        }
    }

    async fn run(&self, mode: Mode) -> Result<Option<LockGuard>> {
        let shared = &self.client.shared;
        let lease = self.fixed_lease.unwrap_or(shared.opts.watchdog_lease);
        // Re-entry shares the existing hold's lost signal.
        let lost = shared
            .live_hold(&self.key)
            .map(|h| h.lost.clone())
            .unwrap_or_default();
        let req = AcquireRequest::new(self.key.clone(), lease, lost.clone());
        let started = Instant::now();
        let span = tracing::debug_span!("dlock.acquire", name = %self.key.name, backend = shared.backend.kind());
        let granted = detached_acquire(&self.client, req, mode)
            .instrument(span)
            .await?;
        let Some(granted) = granted else {
            return Ok(None);
        };
        metrics::histogram!("dlock_acquire_wait_seconds", "backend" => shared.backend.kind())
            .record(started.elapsed().as_secs_f64());
        let hold = shared.attach(
            self.key.clone(),
            granted.token,
            lost,
            granted.requested_at,
            self.fixed_lease,
        );
        Ok(Some(LockGuard::new(
            self.client.clone(),
            hold,
            self.fixed_lease.is_none(),
        )))
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Try,
    Wait(Option<Instant>),
}

/// Runs the acquisition in its own task so that dropping the caller's future cannot strand a
/// grant: if the caller is gone when the server says yes, the task gives the lock back.
async fn detached_acquire(
    client: &Client,
    req: AcquireRequest,
    mode: Mode,
) -> Result<Option<Granted>> {
    let shared = client.shared.clone();
    let cancel = CancellationToken::new();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let (tx, rx) = oneshot::channel::<Result<Option<Granted>>>();
    tokio::spawn(async move {
        let backend = &shared.backend;
        let res = match mode {
            Mode::Try => {
                crate::backoff::retry(shared.opts.retry, || async {
                    let requested_at = Instant::now();
                    Ok(match backend.acquire(&req).await? {
                        AcquireReply::Granted { token } => Some(Granted {
                            token,
                            requested_at,
                        }),
                        AcquireReply::Held { .. } => None,
                    })
                })
                .await
            }
            Mode::Wait(deadline) => backend.acquire_wait(&req, deadline, &cancel).await,
        };
        if let Err(Ok(Some(_))) = tx.send(res) {
            // Nobody is waiting for this grant any more.
            if let Err(e) = backend.release(&req.key).await {
                tracing::warn!(name = %req.key.name, error = %e, "could not give back a grant whose caller had gone");
            }
        }
    });
    rx.await
        .map_err(|_| Error::Runtime("the acquire task ended unexpectedly".into()))?
}
