//! Waiting for a lock: written once for every backend that wakes waiters with notifications.

use crate::backend::{AcquireReply, AcquireRequest, Backend, ReleaseWatch};
use crate::error::Result;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The default waiting strategy (see [`Backend::acquire_wait`]).
///
/// Try; if held, subscribe to the lock's release notifications and try once more (a release
/// may have happened before the subscription was in place); then sleep until a notification
/// arrives or the holder's lease would run out, whichever is first, and try again. There is no
/// fixed polling interval: without notifications a waiter wakes only when the holder's lease
/// ends (or after `max_sleep` when the server cannot tell the lease).
pub async fn watch_and_retry<B: Backend + ?Sized>(
    backend: &B,
    req: &AcquireRequest,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
    max_sleep: Duration,
) -> Result<Option<u64>> {
    let mut watch: Option<Box<dyn ReleaseWatch>> = None;
    let mut backoff = crate::backoff::Backoff::default();
    loop {
        let ttl = match backend.acquire(req).await {
            Ok(AcquireReply::Granted { token }) => return Ok(Some(token)),
            Ok(AcquireReply::Held { ttl }) => {
                backoff.reset();
                ttl
            }
            // Connection trouble while waiting: keep waiting (bounded by the deadline) with a
            // jittered backoff instead of failing the caller at the first blip.
            Err(e) if e.is_retryable() => {
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
            match backend.watch(&req.key.name).await {
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
        let mut sleep = ttl.unwrap_or(max_sleep).min(max_sleep);
        // Wake a hair after the holder's lease ends, not before.
        sleep += Duration::from_millis(1);
        if let Some(d) = deadline {
            sleep = sleep.min(d.saturating_duration_since(Instant::now()));
        }
        let broke = match watch.as_mut() {
            Some(w) => tokio::select! {
                r = w.changed() => r.is_err(),
                _ = tokio::time::sleep(sleep) => false,
                _ = cancel.cancelled() => return Ok(None),
            },
            None => {
                if !sleep_until_or_cancel(sleep, None, cancel).await {
                    return Ok(None);
                }
                false
            }
        };
        if broke {
            watch = None;
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
