//! [`RedisBuilder`]: the URL plus what should not be in it (the password, TLS files), and
//! where each setting comes from.

use crate::address::{self, redact, Address};
use crate::RedisBackend;
use distlock_core::conn::{resolve_password, Password, PasswordSource};
use distlock_core::{ClientOptions, Error, Result};
use std::fmt;
use std::path::PathBuf;

/// Environment variable with the Redis password, used when neither the builder nor the URL
/// gives one.
pub const PASSWORD_ENV: &str = "DLOCK_REDIS_PASSWORD";
/// Environment variable with the path of a file holding the Redis password (its first line),
/// used when nothing else gives one. Suits secrets mounted as files (Kubernetes, systemd
/// credentials).
pub const PASSWORD_FILE_ENV: &str = "DLOCK_REDIS_PASSWORD_FILE";
/// Environment variable with the password of the sentinels of `redis+sentinel://` (their
/// `requirepass`, not the master's), used when neither the builder nor the URL's
/// `?sentinel_password=` gives one.
pub const SENTINEL_PASSWORD_ENV: &str = "DLOCK_REDIS_SENTINEL_PASSWORD";
/// Environment variable with the Redis ACL user name, used when neither the builder nor the
/// URL names one (none: the `default` user).
pub const USER_ENV: &str = "DLOCK_REDIS_USER";

/// Builds a [`RedisBackend`] from a URL and settings that do not belong in it.
///
/// Each setting is taken from the first place that has it:
///
/// | setting | 1. builder | 2. URL | 3. environment |
/// |---|---|---|---|
/// | ACL user | [`user`](Self::user) | `redis://USER:…@…` | `DLOCK_REDIS_USER` (none: `default`) |
/// | password | [`password`](Self::password) / [`password_file`](Self::password_file) | `redis://[user]:PASSWORD@…` | `DLOCK_REDIS_PASSWORD`, then the file named by `DLOCK_REDIS_PASSWORD_FILE` |
/// | CA to trust | [`ca_file`](Self::ca_file) | `rediss://…?ca_file=PATH` (or `cacert=`) | — (the system's CAs) |
/// | client certificate | [`client_cert`](Self::client_cert) | `rediss://…?cert=PATH&key=PATH` | — |
/// | sentinels' password | [`sentinel_password`](Self::sentinel_password) | `redis+sentinel://…?sentinel_password=…` | `DLOCK_REDIS_SENTINEL_PASSWORD` (none: no password) |
///
/// [`ignore_env`](Self::ignore_env) turns the environment off ([`RedisBackend::connect`], and
/// so `distlock::connect` and the CLI, read it). A user without a password is an error. The
/// password never appears in a message, an error or `Debug` output.
///
/// ```no_run
/// # async fn demo() -> distlock_core::Result<()> {
/// use distlock_redis::RedisBackend;
/// let backend = RedisBackend::builder("rediss://redis.internal:6380/0")
///     .user("locks")
///     .password_file("/run/secrets/redis-password")
///     .ca_file("/etc/redis/ca.pem")
///     .client_cert("/etc/redis/client.pem", "/etc/redis/client.key")
///     .connect()
///     .await?;
/// let client = distlock_core::Client::new(std::sync::Arc::new(backend), Default::default())?;
/// # let _ = client; Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBuilder {
    url: String,
    opts: ClientOptions,
    user: Option<String>,
    password: Option<PasswordSource>,
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    sentinel_password: Option<Password>,
    follow_switches: bool,
    env: bool,
}

impl fmt::Debug for RedisBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("url", &redact(&self.url))
            .field("user", &self.user)
            .field("password", &self.password)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("sentinel_password", &self.sentinel_password)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

/// The connection settings after the builder, the URL and the environment had their say.
pub(crate) struct Resolved {
    pub(crate) address: Address,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Password>,
    /// Subscribe to the sentinels' `+switch-master` (else only failed calls find a failover).
    pub(crate) follow_switches: bool,
}

impl RedisBuilder {
    /// A builder for the server at `url` (`redis://…` or `rediss://…`), with default
    /// [`ClientOptions`].
    pub fn new(url: impl Into<String>) -> Self {
        RedisBuilder {
            url: url.into(),
            opts: ClientOptions::default(),
            user: None,
            password: None,
            ca_file: None,
            client_cert: None,
            sentinel_password: None,
            follow_switches: true,
            env: true,
        }
    }

