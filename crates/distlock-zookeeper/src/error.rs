//! Mapping driver errors to dlock's.

use distlock_core::Error;
use zookeeper_client as zk;

/// The backend kind, as in messages and metrics.
pub(crate) const KIND: &str = "zookeeper";

/// True when a request failed with its connection: it may or may not have reached the server.
pub(crate) fn connection_died(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// The session that held (or would hold) the locks is gone.
pub(crate) fn session_gone(endpoint: &str, why: &str) -> Error {
    Error::connection(
        KIND,
        endpoint.to_owned(),
        format!("the ZooKeeper session ended ({why}); a new one is opened on the next call"),
    )
}
