//! Waiting for a lock: one retrying loop for every backend.
//!
//! [`run`] drives a [`WaitStrategy`] — a backend's way to try once and to sleep until the
//! next reason to try — until a grant, the deadline, cancellation, or an error that is not
//! retryable. It does what every wait loop needs once: connection errors are retried with a
//! jittered backoff (the retry is the same attempt, so it has the effect of one), sleeps are
//! bounded by the deadline and the strategy's heartbeat, `cancel` stops it promptly,
//! [`WaitStrategy::give_up`] runs on every exit without a grant, and a wait whose deadline
//! passes right after failed attempts **reports the last error** instead of a timeout that
//! would claim another owner held the lock the whole time.
//!
//! [`watch_and_retry`] is the strategy for backends that wake waiters with notifications
//! ([`Backend::watch`]); [`retrying`] is the loop for backends whose one attempt is itself a
//! wait on the server (an advisory lock with a timeout, a queue node and its watch).

use crate::backend::{AcquireReply, AcquireRequest, Backend, Granted, ReleaseWatch, Wake};
use crate::backoff::{Backoff, RetryPolicy};
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use async_trait::async_trait;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest time a waiter counts as alive in a server-side queue without a new attempt.
pub const MAX_WAITER_TTL: Duration = Duration::from_secs(2);

/// How long a waiter stays registered without a new attempt, for a lock of lease `lease`.
pub fn waiter_ttl(lease: Duration) -> Duration {
    lease.clamp(Duration::from_millis(100), MAX_WAITER_TTL)
}

/// How often a waiter refreshes its place: half its ttl, and at most a quarter of the lease,
/// so that a lock handed over just before a refresh still has most of its lease left.
pub fn heartbeat(lease: Duration) -> Duration {
    (waiter_ttl(lease) / 2).min(lease / 4)
}

/// What one attempt of a wait found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attempt {
    /// The lock is this attempt's.
    Granted(Granted),
    /// Held by another owner: sleep in [`WaitStrategy::wake`] until a wake-up, at most
    /// `retry_in` (e.g. until the holder's lease ends; `None`: no limit but the heartbeat
    /// and the deadline), then try again.
    Held {
        /// Longest sleep before the next attempt.
        retry_in: Option<Duration>,
    },
    /// Try again at once (e.g. a subscription was just made and a release may have come
    /// before it, or a server-side wait ended early).
    Again,
}

/// A backend's way of waiting: the parts of a wait loop that talk to the server. [`run`]
/// does the rest.
///
/// The loop calls [`attempt`](WaitStrategy::attempt); on [`Attempt::Held`] it calls
/// [`wake`](WaitStrategy::wake) with the moment to stop sleeping at the latest; on an error
/// it asks [`retry`](WaitStrategy::retry) whether to go on, pauses with a backoff, and tries
/// again. When the wait ends without a grant it calls [`give_up`](WaitStrategy::give_up).
#[async_trait]
pub trait WaitStrategy: Send {
    /// One attempt. A grant carries the send time of the request that was granted (taken
    /// just before it was sent, on the lease clock); a handoff found later by
    /// [`wake`](WaitStrategy::wake) is measured from the `requested_at` of its
    /// [`Wake::Granted`], or confirmed by the next attempt.
    ///
    /// An attempt may wait on the server itself, bounded by `deadline`; it must then return
    /// promptly (with [`Attempt::Again`], or a grant that raced) when `cancel` fires. The loop
    /// never drops an attempt's future before it completes, so an attempt need not be cancel
    /// safe.
    async fn attempt(&mut self, deadline: Deadline, cancel: &CancellationToken) -> Result<Attempt>;

    /// Sleeps until the next reason to try again — a release notification — or until `until`
    /// (the earliest of the deadline, the heartbeat and the attempt's `retry_in`), whichever
    /// is first. `Ok(Some(Wake::Granted { .. }))` ends the wait with that grant (measured
    /// from the `requested_at` the backend vouches for); `Ok(None)`, `Released` or any other
    /// handoff tries again (an attempt confirms a handoff). An error is
    /// retried as an attempt's error is (after [`retry`](WaitStrategy::retry) and a backoff
    /// pause), but is not reported at the deadline: the holder, not the notifications, kept
    /// the lock. The default sleeps until `until`.
    ///
    /// # Cancel safety
    /// Must be cancel safe: the loop drops it when `cancel` fires.
    async fn wake(&mut self, until: Deadline) -> Result<Option<Wake>> {
        until.reached().await;
        Ok(None)
    }

    /// An attempt or a wake-up failed with `e`: whether the wait goes on (after a backoff
    /// pause). Drop here what `e` may have broken (a subscription). The default goes on for
    /// [retryable](Error::is_retryable) errors.
    fn retry(&mut self, e: &Error) -> bool {
        e.is_retryable()
    }

