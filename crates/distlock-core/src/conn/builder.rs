//! The one builder of every server backend, the one credentials rule, and the [`Connect`]
//! trait the registry calls with the parsed URL.

use super::{ConnectionString, Password, PasswordSource, TlsFiles};
use crate::{Backend, ClientOptions, Error, Result};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

/// How a backend takes credentials from outside the builder and the URL: its environment
/// variables (`{env_prefix}_USER`, `_PASSWORD`, `_PASSWORD_FILE`), whether a user and a
/// password go together, and an ecosystem's own rule (`.pgpass`, `MYSQL_PWD`) tried last.
#[derive(Debug, Clone, Copy)]
pub struct CredentialRule {
    /// The service, for messages (`"Redis"`, `"etcd"`).
    pub service: &'static str,
    /// The prefix of the environment variables, e.g. `"DLOCK_REDIS"`.
    pub env_prefix: &'static str,
    /// True when a password needs a user (etcd, ZooKeeper digest); false when a password alone
    /// is fine (Redis' `default` user).
    pub password_needs_user: bool,
    /// Tried when nothing else gave a password (see [`EcosystemRule`]). A backend with one
    /// lets a user go without a password when the rule finds none: its servers may want none
    /// (PostgreSQL's `trust`, a MySQL account without a password).
    pub ecosystem: Option<EcosystemRule>,
}

/// An ecosystem's own password rule (`.pgpass`, `MYSQL_PWD`): given what the query holds, the
/// password, if it has one.
pub type EcosystemRule = fn(&EcosystemQuery<'_>) -> Result<Option<Password>>;

/// What an [`EcosystemRule`] is given.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct EcosystemQuery<'a> {
    /// The parsed URL.
    pub url: &'a ConnectionString,
    /// The user found so far (builder, URL, environment).
    pub user: Option<&'a str>,
    /// The environment (no variable after `ignore_env`).
    pub env: &'a Env,
    /// The backend's own settings (its `X` of [`Builder<X>`]): downcast them to read a setting
    /// of the rule's (e.g. a `.pgpass` file named in code).
    pub settings: &'a dyn std::any::Any,
}

/// How [`Env`] reads a variable.
type ReadVar = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl CredentialRule {
    /// `{env_prefix}_{suffix}`, e.g. `var("PASSWORD_FILE")`.
    pub fn var(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.env_prefix)
    }
}

/// A user and a password, after the builder, the URL, the environment and the ecosystem's
/// rule had their say. `Debug` never shows the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The user, if any.
    pub user: Option<String>,
    /// The password, if any.
    pub password: Option<Password>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl Credentials {
    /// The credentials by the one rule: each of user and password from the builder, else the
    /// URL, else the environment `env`, the password last from the file named by
    /// `{prefix}_PASSWORD_FILE` and then the ecosystem's rule (given `settings`, the backend's
    /// own).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty user, a user without a password (unless the rule
    /// has an ecosystem rule), a password without a user when the rule wants one, or a
    /// password file that cannot be read; as the ecosystem's rule.
    pub fn resolve(
        user: Option<&str>,
        password: Option<&PasswordSource>,
        url: &ConnectionString,
        rule: &CredentialRule,
        (env, settings): (&Env, &dyn std::any::Any),
    ) -> Result<Credentials> {
        let service = rule.service;
        let user = match user {
            Some("") => return Err(Error::invalid(format!("the {service} user name is empty"))),
            Some(u) => Some(u.to_owned()),
            None => url
                .user()
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .or_else(|| env.var(&rule.var("USER"))),
        };
        let (pw_var, file_var) = (rule.var("PASSWORD"), rule.var("PASSWORD_FILE"));
        let mut found = super::resolve_password(
            password,
            url.password().cloned(),
            |k| env.var(k),
            (&pw_var, &file_var),
            service,
        )?;
        if let (None, Some(hook)) = (&found, rule.ecosystem) {
            found = hook(&EcosystemQuery {
                url,
                user: user.as_deref(),
                env,
                settings,
            })?;
        }
        let scheme = url.scheme();
        match (&user, &found) {
            (Some(u), None) if rule.ecosystem.is_none() => Err(Error::invalid(format!(
                "{service} user `{u}` has no password: give it in the URL \
                 ({scheme}://{u}:PASSWORD@…), with the builder's password or password_file, or \
                 in {pw_var} or a file named by {file_var}"
            ))),
            (None, Some(_)) if rule.password_needs_user => Err(Error::invalid(format!(
                "a {service} password but no user: name the user in the URL \
                 ({scheme}://USER:…@…), with the builder's user, or in {}",
                rule.var("USER")
            ))),
            _ => Ok(Credentials {
                user,
                password: found,
            }),
        }
    }
}

