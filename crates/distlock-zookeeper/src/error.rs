//! Mapping driver errors to dlock's.

use distlock_core::Error;
use zookeeper_client as zk;

/// The backend kind, as in messages and metrics.
pub(crate) const KIND: &str = "zookeeper";

/// A driver error during `what`.
pub(crate) fn map(endpoint: &str, what: &str, e: zk::Error) -> Error {
    use zk::Error as Z;
    match e {
        Z::ConnectionLoss
        | Z::Timeout
        | Z::NoHosts
        | Z::SessionExpired
        | Z::SessionMoved
        | Z::ClientClosed
        | Z::Throttled => Error::connection(KIND, endpoint.to_owned(), format!("{what}: {e}")),
        Z::NoAuth | Z::AuthFailed => Error::auth(
            KIND,
            endpoint.to_owned(),
            format!("{what}: {e} (check the ACLs of the chroot and namespace nodes)"),
        ),
        other => Error::unexpected(KIND, format!("{what}: {other}")),
    }
}

/// A call that got no answer in time (the connection may be down).
pub(crate) fn timed_out(endpoint: &str, what: &str, after: std::time::Duration) -> Error {
    Error::call_timeout(KIND, endpoint, what, after)
}

/// The session that held (or would hold) the locks is gone.
pub(crate) fn session_gone(endpoint: &str, why: &str) -> Error {
    Error::connection(
        KIND,
        endpoint.to_owned(),
        format!("the ZooKeeper session ended ({why}); a new one is opened on the next call"),
    )
}
