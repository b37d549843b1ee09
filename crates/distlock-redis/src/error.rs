//! Turning redis-rs errors into dlock errors a person can act on.

use distlock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind};

pub(crate) const KIND: &str = "redis";

pub(crate) fn map(endpoint: &str, e: RedisError) -> Error {
    map_tls(endpoint, e, None)
}

/// [`map`] knowing whether a client certificate was given (`client_cert`; `None`: not
/// known here), for the words of a refused one.
pub(crate) fn map_tls(endpoint: &str, e: RedisError, client_cert: Option<bool>) -> Error {
    #[cfg(feature = "tls")]
    if let Some(t) = tls::classify(&e, client_cert) {
        return Error::connection(KIND, endpoint.to_owned(), t);
    }
    let _ = client_cert;
    if e.kind() == ErrorKind::Parse {
        // Bytes that are not RESP at all: another kind of server on this port.
        return Error::unexpected(
            KIND,
            format!(
            "the server at {endpoint} does not answer in the Redis protocol (is this port an HTTP \
             server or another service? give the port of a Redis server, 6379 by default)"
        ),
        );
    }
    let text = e.to_string();
    if text.contains("NOAUTH") {
        // Every command of a pipeline answers NOAUTH: one line instead of redis-rs's dump.
        return Error::auth(
            KIND,
            endpoint.to_owned(),
            "the server requires a password and none was given (NOAUTH; e.g. \
             redis://:PASSWORD@HOST:PORT, or DLOCK_REDIS_PASSWORD)",
        );
    }
    if e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("invalid password")
    {
        let text = if e.kind() == ErrorKind::AuthenticationFailed {
            "it refused the user name or password given".to_owned()
        } else {
            text
        };
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
    if connection_lost(&e)
        || matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::Server(ServerErrorKind::BusyLoading)
                | ErrorKind::Server(ServerErrorKind::TryAgain)
                | ErrorKind::Server(ServerErrorKind::MasterDown)
                // A cluster in a failover or resharding, after redis-rs's own redirects and
                // retries ran out: the slot's new master answers a later attempt.
                | ErrorKind::Server(ServerErrorKind::Moved)
                | ErrorKind::Server(ServerErrorKind::Ask)
                | ErrorKind::Server(ServerErrorKind::ClusterDown)
        )
    {
        return Error::connection(KIND, endpoint.to_owned(), e);
    }
    Error::unexpected(KIND, text)
}

/// Whether `e` means the connection failed (or its answer never came), not the request.
pub(crate) fn connection_lost(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The error for a password the server refused although it lets clients in without one:
/// most likely a server with no password set (no `requirepass`, a `nopass` default user).
pub(crate) fn superfluous_password(endpoint: &str) -> Error {
    Error::invalid(format!(
        "redis at {endpoint} refused the password given, but lets clients in without one (it \
         has no requirepass, or its default user is nopass): drop the password from the URL, \
         DLOCK_REDIS_PASSWORD and DLOCK_REDIS_PASSWORD_FILE, or set one on the server; if an \
         ACL user needs this password, check the user name and the password"
    ))
}

/// An unexpected `what` in the replies to `doing` lock `name` (`inspect of`, `forced release of`).
pub(crate) fn unexpected(doing: &str, name: &str, what: &str) -> Error {
    Error::unexpected(KIND, format!("{doing} `{name}`: unexpected {what}"))
}

pub(crate) fn shape(what: &str, got: &redis::Value) -> Error {
    Error::unexpected(KIND, format!("{what}: unexpected reply {got:?}"))
}

/// TLS failures of `rediss://` as the core's [`TlsError`](distlock_core::conn::TlsError).
#[cfg(feature = "tls")]
pub(crate) mod tls {
    use distlock_core::conn::{rustls_error, ClientCert, TlsError, TlsErrorKind, TlsWords};
    use redis::RedisError;

    /// How `rediss://` and a Redis server name their TLS settings.
    const WORDS: TlsWords = TlsWords {
        ca: "`?ca_file=PATH`",
        client_cert: "`?cert=PATH&key=PATH`",
        server_ca: "tls-ca-cert-file",
        plain: "is this a plain-text port? use redis:// for it, or the server's tls-port with rediss://",
    };

    /// What went wrong, if `e` is a TLS failure (`client_cert`: whether a client certificate
    /// was given, when known).
    pub(crate) fn classify(e: &RedisError, client_cert: Option<bool>) -> Option<TlsError> {
        let r = rustls_error(e)?;
        let kind = match TlsErrorKind::of_rustls(&r, client_cert.unwrap_or(false)) {
            // A plain-text server answers the handshake with bytes that are no TLS record.
            TlsErrorKind::Handshake if matches!(r, rustls::Error::InvalidMessage(_)) => {
                TlsErrorKind::NotSupportedByServer
            }
            kind => kind,
        };
        let cert = match client_cert {
            Some(true) => ClientCert::Given(""),
            Some(false) => ClientCert::None,
            None => ClientCert::Unknown,
        };
        Some(TlsError::worded(kind, &r.to_string(), &WORDS, cert))
    }
}
