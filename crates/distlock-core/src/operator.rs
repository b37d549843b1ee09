//! For backend authors: the operator commands (`dlock list`, `dlock release --force`,
//! `dlock doctor`, the service's clock) behind a trait of their own, [`Operator`], and the
//! parts they share.
//!
//! A backend offers them by returning itself from
//! [`Backend::operator`](crate::Backend::operator); the [`Client`](crate::Client) checks the
//! [`Capabilities`](crate::backend::Capabilities) flags and calls them. What is written once
//! here:
//!
//! | part | what it replaces |
//! |---|---|
//! | [`evict`] + [`Eviction`] | a forced release per backend whose server frees a lock only with its holder's session: find the holders, end their sessions, wait until the server freed the lock, advance the fencing counter |
//! | [`clock_finding`], [`measure_clock`], [`clock_not_checked`] | a clock-skew check per backend |
//! | [`version_finding`], [`parse_version`] | a version parser and check per backend |
//! | [`TlsSession`] | the `tls` finding of a backend that can ask its server whether the session is encrypted |
//! | [`plain`], [`client_cert_shown`] | the `tls` finding of a backend that knows its transport from its own settings (etcd, ZooKeeper: the server does not say) |

use crate::error::{Error, Result};
use crate::types::{Finding, ForceReleased, HolderInfo, ListedLock, LockKind, Severity};
use async_trait::async_trait;
use std::fmt::Debug;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The operator commands of a backend (see the [module docs](self)). Every method may be
/// dropped at any await point (the client runs them in the caller's future).
#[async_trait]
pub trait Operator: Send + Sync {
    /// Every lock this backend has state for (held, waited for, or with a fencing counter)
    /// whose name starts with `prefix`, for operators (`dlock list`). Read-only; the order is
    /// by name, then kind.
    ///
    /// # Cancel safety
    /// Must be cancel safe (it only reads).
    ///
    /// # Errors
    /// Connection errors (retried by the core) and unexpected replies.
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>>;

    /// The operator's way out of a stuck lock (`dlock release --force`): removes every
    /// holder of `name` of `kind` (for a read-write lock, both sides), and advances the
    /// fencing counter past every token handed out, so that writes of a removed holder
    /// carrying its old token are rejected by a fenced store. A removed holder's lost signal
    /// fires at its next renewal (its grant is gone). Waiters stay queued. Returns what was
    /// removed.
    ///
    /// # Cancel safety
    /// Must be cancel safe in the sense that a drop leaves a consistent state: the release
    /// happened or it did not (the core never retries it).
    ///
    /// # Errors
    /// Connection errors (the outcome is unknown; the operator inspects) and unexpected
    /// replies; an error that says what to grant when the server refuses to remove a holder
    /// ([`Error::Unsupported`]).
    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased>;

    /// Checks the deployment behind this backend for settings that break locks
    /// (`dlock doctor`): one finding per check, each saying what to change. Read-only.
    ///
    /// # Cancel safety
    /// Must be cancel safe (it only reads).
    ///
    /// # Errors
    /// Connection errors; a check that cannot be made is a [`Finding`], not an error.
    async fn diagnose(&self) -> Result<Vec<Finding>>;

    /// The lock service's clock now (wall-clock time, as its server reads it), for schedules
    /// that every client must read alike, such as `dlock once`'s intervals: clients whose
    /// own clocks disagree still agree on it. `None` when the service has no clock to ask
    /// (callers then use the local clock). The default answers `None`.
    ///
    /// # Cancel safety
    /// Must be cancel safe (it only reads).
    ///
    /// # Errors
    /// Connection errors and unexpected replies.
    async fn server_time(&self) -> Result<Option<SystemTime>> {
        Ok(None)
    }
}

/// The steps of a forced release on a server that frees a lock only when the session holding
/// it ends (PostgreSQL's advisory locks, MySQL's `GET_LOCK`); [`evict`] runs them.
#[async_trait]
pub trait Eviction: Send + Sync {
    /// A server session that holds the lock (a backend pid, a connection id).
    type Session: Copy + Debug + PartialEq + Send + Sync;

    /// What the sessions are called in messages (`backends`, `connections`).
    const SESSIONS: &'static str;

    /// The sessions holding the lock now, and the holders they stand for.
    ///
    /// # Errors
    /// Connection errors and unexpected replies.
    async fn holders(&self) -> Result<(Vec<Self::Session>, Vec<HolderInfo>)>;

