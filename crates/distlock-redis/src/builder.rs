//! [`RedisBuilder`]: the URL plus what should not be in it (the password, TLS files), and
//! where each setting comes from.

use crate::address::{self, Address, Route};
use crate::RedisBackend;
use distlock_core::conn::{Builder, Connect, CredentialRule, Credentials, Password, Settings};
use distlock_core::Result;

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

/// Builds a [`RedisBackend`] from a URL and settings that do not belong in it: the core's
/// [`Builder`] with [`RedisSettings`] (its own setters are in [`RedisBuilderExt`]).
///
/// Each setting is taken from the first place that has it:
///
/// | setting | 1. builder | 2. URL | 3. environment |
/// |---|---|---|---|
/// | ACL user | [`user`](Builder::user) | `redis://USER:…@…` | `DLOCK_REDIS_USER` (none: `default`) |
/// | password | [`password`](Builder::password) / [`password_file`](Builder::password_file) | `redis://[user]:PASSWORD@…` | `DLOCK_REDIS_PASSWORD`, then the file named by `DLOCK_REDIS_PASSWORD_FILE` |
/// | CA to trust | [`ca_file`](Builder::ca_file) | `rediss://…?ca_file=PATH` (or `cacert=`) | — (the system's CAs) |
/// | client certificate | [`client_cert`](Builder::client_cert) | `rediss://…?cert=PATH&key=PATH` | — |
/// | sentinels' password | [`sentinel_password`](RedisBuilderExt::sentinel_password) | `redis+sentinel://…?sentinel_password=…` | `DLOCK_REDIS_SENTINEL_PASSWORD` (none: no password) |
///
/// [`ignore_env`](Builder::ignore_env) turns the environment off ([`RedisBackend::connect`], and
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
pub type RedisBuilder = Builder<RedisSettings>;

/// What only Redis takes beside the core [`Builder`]'s settings.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    sentinel_password: Option<Password>,
    /// Subscribe to the sentinels' `+switch-master` (else only failed calls find a failover).
    follow_switches: bool,
}

impl Default for RedisSettings {
    fn default() -> Self {
        RedisSettings {
            sentinel_password: None,
            follow_switches: true,
        }
    }
}

/// The setters of [`RedisBuilder`] that only Redis has.
pub trait RedisBuilderExt {
    /// The sentinels' password for `redis+sentinel://` (their `requirepass`; the master's is
    /// [`password`](Builder::password)), over the URL's `?sentinel_password=` and
    /// [`SENTINEL_PASSWORD_ENV`].
    #[must_use]
    fn sentinel_password(self, password: impl Into<String>) -> Self;

    /// For tests of the reactive path: do not subscribe to the sentinels' `+switch-master`,
    /// so that only failed calls (a connection error, `READONLY`) find a failover.
    #[doc(hidden)]
    #[must_use]
    fn without_switch_subscription(self) -> Self;
}

impl RedisBuilderExt for RedisBuilder {
    fn sentinel_password(self, password: impl Into<String>) -> Self {
        let p = Password::new(password);
        self.map_settings(|s| s.sentinel_password = Some(p))
    }

    fn without_switch_subscription(self) -> Self {
        self.map_settings(|s| s.follow_switches = false)
    }
}

/// The connection settings after the builder, the URL and the environment had their say.
pub(crate) struct Resolved {
    pub(crate) address: Address,
    pub(crate) credentials: Credentials,
    /// Subscribe to the sentinels' `+switch-master` (else only failed calls find a failover).
    pub(crate) follow_switches: bool,
}

impl RedisSettings {
    fn resolve(s: Settings<Self>) -> Result<Resolved> {
        let mut address = address::from_parsed(s.url.clone())?;
        if let Route::Sentinel(sentinels) = &mut address.route {
            let password = &mut sentinels.password;
            if let Some(p) = &s.settings.sentinel_password {
                *password = Some(p.clone());
            } else if password.is_none() {
                *password = s.env.var(SENTINEL_PASSWORD_ENV).map(Password::new);
            }
        } else if s.settings.sentinel_password.is_some() {
            return Err(s
                .url
                .invalid("a sentinel password is for redis+sentinel:// URLs only"));
        }
        address.tls = s.tls_files(
            address.tls.take(),
            "write rediss://… (redis:// is plain text)",
        )?;
        Ok(Resolved {
            address,
            credentials: s.credentials,
            follow_switches: s.settings.follow_switches,
        })
    }
}

impl Connect for RedisSettings {
    type Backend = RedisBackend;
    const CREDENTIALS: CredentialRule = CredentialRule {
        service: "Redis",
        env_prefix: "DLOCK_REDIS",
        password_needs_user: false,
        ecosystem: None,
    };

    async fn connect(settings: Settings<Self>) -> Result<RedisBackend> {
        let opts = settings.opts.clone();
        RedisBackend::open(RedisSettings::resolve(settings)?, &opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::conn::Env;

    fn env_of(vars: &[(&str, &str)]) -> Env {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_fn(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    fn resolve(b: &RedisBuilder, env: &Env) -> Result<Resolved> {
        RedisSettings::resolve(b.settings_with(&RedisSettings::CREDENTIALS, env)?)
    }

    fn creds(b: &RedisBuilder, env: &Env) -> (Option<String>, Option<String>) {
        let r = resolve(b, env).expect("resolve");
        let c = r.credentials;
        (c.user, c.password.map(|p| p.expose().to_owned()))
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
        let err = |b: RedisBuilder| resolve(&b, &none).err().map(|e| e.to_string());
        for (b, needle) in [
            (RedisBuilder::new("redis://h").user("u"), PASSWORD_ENV),
            (
                RedisBuilder::new("redis://h").password_file("/no/such/file"),
                "/no/such/file",
            ),
            (
                RedisBuilder::new("redis://h").ca_file("/ca.pem"),
                "rediss://",
            ),
        ] {
            let e = err(b);
            assert!(e.as_deref().is_some_and(|e| e.contains(needle)), "{e:?}");
        }
    }

    #[test]
    fn sentinel_password_builder_beats_url_beats_env() {
        let env = env_of(&[(SENTINEL_PASSWORD_ENV, "envsp")]);
        let sp = |b: RedisBuilder| match resolve(&b, &env).expect("resolve").address.route {
            Route::Sentinel(s) => s.password.map(|p| p.expose().to_owned()),
            other => panic!("not sentinel: {other:?}"),
        };
        let url = "redis+sentinel://:master@s1/m";
        assert_eq!(sp(RedisBuilder::new(url)), s("envsp"));
        assert_eq!(sp(RedisBuilder::new(url).ignore_env()), None);
        let with = format!("{url}?sentinel_password=urlsp");
        assert_eq!(sp(RedisBuilder::new(&with)), s("urlsp"));
        assert_eq!(
            sp(RedisBuilder::new(&with).sentinel_password("bsp")),
            s("bsp")
        );
        // The master's password stays its own.
        assert_eq!(creds(&RedisBuilder::new(&with), &env).1, s("master"));
        // The environment's sentinel password is ignored for other URLs; the builder's is an error.
        assert!(resolve(&RedisBuilder::new("redis://h"), &env).is_ok());
        let e = resolve(&RedisBuilder::new("redis://h").sentinel_password("x"), &env)
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("redis+sentinel")),
            "{e:?}"
        );
        let d = format!(
            "{:?}",
            RedisBuilder::new(url).sentinel_password("hidden-sp")
        );
        assert!(!d.contains("hidden-sp"), "{d}");
    }
}
