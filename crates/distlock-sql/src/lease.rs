//! Lease and deadline arithmetic both dialects share.

use distlock_core::backend::Deadline;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long after a lease ends the server ends the holder's connection: half the lease, at
/// most 5 s. The guard's lost signal fires at the lease end itself; the grace keeps a holder
/// that was merely slow to renew (a loaded machine) from losing its connection while its own
/// view still says it holds the lock.
pub fn grace(lease: Duration) -> Duration {
    (lease / 2).min(Duration::from_secs(5))
}

/// `lease` plus its [`grace`].
pub fn with_grace(lease: Duration) -> Duration {
    lease + grace(lease)
}

/// Safety net should the server's timer of a wait be late: the client stops the wait this
/// long after the deadline.
pub const SAFETY_NET: Duration = Duration::from_millis(300);

/// Whole milliseconds for a server-side wait of `left`, rounded up and one more: the server
/// must not give up before the deadline.
pub fn wait_millis(left: Duration) -> u128 {
    left.as_micros().div_ceil(1000) + 1
}

/// Milliseconds of `d` as a float (for `interval '1 millisecond'` arithmetic).
pub fn millis_f64(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Microseconds of `d`, saturating (for `INTERVAL n MICROSECOND`).
pub fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Whole seconds of `d`, rounded up.
pub fn secs_ceil(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Awaits a server-side wait until it ends (`Some`), `cancel` fires or the safety net
/// ([`SAFETY_NET`] after `deadline`) passes (`None`: stop it on the server, then await the
/// rest of `wait` to learn how it ended). `cancel` wins a tie: a wait that ended as the caller
/// went away is reported with `cancel` set, and its grant given back by the caller.
pub async fn wait_or_stop<F: Future + Unpin>(
    wait: &mut F,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
) -> Option<F::Output> {
    let net = Deadline::from(deadline.map(|d| d + SAFETY_NET));
    tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        r = wait => Some(r),
        _ = net.reached() => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        assert_eq!(grace(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(grace(Duration::from_secs(60)), Duration::from_secs(5));
        assert_eq!(with_grace(Duration::from_secs(30)), Duration::from_secs(35));
        assert_eq!(wait_millis(Duration::from_micros(1500)), 3);
        assert_eq!(wait_millis(Duration::ZERO), 1);
        assert_eq!(secs_ceil(Duration::from_millis(1001)), 2);
        assert_eq!(secs_ceil(Duration::from_secs(3)), 3);
        assert_eq!(micros(Duration::MAX), i64::MAX);
    }
}
