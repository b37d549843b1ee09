//! Counting semaphores and multi-locks, built on the same holds, guards and watchdog.

use crate::backend::LockKind;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lock::Lock;
use crate::{Client, ReleaseOutcome};
use std::time::{Duration, Instant};

/// Most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1_000_000;

/// A counting semaphore shared by every process that uses the same name: at most `limit`
/// permits are held at once. See [`Client::semaphore`].
///
/// Every acquisition is its own hold, with its own owner id (`<handle owner>/<n>`), its own
/// lease and its own guard: a crashed holder's permits come back by themselves when their
/// lease ends, and the watchdog renews live ones.
#[derive(Clone, Debug)]
pub struct Semaphore {
    client: Client,
    name: String,
    owner: String,
    limit: u32,
    fixed_lease: Option<Duration>,
}

impl Semaphore {
    pub(crate) fn new(client: Client, name: &str, owner: String, limit: u32) -> Result<Self> {
        check_permits("permits", limit)?;
        Ok(Semaphore {
            client,
            name: name.to_owned(),
            owner,
            limit,
            fixed_lease: None,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The number of permits this handle creates the semaphore with.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The same semaphore with a fixed lease per acquisition (no watchdog).
    pub fn lease(mut self, lease: Duration) -> Result<Self> {
        crate::options::check_lease(lease)?;
        self.fixed_lease = Some(lease);
        Ok(self)
    }

    fn lock_for(&self, permits: u32) -> Result<Lock> {
        check_permits("acquired permits", permits)?;
        if permits > self.limit {
            return Err(Error::invalid(format!(
                "cannot take {permits} permits of semaphore `{}`, which has {}",
                self.name, self.limit
            )));
        }
        let n = self.client.next_seq();
        let lock = Lock::new(
            self.client.clone(),
            &self.name,
            format!("{}/{n}", self.owner),
            LockKind::Semaphore {
                permits,
                limit: self.limit,
            },
        );
        match self.fixed_lease {
            Some(l) => lock.lease(l),
            None => Ok(lock),
        }
    }

    /// Takes `permits` permits if they are free now; `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let pool = client.semaphore("gpu", 4)?;
    /// if let Some(permit) = pool.try_acquire(1).await? {
    ///     // … use one GPU …
    ///     permit.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::try_acquire`]: a grant that races with the drop is given back.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 permits or more than the semaphore has; otherwise as
    /// [`Lock::try_acquire`] ([`Error::Unsupported`] on backends without semaphores).
    pub async fn try_acquire(&self, permits: u32) -> Result<Option<LockGuard>> {
        self.lock_for(permits)?.try_acquire().await
    }

    /// Waits for `permits` permits.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let permits = client.semaphore("gpu", 4)?.acquire(2).await?;
    /// println!("two GPUs, token {}", permits.fencing_token());
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves nothing behind.
    ///
    /// # Errors
    /// As [`Semaphore::try_acquire`], except that connection errors are retried while waiting.
    pub async fn acquire(&self, permits: u32) -> Result<LockGuard> {
        self.lock_for(permits)?.acquire().await
    }

    /// Waits at most `wait` for `permits` permits; [`Error::Timeout`] after that.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use std::time::Duration;
    /// let sem = client.semaphore("gpu", 4)?;
    /// let permit = sem.acquire_timeout(1, Duration::from_secs(30)).await?;
    /// # drop(permit); Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Lock::acquire`]: the place in the queue is lost, nothing is left.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the permits stayed taken for the whole wait; otherwise as
    /// [`Lock::acquire_timeout`].
    pub async fn acquire_timeout(&self, permits: u32, wait: Duration) -> Result<LockGuard> {
        self.lock_for(permits)?.acquire_timeout(wait).await
    }

    /// Changes the number of permits on the server, for every user of the semaphore.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let mut sem = client.semaphore("gpu", 4)?;
    /// sem.set_permits(8).await?;
    /// assert_eq!(sem.limit(), 8);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// If the future is dropped, the new count may or may not have reached the server, and this
    /// handle keeps its old limit; call it again to be sure.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 or more than [`MAX_PERMITS`]; [`Error::Unsupported`]
    /// on backends without semaphores; [`Error::Connection`] (not retried: set it again).
    pub async fn set_permits(&mut self, permits: u32) -> Result<()> {
        check_permits("permits", permits)?;
        crate::name::validate_name(&self.name)?;
        self.client.shared.check_kind(LockKind::Semaphore {
            permits: 1,
            limit: permits,
        })?;
        self.client
            .shared
            .backend
            .set_permits(&self.name, permits)
            .await?;
        self.limit = permits;
        Ok(())
    }
}

fn check_permits(what: &str, n: u32) -> Result<()> {
    if n == 0 || n > MAX_PERMITS {
        return Err(Error::invalid(format!(
            "{what} must be between 1 and {MAX_PERMITS}, not {n}"
        )));
    }
    Ok(())
}

/// Several locks taken together, all or nothing. See [`Client::multi_lock`].
#[derive(Clone, Debug)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

impl MultiLock {
    pub(crate) fn new(client: &Client, names: &[&str]) -> Result<Self> {
        if names.is_empty() {
            return Err(Error::invalid("a multi-lock needs at least one name"));
        }
        // A canonical order (sorted, without duplicates) means two clients taking overlapping
        // sets always take the shared names in the same order, so they cannot deadlock.
        let mut sorted: Vec<&str> = names.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let locks = sorted
            .into_iter()
            .map(|n| client.lock(n))
            .collect::<Result<Vec<_>>>()?;
        Ok(MultiLock { locks })
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> Vec<&str> {
        self.locks.iter().map(|l| l.name()).collect()
    }

    /// Takes every lock if all are free now; otherwise takes none (`Ok(None)`).
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let both = client.multi_lock(&["account:1", "account:2"])?;
    /// if let Some(g) = both.try_acquire().await? {
    ///     // … move money …
    ///     g.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: the locks taken so far are released in the background.
    ///
    /// # Errors
    /// The first error of [`Lock::try_acquire`] on any of the names (the others are then
    /// released).
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            match lock.try_acquire().await {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => {
                    release_all(guards).await;
                    return Ok(None);
                }
                Err(e) => {
                    release_all(guards).await;
                    return Err(e);
                }
            }
        }
        Ok(Some(MultiGuard { guards }))
    }

    /// Waits at most `wait` for all the locks (one deadline for all); on timeout or error,
    /// everything taken so far is released.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use std::time::Duration;
    /// let both = client.multi_lock(&["account:2", "account:1"])?; // taken as 1, then 2
    /// let g = both.acquire_timeout(Duration::from_secs(5)).await?;
    /// # drop(g); Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: the locks taken so far are released in the background and the current
    /// wait is given up, as [`Lock::acquire`].
    ///
    /// # Errors
    /// [`Error::Timeout`] naming all the locks when the deadline passed; otherwise the first
    /// error of [`Lock::acquire_timeout`] on any of the names.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<MultiGuard> {
        self.acquire_until(Instant::now().checked_add(wait), wait)
            .await
    }

    /// Waits as long as it takes for all the locks.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let g = client.multi_lock(&["a", "b", "c"])?.acquire().await?;
    /// assert_eq!(g.guards().len(), 3);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MultiLock::acquire_timeout`].
    ///
    /// # Errors
    /// The first error of [`Lock::acquire`] on any of the names (the others are released).
    pub async fn acquire(&self) -> Result<MultiGuard> {
        self.acquire_until(None, Duration::MAX).await
    }

    async fn acquire_until(&self, deadline: Option<Instant>, wait: Duration) -> Result<MultiGuard> {
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let r = match deadline {
                None => lock.acquire().await,
                Some(d) => {
                    lock.acquire_timeout(d.saturating_duration_since(Instant::now()))
                        .await
                }
            };
            match r {
                Ok(g) => guards.push(g),
                Err(e) => {
                    release_all(guards).await;
                    return Err(match e {
                        Error::Timeout { .. } => Error::Timeout {
                            name: self.names().join(","),
                            waited: wait,
                        },
                        other => other,
                    });
                }
            }
        }
        Ok(MultiGuard { guards })
    }
}

