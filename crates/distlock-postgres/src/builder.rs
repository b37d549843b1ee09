//! [`PostgresBuilder`]: the URL (or the application's own `tokio_postgres::Config`) plus what
//! should not be in it, resolved by the core's one rule with libpq's password rule as the
//! ecosystem's.

use crate::tls::TlsOptions;
use crate::{password, Mode, PostgresBackend};
use distlock_core::conn::{Builder, Connect, ConnectionString, CredentialRule, Settings};
use distlock_core::{Error, Result};
use std::path::PathBuf;
use std::str::FromStr;

/// Builds a [`PostgresBackend`]: the core's [`Builder`] with [`PgSettings`] (its own setters
/// are in [`PostgresBuilderExt`]). Made by [`PostgresBackend::builder`] or
/// [`PostgresBackend::with_config`]; [`connect`](Builder::connect) opens the backend.
///
/// What is set here replaces what the URL says. Each credential is taken from the first place
/// that has it: the builder, the URL (or config), the environment (`DLOCK_PG_*`, then libpq's
/// `PGPASSWORD` and `.pgpass` files, unless [`ignore_env`](Builder::ignore_env)); the order in
/// full: docs/postgres.md, *Credentials*. A user without a password is fine (the server may
/// `trust` it); the password never appears in a message, an error or `Debug`.
pub type PostgresBuilder = Builder<PgSettings>;

/// PostgreSQL's part of [`PostgresBuilder`]; in the crate also the URL's and resolved settings.
#[derive(Debug, Clone, Default)]
pub struct PgSettings {
    /// The application's own config, instead of the URL's.
    config: Option<Box<tokio_postgres::Config>>,
    /// A `.pgpass` file named in code.
    pub(crate) passfile: Option<PathBuf>,
    pub(crate) tls: Option<TlsOptions>,
    pub(crate) mode: Option<Mode>,
    pub(crate) namespace: Option<String>,
    pub(crate) listen: Option<bool>,
}

/// The setters of [`PostgresBuilder`] that only PostgreSQL has.
pub trait PostgresBuilderExt {
    /// A password file in libpq's `.pgpass` format (`hostname:port:database:username:password`
    /// lines, `*` for any; mode 0600), read when nothing else gives a password. Replaces the
    /// URL's `passfile=`, [`PASSFILE_ENV`](crate::PASSFILE_ENV) and `~/.pgpass`.
    #[must_use]
    fn passfile(self, path: impl Into<PathBuf>) -> Self;
    /// TLS settings, instead of the URL's `sslmode=`, `sslrootcert=`, `sslcert=` and `sslkey=`
    /// (or the `ssl_mode` of a [`tokio_postgres::Config`]); the builder's
    /// [`ca_file`](Builder::ca_file) and [`client_cert`](Builder::client_cert) go over them.
    #[must_use]
    fn tls(self, tls: TlsOptions) -> Self;
    /// The mode, instead of the URL's `mode=` (default [`Mode::Session`]).
    #[must_use]
    fn mode(self, mode: Mode) -> Self;
    /// The namespace, instead of the URL's `namespace=` or the client options'.
    #[must_use]
    fn namespace(self, namespace: impl Into<String>) -> Self;
    /// Lease mode: whether waiters listen for notifications (the URL's `listen=`; default on).
    #[must_use]
    fn listen(self, listen: bool) -> Self;
}

impl PostgresBuilderExt for PostgresBuilder {
    fn passfile(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        self.map_settings(|s| s.passfile = Some(path))
    }
    fn tls(self, tls: TlsOptions) -> Self {
        self.map_settings(|s| s.tls = Some(tls))
    }
    fn mode(self, mode: Mode) -> Self {
        self.map_settings(|s| s.mode = Some(mode))
    }
    fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        self.map_settings(|s| s.namespace = Some(namespace))
    }
    fn listen(self, listen: bool) -> Self {
        self.map_settings(|s| s.listen = Some(listen))
    }
}

/// A builder on the application's config: its user and password stand as the URL's would.
pub(crate) fn with_config(config: tokio_postgres::Config, tls: TlsOptions) -> PostgresBuilder {
    let userinfo = distlock_sql::url::userinfo(config.get_user(), config.get_password());
    PostgresBuilder::new(format!("postgres://{userinfo}")).map_settings(|s| {
        s.config = Some(Box::new(config));
        s.tls = Some(tls);
    })
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

/// The driver's config and the URL's settings, checked.
pub(crate) fn parse_url(cs: &ConnectionString) -> Result<(tokio_postgres::Config, PgSettings)> {
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
        cs,
        &[("session", Mode::Session), ("lease", Mode::Lease)],
        "mode=session (advisory locks, the default) or mode=lease (lease table, for PgBouncer)",
    )?;
    let listen = cs.bool("listen")?.unwrap_or(true);
    let tls = TlsOptions::from_url(cs)?;
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
    let driver = distlock_sql::url::driver_url(cs, OURS);
    let config = tokio_postgres::Config::from_str(&driver).map_err(|e| bad(&e.to_string()))?;
    endpoint_of(&config).map_err(bad)?;
    let s = PgSettings {
        config: None,
        passfile,
        tls: Some(tls),
        mode: Some(mode),
        namespace,
        listen: Some(listen),
    };
    Ok((config, s))
}