/// Where the environment variables of a connection's settings are read: the process's,
/// none (a builder's `ignore_env`), or a function (for tests).
#[derive(Clone)]
pub struct Env(Option<ReadVar>);

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Env(on)"
        } else {
            "Env(off)"
        })
    }
}

impl Env {
    /// The process environment (an empty value counts as unset).
    pub fn process() -> Env {
        Env::from_fn(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// No variable is ever set.
    pub fn none() -> Env {
        Env(None)
    }

    /// Exactly the variables `vars` (name, value), for tests.
    pub fn from_pairs(vars: &[(&str, &str)]) -> Env {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Env::from_fn(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    /// Variables as `f` gives them.
    pub fn from_fn(f: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Env {
        Env(Some(Arc::new(f)))
    }

    /// The value of `name`, if set.
    pub fn var(&self, name: &str) -> Option<String> {
        self.0.as_ref().and_then(|f| f(name))
    }
}

#[derive(Clone)]
enum Url {
    Text(String),
    Parsed(ConnectionString),
}

/// Builds a backend from a URL and what should not be written in one: credentials (or a
/// file holding the password), a CA and a client certificate. `X` is the backend's own
/// settings (and, through [`Connect`], how it connects); each backend names it, e.g.
/// `distlock_redis::RedisBuilder`.
///
/// Each setting is taken from the first place that has it: the builder, the URL, the
/// environment (see [`CredentialRule`]; [`ignore_env`](Self::ignore_env) turns it off).
/// `Debug` shows the URL redacted and never a password.
#[derive(Clone)]
pub struct Builder<X> {
    url: Url,
    opts: ClientOptions,
    user: Option<String>,
    password: Option<PasswordSource>,
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    env: bool,
    extra: X,
}

impl<X: fmt::Debug> fmt::Debug for Builder<X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = match &self.url {
            Url::Text(t) => super::redact(t),
            Url::Parsed(cs) => cs.redacted().to_owned(),
        };
        f.debug_struct("Builder")
            .field("url", &url)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("env", &self.env)
            .field("settings", &self.extra)
            .finish_non_exhaustive()
    }
}

impl<X: Default> Builder<X> {
    /// A builder for the server(s) at `url`, with default [`ClientOptions`] (the URL is
    /// parsed when connecting).
    pub fn new(url: impl Into<String>) -> Self {
        Builder::with_url(Url::Text(url.into()))
    }

    /// A builder for a URL parsed already (what the registry has).
    pub fn parsed(url: ConnectionString) -> Self {
        Builder::with_url(Url::Parsed(url))
    }

    fn with_url(url: Url) -> Self {
        Builder {
            url,
            opts: ClientOptions::default(),
            user: None,
            password: None,
            ca_file: None,
            client_cert: None,
            env: true,
            extra: X::default(),
        }
    }
}

impl<X> Builder<X> {
    /// The client options (namespace, timeouts, watchdog lease) the backend is made for.
    #[must_use]
    pub fn options(mut self, opts: ClientOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The user (over the URL's and the environment's).
    #[must_use]
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// The password (over the URL's and the environment's).
    #[must_use]
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(PasswordSource::Text(Password::new(password)));
        self
    }

    /// A file whose first line is the password (over the URL's and the environment's); read
    /// when connecting.
    #[must_use]
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password = Some(PasswordSource::File(path.into()));
        self
    }

    /// User and password at once.
    #[must_use]
    pub fn credentials(self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user(user).password(password)
    }

    /// The CA certificates to trust (a PEM file), instead of the system's; over the URL's
    /// CA parameter. Needs a TLS URL.
    #[must_use]
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// A client certificate chain and its (unencrypted PEM) key, for servers that ask for
    /// one; over the URL's. Needs a TLS URL.
    #[must_use]
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Do not read the environment variables of the backend's credentials.
    #[must_use]
    pub fn ignore_env(mut self) -> Self {
        self.env = false;
        self
    }

    /// The backend's own settings, for its extension methods.
    #[must_use]
    pub fn map_settings(mut self, f: impl FnOnce(&mut X)) -> Self {
        f(&mut self.extra);
        self
    }

    /// Everything resolved against `env` (a variable's value, `None` when unset), for tests;
    /// [`Builder::connect`] reads the process environment.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that does not parse; as [`Credentials::resolve`].
    pub fn settings_with(&self, rule: &CredentialRule, env: &Env) -> Result<Settings<X>>
    where
        X: Clone + 'static,
    {
        let url = match &self.url {
            Url::Text(t) => ConnectionString::parse(t)?,
            Url::Parsed(cs) => cs.clone(),
        };
        let env = if self.env { env.clone() } else { Env::none() };
        let credentials = Credentials::resolve(
            self.user.as_deref(),
            self.password.as_ref(),
            &url,
            rule,
            (&env, &self.extra),
        )?;
        Ok(Settings {
            url,
            opts: self.opts.clone(),
            credentials,
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            settings: self.extra.clone(),
            env,
        })
    }
}

impl<X: Connect> Builder<X> {
    /// Resolves every setting (reading the environment unless told not to) and connects.
    ///
    /// # Errors
    ///
    /// As the backend's `connect`; and [`Error::InvalidArgument`] for credentials that do not
    /// go together or a password file that cannot be read.
    ///
    /// # Cancel safety
    ///
    /// As the backend's connect: dropping the future leaves nothing behind.
    pub async fn connect(self) -> Result<X::Backend> {
        let settings = self.settings_with(&X::CREDENTIALS, &Env::process())?;
        X::connect(settings).await
    }
}

/// Every setting of a connection as one value: what [`Connect::connect`] is given.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings<X> {
    /// The parsed URL.
    pub url: ConnectionString,
    /// The client options.
    pub opts: ClientOptions,
    /// The credentials, resolved.
    pub credentials: Credentials,
    /// The builder's CA file (over the URL's).
    pub ca_file: Option<PathBuf>,
    /// The builder's client certificate and key (over the URL's).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The backend's own settings.
    pub settings: X,
    /// The environment, for a backend's own variables (off after `ignore_env`).
    pub env: Env,
}

impl<X> Settings<X> {
    /// The TLS files of the URL (`url_files`; `None` for a plain scheme) with the builder's CA
    /// and client certificate over them.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when the builder names a TLS file for a plain URL (`hint` says
    /// what to write, e.g. "write etcds://… (etcd:// is plain http)").
    pub fn tls_files(&self, url_files: Option<TlsFiles>, hint: &str) -> Result<Option<TlsFiles>> {
        if self.ca_file.is_none() && self.client_cert.is_none() {
            return Ok(url_files);
        }
        let Some(mut files) = url_files else {
            return Err(self
                .url
                .invalid(format!("a CA or client certificate needs TLS: {hint}")));
        };
        if let Some(ca) = &self.ca_file {
            files = files.with_ca(ca);
        }
        if let Some((cert, key)) = &self.client_cert {
            files = files.with_client(cert, key);
        }
        Ok(Some(files))
    }
}

/// How a backend connects: implemented by its settings type `X`, so that
/// [`Builder<X>::connect`](Builder::connect) and the [registry](crate::registry::Registry::register_connect)
/// open it from the parsed URL and one [`Settings`] value.
pub trait Connect: Clone + Default + Send + Sync + 'static {
    /// The backend this opens.
    type Backend: Backend + 'static;
    /// Where its credentials come from.
    const CREDENTIALS: CredentialRule;
    /// Connects with everything resolved.
    fn connect(settings: Settings<Self>) -> impl Future<Output = Result<Self::Backend>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: CredentialRule = CredentialRule {
        service: "Thing",
        env_prefix: "T",
        password_needs_user: true,
        ecosystem: None,
    };

