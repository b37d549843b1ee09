//! What the mutex and the read-write lock share in waiting: the loop of `acquire_wait`, the
//! release watch over a name's generation, and the start of a thread that blocks in `flock`.
//! See docs/file-backend.md, section *Waiting without polling*.

use crate::{sys, Inner};
use distlock_core::backend::{
    async_trait, wait, AcquireReply, Attempt, Deadline, Granted, ReleaseWatch, WaitStrategy, Wake,
};
use distlock_core::backoff::RetryPolicy;
use distlock_core::Result;
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// [`Watch::wait`]'s strategy.
struct NotifiedWait<'a, G, A> {
    notify: &'a Notify,
    generation: G,
    attempt: A,
    /// The generation before the last attempt: a release after that attempt changes it.
    seen: Option<u64>,
}

#[async_trait]
impl<G, A> WaitStrategy for NotifiedWait<'_, G, A>
where
    G: Fn() -> Option<u64> + Send + Sync,
    A: FnMut() -> Result<AcquireReply> + Send,
{
    async fn attempt(&mut self, _: Deadline, _: &CancellationToken) -> Result<Attempt> {
        self.seen = (self.generation)();
        // On the lease clock, as every grant's start.
        let requested_at = distlock_core::clock::Instant::now();
        Ok(match (self.attempt)()? {
            AcquireReply::Granted { token } => Attempt::Granted(Granted::new(token, requested_at)),
            // Held by another attempt.
            _ => Attempt::Held { retry_in: None },
        })
    }

    async fn wake(&mut self, until: Deadline) -> Result<Option<Wake>> {
        // Registered before the generation is read: a release after the read wakes it.
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if (self.generation)() != self.seen {
            return Ok(Some(Wake::Released));
        }
        tokio::select! {
            _ = notified => Ok(Some(Wake::Released)),
            _ = until.reached() => Ok(None),
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
    /// A registration that reports the first change after generation `seen`, woken by
    /// `notify`: a watch once [`armed`](Self::armed), or a waiter's ([`wait`](Self::wait)).
    pub(crate) fn new(registration: R, notify: Arc<Notify>, seen: u64) -> Watch<R> {
        Watch {
            registration,
            notify,
            seen,
        }
    }

    /// The watch, catching releases by other processes from now on, not only from the
    /// first `changed`.
    pub(crate) fn armed(self) -> Result<Watch<R>> {
        self.registration.rearm()?;
        Ok(self)
    }

    /// Waits for the name without polling, with the core's retrying loop ([`wait::run`]):
    /// `attempt` (one non-blocking attempt under the table lock, which, when the lock is
    /// held, starts the waiting threads it needs), then sleep until the name's notifier
    /// fires, the deadline passes or `cancel` fires. The waiter stays registered for the
    /// whole wait.
    pub(crate) async fn wait(
        &self,
        attempt: impl FnMut() -> Result<AcquireReply> + Send,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let mut strategy = NotifiedWait {
            notify: &self.notify,
            generation: || self.registration.generation(),
            attempt,
            seen: None,
        };
        let deadline = Deadline::from(deadline);
        wait::run(&mut strategy, deadline, cancel, RetryPolicy::default()).await
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

/// Starts a thread named `thread` that runs `body`; `what` says what it does, in the error
/// when it cannot be started ("cannot start a thread to {what}").
pub(crate) fn spawn(
    inner: &Inner,
    thread: &str,
    what: &str,
    body: impl FnOnce() + Send + 'static,
) -> Result<()> {
    std::thread::Builder::new()
        .name(thread.into())
        .stack_size(256 * 1024)
        .spawn(body)
        .map(drop)
        .map_err(|e| inner.io_error(format!("cannot start a thread to {what}"), e))
}

/// Starts a waiting thread (see [`spawn`]; it waits for `what`): `block` blocks in `flock` and
/// returns the descriptor it locked, then `then` gets the backend and that outcome. The thread
/// keeps only a weak reference to the backend while it blocks, so that it does not keep a
/// dropped backend alive; if the backend is gone, the lock it got is given back at once.
pub(crate) fn spawn_waiter(
    inner: &Arc<Inner>,
    thread: &str,
    what: &str,
    block: impl FnOnce() -> io::Result<File> + Send + 'static,
    then: impl FnOnce(&Inner, io::Result<File>) + Send + 'static,
) -> Result<()> {
    let weak = Arc::downgrade(inner);
    spawn(inner, thread, &format!("wait for {what}"), move || {
        let res = block();
        match weak.upgrade() {
            Some(inner) => then(&inner, res),
            None => {
                if let Ok(file) = res {
                    sys::unlock_and_close(file);
                }
            }
        }
    })
}
