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
        | Z::Throttled
        // The driver's own failures of a connection (an I/O error, "no response from
        // connection in …ms" after 2/5 of the session timeout of silence): it reconnects, and
        // the call is to be retried on the new connection, as after a `ConnectionLoss`. A
        // release taken for an unexpected reply was not retried, and its node stayed in the
        // session that lived on.
        | Z::Custom(_) => Error::connection(KIND, endpoint.to_owned(), format!("{what}: {e}")),
        Z::NoAuth | Z::AuthFailed => Error::auth(
            KIND,
            endpoint.to_owned(),
            format!("{what}: {e} (check the ACLs of the chroot and namespace nodes)"),
        ),
        other => Error::unexpected(KIND, format!("{what}: {other}")),
    }
}

/// True when a request failed with its connection: it may or may not have reached the server.
pub(crate) fn connection_died(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss | zk::Error::Custom(_))
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