    fn env_of(vars: &[(&str, &str)]) -> Env {
        Env::from_pairs(vars)
    }

    fn creds(b: &Builder<()>, env: &Env) -> Result<(Option<String>, Option<String>)> {
        let c = b.settings_with(&RULE, env)?.credentials;
        Ok((c.user, c.password.map(|p| p.expose().to_owned())))
    }

    fn s(x: &str) -> Option<String> {
        Some(x.to_owned())
    }

    #[test]
    fn builder_beats_url_beats_env() {
        let env = env_of(&[("T_USER", "eu"), ("T_PASSWORD", "ep")]);
        let b = Builder::<()>::new("x://h");
        assert_eq!(creds(&b, &env_of(&[])).ok(), Some((None, None)));
        assert_eq!(creds(&b, &env).ok(), Some((s("eu"), s("ep"))));
        assert_eq!(
            creds(&b.clone().ignore_env(), &env).ok(),
            Some((None, None))
        );
        let b = Builder::<()>::new("x://u:p@h");
        assert_eq!(creds(&b, &env).ok(), Some((s("u"), s("p"))));
        assert_eq!(
            creds(&Builder::<()>::new("x://u@h"), &env).ok(),
            Some((s("u"), s("ep")))
        );
        let b = b.credentials("b", "bp");
        assert_eq!(creds(&b, &env).ok(), Some((s("b"), s("bp"))));
    }

