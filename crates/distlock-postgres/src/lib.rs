#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod common;
mod error;
mod lease;
mod listen;
mod ops;
mod password;
mod session;
mod tls;

pub use common::{channel, election_key, lock_key};
pub use password::{PASSFILE_ENV, PASSWORD_ENV};
pub use tls::{RootCert, SslMode, TlsError, TlsErrorKind, TlsOptions};

use crate::common::Common;
use crate::error::KIND;
use distlock_core::backend::{Backend, Capabilities, GrantRef, Granted};
use distlock_core::conn::{ConnectionString, Password};
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, ClientOptions, LockInfo, LockKind, ReleaseOutcome,
    ReleaseWatch, RenewOutcome, Result,
};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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

/// What the URL says, beyond what tokio-postgres understands.
#[derive(Debug)]
struct Parsed {
    config: tokio_postgres::Config,
    mode: Mode,
    namespace: Option<String>,
    listen: bool,
    tls: TlsOptions,
    passfile: Option<PathBuf>,
}

/// The URL with its password (in the user info or a `password=` parameter) replaced by `***`.
pub fn redact(url: &str) -> String {
    distlock_core::conn::redact(url)
}

/// The parameters this crate reads (the driver would refuse them, or read them its own way).
const OURS: &[&str] = &[
    "mode",
    "namespace",
    "listen",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "passfile",
];

fn parse_url(url: &str) -> Result<Parsed> {
    let cs = ConnectionString::parse(url)?;
    let bad = |reason: &str| cs.invalid(reason);
    if !matches!(cs.scheme(), "postgres" | "postgresql") {
        return Err(cs.invalid(format!(
            "scheme `{}` is not postgres:// or postgresql://",
            cs.scheme()
        )));
    }
    let distlock_sql::url::Params {
        mode, namespace, ..
    } = distlock_sql::url::params(
        &cs,
        &[("session", Mode::Session), ("lease", Mode::Lease)],
        "mode=session (advisory locks, the default) or mode=lease (lease table, for PgBouncer)",
    )?;
    let listen = cs.bool("listen")?.unwrap_or(true);
    let tls = TlsOptions::from_url(&cs)?;
    let passfile = match cs.param("passfile") {
        None => None,
        Some("") => return Err(bad("passfile= is empty; give the path of a .pgpass file")),
        Some(p) => Some(PathBuf::from(p)),
    };
    if !listen && mode == Mode::Session {
        return Err(bad(
            "listen=off applies to mode=lease only (session mode waits on the server)",
        ));
    }
    let driver = distlock_sql::url::driver_url(&cs, OURS);
    let config = tokio_postgres::Config::from_str(&driver).map_err(|e| bad(&e.to_string()))?;
    endpoint_of(&config).map_err(bad)?;
    Ok(Parsed {
        config,
        mode,
        namespace,
        listen,
        tls,
        passfile,
    })
}

/// `host:port` of the first host, for messages; what a config must have.
fn endpoint_of(config: &tokio_postgres::Config) -> std::result::Result<String, &'static str> {
    if config.get_user().is_none() {
        return Err("no user; write postgres://user:password@host:port/database");
    }
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => return Err("no host; write postgres://user:password@host:port/database"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Ok(format!("{host}:{port}"))
}

/// Where a [`PostgresBuilder`] connects to.
enum Target {
    Url(String),
    Config(Box<tokio_postgres::Config>),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Url(u) => f.debug_tuple("Url").field(&redact(u)).finish(),
            // tokio-postgres's Debug of a config shows no password.
            Target::Config(c) => f.debug_tuple("Config").field(c).finish(),
        }
    }
}

/// Connection settings beyond the URL: the password, TLS, the mode; or the application's own
/// [`tokio_postgres::Config`]. Made by [`PostgresBackend::builder`] or
/// [`PostgresBackend::with_config`]; [`connect`](Self::connect) opens the backend.
///
/// What is set here replaces what the URL says. The password never appears in a message, an
/// error or `Debug`.
#[derive(Debug)]
#[must_use]
pub struct PostgresBuilder {
    target: Target,
    password: Option<Password>,
    passfile: Option<PathBuf>,
    tls: Option<TlsOptions>,
    mode: Option<Mode>,
    namespace: Option<String>,
    listen: Option<bool>,
}

impl PostgresBuilder {
    fn new(target: Target) -> Self {
        PostgresBuilder {
            target,
            password: None,
            passfile: None,
            tls: None,
            mode: None,
            namespace: None,
            listen: None,
        }
    }

