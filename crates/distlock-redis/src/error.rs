//! Turning redis-rs errors into dlock errors a person can act on.

use distlock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const KIND: &str = "redis";

pub(crate) fn map(endpoint: &str, e: RedisError) -> Error {
    let text = e.to_string();
    if e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("invalid password")
    {
        return Error::auth(KIND, endpoint.to_owned(), text);
    }
    if text.contains("WRONGTYPE") {
        return Error::unexpected(KIND, format!(
                "a dlock key holds data of another type ({text}); another application writes under \
                 the same names: use another namespace (ClientOptions::namespace or ?namespace= in the URL)"
            ));
    }
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return Error::auth(KIND, endpoint.to_owned(), format!("{text} (the ACL user needs EVALSHA, SCRIPT, PUBLISH, SUBSCRIBE and access to the namespace's keys)"));
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::Server(ServerErrorKind::BusyLoading)
                | ErrorKind::Server(ServerErrorKind::TryAgain)
                | ErrorKind::Server(ServerErrorKind::MasterDown)
        )
    {
        return Error::connection(KIND, endpoint.to_owned(), e);
    }
    Error::unexpected(KIND, text)
}

pub(crate) fn shape(what: &str, got: &redis::Value) -> Error {
    Error::unexpected(KIND, format!("{what}: unexpected reply {got:?}"))
}
