//! [`MysqlBuilder`]: the URL (or the application's own `mysql_async::Opts`) plus what should
//! not be in it, resolved by the core's one rule with the mysql client's (`MYSQL_PWD`) as the
//! ecosystem's.

use crate::common::{Common, Connector};
use crate::tls::{SslMode, TlsOptions};
use crate::{Inner, Mode, MysqlBackend};
use distlock_core::conn::{
    read_password_file, Builder, Connect, ConnectionString, CredentialRule, EcosystemQuery,
    Password, Settings,
};
use distlock_core::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;

/// The environment variable holding the password when nothing else gives one (the mysql
/// client's).
pub const PASSWORD_ENV: &str = "MYSQL_PWD";

/// Builds a [`MysqlBackend`]: the core's [`Builder`] with [`MysqlSettings`] (its own setters
/// are in [`MysqlBuilderExt`]). Made by [`MysqlBackend::builder`] or
/// [`MysqlBackend::with_opts`].
///
/// What is set here replaces what the URL says; the order in which each credential is looked
/// for is in docs/mysql.md, "Credentials" ([`ignore_env`](Builder::ignore_env) turns the
/// environment off, [`PASSWORD_ENV`] too). Its `Debug` shows no password.
pub type MysqlBuilder = Builder<MysqlSettings>;

/// MySQL's part of [`MysqlBuilder`].
#[derive(Clone, Default)]
pub struct MysqlSettings {
    /// The application's own driver options, instead of the URL's.
    opts: Option<mysql_async::Opts>,
    tls: Option<TlsOptions>,
    mode: Option<Mode>,
    namespace: Option<String>,
}

impl std::fmt::Debug for MysqlSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the driver's options: their Debug shows the password.
        let opts = self.opts.as_ref().map(|o| {
            let user = o.user().unwrap_or_default();
            format!(
                "mysql_async::Opts for {user}@{}",
                crate::common::endpoint(o)
            )
        });
        f.debug_struct("MysqlSettings")
            .field("opts", &opts)
            .field("tls", &self.tls)
            .field("mode", &self.mode)
            .field("namespace", &self.namespace)
            .finish()
    }
}

/// The setters of [`MysqlBuilder`] that only MySQL has.
pub trait MysqlBuilderExt {
    /// TLS settings (instead of the URL's `ssl-mode=`…, or the application's `SslOpts`); the
    /// builder's [`ca_file`](Builder::ca_file) and [`client_cert`](Builder::client_cert) go
    /// over them.
    #[must_use]
    fn tls(self, tls: TlsOptions) -> Self;
    /// The mode (instead of the URL's `mode=`; default [`Mode::Session`]).
    #[must_use]
    fn mode(self, mode: Mode) -> Self;
    /// The namespace (instead of the URL's `namespace=` and the client options').
    #[must_use]
    fn namespace(self, namespace: impl Into<String>) -> Self;
}

impl MysqlBuilderExt for MysqlBuilder {
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
}

/// A builder on the application's options: their user and password stand as the URL's would.
pub(crate) fn with_opts(opts: mysql_async::Opts) -> MysqlBuilder {
    let userinfo = distlock_sql::url::userinfo(opts.user(), opts.pass().map(str::as_bytes));
    MysqlBuilder::new(format!("mysql://{userinfo}")).map_settings(|s| s.opts = Some(opts))
}

/// The URL parameters dlock reads itself besides the TLS files' (the driver gets the others).
const OUR_PARAMS: &[&str] = &[
    "mode",
    "namespace",
    "ssl-mode",
    "ssl_mode",
    "password-file",
    "password_file",
];

/// What the URL (or the application's options) says.
pub(crate) struct Parsed {
    pub(crate) opts: mysql_async::Opts,
    pub(crate) mode: Mode,
    pub(crate) namespace: Option<String>,
    /// `None`: the application's options, their TLS settings as they are.
    pub(crate) tls: Option<TlsOptions>,
}