    #[test]
    fn halves_and_hooks() {
        let none = env_of(&[]);
        let e = creds(&Builder::<()>::new("x://u@h"), &none)
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("has no password") && e.contains("T_PASSWORD_FILE")),
            "{e:?}"
        );
        let e = creds(&Builder::<()>::new("x://h").password("secret-pw"), &none)
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("but no user") && !e.contains("secret-pw")),
            "{e:?}"
        );
        let e = creds(&Builder::<()>::new("x://h").user(""), &none)
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("user name is empty")),
            "{e:?}"
        );
        let alone = CredentialRule {
            password_needs_user: false,
            ..RULE
        };
        let c = Builder::<()>::new("x://:p@h")
            .settings_with(&alone, &none)
            .map(|s| s.credentials.user);
        assert_eq!(c.ok(), Some(None));
        let hooked = CredentialRule {
            ecosystem: Some(|q| {
                let extra = q.settings.downcast_ref::<()>().map_or("?", |()| "unit");
                Ok(Some(Password::new(format!(
                    "{}-{}-{extra}",
                    q.url.scheme(),
                    q.user.unwrap_or("-")
                ))))
            }),
            ..RULE
        };
        let c = Builder::<()>::new("x://u@h")
            .settings_with(&hooked, &none)
            .map(|s| s.credentials.password);
        assert_eq!(
            c.ok().flatten().map(|p| p.expose().to_owned()),
            s("x-u-unit")
        );
        let quiet = CredentialRule {
            ecosystem: Some(|_| Ok(None)),
            ..RULE
        };
        let c = Builder::<()>::new("x://u@h").settings_with(&quiet, &none);
        assert_eq!(c.ok().map(|s| s.credentials.user), Some(s("u")));
    }

    #[test]
    fn debug_hides_passwords() {
        let b = Builder::<()>::new("x://u:url-secret@h").password("builder-secret");
        let d = format!("{b:?}");
        assert!(
            !d.contains("url-secret") && !d.contains("builder-secret"),
            "{d}"
        );
        let c = b
            .settings_with(&RULE, &Env::none())
            .map(|s| format!("{:?}", s.credentials));
        assert!(c.is_ok_and(|d| !d.contains("secret")));
    }
}
