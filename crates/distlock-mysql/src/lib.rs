#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod common;
mod error;
mod observe;
mod ops;
mod session;
mod socket;
mod table;
mod tls;

pub use common::{election_key, lock_key};
pub use tls::{SslMode, TlsError, TlsErrorKind, TlsOptions};

use crate::common::{Common, Connector};
use crate::error::KIND;
use distlock_core::backend::{Backend, Capabilities, GrantRef, Granted};
use distlock_core::conn::{ConnectionString, Password};
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, ClientOptions, Error, LockInfo, LockKind,
    ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The environment variable holding the password when neither the code, the URL nor a
/// password file gives one (the mysql client's).
pub const PASSWORD_ENV: &str = "MYSQL_PWD";

/// The URL parameters dlock reads itself (the driver gets the others).
const OUR_PARAMS: &[&str] = &[
    "mode",
    "namespace",
    "ssl-mode",
    "ssl_mode",
    "ssl-ca",
    "ssl_ca",
    "ssl-cert",
    "ssl_cert",
    "ssl-key",
    "ssl_key",
    "password-file",
    "password_file",
];

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
pub fn redact(url: &str) -> String {
    distlock_core::conn::redact(url)
}

struct Parsed {
    opts: mysql_async::Opts,
    endpoint: String,
    mode: Mode,
    namespace: Option<String>,
    tls: TlsOptions,
    password_file: Option<PathBuf>,
}

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the driver's options: their Debug shows the password.
        f.debug_struct("Parsed")
            .field("endpoint", &self.endpoint)
            .field("mode", &self.mode)
            .field("namespace", &self.namespace)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

fn parse_url(url: &str) -> Result<Parsed> {
    let cs = ConnectionString::parse(url)?;
    if cs.scheme() != "mysql" {
        return Err(cs.invalid(format!("scheme `{}` is not mysql://", cs.scheme())));
    }
    if cs.hosts().is_empty() {
        return Err(cs.invalid("no host; write mysql://user:password@host:port/database"));
    }
    if cs.user().is_none_or(str::is_empty) {
        return Err(cs.invalid("no user; write mysql://user:password@host:port/database"));
    }
    let distlock_sql::url::Params {
        mode, namespace, ..
    } = distlock_sql::url::params(
        &cs,
        &[("session", Mode::Session), ("table", Mode::Table)],
        "mode=session (GET_LOCK, the default) or mode=table (lock rows, for clusters)",
    )?;
    for theirs in [
        "require_ssl",
        "verify_ca",
        "verify_identity",
        "built_in_roots",
    ] {
        if cs.param(theirs).is_some() {
            return Err(cs.invalid(format!(
                "{theirs}= is not read here; use ssl-mode=DISABLED|PREFERRED|REQUIRED|VERIFY_CA|\
                 VERIFY_IDENTITY (with ssl-ca=PATH), as the mysql client does"
            )));
        }
    }
    let tls = TlsOptions::from_url(&cs)?;
    let password_file = match cs.param("password-file").or(cs.param("password_file")) {
        None => None,
        Some("") => return Err(cs.invalid("password-file= is empty; give a file")),
        Some(p) => Some(PathBuf::from(p)),
    };
    let prefer_socket = cs.bool("prefer_socket")?.unwrap_or(false);
    let driver = distlock_sql::url::driver_url(&cs, OUR_PARAMS);
    let opts = mysql_async::Opts::from_url(&driver).map_err(|e| cs.invalid(e.to_string()))?;
    let endpoint = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
    let opts: mysql_async::Opts = mysql_async::OptsBuilder::from_opts(opts)
        .prefer_socket(prefer_socket)
        .into();
    Ok(Parsed {
        opts,
        endpoint,
        mode,
        namespace,
        tls,
        password_file,
    })
}

/// The first password found: given in code, in the URL (already in `opts`), in a password
/// file, in [`PASSWORD_ENV`].
fn resolve_password(
    opts: &mysql_async::Opts,
    given: Option<&Password>,
    file: Option<&Path>,
) -> Result<Option<String>> {
    if let Some(p) = given {
        return Ok(Some(p.expose().to_owned()));
    }
    if let Some(p) = opts.pass() {
        return Ok(Some(p.to_owned()));
    }
    if let Some(f) = file {
        let text = std::fs::read_to_string(f).map_err(|e| {
            Error::InvalidArgument(format!(
                "password file {}: {e}; give a readable file holding the password",
                f.display()
            ))
        })?;
        let pw = text
            .strip_suffix('\n')
            .map(|t| t.strip_suffix('\r').unwrap_or(t))
            .unwrap_or(&text);
        return Ok(Some(pw.to_owned()));
    }
    Ok(std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty()))
}

/// Where a builder's connection settings come from.
enum Source {
    Url(String),
    Opts(mysql_async::Opts),
}

