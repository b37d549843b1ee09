//! Waiting in the nodes' queues (see `docs/redlock.md`, "Waiting"): the waiter arms its watch
//! on every node, votes as a waiter (entering each node's queue at its place), and sleeps until
//! the nodes where it is first wake it, or its heartbeat (the backstop for a lost message).

use crate::RedlockBackend;
use distlock_core::backend::{
    wait, AcquireReply, AcquireRequest, Attempt, Deadline, Granted, ReleaseWatch, WaitStrategy,
    Wake,
};
use distlock_core::{Backend, Error, Result};
use distlock_redis::RedisNode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// The place of a waiter that starts now: µs since the Unix epoch by this client's clock. The
/// same on every node, so every node orders the waiters it has alike; clients whose clocks
/// differ by `d` are served as if they had come `d` apart (fairness, never safety, depends on
/// it).
fn place_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// One queued wait.
struct Queued<'a> {
    shared: &'a RedlockBackend,
    req: AcquireRequest,
    place: u64,
    /// Armed before every vote that may queue, so no wake-up can come before it.
    watch: Option<Box<dyn ReleaseWatch>>,
    /// A request was sent: the attempt must be given up if the wait ends without a grant.
    sent: bool,
}

#[async_trait::async_trait]
impl WaitStrategy for Queued<'_> {
    async fn attempt(&mut self, deadline: Deadline, cancel: &CancellationToken) -> Result<Attempt> {
        if self.watch.is_none() && !cancel.is_cancelled() && !deadline.passed() {
            // The attempt's own wake channel on every node: the node tells the attempt alone
            // that it is first and the lock is free (no pause: it is woken alone).
            let attempt = &self.req.attempt;
            let wake = |b: Arc<RedisNode>| async move { b.wake_watch(attempt).await };
            match self.shared.quorum_watch(None, Duration::ZERO, wake).await {
                Ok(w) => self.watch = Some(w),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "cannot subscribe; queued, waking at the heartbeat");
                }
                Err(e) => return Err(e),
            }
        }
        self.sent = true;
        let sent = distlock_core::clock::Instant::now();
        let queue = Some((wait::waiter_ttl(self.req.lease), self.place));
        let (reply, first) = self.shared.round(&self.req, queue).await?;
        let ttl = match reply {
            AcquireReply::Granted { token } => {
                return Ok(Attempt::Granted(Granted::new(token, sent)))
            }
            AcquireReply::Held { ttl } => ttl,
        };
        // First on a majority: the holder's lease end is this waiter's cue too (a holder that
        // crashed publishes nothing). Otherwise only a wake-up or the heartbeat.
        let retry_in = (first >= self.shared.quorum())
            .then(|| ttl.map(|t| t + Duration::from_millis(1)))
            .flatten();
        Ok(Attempt::Held { retry_in })
    }

    async fn wake(&mut self, until: Deadline) -> Result<Option<Wake>> {
        let Some(w) = self.watch.as_mut() else {
            until.reached().await;
            return Ok(None);
        };
        tokio::select! {
            r = w.changed() => match r {
                // A node never hands the lock over: any wake-up means "try".
                Ok(_) => Ok(Some(Wake::Released)),
                Err(e) => {
                    tracing::debug!(error = %e, "release notifications broke; subscribing again");
                    self.watch = None;
                    Ok(None)
                }
            },
            _ = until.reached() => Ok(None),
        }
    }

    fn retry(&mut self, e: &Error) -> bool {
        e.is_retryable()
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(wait::heartbeat(self.req.lease))
    }

    async fn give_up(&mut self) {
        self.watch = None;
        if !self.sent {
            return;
        }
        if let Err(e) = Backend::give_up(self.shared, &self.req).await {
            tracing::debug!(error = %e, name = %self.req.key.name, "could not leave the redlock queues; the entries expire by themselves");
        }
    }
}

impl RedlockBackend {
    /// Waits in the nodes' queues; see the module docs.
    pub(crate) async fn queued_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<std::time::Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let mut q = Queued {
            shared: self,
            req: req.clone(),
            place: place_now(),
            watch: None,
            sent: false,
        };
        wait::run(&mut q, deadline.into(), cancel, Default::default()).await
    }
}