    /// Longest sleep between two attempts while the lock is held (a waiter's heartbeat in a
    /// server-side queue, or a safety net under notifications). Default: none.
    fn heartbeat(&self) -> Option<Duration> {
        None
    }

    /// The wait ends without a grant (deadline, cancellation or error): leave the server's
    /// queue and give back a grant this attempt may have got meanwhile. Runs once, also
    /// after `cancel` fired. The default does nothing.
    async fn give_up(&mut self) {}
}

/// Waits with `strategy` until a grant (`Ok(Some)`), the deadline or `cancel`
/// (`Ok(None)`), or an error.
///
/// Errors the strategy [retries](WaitStrategy::retry) pause the loop with a full-jitter
/// backoff of `policy`'s delays (its attempt count is not used: the deadline bounds the
/// wait). If the deadline passes while the last attempt had failed, that error is returned
/// instead of `Ok(None)`: the caller learns why it did not get the lock (a failed wake-up after
/// a "held" answer does not count: the holder is why). A cancelled wait is always `Ok(None)`.
///
/// ```
/// use distlock_core::backend::{async_trait, wait, Attempt, Deadline, Granted, WaitStrategy};
/// use tokio_util::sync::CancellationToken;
///
/// /// Granted at the third look.
/// struct Third(u32);
///
/// #[async_trait]
/// impl WaitStrategy for Third {
///     async fn attempt(&mut self, _: Deadline, _: &CancellationToken) -> distlock_core::Result<Attempt> {
///         self.0 += 1;
///         Ok(if self.0 == 3 {
///             Attempt::Granted(Granted::new(9, distlock_core::clock::Instant::now()))
///         } else {
///             Attempt::Held { retry_in: Some(std::time::Duration::from_millis(1)) }
///         })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cancel = CancellationToken::new();
/// let g = wait::run(&mut Third(0), Deadline::never(), &cancel, Default::default()).await;
/// assert_eq!(g.unwrap().map(|g| g.token), Some(9));
/// # }
/// ```
///
/// # Cancel safety
/// Stop it with `cancel`, not by dropping it: `give_up` runs only when the loop ends by
/// itself. (The core runs every wait in a task of its own and never drops it.)
///
/// # Errors
/// A non-retryable error of an attempt or wake-up; the last retryable one if the deadline
/// passed right after it.
pub async fn run<S: WaitStrategy + ?Sized>(
    strategy: &mut S,
    deadline: Deadline,
    cancel: &CancellationToken,
    policy: RetryPolicy,
) -> Result<Option<Granted>> {
    run_after(strategy, None, deadline, cancel, policy).await
}

/// [`run`], with the outcome of a first attempt the caller already made (`None`: none).
async fn run_after<S: WaitStrategy + ?Sized>(
    strategy: &mut S,
    first: Option<Result<Attempt>>,
    deadline: Deadline,
    cancel: &CancellationToken,
    policy: RetryPolicy,
) -> Result<Option<Granted>> {
    let res = run_loop(strategy, first, deadline, cancel, policy).await;
    if !matches!(res, Ok(Some(_))) {
        strategy.give_up().await;
    }
    res
}

