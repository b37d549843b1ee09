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
/// that has it:
///
/// | setting | 1. builder | 2. URL (or config) | 3. environment | 4. libpq's rule |
/// |---|---|---|---|---|
/// | user | [`user`](Builder::user) | `postgres://USER@…` | `DLOCK_PG_USER` | — |
/// | password | [`password`](Builder::password) / [`password_file`](Builder::password_file) (its first line) | `postgres://user:PASSWORD@…`, `?password=` | `DLOCK_PG_PASSWORD`, then the file named by `DLOCK_PG_PASSWORD_FILE` | `PGPASSWORD`, then a `.pgpass` file: [`passfile`](PostgresBuilderExt::passfile), `?passfile=`, `PGPASSFILE`, `~/.pgpass` |
///
/// [`ignore_env`](Builder::ignore_env) turns the environment off (libpq's variables too). A
/// user without a password is fine (the server may `trust` it). The password never appears in
/// a message, an error or `Debug`.
pub type PostgresBuilder = Builder<PgSettings>;

/// PostgreSQL's part of [`PostgresBuilder`].
#[derive(Debug, Clone, Default)]
pub struct PgSettings {
    /// The application's own config, instead of the URL's.
    config: Option<Box<tokio_postgres::Config>>,
    /// A `.pgpass` file named in code.
    pub(crate) passfile: Option<PathBuf>,
    tls: Option<TlsOptions>,
    mode: Option<Mode>,
    namespace: Option<String>,
    listen: Option<bool>,
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

/// What the URL (or the application's config) says, beyond the credentials.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) mode: Mode,
    pub(crate) namespace: Option<String>,
    pub(crate) listen: bool,
    pub(crate) tls: TlsOptions,
    pub(crate) passfile: Option<PathBuf>,
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

/// The URL's settings, checked, and the driver's config from the rest.
pub(crate) fn parse_url(cs: &ConnectionString) -> Result<Parsed> {
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
    Ok(Parsed {
        config,
        mode,
        namespace,
        listen,
        tls,
        passfile,
    })
}

/// The settings of `url`, or of the application's config in `x` (whose TLS options
/// [`with_config`] always sets).
pub(crate) fn parsed(url: &ConnectionString, x: &PgSettings) -> Result<Parsed> {
    let Some(config) = &x.config else {
        return parse_url(url);
    };
    Ok(Parsed {
        config: (**config).clone(),
        mode: Mode::Session,
        namespace: None,
        listen: true,
        tls: TlsOptions::default(),
        passfile: None,
    })
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

impl PgSettings {
    const RULE: CredentialRule = CredentialRule {
        service: "PostgreSQL",
        env_prefix: "DLOCK_PG",
        // The application's config names its user outside the URL: `connect` checks.
        password_needs_user: false,
        ecosystem: Some(password::libpq),
    };

    /// Every setting resolved: the driver's config with the credentials, the TLS options, the
    /// mode, the namespace (if the URL or the builder sets one), whether lease waiters listen,
    /// and the endpoint.
    pub(crate) fn resolve(s: &Settings<Self>) -> Result<(Parsed, String)> {
        let x = &s.settings;
        let mut p = parsed(&s.url, x)?;
        if let Some(u) = &s.credentials.user {
            p.config.user(u);
        }
        if let Some(pw) = &s.credentials.password {
            p.config.password(pw.expose());
        }
        if p.config.get_user().is_none() {
            let reason = "no user; write postgres://user:password@host:port/database";
            return Err(match x.config {
                None => s.url.invalid(reason),
                Some(_) => Error::InvalidArgument(reason.into()),
            });
        }
        let endpoint = endpoint_of(&p.config).map_err(|e| Error::InvalidArgument(e.into()))?;
        p.tls = x.tls.clone().unwrap_or(p.tls);
        if let Some(ca) = &s.ca_file {
            p.tls = p.tls.root_cert(ca);
        }
        if let Some((cert, key)) = &s.client_cert {
            p.tls = p.tls.client_cert(cert, key);
        }
        p.mode = x.mode.unwrap_or(p.mode);
        p.listen = x.listen.unwrap_or(p.listen);
        if !p.listen && p.mode == Mode::Session {
            return Err(Error::InvalidArgument(
                "listen=off applies to mode=lease only (session mode waits on the server)".into(),
            ));
        }
        // Else the client options' (when the backend opens).
        p.namespace = x.namespace.clone().or(p.namespace);
        Ok((p, endpoint))
    }
}

impl Connect for PgSettings {
    type Backend = PostgresBackend;
    const CREDENTIALS: CredentialRule = PgSettings::RULE;

    /// Connects, checks the credentials and creates dlock's tables if they are missing (or
    /// migrates those of an older version); see [`PostgresBackend::connect`].
    async fn connect(settings: Settings<Self>) -> Result<PostgresBackend> {
        let (p, endpoint) = PgSettings::resolve(&settings)?;
        PostgresBackend::open(p, endpoint, &settings.opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::SslMode;
    use distlock_core::conn::Env;

    fn parse(url: &str) -> Result<Parsed> {
        parse_url(&ConnectionString::parse(url)?)
    }

    fn resolve(b: &PostgresBuilder, env: &[(&str, &str)]) -> Result<(Parsed, String)> {
        PgSettings::resolve(&b.settings_with(&PgSettings::RULE, &Env::from_pairs(env))?)
    }

    #[test]
    fn urls() {
        let p = parse("postgres://u:pw@127.0.0.1:7000/db?namespace=shop&mode=lease").unwrap();
        assert_eq!(endpoint_of(&p.config).unwrap(), "127.0.0.1:7000");
        assert_eq!(p.mode, Mode::Lease);
        assert_eq!(p.namespace.as_deref(), Some("shop"));
        assert_eq!(p.config.get_user(), Some("u"));
        assert_eq!(p.config.get_dbname(), Some("db"));
        let p = parse("postgresql://u@h/db?application_name=x&sslmode=disable").unwrap();
        assert_eq!(endpoint_of(&p.config).unwrap(), "h:5432");
        assert_eq!(p.mode, Mode::Session);
        assert_eq!(p.config.get_application_name(), Some("x"));
        let p = parse("postgres:///db?host=/run/postgresql&user=u").unwrap();
        assert_eq!(endpoint_of(&p.config).unwrap(), "/run/postgresql:5432");
        let p = parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&passfile=/pw")
            .unwrap();
        assert_eq!(p.tls.mode(), SslMode::VerifyFull);
        assert_eq!(p.passfile, Some(PathBuf::from("/pw")));
        let p = parse("postgres://u@h/db?mode=lease&listen=off").unwrap();
        assert!(!p.listen);
        let p = parse("postgres://u@h/db?mode=lease&options=-c%20search_path%3Dx%2By").unwrap();
        assert_eq!(p.config.get_options(), Some("-c search_path=x+y"));
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
        let (p, endpoint) = resolve(
            &PostgresBuilder::new("postgres://h/db"),
            &[("DLOCK_PG_USER", "envuser"), ("DLOCK_PG_PASSWORD", "envpw")],
        )
        .unwrap();
        assert_eq!(endpoint, "h:5432");
        assert_eq!(p.config.get_user(), Some("envuser"));
        assert_eq!(p.config.get_password(), Some(&b"envpw"[..]));
        // libpq's variable comes after the URL and dlock's own.
        let b = PostgresBuilder::new("postgres://u:url@h/db");
        let (p, _) = resolve(&b, &[("PGPASSWORD", "libpq")]).unwrap();
        assert_eq!(p.config.get_password(), Some(&b"url"[..]));
        let b = PostgresBuilder::new("postgres://u@h/db");
        let (p, _) = resolve(&b, &[("PGPASSWORD", "libpq")]).unwrap();
        assert_eq!(p.config.get_password(), Some(&b"libpq"[..]));
        let (p, _) = resolve(&b.clone().ignore_env(), &[("PGPASSWORD", "libpq")]).unwrap();
        assert_eq!(p.config.get_password(), None);
        let b = b
            .password("code")
            .mode(Mode::Lease)
            .listen(false)
            .namespace("ns")
            .ca_file("/ca.pem")
            .tls(TlsOptions::new(SslMode::VerifyCa));
        let (p, _) = resolve(&b, &[]).unwrap();
        assert_eq!(p.config.get_password(), Some(&b"code"[..]));
        assert_eq!((p.mode, p.listen), (Mode::Lease, false));
        assert_eq!(p.namespace.as_deref(), Some("ns"));
        assert_eq!(
            p.tls,
            TlsOptions::new(SslMode::VerifyCa).root_cert("/ca.pem")
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
        let (p, endpoint) = resolve(&b, &[("DLOCK_PG_USER", "other")]).unwrap();
        assert_eq!(endpoint, "db:5432");
        assert_eq!(p.config.get_user(), Some("app"));
        assert_eq!(p.config.get_password(), Some(&b"mine"[..]));
        assert_eq!(p.tls.mode(), SslMode::Disable);
        let (p, _) = resolve(&b.password("code"), &[]).unwrap();
        assert_eq!(p.config.get_password(), Some(&b"code"[..]));
        let e = resolve(
            &with_config(tokio_postgres::Config::new(), TlsOptions::default()),
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}
