//! `tls` findings of a backend that knows its transport from its own settings (etcd,
//! ZooKeeper: the server does not say whether a session is encrypted; compare
//! [`TlsSession`](crate::operator::TlsSession) for servers that do).

use crate::conn::is_loopback;
use crate::{Finding, Severity};

/// The `tls` finding of a clear-text connection (`protocol`: `http`, `TCP`) to `hosts`
/// (`host:port`): fine on loopback only; off it, `risk_and_fix` says what travels in clear and
/// what to set.
///
/// ```
/// use distlock_core::{doctor::plain, Severity};
/// assert_eq!(plain(["127.0.0.1:1", "localhost:2", "[::1]:3"], "TCP", "x").severity, Severity::Ok);
/// assert_eq!(plain(["127.0.0.1:1", "10.0.0.1:2"], "TCP", "x").severity, Severity::Warning);
/// assert_eq!(plain(["zk.example:2181"], "TCP", "x").severity, Severity::Warning);
/// ```
pub fn plain<'a>(
    hosts: impl IntoIterator<Item = &'a str>,
    protocol: &str,
    risk_and_fix: &str,
) -> Finding {
    if hosts.into_iter().all(is_loopback) {
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
