#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod builder;
mod common;
mod error;
mod lease;
mod listen;
mod ops;
mod password;
mod session;
mod tls;

pub use builder::{PgSettings, PostgresBuilder, PostgresBuilderExt};
pub use common::{channel, election_key, lock_key};
pub use password::{PASSFILE_ENV, PASSWORD_ENV};
pub use tls::{RootCert, SslMode, TlsError, TlsErrorKind, TlsOptions};

use crate::common::Common;
use distlock_core::backend::{Backend, Delegate};
use distlock_core::{ClientOptions, Result};
use std::sync::Arc;

/// How locks are kept on the server (`?mode=` in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Session advisory locks on a dedicated connection per holder (the default).
    Session,
    /// A lease table; works behind PgBouncer in transaction mode.
    Lease,
}

impl Mode {
    /// `session` or `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Lease => "lease",
        }
    }
}

/// The URL with its password (in the user info or a `password=` parameter) replaced by `***`.
pub use distlock_core::conn::redact;

enum Inner {
    Session(session::SessionMode),
    Lease(lease::LeaseMode),
}

/// The PostgreSQL backend. Build it with [`PostgresBackend::connect`] (or `distlock::connect`).
pub struct PostgresBackend {
    common: Arc<Common>,
    listener: Arc<listen::Listener>,
    inner: Inner,
}

impl PostgresBackend {
    /// Connects to the server at `url`, checks the credentials and creates dlock's tables if
    /// they are missing (or migrates those of an older version). The same as
    /// `PostgresBackend::builder(url).options(opts.clone()).connect()`.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) (the URL redacted) for a URL
    /// this backend cannot use; `InvalidArgument` for settings that do not go together (e.g.
    /// `verify-full` without a root certificate), an unreadable certificate, key or named
    /// password file, or a config without a user or host; `Connection` when the server cannot
    /// be reached within the connect timeout, or TLS fails (its source a [`TlsError`] saying
    /// why: the server does not support TLS, its certificate is not trusted or not valid for
    /// the host, the client certificate was refused); `Auth` for refused credentials or missing
    /// privileges; `UnexpectedReply` when creating the tables fails.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes the connections it opened. A schema creation
    /// interrupted midway is rolled back by the server (it runs in one transaction).
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        Self::builder(url).options(opts.clone()).connect().await
    }

    /// A builder on `url` (read when it connects), to give the password, TLS settings or the
    /// mode in code; see [`PostgresBuilder`].
    ///
    /// ```no_run
    /// use distlock_postgres::{PostgresBackend, PostgresBuilderExt, SslMode, TlsOptions};
    ///
    /// # async fn f() -> distlock_core::Result<()> {
    /// let backend = PostgresBackend::builder("postgres://app@db.internal:5432/app")
    ///     .password(std::env::var("APP_DB_PASSWORD").unwrap_or_default())
    ///     .tls(TlsOptions::new(SslMode::VerifyFull).root_cert("/etc/ssl/db-ca.pem"))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(url: &str) -> PostgresBuilder {
        PostgresBuilder::new(url)
    }

    /// A builder on the application's own [`tokio_postgres::Config`] (host, user, password,
    /// database, keepalives, …), with the TLS settings `tls` (they replace the config's
    /// `ssl_mode`); its user and password stand as a URL's would. What dlock opens from it and
    /// sets in it: docs/postgres.md, *Bring your own config*.
    ///
    /// ```no_run
    /// use distlock_postgres::{PostgresBackend, SslMode, TlsOptions};
    ///
    /// # async fn f() -> distlock_core::Result<()> {
    /// let mut config = tokio_postgres::Config::new();
    /// config.host("db.internal").port(5432).user("app").dbname("app");
    /// config.password("from-the-vault");
    /// let tls = TlsOptions::new(SslMode::VerifyFull).root_cert("/etc/ssl/db-ca.pem");
    /// let backend = PostgresBackend::with_config(config, tls).connect().await?;
    /// let client = distlock_core::Client::new(std::sync::Arc::new(backend), Default::default())?;
    /// let guard = client.lock("orders:42")?.acquire().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub fn with_config(config: tokio_postgres::Config, tls: TlsOptions) -> PostgresBuilder {
        builder::with_config(config, tls)
    }

    /// Opens the backend with every setting resolved.
    async fn open(
        mut config: tokio_postgres::Config,
        p: PgSettings,
        endpoint: String,
        opts: &ClientOptions,
    ) -> Result<Self> {
        let (tls, mode) = (p.tls.unwrap_or_default(), p.mode.unwrap_or(Mode::Session));
        let connector = tls.connector(&mut config)?;
        config.connect_timeout(opts.get_connect_timeout());
        if config.get_application_name().is_none() {
            config.application_name("dlock");
        }
        let namespace = p
            .namespace
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        let common = Common::connect(config, connector, endpoint, namespace, opts).await?;
        let (tables, columns, ddl) = match mode {
            Mode::Session => (session::TABLES, session::COLUMNS, session::DDL),
            Mode::Lease => (lease::TABLES, lease::COLUMNS, lease::DDL),
        };
        common.ensure_schema(tables, columns, ddl).await?;
        let listener = listen::Listener::new(common.clone(), p.listen.unwrap_or(true));
        let (c, l) = (common.clone(), listener.clone());
        let inner = match mode {
            Mode::Session => Inner::Session(session::new_mode(c, l)),
            Mode::Lease => Inner::Lease(lease::LeaseMode::new(c, l)),
        };
        Ok(PostgresBackend {
            common,
            listener,
            inner,
        })
    }

    /// The mode this backend runs in.
    pub fn mode(&self) -> Mode {
        match self.inner {
            Inner::Session(_) => Mode::Session,
            Inner::Lease(_) => Mode::Lease,
        }
    }

    /// The namespace (the `ns` column of dlock's tables).
    pub fn namespace(&self) -> &str {
        &self.common.namespace
    }

    /// The server's `server_version_num` (e.g. 150004). Below 140000 the session mode cannot
    /// enforce leases on the server (no `idle_session_timeout`): a hung holder keeps its lock
    /// until its connection closes.
    pub fn server_version(&self) -> i32 {
        self.common.server_version
    }

    /// Session mode: the backend pid of a connection holding `name` for `owner` in this
    /// client (of one of its grants, if two clients' attempts share the owner id here).
    /// `SELECT pg_terminate_backend(pid)` revokes that lock at once. `None` in lease mode.
    ///
    /// # Errors
    /// None: `None` when no live grant matches.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads this client's state (waiting for a request of the attempt
    /// that is running).
    pub async fn holder_pid(&self, name: &str, owner: &str) -> Option<i32> {
        match &self.inner {
            Inner::Session(s) => session::holder_pid(s, name, owner).await,
            Inner::Lease(_) => None,
        }
    }

    /// Session mode: idle connections kept for the next grant.
    pub fn idle_sessions(&self) -> usize {
        match &self.inner {
            Inner::Session(s) => s.dialect().pool.len(),
            Inner::Lease(_) => 0,
        }
    }

    /// Notification channels this client listens on right now (one per lock some caller of
    /// this client waits for through notifications).
    ///
    /// # Errors
    /// None.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads this client's state.
    pub async fn listening_channels(&self) -> usize {
        self.listener.listening().await
    }
}

/// The lock operations are the mode's; the operator commands are in `ops`.
impl Delegate for PostgresBackend {
    fn target(&self) -> &dyn Backend {
        match &self.inner {
            Inner::Session(s) => s,
            Inner::Lease(l) => l,
        }
    }

    fn delegate_operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}