/// The driver's config and the settings of `url` (or of the application's config in `x`,
/// whose TLS options [`with_config`] always sets), those set in `x` over them.
pub(crate) fn parsed(
    url: &ConnectionString,
    x: &PgSettings,
) -> Result<(tokio_postgres::Config, PgSettings)> {
    let (config, url) = match &x.config {
        None => parse_url(url)?,
        Some(c) => ((**c).clone(), PgSettings::default()),
    };
    let s = PgSettings {
        config: None,
        passfile: x.passfile.clone().or(url.passfile),
        tls: x.tls.clone().or(url.tls),
        mode: x.mode.or(url.mode),
        namespace: x.namespace.clone().or(url.namespace),
        listen: x.listen.or(url.listen),
    };
    Ok((config, s))
}

/// `host:port` of the first host, for messages; what a config must have.
pub(crate) fn endpoint_of(
    config: &tokio_postgres::Config,
) -> std::result::Result<String, &'static str> {
    let (host, port, _) =
        first_host(config).ok_or("no host; write postgres://user:password@host:port/database")?;
    Ok(format!("{host}:{port}"))
}

/// The first host (a unix socket's directory), its port, and whether it is a unix socket.
pub(crate) fn first_host(config: &tokio_postgres::Config) -> Option<(String, u16, bool)> {
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first()? {
        tokio_postgres::config::Host::Tcp(h) => Some((h.clone(), port, false)),
        tokio_postgres::config::Host::Unix(p) => Some((p.display().to_string(), port, true)),
    }
}

/// The driver's config, the settings and the endpoint, resolved ([`resolve`]).
pub(crate) type Resolved = (tokio_postgres::Config, PgSettings, String);

/// Every setting resolved: the driver's config with the credentials, the settings (TLS
/// with the builder's files; a mode, namespace or `listen` not set: the default, or the
/// client options' namespace when the backend opens), and the endpoint.
pub(crate) fn resolve(s: &Settings<PgSettings>) -> Result<Resolved> {
    let (mut config, mut p) = parsed(&s.url, &s.settings)?;
    if let Some(u) = &s.credentials.user {
        config.user(u);
    }
    if let Some(pw) = &s.credentials.password {
        config.password(pw.expose());
    }
    if config.get_user().is_none() {
        let reason = "no user; write postgres://user:password@host:port/database";
        return Err(match s.settings.config {
            None => s.url.invalid(reason),
            Some(_) => Error::InvalidArgument(reason.into()),
        });
    }
    let endpoint = endpoint_of(&config).map_err(|e| Error::InvalidArgument(e.into()))?;
    let mut tls = p.tls.unwrap_or_default();
    if let Some(ca) = &s.ca_file {
        tls = tls.root_cert(ca);
    }
    if let Some((cert, key)) = &s.client_cert {
        tls = tls.client_cert(cert, key);
    }
    p.tls = Some(tls);
    if p.listen == Some(false) && p.mode != Some(Mode::Lease) {
        return Err(Error::InvalidArgument(
            "listen=off applies to mode=lease only (session mode waits on the server)".into(),
        ));
    }
    Ok((config, p, endpoint))
}

impl Connect for PgSettings {
    type Backend = PostgresBackend;
    const CREDENTIALS: CredentialRule = CredentialRule {
        service: "PostgreSQL",
        env_prefix: "DLOCK_PG",
        // The application's config names its user outside the URL: `connect` checks.
        password_needs_user: false,
        ecosystem: Some(password::libpq),
    };