    /// The password, instead of one in the URL (or the config), `PGPASSWORD` or a password
    /// file.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(Password::new(password));
        self
    }

    /// A password file in libpq's `.pgpass` format (`hostname:port:database:username:password`
    /// lines, `*` for any; mode 0600), read when neither the code, the URL nor `PGPASSWORD`
    /// gives a password. Replaces the URL's `passfile=`, [`PASSFILE_ENV`] and `~/.pgpass`.
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.passfile = Some(path.into());
        self
    }

    /// TLS settings, instead of the URL's `sslmode=`, `sslrootcert=`, `sslcert=` and `sslkey=`
    /// (or the `ssl_mode` of a [`tokio_postgres::Config`]).
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The mode, instead of the URL's `mode=` (default [`Mode::Session`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The namespace, instead of the URL's `namespace=` or the client options'.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Lease mode: whether waiters listen for notifications (the URL's `listen=`; default on).
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = Some(listen);
        self
    }

    /// Connects, checks the credentials and creates dlock's tables if they are missing (or
    /// migrates those of an older version).
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
    pub async fn connect(self, opts: &ClientOptions) -> Result<PostgresBackend> {
        let (mut config, tls, mode, namespace, listen, passfile) = match self.target {
            Target::Url(url) => {
                let p = parse_url(&url)?;
                (p.config, p.tls, p.mode, p.namespace, p.listen, p.passfile)
            }
            Target::Config(config) => {
                use tokio_postgres::config::SslMode as D;
                let mode = match config.get_ssl_mode() {
                    D::Disable => SslMode::Disable,
                    D::Require => SslMode::Require,
                    _ => SslMode::Prefer,
                };
                (
                    *config,
                    TlsOptions::new(mode),
                    Mode::Session,
                    None,
                    true,
                    None,
                )
            }
        };
        let endpoint = endpoint_of(&config)
            .map_err(|e| distlock_core::Error::InvalidArgument(e.to_owned()))?;
        let tls = self.tls.unwrap_or(tls);
        let mode = self.mode.unwrap_or(mode);
        let listen = self.listen.unwrap_or(listen);
        if !listen && mode == Mode::Session {
            return Err(distlock_core::Error::InvalidArgument(
                "listen=off applies to mode=lease only (session mode waits on the server)".into(),
            ));
        }
        password::resolve(
            &mut config,
            self.password.as_ref(),
            self.passfile.as_deref().or(passfile.as_deref()),
        )?;
        let connector = tls.connector()?;
        // libpq ignores sslmode on unix sockets, and the server offers no TLS there.
        let unix_only = config
            .get_hosts()
            .iter()
            .all(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)));
        config.ssl_mode(match unix_only {
            true => tokio_postgres::config::SslMode::Disable,
            false => tls.driver_mode(),
        });
        config.connect_timeout(opts.get_connect_timeout());
        if config.get_application_name().is_none() {
            config.application_name("dlock");
        }
        let namespace = self
            .namespace
            .or(namespace)
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        let common = Common::connect(
            config,
            connector,
            endpoint,
            namespace,
            opts.get_connect_timeout(),
            opts.get_op_timeout(),
        )
        .await?;
        let listener = listen::Listener::new(common.clone(), listen);
        let inner = match mode {
            Mode::Session => {
                common
                    .ensure_schema(session::TABLES, session::COLUMNS, session::DDL)
                    .await?;
                Inner::Session(session::new_mode(common.clone(), listener.clone()))
            }
            Mode::Lease => {
                common
                    .ensure_schema(lease::TABLES, lease::COLUMNS, lease::DDL)
                    .await?;
                Inner::Lease(lease::LeaseMode::new(common.clone(), listener.clone()))
            }
        };
        Ok(PostgresBackend {
            common,
            listener,
            inner,
            listen,
        })
    }
}

enum Inner {
    Session(session::SessionMode),
    Lease(lease::LeaseMode),
}

/// The PostgreSQL backend. Build it with [`PostgresBackend::connect`] (or `distlock::connect`).
pub struct PostgresBackend {
    common: Arc<Common>,
    listener: Arc<listen::Listener>,
    inner: Inner,
    listen: bool,
}