async fn release_all(guards: Vec<LockGuard>) {
    for g in guards.into_iter().rev() {
        if let Err(e) = g.release().await {
            tracing::warn!(error = %e, "releasing part of a multi-lock failed; it frees at lease end");
        }
    }
}

/// The guards of a [`MultiLock`], one per name in canonical order.
#[must_use = "dropping the guard releases the locks at once"]
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The guards, in canonical name order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// True once any of the locks is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(|g| g.is_lost())
    }

    /// Resolves when any of the locks is lost.
    ///
    /// ```no_run
    /// # async fn f(g: distlock_core::MultiGuard) {
    /// tokio::select! {
    ///     why = g.lost() => eprintln!("a lock of the set is lost: {why}"),
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
    /// }
    /// # }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    ///
    /// # Errors
    /// None: it resolves with the reason of the first lock lost.
    pub async fn lost(&self) -> crate::LostReason {
        let waits: Vec<_> = self
            .guards
            .iter()
            .map(|g| Box::pin(g.lost_signal().lost_owned()))
            .collect();
        futures_select_first(waits).await
    }

    /// Releases every lock (in reverse order); the outcome per name.
    ///
    /// ```no_run
    /// # async fn f(g: distlock_core::MultiGuard) -> distlock_core::Result<()> {
    /// let outcomes = g.release().await?;
    /// assert!(outcomes.iter().all(|o| o.was_held()));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Each release runs detached: if the future is dropped, the locks not yet released are
    /// released in the background.
    ///
    /// # Errors
    /// The first error of [`LockGuard::release`] (every lock is still tried; those that failed
    /// free themselves at their lease end).
    pub async fn release(self) -> Result<Vec<ReleaseOutcome>> {
        let mut out = Vec::with_capacity(self.guards.len());
        let mut first_err = None;
        for g in self.guards.into_iter().rev() {
            match g.release().await {
                Ok(o) => out.push(o),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        out.reverse();
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// The first of several futures to finish (a tiny `select_all`, to keep the core free of a
/// futures dependency).
async fn futures_select_first<F>(mut futs: Vec<std::pin::Pin<Box<F>>>) -> F::Output
where
    F: std::future::Future,
{
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}
