//! Waiting for a lock: written once for every backend that wakes waiters with notifications.

use crate::backend::{AcquireReply, AcquireRequest, Backend, Granted, ReleaseWatch, Wake};
use crate::error::Result;
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

/// The default waiting strategy (see [`Backend::acquire_wait`]).
///
/// Try (registering as a waiter); if held, subscribe to the lock's notifications and try once
/// more (a release may have come before the subscription was in place); then sleep until a
/// notification, the holder's lease end, or the waiter's heartbeat, whichever is first. A
/// backend with a server-side queue may hand the lock over in the notification itself
/// ([`Wake::HandedOver`]), saving the waiter a round trip. There is no fixed polling interval:
/// the heartbeat only keeps the waiter's place in the queue alive (so a crashed waiter drops
/// out), and it is a quarter of the lease or longer.
pub async fn watch_and_retry<B: Backend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<Option<Granted>> {
    let mut req = req.clone();
    req.waiter_ttl = Some(waiter_ttl(req.lease));
    let beat = heartbeat(req.lease);
    let mut queued = false;
    let res = wait_loop(backend, &req, deadline, cancel, beat, &mut queued).await;
    if !matches!(res, Ok(Some(_))) && queued {
        // Leave the queue, and give back a grant that may have been handed over to this
        // attempt meanwhile (only this attempt's: the request names it).
        if let Err(e) = backend.give_up(&req).await {
            tracing::debug!(error = %e, name = %req.key.name, "could not leave the wait queue; it expires by itself");
        }
    }
    res
}

async fn wait_loop<B: Backend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
    beat: Duration,
    queued: &mut bool,
) -> Result<Option<Granted>> {
    let mut watch: Option<Box<dyn ReleaseWatch>> = None;
    let mut backoff = crate::backoff::Backoff::default();
    loop {
        let sent = crate::clock::Instant::now();
        let ttl = match backend.acquire(req).await {
            Ok(AcquireReply::Granted { token }) => {
                return Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }))
            }
            Ok(AcquireReply::Held { ttl }) => {
                backoff.reset();
                *queued = true;
                ttl
            }
            // Connection trouble while waiting: keep waiting (bounded by the deadline) with a
            // jittered backoff instead of failing the caller at the first blip.
            Err(e) if e.is_retryable() => {
                // The attempt may have reached the server (and queued or even been granted):
                // the retry names the same attempt, so it has the effect of one.
                *queued = true;
                let pause = backoff.next_delay();
                tracing::debug!(error = %e, ?pause, "acquire attempt failed; retrying");
                watch = None;
                if !sleep_until_or_cancel(pause, deadline, cancel).await {
                    return Ok(None);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        if cancel.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        if watch.is_none() {
            match backend.watch(req).await {
                Ok(w) => {
                    watch = Some(w);
                    // Try again at once: the release may have come before we subscribed.
                    continue;
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "cannot subscribe; waiting for the lease instead");
                }
                Err(e) => return Err(e),
            }
        }
        // Wake a hair after the holder's lease ends, not before; refresh our place in time.
        let mut sleep = ttl.map_or(beat, |t| (t + Duration::from_millis(1)).min(beat));
        if let Some(d) = deadline {
            sleep = sleep.min(d.saturating_duration_since(Instant::now()));
        }
        let woke = match watch.as_mut() {
            Some(w) => tokio::select! {
                r = w.changed() => Some(r),
                _ = tokio::time::sleep(sleep) => None,
                _ = cancel.cancelled() => return Ok(None),
            },
            None => {
                if !sleep_until_or_cancel(sleep, None, cancel).await {
                    return Ok(None);
                }
                None
            }
        };
        match woke {
            Some(Ok(Wake::HandedOver { token })) => {
                // The grant happened after our last attempt reached the server.
                return Ok(Some(Granted {
                    token,
                    requested_at: sent,
                }));
            }
            Some(Err(_)) => watch = None,
            Some(Ok(Wake::Released)) | None => {}
        }
    }
}

/// Sleeps `pause` (capped by `deadline`); false if cancelled or the deadline passed.
async fn sleep_until_or_cancel(
    pause: Duration,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> bool {
    let pause = match deadline {
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            pause.min(left)
        }
        None => pause,
    };
    tokio::select! {
        _ = tokio::time::sleep(pause) => deadline.is_none_or(|d| Instant::now() < d),
        _ = cancel.cancelled() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiter_timing() {
        let s = Duration::from_secs(1);
        assert_eq!(waiter_ttl(s), s);
        assert_eq!(heartbeat(s), Duration::from_millis(250));
        let l = Duration::from_secs(30);
        assert_eq!(waiter_ttl(l), MAX_WAITER_TTL);
        assert_eq!(heartbeat(l), Duration::from_secs(1));
    }
}