/// Settings beyond the URL: the password from code or a file, TLS in code, the application's
/// own [`mysql_async::Opts`]. Made by [`MysqlBackend::builder`] or [`MysqlBackend::with_opts`].
///
/// Its `Debug` shows no password.
pub struct MysqlBuilder {
    source: Source,
    password: Option<Password>,
    password_file: Option<PathBuf>,
    tls: Option<TlsOptions>,
    mode: Option<Mode>,
    namespace: Option<String>,
}

impl std::fmt::Debug for MysqlBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match &self.source {
            Source::Url(u) => redact(u),
            Source::Opts(o) => format!(
                "mysql_async::Opts for {}@{}:{}",
                o.user().unwrap_or_default(),
                o.ip_or_hostname(),
                o.tcp_port()
            ),
        };
        f.debug_struct("MysqlBuilder")
            .field("source", &source)
            .field("password", &self.password)
            .field("password_file", &self.password_file)
            .field("tls", &self.tls)
            .field("mode", &self.mode)
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl MysqlBuilder {
    fn new(source: Source) -> Self {
        MysqlBuilder {
            source,
            password: None,
            password_file: None,
            tls: None,
            mode: None,
            namespace: None,
        }
    }

    /// The password (wins over the URL's, a password file and [`PASSWORD_ENV`]).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(Password::new(password));
        self
    }

    /// Read the password from the file `path` (its whole content but a final newline), when
    /// neither [`password`](Self::password) nor the URL gives one. The URL's
    /// `password-file=PATH` does the same; this wins over it.
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password_file = Some(path.into());
        self
    }

    /// TLS settings (instead of the URL's `ssl-mode=`…, or the application's `SslOpts`).
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The mode (instead of the URL's `mode=`; default [`Mode::Session`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The namespace (instead of the URL's `namespace=` and the client options').
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Connects as [`MysqlBackend::connect`] does.
    ///
    /// # Errors
    /// As [`MysqlBackend::connect`]; also [`Error::InvalidArgument`] for a TLS or password
    /// file that cannot be read, or TLS settings that do not go together. A TLS failure is an
    /// `Error::Connection` whose source is a [`TlsError`].
    ///
    /// # Cancel safety
    /// As [`MysqlBackend::connect`].
    pub async fn connect(self, opts: &ClientOptions) -> Result<MysqlBackend> {
        let (driver, endpoint, mode, namespace, tls, file) = match self.source {
            Source::Url(url) => {
                let p = parse_url(&url)?;
                (
                    p.opts,
                    p.endpoint,
                    p.mode,
                    p.namespace,
                    Some(p.tls),
                    p.password_file,
                )
            }
            Source::Opts(o) => {
                let endpoint = format!("{}:{}", o.ip_or_hostname(), o.tcp_port());
                (o, endpoint, Mode::Session, None, None, None)
            }
        };
        let mode = self.mode.unwrap_or(mode);
        let namespace = self
            .namespace
            .or(namespace)
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        let file = self.password_file.or(file);
        let password = resolve_password(&driver, self.password.as_ref(), file.as_deref())?;
        // Renewals count matched rows, not changed ones.
        let base = mysql_async::OptsBuilder::from_opts(driver)
            .pass(password)
            .client_found_rows(true);
        let tls = self.tls.or(tls);
        let connector = match tls {
            Some(tls) => {
                let ssl = tls.ssl_opts(tls.mode())?;
                let plain_fallback = (tls.mode() == SslMode::Preferred && ssl.is_some())
                    .then(|| base.clone().ssl_opts(None).into());
                Connector {
                    opts: base.ssl_opts(ssl).into(),
                    plain_fallback,
                    client_cert: tls.has_client_cert(),
                    tls: tls.context(),
                }
            }
            // The application's options, its TLS settings as they are.
            None => {
                let opts: mysql_async::Opts = base.into();
                let tls = TlsOptions::new(match opts.ssl_opts() {
                    Some(s) if s.accept_invalid_certs() => SslMode::Required,
                    Some(_) => SslMode::VerifyIdentity,
                    None => SslMode::Disabled,
                });
                Connector {
                    client_cert: opts.ssl_opts().is_some_and(has_identity),
                    opts,
                    plain_fallback: None,
                    tls: tls.context(),
                }
            }
        };
        MysqlBackend::start(connector, endpoint, mode, namespace, opts).await
    }
}

#[cfg(feature = "tls")]
fn has_identity(s: &mysql_async::SslOpts) -> bool {
    s.client_identity().is_some()
}

