//! The one error type of dlock.

use std::time::Duration;

/// A boxed driver error kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used across dlock.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// Contention is *not* an error: [`Lock::try_acquire`](crate::Lock::try_acquire) returns
/// `Ok(None)` when the lock is held elsewhere, and [`LockGuard::release`](crate::LockGuard::release)
/// reports the normal races (already expired, taken by someone else) as a
/// [`ReleaseOutcome`](crate::ReleaseOutcome). Errors are what a caller must handle or report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock stayed held by another owner for the whole wait.
    #[error(
        "lock `{name}` was not acquired within {waited:?}: another owner held it the whole time"
    )]
    Timeout {
        /// Lock name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The caller asked for something only the current holder may do, and it is not (or no
    /// longer) the holder: its lease ran out or another owner has the lock now.
    #[error("lock `{name}` is not held by owner `{owner}` (its lease ran out or another owner holds it now)")]
    NotOwner {
        /// Lock name.
        name: String,
        /// The owner id that made the call.
        owner: String,
    },

    /// A bad argument: empty or oversized name, zero lease, a lease too short for the watchdog…
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The backend URL could not be understood.
    #[error("invalid backend URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given, with any password replaced by `***`.
        url: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// The backend does not implement this kind of lock or operation.
    #[error("{operation} is not supported by the {backend} backend")]
    Unsupported {
        /// Backend kind, e.g. `redis`.
        backend: &'static str,
        /// What was asked for.
        operation: String,
    },

    /// The server could not be reached, or the connection broke during the call.
    #[error("cannot talk to {backend} at {endpoint}: {source}")]
    Connection {
        /// Backend kind.
        backend: &'static str,
        /// Where we tried to connect (no credentials).
        endpoint: String,
        /// The driver's error.
        #[source]
        source: BoxError,
    },

    /// The server refused the credentials.
    #[error("{backend} at {endpoint} refused the credentials: {message} (check the user and password: in the URL, the builder, or the environment variable or file the backend reads)")]
    Auth {
        /// Backend kind.
        backend: &'static str,
        /// Where we tried to connect (no credentials).
        endpoint: String,
        /// The server's message.
        message: String,
    },

    /// The server answered something dlock did not expect: a key of the wrong type, a script
    /// error, a reply of the wrong shape.
    #[error("unexpected reply from {backend}: {message}")]
    UnexpectedReply {
        /// Backend kind.
        backend: &'static str,
        /// What was expected and what came back, and what to do about it.
        message: String,
    },

    /// The client was used outside what it needs (e.g. outside a tokio runtime).
    #[error("{0}")]
    Runtime(String),
}

impl Error {
    /// Builds an [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    /// Builds an [`Error::Unsupported`].
    pub fn unsupported(backend: &'static str, operation: impl Into<String>) -> Self {
        Error::Unsupported {
            backend,
            operation: operation.into(),
        }
    }

    /// Builds an [`Error::Timeout`]: the lock `name` stayed held for the whole wait of
    /// `waited`.
    pub fn timeout(name: impl Into<String>, waited: Duration) -> Self {
        Error::Timeout {
            name: name.into(),
            waited,
        }
    }

    /// Builds an [`Error::NotOwner`].
    pub fn not_owner(name: impl Into<String>, owner: impl Into<String>) -> Self {
        Error::NotOwner {
            name: name.into(),
            owner: owner.into(),
        }
    }

    /// Builds an [`Error::InvalidUrl`]; `url` must already have its password masked.
    pub fn invalid_url(url: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidUrl {
            url: url.into(),
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::Connection`] (retryable): `source` is the driver's error, or a
    /// message saying what broke.
    ///
    /// ```
    /// let e = distlock_core::Error::connection("redis", "127.0.0.1:6379", "connection reset");
    /// assert!(e.is_retryable());
    /// assert_eq!(e.to_string(), "cannot talk to redis at 127.0.0.1:6379: connection reset");
    /// ```
    pub fn connection(
        backend: &'static str,
        endpoint: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Connection {
            backend,
            endpoint: endpoint.into(),
            source: source.into(),
        }
    }

    /// Builds an [`Error::Connection`] for a call that got no answer in time: `what took
    /// longer than {after:?}`.
    pub fn call_timeout(
        backend: &'static str,
        endpoint: impl Into<String>,
        what: &str,
        after: Duration,
    ) -> Self {
        Error::connection(
            backend,
            endpoint,
            format!("{what} took longer than {after:?}"),
        )
    }

    /// Builds an [`Error::Auth`].
    pub fn auth(
        backend: &'static str,
        endpoint: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Auth {
            backend,
            endpoint: endpoint.into(),
            message: message.into(),
        }
    }

    /// Builds an [`Error::UnexpectedReply`]: `message` says what was expected, what came
    /// back, and what to do about it.
    pub fn unexpected(backend: &'static str, message: impl Into<String>) -> Self {
        Error::UnexpectedReply {
            backend,
            message: message.into(),
        }
    }

    /// Builds an [`Error::Runtime`].
    pub fn runtime(message: impl Into<String>) -> Self {
        Error::Runtime(message.into())
    }

    /// True when the server answered something dlock did not expect.
    pub fn is_unexpected_reply(&self) -> bool {
        matches!(self, Error::UnexpectedReply { .. })
    }

    /// True for a bad argument.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument(_))
    }

    /// The backend kind this error came from, for the variants that name one.
    pub fn backend(&self) -> Option<&'static str> {
        match self {
            Error::Unsupported { backend, .. }
            | Error::Connection { backend, .. }
            | Error::Auth { backend, .. }
            | Error::UnexpectedReply { backend, .. } => Some(backend),
            _ => None,
        }
    }

    /// True when a wait for the lock ran out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True when the server could not be reached or the connection broke.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection { .. })
    }

    /// True when the caller is not (or no longer) the holder.
    pub fn is_not_owner(&self) -> bool {
        matches!(self, Error::NotOwner { .. })
    }

    /// True when the backend does not support what was asked.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }

    /// True when the same call may succeed if tried again after a short pause.
    pub fn is_retryable(&self) -> bool {
        self.is_connection()
    }
}
