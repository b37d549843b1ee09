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
        return Error::unexpected(KIND, not_redis(endpoint));
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

/// The message for a server at `endpoint` whose replies are not the Redis protocol.
pub(crate) fn not_redis(endpoint: &str) -> String {
    format!(
        "the server at {endpoint} does not answer in the Redis protocol (is this port an HTTP \
         server or another service? give the port of a Redis server, 6379 by default)"
    )
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

pub(crate) fn shape(what: &str, got: &redis::Value) -> Error {
    Error::unexpected(KIND, format!("{what}: unexpected reply {got:?}"))
}

/// TLS failures of `rediss://` as the core's [`TlsError`](distlock_core::conn::TlsError).
#[cfg(feature = "tls")]
pub(crate) mod tls {
    use distlock_core::conn::{TlsError, TlsErrorKind};
    use redis::RedisError;

    /// The rustls error under `e` (redis-rs wraps the `io::Error` tokio-rustls gives).
    fn find_rustls(e: &RedisError) -> Option<rustls::Error> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
        for _ in 0..16 {
            let err = cur?;
            if let Some(r) = err.downcast_ref::<rustls::Error>() {
                return Some(r.clone());
            }
            // redis-rs keeps the `io::Error` in an `Arc`, whose `source()` skips what the
            // `io::Error` wraps: look inside the `Arc`.
            let inner: &(dyn std::error::Error + 'static) =
                match err.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>() {
                    Some(arc) => arc.as_ref(),
                    None => err,
                };
            if let Some(r) = inner
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>())
            {
                return Some(r.clone());
            }
            cur = err.source();
        }
        None
    }

    /// What went wrong, if `e` is a TLS failure (`client_cert`: whether a client certificate
    /// was given, when known).
    pub(crate) fn classify(e: &RedisError, client_cert: Option<bool>) -> Option<TlsError> {
        let r = find_rustls(e)?;
        let kind = TlsErrorKind::of_rustls(&r, client_cert.unwrap_or(false));
        let message = match kind {
            TlsErrorKind::Untrusted => format!(
                "the server's certificate is not trusted ({r}); name the CA that signed it with `?ca_file=PATH`"
            ),
            TlsErrorKind::WrongHost => format!(
                "the server's certificate is not valid for the host name in the URL ({r}); connect by a name or address the certificate lists"
            ),
            TlsErrorKind::Expired => format!(
                "the server's certificate is expired or not valid yet ({r}); renew it (or check the clocks)"
            ),
            TlsErrorKind::ClientCertRejected => match client_cert {
                Some(false) => format!(
                    "the server requires a client certificate ({r}); give one with `?cert=PATH&key=PATH`"
                ),
                Some(true) => format!(
                    "the server refused the client certificate ({r}); give one signed by a CA the server trusts (its tls-ca-cert-file)"
                ),
                None => format!(
                    "the server refused the client certificate, or wanted one and got none ({r}); check `?cert=PATH&key=PATH`"
                ),
            },
            _ if matches!(r, rustls::Error::InvalidMessage(_)) => format!(
                "the handshake failed ({r}); is this a plain-text port? use redis:// for it, or the server's tls-port with rediss://"
            ),
            _ => format!("the handshake failed ({r})"),
        };
        Some(TlsError::new(kind, message))
    }
}