#[cfg(not(feature = "tls"))]
fn has_identity(_: &mysql_async::SslOpts) -> bool {
    false
}

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
    /// [`Error::InvalidUrl`] (the URL redacted) for a URL
    /// this backend cannot use; `Connection` when the server cannot be reached within the
    /// connect timeout; `Auth` for refused credentials or missing privileges;
    /// `UnexpectedReply` when creating the tables fails.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes the connections it opened; `CREATE TABLE IF
    /// NOT EXISTS` runs again on the next connect.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        Self::builder(url).connect(opts).await
    }

    /// A builder on `url` for settings the URL should not carry: the password (or a file
    /// holding it), TLS in code.
    ///
    /// ```no_run
    /// # async fn demo() -> distlock_core::Result<()> {
    /// use distlock_mysql::{MysqlBackend, SslMode, TlsOptions};
    ///
    /// let backend = MysqlBackend::builder("mysql://app@db.internal:3306/locks")
    ///     .password_file("/run/secrets/db-password")
    ///     .tls(TlsOptions::new(SslMode::VerifyIdentity).ca("/etc/ssl/db-ca.pem"))
    ///     .connect(&distlock_core::ClientOptions::default())
    ///     .await?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn builder(url: &str) -> MysqlBuilder {
        MysqlBuilder::new(Source::Url(url.to_owned()))
    }

    /// A builder on the application's own driver options (the ones it built its
    /// `mysql_async::Pool` from, say): host, user, password, database, `SslOpts` and the rest
    /// are used as they are, except `client_found_rows`, which dlock turns on.
    ///
    /// dlock opens its own connections with them rather than borrowing the pool's: session
    /// mode keeps one connection per held lock for the whole hold (the lock lives and dies
    /// with it) and must close it at once when a reply is late, which a pool's connection
    /// (returned, reset and reused on drop) does not allow. Count them in the server's
    /// `max_connections`: one per held lock, plus up to 8 idle ones.
    ///
    /// ```no_run
    /// # async fn demo() -> distlock_core::Result<()> {
    /// use distlock_mysql::MysqlBackend;
    ///
    /// let opts = mysql_async::Opts::from_url("mysql://app:secret@db.internal/locks")
    ///     .expect("the application's URL");
    /// let pool = mysql_async::Pool::new(opts.clone()); // the application's pool
    /// let backend = MysqlBackend::with_opts(opts)
    ///     .namespace("billing")
    ///     .connect(&distlock_core::ClientOptions::default())
    ///     .await?;
    /// # let _ = (backend, pool); Ok(()) }
    /// ```
    pub fn with_opts(opts: mysql_async::Opts) -> MysqlBuilder {
        MysqlBuilder::new(Source::Opts(opts))
    }

    async fn start(
        connector: Connector,
        endpoint: String,
        mode: Mode,
        namespace: String,
        opts: &ClientOptions,
    ) -> Result<Self> {
        // mysql_async builds its rustls config with the process default provider, which rustls
        // may not pick one by itself: set dlock's one (aws-lc-rs) for every way in
        // (URL, builder, the application's own Opts) unless the program already did.
        #[cfg(feature = "tls")]
        distlock_core::conn::install_crypto_provider();
        let common = Arc::new(Common::new(
            connector,
            endpoint,
            namespace,
            opts.get_connect_timeout(),
            opts.get_op_timeout(),
        ));
        common.ensure_schema(session::DDL).await?;
        let inner = match mode {
            Mode::Session => Inner::Session(session::new_mode(common.clone())),
            Mode::Table => {
                common.ensure_schema(table::DDL).await?;
                let t = table::TableMode::new(common.clone());
                t.migrate().await?;
                Inner::Table(t)
            }
        };
        Ok(MysqlBackend { common, inner })
    }

    /// The mode in use, which does the lock operations.
    fn current(&self) -> &dyn Backend {
        match &self.inner {
            Inner::Session(s) => s,
            Inner::Table(t) => t,
        }
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
#[async_trait]
impl Backend for MysqlBackend {
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

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.current().watch(req).await
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.current().observe(name).await
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.current().acquire(req).await
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<std::time::Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        self.current().acquire_wait(req, deadline, cancel).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.current().give_up(req).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.current().release(grant).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.current().inspect(name, kind).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.current().renew(holds).await
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.current().proclaim(grant, seq, value).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let p = parse_url("mysql://u:pw@127.0.0.1:7000/db?namespace=shop&mode=table").unwrap();
        assert_eq!(p.endpoint, "127.0.0.1:7000");
        assert_eq!(p.mode, Mode::Table);
        assert_eq!(p.namespace.as_deref(), Some("shop"));
        assert_eq!(p.opts.user(), Some("u"));
        assert_eq!(p.opts.db_name(), Some("db"));
        assert!(!p.opts.prefer_socket());
        let p = parse_url("mysql://u@h/db?tcp_keepalive=1000").unwrap();
        assert_eq!(p.endpoint, "h:3306");
        assert_eq!(p.mode, Mode::Session);
        for bad in [
            "mysql://",
            "mysql://h/db",
            "postgres://u@h/db",
            "mysql://u@h/db?mode=x",
            "mysql://u@h/db?nope=1",
            "mysql://u@h:notaport/db",
            "mysql://u@h/db?namespace=",
            "not a url",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let e = parse_url("mysql://u:secret@h/db?nope=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(redact("mysql://u:secret@h:1/d"), "mysql://u:***@h:1/d");
        assert_eq!(redact("mysql://u:secret@h:x/d"), "mysql://u:***@h:x/d");
    }
}