impl PostgresBackend {
    /// Connects to the server at `url`, checks the credentials and creates dlock's tables if
    /// they are missing (or migrates those of an older version). The same as
    /// `PostgresBackend::builder(url).connect(opts)`; see [`PostgresBuilder::connect`].
    ///
    /// # Errors
    /// As [`PostgresBuilder::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes the connections it opened. A schema creation
    /// interrupted midway is rolled back by the server (it runs in one transaction).
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        Self::builder(url).connect(opts).await
    }

    /// A builder on `url` (read when it connects), to give the password, TLS settings or the
    /// mode in code.
    ///
    /// ```no_run
    /// use distlock_postgres::{PostgresBackend, SslMode, TlsOptions};
    ///
    /// # async fn f() -> distlock_core::Result<()> {
    /// let backend = PostgresBackend::builder("postgres://app@db.internal:5432/app")
    ///     .password(std::env::var("APP_DB_PASSWORD").unwrap_or_default())
    ///     .tls(TlsOptions::new(SslMode::VerifyFull).root_cert("/etc/ssl/db-ca.pem"))
    ///     .connect(&distlock_core::ClientOptions::default())
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(url: &str) -> PostgresBuilder {
        PostgresBuilder::new(Target::Url(url.to_owned()))
    }

    /// A builder on the application's own [`tokio_postgres::Config`] (host, user, password,
    /// database, keepalives, …), with the TLS settings `tls` (they replace the config's
    /// `ssl_mode`). dlock opens its own connections from it: in session mode one per holder,
    /// plus a control connection. It sets `connect_timeout` from the client options and
    /// `application_name` to `dlock` when the config has none.
    ///
    /// ```no_run
    /// use distlock_postgres::{PostgresBackend, SslMode, TlsOptions};
    ///
    /// # async fn f() -> distlock_core::Result<()> {
    /// let mut config = tokio_postgres::Config::new();
    /// config.host("db.internal").port(5432).user("app").dbname("app");
    /// config.password("from-the-vault");
    /// let tls = TlsOptions::new(SslMode::VerifyFull).root_cert("/etc/ssl/db-ca.pem");
    /// let backend = PostgresBackend::with_config(config, tls)
    ///     .connect(&distlock_core::ClientOptions::default())
    ///     .await?;
    /// let client = distlock_core::Client::new(std::sync::Arc::new(backend), Default::default())?;
    /// let guard = client.lock("orders:42")?.acquire().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub fn with_config(config: tokio_postgres::Config, tls: TlsOptions) -> PostgresBuilder {
        PostgresBuilder::new(Target::Config(Box::new(config))).tls(tls)
    }

    /// The mode in use, which does the lock operations.
    fn current(&self) -> &dyn Backend {
        match &self.inner {
            Inner::Session(s) => s,
            Inner::Lease(l) => l,
        }
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
            Inner::Session(s) => session::idle_sessions(s),
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
#[async_trait]
impl Backend for PostgresBackend {
    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }

    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.common.endpoint.clone()
    }

    fn capabilities(&self) -> Capabilities {
        self.current().capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.current().acquire(req).await
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.current().watch(req).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.current().give_up(req).await
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<std::time::Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        self.current().acquire_wait(req, deadline, cancel).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.current().release(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.current().renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.current().inspect(name, kind).await
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.current().proclaim(grant, seq, value).await
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.current().observe(name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::Error;

    #[test]
    fn urls() {
        let p = parse_url("postgres://u:pw@127.0.0.1:7000/db?namespace=shop&mode=lease").unwrap();
        assert_eq!(endpoint_of(&p.config).unwrap(), "127.0.0.1:7000");
        assert_eq!(p.mode, Mode::Lease);
        assert_eq!(p.namespace.as_deref(), Some("shop"));
        assert_eq!(p.config.get_user(), Some("u"));
        assert_eq!(p.config.get_dbname(), Some("db"));
        let p = parse_url("postgresql://u@h/db?application_name=x&sslmode=disable").unwrap();
        assert_eq!(endpoint_of(&p.config).unwrap(), "h:5432");
        assert_eq!(p.mode, Mode::Session);
        assert_eq!(p.config.get_application_name(), Some("x"));
        let p = parse_url("postgres:///db?host=/run/postgresql&user=u").unwrap();
        assert_eq!(endpoint_of(&p.config).unwrap(), "/run/postgresql:5432");
        let p = parse_url("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&passfile=/pw")
            .unwrap();
        assert_eq!(p.tls.mode(), SslMode::VerifyFull);
        assert_eq!(p.passfile, Some(PathBuf::from("/pw")));
        let p = parse_url("postgres://u@h/db?mode=lease&listen=off").unwrap();
        assert!(!p.listen);
        let p = parse_url("postgres://u@h/db?mode=lease&options=-c%20search_path%3Dx%2By").unwrap();
        assert_eq!(p.config.get_options(), Some("-c search_path=x+y"));
        for bad in [
            "postgres://",
            "postgres://h/db",
            "mysql://u@h/db",
            "postgres://u@h/db?mode=x",
            "postgres://u@h/db?listen=maybe",
            "postgres://u@h/db?listen=off",
            "postgres://u@h/db?sslmode=allow",
            "postgres://u@h/db?sslmode=verify-ca",
            "postgres://u@h/db?passfile=",
            "postgres://u@h/db?nope=1",
            "postgres://u@h:notaport/db",
            "postgres://u@h/db?namespace=",
            "not a url",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        for secret in [
            "postgres://u:secret@h/db?nope=1",
            "postgres://u@h/db?password=secret&mode=x",
            "postgres://u:secret@h:notaport/db",
        ] {
            let e = parse_url(secret).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
            assert!(matches!(parse_url(secret), Err(Error::InvalidUrl { .. })));
        }
        assert_eq!(
            redact("postgres://u:secret@h:1/d"),
            "postgres://u:***@h:1/d"
        );
    }
}
