//! Jittered exponential backoff for connection errors.

use std::time::Duration;

/// How often and how patiently to retry calls that failed on a connection error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub attempts: u32,
    /// First pause.
    pub base_delay: Duration,
    /// Longest pause.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// `attempts` attempts in all, pauses from `base_delay` doubling up to `max_delay`, each
    /// with full jitter.
    pub fn new(attempts: u32, base_delay: Duration, max_delay: Duration) -> Self {
        RetryPolicy {
            attempts,
            base_delay,
            max_delay,
        }
    }
}

impl Default for RetryPolicy {
    /// 4 attempts, pauses from 20 ms doubling up to 500 ms, each with full jitter.
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(500),
        }
    }
}

/// Full-jitter exponential backoff state.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    step: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(RetryPolicy::default())
    }
}

impl Backoff {
    /// Starts a backoff following `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        Backoff { policy, step: 0 }
    }

    /// The next pause: uniform in [cap/2, cap], where cap doubles each step up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let cap = self
            .policy
            .base_delay
            .saturating_mul(1u32 << self.step.min(16))
            .min(self.policy.max_delay);
        self.step = self.step.saturating_add(1);
        let half = cap / 2;
        half + Duration::from_nanos(fastrand::u64(0..=(cap - half).as_nanos() as u64))
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.step
    }

    /// Back to the first step.
    pub fn reset(&mut self) {
        self.step = 0;
    }
}

/// Runs `op` until it succeeds, fails with a non-retryable error, or `policy.attempts` ran out.
///
/// ```no_run
/// # async fn f(b: &dyn distlock_core::Backend) -> distlock_core::Result<()> {
/// use distlock_core::{LockKind, RetryPolicy};
/// let info = distlock_core::backoff::retry(RetryPolicy::default(), || b.inspect("n", LockKind::Mutex)).await?;
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// As cancel safe as `op`'s futures: dropping it drops the one in flight.
///
/// # Errors
/// The last error of `op`: a non-retryable one at once, a retryable one after the last attempt.
pub async fn retry<T, F, Fut>(policy: RetryPolicy, mut op: F) -> crate::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::Result<T>>,
{
    let mut backoff = Backoff::new(policy);
    loop {
        match op().await {
            Err(e) if e.is_retryable() && backoff.attempts() + 1 < policy.attempts.max(1) => {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let mut b = Backoff::default();
        let d: Vec<_> = (0..10).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(10) && d[0] <= Duration::from_millis(20));
        assert!(d[9] >= Duration::from_millis(250) && d[9] <= Duration::from_millis(500));
    }
}
