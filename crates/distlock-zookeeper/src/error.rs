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
        | Z::Throttled => Error::Connection {
            backend: KIND,
            endpoint: endpoint.to_owned(),
            source: format!("{what}: {e}").into(),
        },
        Z::NoAuth | Z::AuthFailed => Error::Auth {
            backend: KIND,
            endpoint: endpoint.to_owned(),
            message: format!("{what}: {e} (check the ACLs of the chroot and namespace nodes)"),
        },
        other => Error::UnexpectedReply {
            backend: KIND,
            message: format!("{what}: {other}"),
        },
    }
}

/// A call that got no answer in time (the connection may be down).
pub(crate) fn timed_out(endpoint: &str, what: &str, after: std::time::Duration) -> Error {
    Error::Connection {
        backend: KIND,
        endpoint: endpoint.to_owned(),
        source: format!("{what}: no answer within {after:?}").into(),
    }
}

/// The session that held (or would hold) the locks is gone.
pub(crate) fn session_gone(endpoint: &str, why: &str) -> Error {
    Error::Connection {
        backend: KIND,
        endpoint: endpoint.to_owned(),
        source: format!(
            "the ZooKeeper session ended ({why}); a new one is opened on the next call"
        )
        .into(),
    }
}