/// The URL's settings, checked, and the driver's options from the rest.
pub(crate) fn parse_url(cs: &ConnectionString) -> Result<Parsed> {
    if cs.scheme() != "mysql" {
        return Err(cs.invalid(format!("scheme `{}` is not mysql://", cs.scheme())));
    }
    if cs.hosts().is_empty() {
        return Err(cs.invalid("no host; write mysql://user:password@host:port/database"));
    }
    let distlock_sql::url::Params {
        mode, namespace, ..
    } = distlock_sql::url::params(
        cs,
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
    let tls = TlsOptions::from_url(cs)?;
    password_file(cs)?;
    let prefer_socket = cs.bool("prefer_socket")?.unwrap_or(false);
    let names = crate::tls::NAMES;
    let ours = [OUR_PARAMS, names.ca, names.cert, names.key].concat();
    let driver = distlock_sql::url::driver_url(cs, &ours);
    let opts = mysql_async::Opts::from_url(&driver).map_err(|e| cs.invalid(e.to_string()))?;
    let opts: mysql_async::Opts = mysql_async::OptsBuilder::from_opts(opts)
        .prefer_socket(prefer_socket)
        .into();
    Ok(Parsed {
        opts,
        mode,
        namespace,
        tls: Some(tls),
    })
}

/// The mysql client's password rule: the file of `?password-file=`, then [`PASSWORD_ENV`];
/// `None` when the application's options have a password, which then stands.
///
/// # Errors
/// [`Error::InvalidArgument`] for a password file that cannot be read; as the URL.
fn mysql_client(q: &EcosystemQuery<'_>) -> Result<Option<Password>> {
    let x = q.settings.downcast_ref::<MysqlSettings>();
    if x.and_then(|x| x.opts.as_ref())
        .is_some_and(|o| o.pass().is_some())
    {
        return Ok(None);
    }
    if let Some(f) = password_file(q.url)? {
        return read_password_file(&f, "MySQL", "password-file=").map(Some);
    }
    Ok(q.env.var(PASSWORD_ENV).map(Password::new))
}

/// The URL's `password-file=`.
fn password_file(cs: &ConnectionString) -> Result<Option<PathBuf>> {
    match cs.param("password-file").or(cs.param("password_file")) {
        Some("") => Err(cs.invalid("password-file= is empty; give a file")),
        p => Ok(p.map(PathBuf::from)),
    }
}

impl MysqlSettings {
    const RULE: CredentialRule = CredentialRule {
        service: "MySQL",
        env_prefix: "DLOCK_MYSQL",
        // The application's options name their user outside the URL: `resolve` checks.
        password_needs_user: false,
        ecosystem: Some(mysql_client),
    };

    /// Every setting resolved: the driver's options with the credentials and the TLS settings
    /// (as the connector), the mode and the namespace (if the URL or the builder sets one).
    pub(crate) fn resolve(s: &Settings<Self>) -> Result<(Connector, Parsed)> {
        let x = &s.settings;
        let mut p = match &x.opts {
            None => parse_url(&s.url)?,
            Some(o) => Parsed {
                opts: o.clone(),
                mode: Mode::Session,
                namespace: None,
                tls: None,
            },
        };
        let (user, pass) = (&s.credentials.user, &s.credentials.password);
        let user = user.as_deref().or(p.opts.user());
        let base = mysql_async::OptsBuilder::from_opts(p.opts.clone())
            .user(user)
            .pass(pass.as_ref().map(Password::expose).or(p.opts.pass()))
            // Renewals count matched rows, not changed ones.
            .client_found_rows(true);
        if user.is_none_or(str::is_empty) {
            let reason = "no user; write mysql://user:password@host:port/database";
            return Err(match x.opts {
                None => s.url.invalid(reason),
                Some(_) => Error::InvalidArgument(reason.into()),
            });
        }
        let mut tls = x.tls.clone().or(p.tls.take());
        if s.ca_file.is_some() || s.client_cert.is_some() {
            let mut t = tls.unwrap_or_default();
            t.files = s.tls_files(Some(t.files.clone()), "")?.unwrap_or(t.files);
            tls = Some(t);
        }
        p.mode = x.mode.unwrap_or(p.mode);
        // Else the client options' (when the backend opens).
        p.namespace = x.namespace.clone().or(p.namespace);
        Ok((connector(base, tls)?, p))
    }
}

/// The connector of `base` with `tls` (`None`: the application's options, their TLS settings
/// as they are).
fn connector(base: mysql_async::OptsBuilder, tls: Option<TlsOptions>) -> Result<Connector> {
    let (opts, plain_fallback, tls) = match tls {
        None => {
            let opts: mysql_async::Opts = base.into();
            let tls = TlsOptions::new(match opts.ssl_opts() {
                Some(s) if s.accept_invalid_certs() => SslMode::Require,
                Some(_) => SslMode::VerifyFull,
                None => SslMode::Disable,
            });
            (opts, None, tls)
        }
        Some(tls) => {
            let ssl = tls.ssl_opts()?;
            let plain_fallback = (tls.mode() == SslMode::Prefer && ssl.is_some())
                .then(|| base.clone().ssl_opts(None).into());
            (base.ssl_opts(ssl).into(), plain_fallback, tls)
        }
    };
    Ok(Connector {
        opts,
        plain_fallback,
        tls,
    })
}

impl Connect for MysqlSettings {
    type Backend = MysqlBackend;
    const CREDENTIALS: CredentialRule = MysqlSettings::RULE;

    /// Connects as [`MysqlBackend::connect`] does.
    async fn connect(settings: Settings<Self>) -> Result<MysqlBackend> {
        let (connector, p) = MysqlSettings::resolve(&settings)?;
        let namespace = (p.namespace).unwrap_or_else(|| settings.opts.get_namespace().to_owned());
        // mysql_async builds its rustls config with the process default provider, which rustls
        // may not pick by itself: dlock's one (aws-lc-rs), for every way in (URL, builder, the
        // application's own Opts), unless the program set one already.
        #[cfg(feature = "tls")]
        distlock_core::conn::install_crypto_provider();
        let common = Arc::new(Common::new(connector, namespace, &settings.opts));
        common.ensure_schema(crate::session::DDL).await?;
        let inner = match p.mode {
            Mode::Session => Inner::Session(crate::session::new_mode(common.clone())),
            Mode::Table => Inner::Table(crate::table::TableMode::start(common.clone()).await?),
        };
        Ok(MysqlBackend { common, inner })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::endpoint;
    use distlock_core::conn::Env;

    fn parse(url: &str) -> Result<Parsed> {
        parse_url(&ConnectionString::parse(url)?)
    }

    fn resolve(b: &MysqlBuilder, env: &[(&str, &str)]) -> Result<(Connector, Parsed)> {
        MysqlSettings::resolve(&b.settings_with(&MysqlSettings::RULE, &Env::from_pairs(env))?)
    }

    fn error(b: &MysqlBuilder) -> Error {
        match resolve(b, &[]) {
            Ok(_) => panic!("{b:?} resolved"),
            Err(e) => e,
        }
    }

    fn pass(b: &MysqlBuilder, env: &[(&str, &str)]) -> Option<String> {
        let (c, _) = resolve(b, env).expect("resolve");
        c.opts.pass().map(str::to_owned)
    }

    #[test]
    fn urls() {
        let p = parse("mysql://u:pw@127.0.0.1:7000/db?namespace=shop&mode=table").unwrap();
        assert_eq!(endpoint(&p.opts), "127.0.0.1:7000");
        assert_eq!(p.mode, Mode::Table);
        assert_eq!(p.namespace.as_deref(), Some("shop"));
        assert_eq!(p.opts.user(), Some("u"));
        assert_eq!(p.opts.db_name(), Some("db"));
        assert!(!p.opts.prefer_socket());
        let p = parse("mysql://u@h/db?tcp_keepalive=1000").unwrap();
        assert_eq!(endpoint(&p.opts), "h:3306");
        assert_eq!(p.mode, Mode::Session);
        for bad in [
            "mysql://",
            "postgres://u@h/db",
            "mysql://u@h/db?mode=x",
            "mysql://u@h/db?nope=1",
            "mysql://u@h:notaport/db",
            "mysql://u@h/db?namespace=",
            "not a url",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let e = parse("mysql://u:secret@h/db?nope=1")
            .err()
            .expect("refused");
        let e = e.to_string();
        assert!(!e.contains("secret"), "{e}");
        for port in ["1", "x"] {
            let url = format!("mysql://u:secret@h:{port}/d");
            assert_eq!(crate::redact(&url), format!("mysql://u:***@h:{port}/d"));
        }
    }

    #[test]
    fn builder_settings() {
        let e = error(&MysqlBuilder::new("mysql://h/db"));
        assert!(matches!(&e, Error::InvalidUrl { reason, .. } if reason.contains("no user")));
        let env = [("DLOCK_MYSQL_USER", "eu"), ("MYSQL_PWD", "client")];
        let (c, p) = resolve(&MysqlBuilder::new("mysql://h/db"), &env).unwrap();
        assert_eq!(
            (c.opts.user(), c.opts.pass(), endpoint(&p.opts).as_str()),
            (Some("eu"), Some("client"), "h:3306")
        );
        let b = MysqlBuilder::new("mysql://u:url@h/db");
        assert_eq!(pass(&b, &env).as_deref(), Some("url"));
        let b = MysqlBuilder::new("mysql://u@h/db");
        assert_eq!(pass(&b.clone().ignore_env(), &env), None);
        assert_eq!(
            pass(
                &b.clone(),
                &[("DLOCK_MYSQL_PASSWORD", "ours"), ("MYSQL_PWD", "c")]
            )
            .as_deref(),
            Some("ours")
        );
        let e = error(&MysqlBuilder::new(
            "mysql://u@h/db?password-file=/nonexistent/pw",
        ));
        assert!(e.to_string().contains("/nonexistent/pw"), "{e}");
        let (c, p) = resolve(&b.password("code").mode(Mode::Table).namespace("ns"), &env).unwrap();
        assert_eq!(c.opts.pass(), Some("code"));
        assert_eq!((p.mode, p.namespace.as_deref()), (Mode::Table, Some("ns")));
        assert!(!format!("{:?}", MysqlBuilder::new("mysql://u:hush@h/d")).contains("hush"));
    }

    #[test]
    fn application_options() {
        let opts = mysql_async::Opts::from_url("mysql://app:mine@db/d").expect("opts");
        let b = with_opts(opts);
        assert!(!format!("{b:?}").contains("mine"), "{b:?}");
        let (c, p) = resolve(&b, &[("DLOCK_MYSQL_USER", "other"), ("MYSQL_PWD", "x")]).unwrap();
        assert_eq!((c.opts.user(), c.opts.pass()), (Some("app"), Some("mine")));
        assert_eq!(endpoint(&p.opts), "db:3306");
        assert!(c.opts.client_found_rows());
    }
}
