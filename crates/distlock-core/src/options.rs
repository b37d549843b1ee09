//! Client options, with documented defaults, checked when the client is built.

use crate::backoff::RetryPolicy;
use crate::error::{Error, Result};
use std::time::Duration;

/// Shortest watchdog lease accepted: renewals run every lease/3, and a renewal must have time
/// to reach the server and come back well inside one third.
pub const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(150);

/// Longest lease accepted (30 days).
pub const MAX_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Options shared by every backend.
///
/// ```
/// use std::time::Duration;
/// let opts = distlock_core::ClientOptions::default()
///     .namespace("shop")
///     .watchdog_lease(Duration::from_secs(10));
/// assert_eq!(opts.renew_interval(), Duration::from_nanos(3_333_333_333));
/// ```
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub(crate) namespace: String,
    pub(crate) watchdog_lease: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
}

impl Default for ClientOptions {
    /// Namespace `dlock`, watchdog lease 30 s (renewed every 10 s), [`RetryPolicy::default`],
    /// connect timeout 5 s, per-call timeout 3 s.
    fn default() -> Self {
        ClientOptions {
            namespace: "dlock".into(),
            watchdog_lease: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(3),
        }
    }
}

impl ClientOptions {
    /// Prefix of every key/row/path dlock writes, so several applications can share a server.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    /// Lease of locks in watchdog mode (the default mode); renewed every lease/3 while held.
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.watchdog_lease = lease;
        self
    }

    /// Retries of calls that fail on a connection error.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Longest wait for a connection to the server.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Longest wait for one reply from the server; a paused or partitioned server costs at most this.
    pub fn op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }

    /// The namespace.
    pub fn get_namespace(&self) -> &str {
        &self.namespace
    }

    /// The watchdog lease.
    pub fn get_watchdog_lease(&self) -> Duration {
        self.watchdog_lease
    }

    /// The retry policy.
    pub fn get_retry(&self) -> RetryPolicy {
        self.retry
    }

    /// The connect timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The per-call timeout.
    pub fn get_op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// How often the watchdog renews: a third of the watchdog lease.
    pub fn renew_interval(&self) -> Duration {
        self.watchdog_lease / 3
    }

    /// How long the watchdog waits for one batched renewal (`Backend::renew`) before it drops
    /// the call: the per-call timeout, at most one renewal interval. A backend that renews a
    /// batch on several servers answers before it with the outcomes it has (a server that did
    /// not answer in time leaves only its holds unconfirmed).
    pub fn renew_timeout(&self) -> Duration {
        self.op_timeout.min(self.renew_interval())
    }

    /// Checks every option; [`Client::new`](crate::Client::new) calls it.
    pub fn validate(&self) -> Result<()> {
        if self.namespace.is_empty()
            || self.namespace.len() > 64
            || self
                .namespace
                .chars()
                .any(|c| c.is_control() || c == '{' || c == '}')
        {
            return Err(Error::invalid(format!(
                "namespace `{}` must be 1 to 64 printable characters without `{{` or `}}`",
                self.namespace.escape_debug()
            )));
        }
        check_watchdog_lease(self.watchdog_lease)?;
        if self.retry.attempts == 0 {
            return Err(Error::invalid("retry attempts must be at least 1"));
        }
        if self.connect_timeout.is_zero() || self.op_timeout.is_zero() {
            return Err(Error::invalid(
                "connect and per-call timeouts must be above zero",
            ));
        }
        Ok(())
    }
}

/// Checks a watchdog lease.
pub fn check_watchdog_lease(lease: Duration) -> Result<()> {
    if lease < MIN_WATCHDOG_LEASE {
        return Err(Error::invalid(format!(
            "watchdog lease {lease:?} is too short: renewals run every lease/3, so it must be at least {MIN_WATCHDOG_LEASE:?}"
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::invalid(format!(
            "watchdog lease {lease:?} is longer than the limit of 30 days"
        )));
    }
    Ok(())
}

/// Checks a fixed lease.
pub fn check_lease(lease: Duration) -> Result<()> {
    if lease < Duration::from_millis(1) {
        return Err(Error::invalid(format!(
            "lease {lease:?} is too short: a lease must be at least 1ms (zero would never hold)"
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::invalid(format!(
            "lease {lease:?} is longer than the limit of 30 days"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(ClientOptions::default().validate().is_ok());
        assert!(ClientOptions::default().namespace("").validate().is_err());
        assert!(ClientOptions::default()
            .namespace("a{b")
            .validate()
            .is_err());
        let e = ClientOptions::default()
            .watchdog_lease(Duration::from_millis(10))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("too short"), "{e}");
        assert!(check_lease(Duration::ZERO).is_err());
        assert!(check_lease(Duration::from_millis(1)).is_ok());
    }
}