async fn run_loop<S: WaitStrategy + ?Sized>(
    strategy: &mut S,
    mut first: Option<Result<Attempt>>,
    deadline: Deadline,
    cancel: &CancellationToken,
    policy: RetryPolicy,
) -> Result<Option<Granted>> {
    let mut backoff = Backoff::new(policy);
    let mut last_err: Option<Error> = None;
    loop {
        let outcome = match first.take() {
            // Made by the caller after the same checks.
            Some(outcome) => outcome,
            None => {
                if cancel.is_cancelled() {
                    return Ok(None);
                }
                if deadline.passed() {
                    return last_err.map_or(Ok(None), Err);
                }
                strategy.attempt(deadline, cancel).await
            }
        };
        // A failed attempt is why the lock was not got; a failed wake-up after a "held" answer
        // is not (the holder was), so only the former is reported at the deadline.
        let (failed, by_attempt) = match outcome {
            Ok(Attempt::Granted(g)) => return Ok(Some(g)),
            Ok(Attempt::Again) => {
                backoff.reset();
                last_err = None;
                // Cooperative: a strategy that answers `Again` many times in a row must not
                // starve the other tasks of its worker thread.
                tokio::task::yield_now().await;
                continue;
            }
            Ok(Attempt::Held { retry_in }) => {
                backoff.reset();
                last_err = None;
                if cancel.is_cancelled() || deadline.passed() {
                    return Ok(None);
                }
                let mut until = deadline;
                if let Some(beat) = strategy.heartbeat() {
                    until = until.within(beat);
                }
                if let Some(r) = retry_in {
                    until = until.within(r);
                }
                let woke = tokio::select! {
                    w = strategy.wake(until) => w,
                    _ = cancel.cancelled() => return Ok(None),
                };
                match woke {
                    // A handoff is not a grant until an attempt confirms it. Its notice comes
                    // on another connection than the attempts, so it may be older than the
                    // last attempt: a waiter stopped (SIGSTOP, a GC pause) or slow to read its
                    // notices hears, after its last attempt was answered "held", of a handoff
                    // whose lease ran out meanwhile, with another holder since. Measuring that
                    // lease from the last attempt made two holders (`dlock torture`, redis,
                    // seed 12: a waiter paused 2.4 s held the lock 290 ms beside three others,
                    // never told). The next attempt names the same attempt: the server answers
                    // with the same grant, its lease made to run from that request, or finds
                    // it gone. Unless the backend vouches for it (`Wake::Granted`): the notice
                    // names the request it followed, that request is the attempt's last, and
                    // its send time plus the lease is still ahead.
                    // A handoff the backend vouches for (it knows the handoff followed the
                    // attempt's last request, answered "held", and when that was sent): the
                    // grant, measured from that request (see `Wake::Granted`).
                    Ok(Some(Wake::Granted {
                        token,
                        requested_at,
                    })) => return Ok(Some(Granted::new(token, requested_at))),
                    Ok(
                        Some(
                            Wake::HandedOver { .. } | Wake::HandedOverAfter { .. } | Wake::Released,
                        )
                        | None,
                    ) => continue,
                    Err(e) => (e, false),
                }
            }
            Err(e) => (e, true),
        };
        if !strategy.retry(&failed) {
            return Err(failed);
        }
        let pause = backoff.next_delay();
        tracing::debug!(error = %failed, ?pause, "waiting for the lock failed; retrying");
        last_err = by_attempt.then_some(failed);
        if !deadline.sleep(pause, cancel).await {
            if cancel.is_cancelled() {
                return Ok(None);
            }
            return last_err.map_or(Ok(None), Err);
        }
    }
}

/// The wait loop for backends whose one attempt is a whole (server-side) wait: runs `round`
/// until it returns a grant, the deadline passes or `cancel` fires, retrying retryable errors
/// as [`run`] does (and reporting the last one if the deadline passes right after it). A
/// round returns `Ok(None)` when it stopped without the lock (early, or at the deadline or
/// cancellation, which it must watch itself); the loop then tries again if time is left.
///
/// ```no_run
/// # use distlock_core::backend::{Deadline, Granted};
/// # async fn one_round(d: Deadline) -> distlock_core::Result<Option<Granted>> { Ok(None) }
/// # async fn f(d: Deadline, cancel: tokio_util::sync::CancellationToken) -> distlock_core::Result<()> {
/// let granted = distlock_core::wait::retrying(d, &cancel, Default::default(), || one_round(d)).await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// As [`run`]: a round is never dropped half-way; stop the loop with `cancel`.
///
/// # Errors
/// As [`run`].
pub async fn retrying<F, Fut>(
    deadline: Deadline,
    cancel: &CancellationToken,
    policy: RetryPolicy,
    round: F,
) -> Result<Option<Granted>>
where
    F: FnMut() -> Fut + Send,
    Fut: Future<Output = Result<Option<Granted>>> + Send,
{
    let mut rounds = Rounds(round);
    run(&mut rounds, deadline, cancel, policy).await
}

struct Rounds<F>(F);

#[async_trait]
impl<F, Fut> WaitStrategy for Rounds<F>
where
    F: FnMut() -> Fut + Send,
    Fut: Future<Output = Result<Option<Granted>>> + Send,
{
    async fn attempt(&mut self, _: Deadline, _: &CancellationToken) -> Result<Attempt> {
        Ok(match (self.0)().await? {
            Some(g) => Attempt::Granted(g),
            None => Attempt::Again,
        })
    }
}

