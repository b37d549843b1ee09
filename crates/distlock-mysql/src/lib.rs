#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod builder;
mod common;
mod error;
mod observe;
mod ops;
mod session;
mod socket;
mod table;
mod tls;

pub use builder::{MysqlBuilder, MysqlBuilderExt, MysqlSettings, PASSWORD_ENV};
pub use common::{election_key, lock_key};
pub use tls::{SslMode, TlsError, TlsErrorKind, TlsOptions};

use crate::common::Common;
use distlock_core::backend::{Backend, Delegate};
use distlock_core::{ClientOptions, Result};
use std::sync::Arc;

/// How locks are kept on the server (`?mode=` in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// `GET_LOCK` on a dedicated connection per holder (the default).
    Session,
    /// A lock row per name, changed in row-locking transactions.
    Table,
}

impl Mode {
    /// `session` or `table`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Table => "table",
        }
    }
}

/// The URL with its password (in the user info or a `password=` parameter) replaced by `***`.
pub use distlock_core::conn::redact;

enum Inner {
    Session(session::SessionMode),
    Table(table::TableMode),
}

/// The MySQL/MariaDB backend. Build it with [`MysqlBackend::connect`] (or `distlock::connect`).
pub struct MysqlBackend {
    common: Arc<Common>,
    inner: Inner,
}

impl MysqlBackend {
    /// Connects to the server at `url`, checks the credentials and creates dlock's tables if
    /// they are missing (table mode: adds the columns an older table lacks).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) (the URL redacted) for a URL
    /// this backend cannot use; `InvalidArgument` for a TLS or password file that cannot be
    /// read, or TLS settings that do not go together; `Connection` when the server cannot be
    /// reached within the connect timeout (a TLS failure: its source a [`TlsError`]); `Auth`
    /// for refused credentials or missing privileges; `UnexpectedReply` when creating the
    /// tables fails.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes the connections it opened; `CREATE TABLE IF
    /// NOT EXISTS` runs again on the next connect.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        Self::builder(url).options(opts.clone()).connect().await
    }

    /// A builder on `url` for settings the URL should not carry: the password (or a file
    /// holding it), TLS in code; see [`MysqlBuilder`].
    ///
    /// ```no_run
    /// # async fn demo() -> distlock_core::Result<()> {
    /// use distlock_mysql::{MysqlBackend, MysqlBuilderExt, SslMode, TlsOptions};
    ///
    /// let backend = MysqlBackend::builder("mysql://app@db.internal:3306/locks")
    ///     .password_file("/run/secrets/db-password")
    ///     .tls(TlsOptions::new(SslMode::VerifyFull).ca("/etc/ssl/db-ca.pem"))
    ///     .connect()
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn builder(url: &str) -> MysqlBuilder {
        MysqlBuilder::new(url)
    }

    /// A builder on the application's own driver options (the ones it built its
    /// `mysql_async::Pool` from, say): host, user, password, database, `SslOpts` and the rest
    /// are used as they are, except `client_found_rows`, which dlock turns on. dlock opens its
    /// own connections with them (why, and how many: docs/mysql.md, "Bring your own options").
    ///
    /// ```no_run
    /// # async fn demo() -> distlock_core::Result<()> {
    /// use distlock_mysql::{MysqlBackend, MysqlBuilderExt};
    ///
    /// let opts = mysql_async::Opts::from_url("mysql://app:secret@db.internal/locks")
    ///     .expect("the application's URL");
    /// let pool = mysql_async::Pool::new(opts.clone()); // the application's pool
    /// let backend = MysqlBackend::with_opts(opts)
    ///     .namespace("billing")
    ///     .connect()
    ///     .await?;
    /// # let _ = (backend, pool); Ok(()) }
    /// ```
    pub fn with_opts(opts: mysql_async::Opts) -> MysqlBuilder {
        builder::with_opts(opts)
    }

    /// The mode this backend runs in.
    pub fn mode(&self) -> Mode {
        match self.inner {
            Inner::Session(_) => Mode::Session,
            Inner::Table(_) => Mode::Table,
        }
    }

    /// The namespace (hashed into every lock key).
    pub fn namespace(&self) -> &str {
        &self.common.namespace
    }

    /// Session mode: the connection id holding `name` for `owner` in this client
    /// (`KILL id` revokes that lock at once). `None` in table mode, or if this client holds
    /// no grant of `name` for `owner`.
    ///
    /// # Errors
    /// None: `None` when no grant matches.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads this client's state (waiting at most the op timeout for a
    /// request of the attempt that is running).
    pub async fn holder_connection(&self, name: &str, owner: &str) -> Option<u32> {
        match &self.inner {
            Inner::Session(s) => session::holder_connection(s, name, owner).await,
            Inner::Table(_) => None,
        }
    }
}

/// The lock operations (and `watch`, `observe`) are the mode's; the operator commands are in
/// `ops`. MySQL has no notifications: table mode's waiters wake at the holder's lease end or
/// their heartbeat, session mode waits on the server. Observers are woken by the server,
/// without polling (see `observe`).
impl Delegate for MysqlBackend {
    fn target(&self) -> &dyn Backend {
        match &self.inner {
            Inner::Session(s) => s,
            Inner::Table(t) => t,
        }
    }

    fn delegate_operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}