    /// Ends `session` (`Ok` too when it had ended already).
    ///
    /// # Errors
    /// [`Error::Unsupported`] saying what to grant when the server refuses; other errors.
    async fn end(&self, session: Self::Session) -> Result<()>;

    /// Whether any of `sessions` still holds the lock (ending a session returns before the
    /// server freed its locks).
    ///
    /// # Errors
    /// Connection errors and unexpected replies.
    async fn still_held(&self, sessions: &[Self::Session]) -> Result<bool>;

    /// Removes what the `ended` sessions' grants left (their rows) and advances the fencing
    /// counter past every token handed out; returns the counter.
    ///
    /// # Errors
    /// Connection errors and unexpected replies.
    async fn advance(&self, ended: &[Self::Session]) -> Result<u64>;
}

/// The forced release of lock `name` of backend `backend` by ending the sessions that hold it:
/// every holder's session is ended (a refusal is reported after the others were ended and
/// fenced: a half-done release still advances the counter), the server is given `patience`
/// (at least 5 s) to free the lock, then the counter is advanced.
///
/// # Errors
/// The first refusal of [`Eviction::end`]; an unexpected reply when an ended session still
/// holds the lock after `patience`; the steps' errors.
pub async fn evict<E: Eviction>(
    steps: &E,
    backend: &'static str,
    name: &str,
    patience: Duration,
) -> Result<ForceReleased> {
    let (sessions, removed) = steps.holders().await?;
    let mut refused = None;
    let mut ended = Vec::with_capacity(sessions.len());
    for s in sessions {
        match steps.end(s).await {
            Ok(()) => ended.push(s),
            Err(e @ Error::Unsupported { .. }) => {
                refused.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    let limit = Instant::now() + patience.max(Duration::from_secs(5));
    while !ended.is_empty() && steps.still_held(&ended).await? {
        if Instant::now() >= limit {
            return Err(Error::unexpected(
                backend,
                format!(
                    "forced release of `{name}`: {} {ended:?} were ended but still hold the lock; try again",
                    E::SESSIONS
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let token = steps.advance(&ended).await?;
    match refused {
        Some(e) => Err(e),
        None => Ok(ForceReleased::new(removed, token)),
    }
}

/// Server/local clock offset above which [`clock_finding`] warns.
pub const CLOCK_WARN: Duration = Duration::from_secs(1);

/// Milliseconds since 1970 of `t` (0 before it).
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How far (in ms) the clock `read` returns is ahead of the local clock at the middle of the
/// round trip (behind: negative).
///
/// # Errors
/// `read`'s.
pub async fn measure_clock(
    read: impl std::future::Future<Output = Result<SystemTime>>,
) -> Result<i64> {
    let before = SystemTime::now();
    let server = read.await?;
    let after = SystemTime::now();
    Ok(unix_ms(server) - (unix_ms(before) + unix_ms(after)) / 2)
}

/// The `clock` finding for the `what` clock (`server`, `master x`) `offset_ms` ahead of the
/// local one (behind: negative); `leases` says how leases are measured, e.g. `on the server`.
///
/// ```
/// use distlock_core::operator::clock_finding;
/// use distlock_core::Severity;
/// assert_eq!(clock_finding(1500, "server", "on the server").severity, Severity::Warning);
/// assert_eq!(clock_finding(-20, "server", "on the server").severity, Severity::Ok);
/// ```
pub fn clock_finding(offset_ms: i64, what: &str, leases: &str) -> Finding {
    if Duration::from_millis(offset_ms.unsigned_abs()) > CLOCK_WARN {
        let side = if offset_ms > 0 { "ahead of" } else { "behind" };
        Finding::new(
            Severity::Warning,
            "clock",
            format!("the {what} clock is {offset_ms} ms {side} the local clock: leases are measured {leases}, so they stay correct, but lease times shown locally (logs, `dlock list`) are off; a clock set by hand like this may also be stepped back later, and fencing tokens are floored by the {what} clock; run NTP (chrony) on both, slewing, never stepping"),
        )
    } else {
        Finding::new(
            Severity::Ok,
            "clock",
            format!("the {what} clock is within {offset_ms} ms of the local clock"),
        )
    }
}

/// The `clock` finding of a service whose clock cannot be read: `why` says why nothing
/// depends on it.
pub fn clock_not_checked(why: &str) -> Finding {
    Finding::new(Severity::Ok, "clock", format!("not checked: {why}"))
}

/// `(major, minor, patch)` of a version string such as `7.0.15`, `3.5`,
/// `10.11.6-MariaDB-0+deb12u1` or `5.6.51-log` (a missing patch is 0).
///
/// ```
/// use distlock_core::operator::parse_version;
/// assert_eq!(parse_version("10.11.6-MariaDB-0+deb12u1"), Some((10, 11, 6)));
/// assert_eq!(parse_version("3.5"), Some((3, 5, 0)));
/// assert_eq!(parse_version("x"), None);
/// ```
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let num = v.trim().split(['-', '+', ' ']).next()?;
    let mut it = num.split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// The `version` finding for `product` at `version` (as the server tells it), which dlock
/// needs at `min` or later because of `needs`; `risk` says what goes wrong before.
///
/// ```
/// use distlock_core::operator::version_finding;
/// use distlock_core::Severity;
/// let f = |v| version_finding("Redis", v, (5, 0, 0), "script effects replication", "writes are refused").severity;
/// assert_eq!(f("7.2.4"), Severity::Ok);
/// assert_eq!(f("4.0.14"), Severity::Unsafe);
/// assert_eq!(f("unknown"), Severity::Warning);
/// ```
pub fn version_finding(
    product: &str,
    version: &str,
    min: (u32, u32, u32),
    needs: &str,
    risk: &str,
) -> Finding {
    let (a, b, c) = min;
    match parse_version(version) {
        Some(v) if v >= min => Finding::new(
            Severity::Ok,
            "version",
            format!("{product} {version} ({needs} needs {a}.{b}.{c} or later)"),
        ),
        Some(_) => Finding::new(
            Severity::Unsafe,
            "version",
            format!("{product} {version} is older than {a}.{b}.{c}, which {needs} needs: {risk}; upgrade to a maintained {product}"),
        ),
        None => Finding::new(
            Severity::Warning,
            "version",
            format!("cannot read the {product} version (`{version}`); {needs} needs {a}.{b}.{c} or later"),
        ),
    }
}

/// What a backend knows of its connection's protection, for the `tls` finding of a server
/// that tells whether a session is encrypted (PostgreSQL's `pg_stat_ssl`, MySQL's
/// `Ssl_version`).
#[derive(Debug, Clone)]
pub struct TlsSession<'a> {
    /// The host connected to (for messages).
    pub host: &'a str,
    /// Whether it is this machine (nothing crosses a network).
    pub loopback: bool,
    /// The setting in force, e.g. `sslmode=require`.
    pub setting: String,
    /// What of the server's certificate is checked, e.g. `certificate chain and host name
    /// checked`.
    pub checks: &'a str,
    /// Whether the certificate chain at least is checked.
    pub verified: bool,
    /// What to set for a checked certificate, e.g. `use sslmode=verify-full with sslrootcert`.
    pub fix_unchecked: &'a str,
    /// What travels in clear and what to set, e.g. `lock names and tokens travel in clear;
    /// turn on ssl in the server and use sslmode=verify-full`.
    pub fix_plain: &'a str,
}

impl TlsSession<'_> {
    /// The `tls` finding for what the server said of the session: `Some(Some(version))`
    /// encrypted, `Some(None)` not encrypted, `None` not told.
    pub fn finding(&self, encrypted: Option<Option<&str>>) -> Finding {
        let (setting, checks) = (&self.setting, self.checks);
        let (severity, message) = match encrypted {
            Some(Some(v)) if !self.verified && !self.loopback => (
                Severity::Warning,
                format!("encrypted ({v}), {setting}: {checks}: a machine in the middle can read and change the traffic; {}", self.fix_unchecked),
            ),
            Some(Some(v)) => (Severity::Ok, format!("encrypted ({v}), {setting}: {checks}")),
            Some(None) if !self.loopback => (
                Severity::Warning,
                format!("not encrypted ({setting}) to {}, off this machine: {}", self.host, self.fix_plain),
            ),
            Some(None) => (Severity::Ok, format!("not encrypted ({setting}), to this machine")),
            None => (
                Severity::Ok,
                format!("{setting}; the server does not say whether this session is encrypted"),
            ),
        };
        Finding::new(severity, "tls", message)
    }
}

/// The `tls` finding of a clear-text connection (`protocol`: `http`, `TCP`) to `hosts`
/// (`host:port`): fine on loopback only; off it, `risk_and_fix` says what travels in clear and
/// what to set.
///
/// ```
/// use distlock_core::{operator::plain, Severity};
/// assert_eq!(plain(["127.0.0.1:1", "localhost:2", "[::1]:3"], "TCP", "x").severity, Severity::Ok);
/// assert_eq!(plain(["127.0.0.1:1", "10.0.0.1:2"], "TCP", "x").severity, Severity::Warning);
/// assert_eq!(plain(["zk.example:2181"], "TCP", "x").severity, Severity::Warning);
/// ```
pub fn plain<'a>(
    hosts: impl IntoIterator<Item = &'a str>,
    protocol: &str,
    risk_and_fix: &str,
) -> Finding {
    if hosts.into_iter().all(crate::conn::is_loopback) {
        let message = format!("plain {protocol}, on loopback only (nothing crosses a network)");
        Finding::new(Severity::Ok, "tls", message)
    } else {
        let message = format!("plain {protocol} off loopback: {risk_and_fix}");
        Finding::new(Severity::Warning, "tls", message)
    }
}

/// Whether a client certificate is shown, as a `tls` finding says it.
pub fn client_cert_shown(shown: bool) -> &'static str {
    if shown {
        "a client certificate is shown"
    } else {
        "no client certificate"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Steps {
        held: std::sync::Mutex<Vec<u32>>,
        refuse: Option<u32>,
    }

    #[async_trait]
    impl Eviction for Steps {
        type Session = u32;
        const SESSIONS: &'static str = "pids";
        async fn holders(&self) -> Result<(Vec<u32>, Vec<HolderInfo>)> {
            let held = self
                .held
                .lock()
                .map_or_else(|e| e.into_inner().clone(), |h| h.clone());
            let infos = held
                .iter()
                .map(|p| HolderInfo::new(format!("pid {p}"), 1))
                .collect();
            Ok((held, infos))
        }
        async fn end(&self, s: u32) -> Result<()> {
            if self.refuse == Some(s) {
                return Err(Error::unsupported("test", "ending it"));
            }
            if let Ok(mut h) = self.held.lock() {
                h.retain(|p| *p != s);
            }
            Ok(())
        }
        async fn still_held(&self, s: &[u32]) -> Result<bool> {
            Ok(self
                .held
                .lock()
                .is_ok_and(|h| h.iter().any(|p| s.contains(p))))
        }
        async fn advance(&self, ended: &[u32]) -> Result<u64> {
            Ok(100 + ended.len() as u64)
        }
    }

    #[tokio::test]
    async fn evict_ends_fences_and_reports_a_refusal_last() {
        let s = Steps {
            held: std::sync::Mutex::new(vec![1, 2]),
            refuse: None,
        };
        let out = evict(&s, "test", "n", Duration::ZERO).await.expect("evict");
        assert_eq!((out.removed.len(), out.fencing_token), (2, 102));
        let s = Steps {
            held: std::sync::Mutex::new(vec![1, 2]),
            refuse: Some(1),
        };
        let e = evict(&s, "test", "n", Duration::ZERO)
            .await
            .expect_err("refused");
        assert!(e.is_unsupported(), "{e}");
        // The other one was ended all the same.
        assert_eq!(
            s.held.lock().map(|h| h.clone()).unwrap_or_default(),
            vec![1]
        );
    }

    #[test]
    fn findings() {
        assert_eq!(
            clock_finding(1500, "server", "x").severity,
            Severity::Warning
        );
        assert_eq!(
            clock_finding(-1500, "server", "x").severity,
            Severity::Warning
        );
        assert_eq!(clock_finding(20, "server", "x").severity, Severity::Ok);
        assert_eq!(parse_version("5.6.51-log"), Some((5, 6, 51)));
        assert_eq!(parse_version("7"), None);
        let t = TlsSession {
            host: "db",
            loopback: false,
            setting: "ssl-mode=REQUIRED".into(),
            checks: "certificate not checked",
            verified: false,
            fix_unchecked: "check it",
            fix_plain: "encrypt it",
        };
        assert_eq!(t.finding(Some(Some("TLSv1.3"))).severity, Severity::Warning);
        assert_eq!(t.finding(Some(None)).severity, Severity::Warning);
        assert_eq!(t.finding(None).severity, Severity::Ok);
        let local = TlsSession {
            loopback: true,
            ..t
        };
        let f = local.finding(Some(None));
        assert_eq!(f.severity, Severity::Ok);
        assert!(f
            .message
            .starts_with("not encrypted (ssl-mode=REQUIRED), to this machine"));
    }
}