/// The default waiting strategy (see [`Backend::acquire_wait`]).
///
/// Try (registering as a waiter); if held, subscribe to the lock's notifications and try once
/// more (a release may have come before the subscription was in place); then sleep until a
/// notification, the holder's lease end, or the waiter's heartbeat, whichever is first. A
/// backend with a server-side queue may hand the lock over in the notification itself; the
/// waiter confirms a handoff with one more attempt ([`Wake::HandedOver`]) unless the backend
/// vouches for it ([`Wake::Granted`]), which saves that round trip. There is no fixed polling interval:
/// the heartbeat only keeps the waiter's place in the queue alive (so a crashed waiter drops
/// out), and it is a quarter of the lease or longer. A wait that ends at its deadline right
/// after failed attempts returns the last error (see [`run`]).
///
/// ```no_run
/// # use distlock_core::backend::*;
/// # async fn f(b: &dyn Backend, req: &AcquireRequest) -> distlock_core::Result<()> {
/// use std::time::{Duration, Instant};
/// let cancel = tokio_util::sync::CancellationToken::new();
/// let deadline = Some(Instant::now() + Duration::from_secs(5));
/// match wait::watch_and_retry(b, req, deadline, &cancel).await? {
///     Some(g) => println!("granted with token {}", g.token),
///     None => println!("still held at the deadline"),
/// }
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// As [`run`]: stop it with `cancel`.
///
/// # Errors
/// As [`run`].
pub async fn watch_and_retry<B: Backend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<Option<Granted>> {
    let mut req = req.clone();
    req.waiter_ttl = Some(waiter_ttl(req.lease));
    let mut w = Watching {
        backend,
        beat: heartbeat(req.lease),
        req,
        watch: None,
        queued: false,
    };
    let deadline = Deadline::from(deadline);
    // The first attempt called directly (the loop's calls go through a boxed future): an
    // uncontended wait ends here. The loop's own checks come first, as it would make them.
    let mut first = None;
    if !cancel.is_cancelled() && !deadline.passed() {
        let outcome = w.try_once(deadline, cancel).await;
        if let Ok(Attempt::Granted(g)) = outcome {
            return Ok(Some(g));
        }
        first = Some(outcome);
    }
    run_after(&mut w, first, deadline, cancel, RetryPolicy::default()).await
}

/// [`watch_and_retry`]'s strategy.
struct Watching<'a, B: ?Sized> {
    backend: &'a B,
    req: AcquireRequest,
    beat: Duration,
    watch: Option<Box<dyn ReleaseWatch>>,
    /// The attempt may be in the server's queue (or granted with its reply lost).
    queued: bool,
}

#[async_trait]
impl<B: Backend + ?Sized> WaitStrategy for Watching<'_, B> {
    async fn attempt(&mut self, deadline: Deadline, cancel: &CancellationToken) -> Result<Attempt> {
        self.try_once(deadline, cancel).await
    }

    async fn wake(&mut self, until: Deadline) -> Result<Option<Wake>> {
        let Some(w) = self.watch.as_mut() else {
            until.reached().await;
            return Ok(None);
        };
        tokio::select! {
            r = w.changed() => match r {
                Ok(wake) => Ok(Some(wake)),
                Err(e) => {
                    // Notifications may have been missed: try again, then subscribe anew.
                    tracing::debug!(error = %e, "release notifications broke; subscribing again");
                    self.watch = None;
                    Ok(None)
                }
            },
            _ = until.reached() => Ok(None),
        }
    }

    fn retry(&mut self, e: &Error) -> bool {
        // Connection trouble while waiting: keep waiting (bounded by the deadline) instead of
        // failing the caller at the first blip, with a new subscription afterwards.
        self.watch = None;
        e.is_retryable()
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(self.beat)
    }

    async fn give_up(&mut self) {
        self.watch = None;
        if !self.queued {
            return;
        }
        // Leave the queue, and give back a grant that may have been handed over to this
        // attempt meanwhile (only this attempt's: the request names it).
        if let Err(e) = self.backend.give_up(&self.req).await {
            tracing::debug!(error = %e, name = %self.req.key.name, "could not leave the wait queue; it expires by itself");
        }
    }
}

impl<B: Backend + ?Sized> Watching<'_, B> {
    /// One attempt ([`WaitStrategy::attempt`]).
    async fn try_once(
        &mut self,
        deadline: Deadline,
        cancel: &CancellationToken,
    ) -> Result<Attempt> {
        // The attempt may reach the server (and queue, or even be granted) however it ends:
        // every retry names the same attempt, so it has the effect of one.
        self.queued = true;
        if self.watch.is_none() {
            // In place before the request is sent: a handoff right after it is not missed.
            self.watch = self.backend.watch_ready(&self.req);
        }
        let sent = crate::clock::Instant::now();
        let ttl = match self.backend.acquire(&self.req).await? {
            AcquireReply::Granted { token } => {
                return Ok(Attempt::Granted(Granted {
                    token,
                    requested_at: sent,
                }))
            }
            AcquireReply::Held { ttl } => ttl,
        };
        if self.watch.is_none() && !cancel.is_cancelled() && !deadline.passed() {
            match self.backend.watch(&self.req).await {
                Ok(w) => {
                    self.watch = Some(w);
                    // Try again at once: the release may have come before we subscribed.
                    return Ok(Attempt::Again);
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "cannot subscribe; waiting for the lease instead");
                }
                Err(e) => return Err(e),
            }
        }
        // Wake a hair after the holder's lease ends, not before.
        Ok(Attempt::Held {
            retry_in: ttl.map(|t| t + Duration::from_millis(1)),
        })
    }
}

#[cfg(test)]
mod tests;