    /// Connects, checks the credentials and creates dlock's tables if they are missing (or
    /// migrates those of an older version); see [`PostgresBackend::connect`].
    async fn connect(settings: Settings<Self>) -> Result<PostgresBackend> {
        let (config, p, endpoint) = resolve(&settings)?;
        PostgresBackend::open(config, p, endpoint, &settings.opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::SslMode;
    use distlock_core::conn::Env;

    fn parse(url: &str) -> Result<(tokio_postgres::Config, PgSettings)> {
        parse_url(&ConnectionString::parse(url)?)
    }

    fn resolve(b: &PostgresBuilder, env: &[(&str, &str)]) -> Result<Resolved> {
        super::resolve(&b.settings_with(&PgSettings::CREDENTIALS, &Env::from_pairs(env))?)
    }

    #[test]
    fn urls() {
        let (c, p) = parse("postgres://u:pw@127.0.0.1:7000/db?namespace=shop&mode=lease").unwrap();
        assert_eq!(endpoint_of(&c).unwrap(), "127.0.0.1:7000");
        assert_eq!(p.mode, Some(Mode::Lease));
        assert_eq!(p.namespace.as_deref(), Some("shop"));
        assert_eq!(c.get_user(), Some("u"));
        assert_eq!(c.get_dbname(), Some("db"));
        let (c, p) = parse("postgresql://u@h/db?application_name=x&sslmode=disable").unwrap();
        assert_eq!(endpoint_of(&c).unwrap(), "h:5432");
        assert_eq!(p.mode, Some(Mode::Session));
        assert_eq!(c.get_application_name(), Some("x"));
        let (c, _) = parse("postgres:///db?host=/run/postgresql&user=u").unwrap();
        assert_eq!(endpoint_of(&c).unwrap(), "/run/postgresql:5432");
        let (_, p) =
            parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&passfile=/pw")
                .unwrap();
        assert_eq!(p.tls.map(|t| t.mode()), Some(SslMode::VerifyFull));
        assert_eq!(p.passfile, Some(PathBuf::from("/pw")));
        let (_, p) = parse("postgres://u@h/db?mode=lease&listen=off").unwrap();
        assert_eq!(p.listen, Some(false));
        let (c, _) =
            parse("postgres://u@h/db?mode=lease&options=-c%20search_path%3Dx%2By").unwrap();
        assert_eq!(c.get_options(), Some("-c search_path=x+y"));
        for bad in [
            "postgres://",
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
            assert!(parse(bad).is_err(), "{bad}");
        }
        for secret in [
            "postgres://u:secret@h/db?nope=1",
            "postgres://u@h/db?password=secret&mode=x",
            "postgres://u:secret@h:notaport/db",
        ] {
            let e = parse(secret).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
            assert!(matches!(parse(secret), Err(Error::InvalidUrl { .. })));
        }
        assert_eq!(
            crate::redact("postgres://u:secret@h:1/d"),
            "postgres://u:***@h:1/d"
        );
    }

    #[test]
    fn builder_settings() {
        let e = resolve(&PostgresBuilder::new("postgres://h/db"), &[]).unwrap_err();
        assert!(matches!(&e, Error::InvalidUrl { reason, .. } if reason.contains("no user")));
        let (c, _, endpoint) = resolve(
            &PostgresBuilder::new("postgres://h/db"),
            &[("DLOCK_PG_USER", "envuser"), ("DLOCK_PG_PASSWORD", "envpw")],
        )
        .unwrap();
        assert_eq!(endpoint, "h:5432");
        assert_eq!(c.get_user(), Some("envuser"));
        assert_eq!(c.get_password(), Some(&b"envpw"[..]));
        // libpq's variable comes after the URL and dlock's own.
        let b = PostgresBuilder::new("postgres://u:url@h/db");
        let (c, _, _) = resolve(&b, &[("PGPASSWORD", "libpq")]).unwrap();
        assert_eq!(c.get_password(), Some(&b"url"[..]));
        let b = PostgresBuilder::new("postgres://u@h/db");
        let (c, _, _) = resolve(&b, &[("PGPASSWORD", "libpq")]).unwrap();
        assert_eq!(c.get_password(), Some(&b"libpq"[..]));
        let (c, _, _) = resolve(&b.clone().ignore_env(), &[("PGPASSWORD", "libpq")]).unwrap();
        assert_eq!(c.get_password(), None);
        let b = b
            .password("code")
            .mode(Mode::Lease)
            .listen(false)
            .namespace("ns")
            .ca_file("/ca.pem")
            .tls(TlsOptions::new(SslMode::VerifyCa));
        let (c, p, _) = resolve(&b, &[]).unwrap();
        assert_eq!(c.get_password(), Some(&b"code"[..]));
        assert_eq!((p.mode, p.listen), (Some(Mode::Lease), Some(false)));
        assert_eq!(p.namespace.as_deref(), Some("ns"));
        assert_eq!(
            p.tls,
            Some(TlsOptions::new(SslMode::VerifyCa).root_cert("/ca.pem"))
        );
        let e = resolve(&b.mode(Mode::Session), &[]).unwrap_err();
        assert!(e.to_string().contains("listen=off"), "{e}");
        assert!(!format!("{:?}", PostgresBuilder::new("postgres://u:hush@h/d")).contains("hush"));
    }

    #[test]
    fn application_config() {
        let mut config = tokio_postgres::Config::new();
        config.host("db").user("app").dbname("d").password("mine");
        let b = with_config(config, TlsOptions::new(SslMode::Disable));
        let (c, p, endpoint) = resolve(&b, &[("DLOCK_PG_USER", "other")]).unwrap();
        assert_eq!(endpoint, "db:5432");
        assert_eq!(c.get_user(), Some("app"));
        assert_eq!(c.get_password(), Some(&b"mine"[..]));
        assert_eq!(p.tls.map(|t| t.mode()), Some(SslMode::Disable));
        let (c, _, _) = resolve(&b.password("code"), &[]).unwrap();
        assert_eq!(c.get_password(), Some(&b"code"[..]));
        let e = resolve(
            &with_config(tokio_postgres::Config::new(), TlsOptions::default()),
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}
