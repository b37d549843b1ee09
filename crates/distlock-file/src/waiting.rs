//! What the mutex and the read-write lock share in waiting: the loop of `acquire_wait`, the
//! release watch over a name's generation, and the start of a thread that blocks in `flock`.
//! See the crate documentation, section *Waiting without polling*.

use crate::Inner;
use distlock_core::{async_trait, AcquireReply, Granted, ReleaseWatch, Result, Wake};
use std::sync::{Arc, Weak};
use std::time::Instant;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Sleeps until `deadline`, forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// The waiting loop of every kind: one attempt (which, when the lock is held, starts the
/// waiting threads it needs), then sleep until the name's notifier fires, the deadline passes
/// or `cancel` fires. The caller keeps its waiter registered for the whole loop.
pub(crate) async fn wait_loop(
    notify: &Notify,
    mut attempt: impl FnMut() -> Result<AcquireReply>,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<Option<Granted>> {
    let mut backoff = distlock_core::backoff::Backoff::default();
    loop {
        // Registered before the attempt: a release after it wakes this future.
        let notified = notify.notified();
        tokio::pin!(notified);
        // On the lease clock, as every grant's start.
        let requested_at = distlock_core::clock::Instant::now();
        let pause = match attempt() {
            Ok(AcquireReply::Granted { token }) => {
                return Ok(Some(Granted {
                    token,
                    requested_at,
                }))
            }
            Ok(AcquireReply::Held { .. }) => {
                backoff.reset();
                None
            }
            Err(e) if e.is_retryable() => {
                let pause = backoff.next_delay();
                tracing::debug!(error = %e, ?pause, "acquire attempt failed; retrying");
                Some(pause)
            }
            Err(e) => return Err(e),
        };
        if cancel.is_cancelled() || past(deadline) {
            return Ok(None);
        }
        tokio::select! {
            _ = &mut notified, if pause.is_none() => {}
            _ = tokio::time::sleep(pause.unwrap_or_default()), if pause.is_some() => {}
            _ = until(deadline) => {
                if past(deadline) {
                    return Ok(None);
                }
            }
            _ = cancel.cancelled() => return Ok(None),
        }
    }
}

/// A registered watch of one name (of the mutex or of one side of a read-write lock).
pub(crate) trait Registration: Send + Sync + 'static {
    /// The name's generation, bumped at every release, hand-over or waiting-thread event;
    /// `None` when the backend keeps nothing for the name.
    fn generation(&self) -> Option<u64>;

    /// Takes the waiting threads' error, if any, and starts the thread that notices a release
    /// by another process (or backend) if one is needed and none runs yet.
    fn rearm(&self) -> Result<()>;
}

/// Release notifications of one name, from this backend and from other processes.
pub(crate) struct Watch<R> {
    registration: R,
    notify: Arc<Notify>,
    seen: u64,
}

impl<R: Registration> Watch<R> {
    /// A watch that reports the first change after generation `seen`, woken by `notify`.
    pub(crate) fn new(registration: R, notify: Arc<Notify>, seen: u64) -> Watch<R> {
        Watch {
            registration,
            notify,
            seen,
        }
    }
}

#[async_trait]
impl<R: Registration> ReleaseWatch for Watch<R> {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            let generation = self.registration.generation().unwrap_or(self.seen);
            if generation != self.seen {
                self.seen = generation;
                return Ok(Wake::Released);
            }
            self.registration.rearm()?;
            notified.await;
        }
    }
}

/// Starts a thread named `thread` that runs `body` (which blocks in `flock`) with a weak
/// reference to the backend, so that a blocked thread does not keep a dropped backend alive.
/// `what` says what it waits for, in the error when the thread cannot be started.
pub(crate) fn spawn_waiter(
    inner: &Arc<Inner>,
    thread: &str,
    what: &str,
    body: impl FnOnce(Weak<Inner>) + Send + 'static,
) -> Result<()> {
    let weak = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name(thread.into())
        .stack_size(256 * 1024)
        .spawn(move || body(weak))
        .map(drop)
        .map_err(|e| inner.io_error(format!("cannot start a thread to wait for {what}"), e))
}