    /// The client options (timeouts, namespace) the backend is made for.
    pub fn options(mut self, opts: ClientOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The ACL user (over the URL's).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// The password (over the URL's and the environment's).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(PasswordSource::Text(Password::new(password)));
        self
    }

    /// A file whose first line is the password (over the URL's and the environment's); read
    /// when connecting.
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password = Some(PasswordSource::File(path.into()));
        self
    }

    /// The CA to trust for `rediss://` (over the URL's `ca_file=`/`cacert=`): only it is
    /// trusted, not the system's CAs.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// A client certificate and its (unencrypted PEM) key for `rediss://`, for servers with
    /// `tls-auth-clients yes` (over the URL's `cert=`/`key=`).
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// The sentinels' password for `redis+sentinel://` (their `requirepass`; the master's is
    /// [`password`](Self::password)), over the URL's `?sentinel_password=` and
    /// [`SENTINEL_PASSWORD_ENV`].
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(Password::new(password));
        self
    }

    /// For tests of the reactive path: do not subscribe to the sentinels' `+switch-master`,
    /// so that only failed calls (a connection error, `READONLY`) find a failover.
    #[doc(hidden)]
    pub fn without_switch_subscription(mut self) -> Self {
        self.follow_switches = false;
        self
    }

    /// Do not read `DLOCK_REDIS_USER`, `DLOCK_REDIS_PASSWORD`, `DLOCK_REDIS_PASSWORD_FILE` or
    /// `DLOCK_REDIS_SENTINEL_PASSWORD`.
    pub fn ignore_env(mut self) -> Self {
        self.env = false;
        self
    }

    pub(crate) fn resolve(&self) -> Result<Resolved> {
        self.resolve_with(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    fn resolve_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<Resolved> {
        let mut address = address::parse(&self.url)?;
        let env = |k: &str| if self.env { env(k) } else { None };
        let (url_user, url_password) = (
            address
                .conn
                .user()
                .filter(|u| !u.is_empty())
                .map(str::to_owned),
            address.conn.password().cloned(),
        );
        let user = match &self.user {
            Some(u) if u.is_empty() => return Err(Error::invalid("the Redis user name is empty")),
            Some(u) => Some(u.clone()),
            None => url_user.or_else(|| env(USER_ENV)),
        };
        let password = resolve_password(
            self.password.as_ref(),
            url_password,
            env,
            (PASSWORD_ENV, PASSWORD_FILE_ENV),
            "Redis",
        )?;
        if let (Some(u), None) = (&user, &password) {
            return Err(Error::invalid(format!(
                "Redis user `{u}` has no password: give it in the URL (redis://{u}:PASSWORD@…), \
                 with RedisBuilder::password or password_file, or in {PASSWORD_ENV} or a file \
                 named by {PASSWORD_FILE_ENV}"
            )));
        }
        if address.sentinel.is_some() {
            if let Some(p) = &self.sentinel_password {
                address.sentinel_password = Some(p.clone());
            } else if address.sentinel_password.is_none() {
                address.sentinel_password = env(SENTINEL_PASSWORD_ENV).map(Password::new);
            }
        } else if self.sentinel_password.is_some() {
            return Err(Error::invalid_url(
                redact(&self.url),
                "a sentinel password is for redis+sentinel:// URLs only",
            ));
        }
        if self.ca_file.is_some() || self.client_cert.is_some() {
            if !address.driver_url.starts_with("rediss:") {
                return Err(Error::invalid_url(
                    redact(&self.url),
                    "a CA or client certificate needs TLS: write rediss://… (redis:// is plain text)",
                ));
            }
            if let Some(ca) = &self.ca_file {
                address.tls = address.tls.clone().with_ca(ca);
            }
            if let Some((c, k)) = &self.client_cert {
                address.tls = address.tls.clone().with_client(c, k);
            }
        }
        Ok(Resolved {
            address,
            user,
            password,
            follow_switches: self.follow_switches,
        })
    }

    /// Connects (see [`RedisBackend::connect`]).
    ///
    /// # Errors
    /// As [`RedisBackend::connect`]; and [`Error::InvalidArgument`] for a user without a
    /// password or a password file that cannot be read.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`RedisBackend::connect`].
    pub async fn connect(self) -> Result<RedisBackend> {
        let resolved = self.resolve()?;
        RedisBackend::open(resolved, &self.opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn creds(
        b: &RedisBuilder,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> (Option<String>, Option<String>) {
        let r = b.resolve_with(env).expect("resolve");
        (r.user, r.password.map(|p| p.expose().to_owned()))
    }

    fn s(x: &str) -> Option<String> {
        Some(x.to_owned())
    }

    #[test]
    fn builder_beats_url_beats_env() {
        let none = env_of(&[]);
        let env = env_of(&[(USER_ENV, "envuser"), (PASSWORD_ENV, "envpass")]);
        let b = RedisBuilder::new("redis://h");
        assert_eq!(creds(&b, &none), (None, None));
        assert_eq!(creds(&b, &env), (s("envuser"), s("envpass")));
        assert_eq!(creds(&b.clone().ignore_env(), &env), (None, None));
        let b = RedisBuilder::new("redis://:p@h");
        assert_eq!(creds(&b, &env), (s("envuser"), s("p")));
        let b = RedisBuilder::new("redis://u:p@h");
        assert_eq!(creds(&b, &env), (s("u"), s("p")));
        let b = RedisBuilder::new("redis://u:p@h").user("b").password("bp");
        assert_eq!(creds(&b, &env), (s("b"), s("bp")));
        let only_pw = env_of(&[(PASSWORD_ENV, "envpass")]);
        assert_eq!(
            creds(&RedisBuilder::new("redis://h"), &only_pw),
            (None, s("envpass"))
        );
    }

    #[test]
    fn user_without_password_and_bad_files() {
        let none = env_of(&[]);
        let e = RedisBuilder::new("redis://h")
            .user("u")
            .resolve_with(&none)
            .err()
            .expect("no password");
        assert!(e.to_string().contains(PASSWORD_ENV), "{e}");
        let e = RedisBuilder::new("redis://h")
            .password_file("/no/such/file")
            .resolve_with(&none)
            .err()
            .expect("no file");
        assert!(e.to_string().contains("/no/such/file"), "{e}");
        let e = RedisBuilder::new("redis://h")
            .ca_file("/ca.pem")
            .resolve_with(&none)
            .err()
            .expect("plain");
        assert!(e.to_string().contains("rediss://"), "{e}");
    }

    #[test]
    fn sentinel_password_builder_beats_url_beats_env() {
        let env = env_of(&[(SENTINEL_PASSWORD_ENV, "envsp")]);
        let sp = |b: &RedisBuilder| {
            b.resolve_with(&env)
                .expect("resolve")
                .address
                .sentinel_password
                .map(|p| p.expose().to_owned())
        };
        let url = "redis+sentinel://:master@s1/m";
        assert_eq!(sp(&RedisBuilder::new(url)), s("envsp"));
        assert_eq!(sp(&RedisBuilder::new(url).ignore_env()), None);
        let with = format!("{url}?sentinel_password=urlsp");
        assert_eq!(sp(&RedisBuilder::new(&with)), s("urlsp"));
        assert_eq!(
            sp(&RedisBuilder::new(&with).sentinel_password("bsp")),
            s("bsp")
        );
        // The master's password stays its own.
        assert_eq!(creds(&RedisBuilder::new(&with), &env).1, s("master"));
        // The environment's sentinel password is ignored for other URLs; the builder's is an error.
        assert!(RedisBuilder::new("redis://h").resolve_with(&env).is_ok());
        let e = RedisBuilder::new("redis://h")
            .sentinel_password("x")
            .resolve_with(&env)
            .err()
            .expect("not a sentinel URL");
        assert!(e.to_string().contains("redis+sentinel"), "{e}");
        let d = format!(
            "{:?}",
            RedisBuilder::new(url).sentinel_password("hidden-sp")
        );
        assert!(!d.contains("hidden-sp"), "{d}");
    }

    #[test]
    fn debug_hides_the_password() {
        let b = RedisBuilder::new("redis://u:urlsecret@h").password("buildersecret");
        let d = format!("{b:?}");
        assert!(
            !d.contains("urlsecret") && !d.contains("buildersecret"),
            "{d}"
        );
    }
}
