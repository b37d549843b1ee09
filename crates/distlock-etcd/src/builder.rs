//! [`EtcdBuilder`]: the URL plus what should not be in it (the password, TLS files), and
//! where each setting comes from.

use crate::url::{parse_url, redact, Target};
use crate::EtcdBackend;
use distlock_core::conn::{resolve_password, Password, PasswordSource};
use distlock_core::{ClientOptions, Error, Result};
use std::fmt;
use std::path::PathBuf;

/// Environment variable with the etcd user name, used when neither the builder nor the URL
/// names a user.
pub const USER_ENV: &str = "DLOCK_ETCD_USER";
/// Environment variable with the etcd password, used when neither the builder nor the URL
/// gives one.
pub const PASSWORD_ENV: &str = "DLOCK_ETCD_PASSWORD";
/// Environment variable with the path of a file holding the etcd password (one line; a
/// trailing newline is dropped), used when nothing else gives one. Suits secrets mounted as
/// files (Kubernetes, systemd credentials).
pub const PASSWORD_FILE_ENV: &str = "DLOCK_ETCD_PASSWORD_FILE";

/// Builds an [`EtcdBackend`] from a URL and settings that do not belong in it.
///
/// Each setting is taken from the first place that has it:
///
/// | setting | 1. builder | 2. URL | 3. environment |
/// |---|---|---|---|
/// | user | [`user`](Self::user) / [`credentials`](Self::credentials) | `etcd://USER@…` | `DLOCK_ETCD_USER` |
/// | password | [`password`](Self::password) / [`password_file`](Self::password_file) | `etcd://user:PASSWORD@…` | `DLOCK_ETCD_PASSWORD`, then the file named by `DLOCK_ETCD_PASSWORD_FILE` |
/// | CA to trust | [`cacert`](Self::cacert) | `etcds://…?cacert=PATH` | — (the system's CAs) |
/// | client certificate | [`client_cert`](Self::client_cert) | `etcds://…?cert=PATH&key=PATH` | — |
///
/// [`ignore_env`](Self::ignore_env) turns the environment off. A password is only sent with
/// a user; a password without one is an error. The password never appears in a message, an
/// error or `Debug` output.
///
/// ```no_run
/// # async fn demo() -> distlock_core::Result<()> {
/// use distlock_etcd::EtcdBackend;
/// let backend = EtcdBackend::builder("etcds://10.0.0.1:2379,10.0.0.2:2379/shop")
///     .user("shop")
///     .password_file("/run/secrets/etcd-password")
///     .cacert("/etc/etcd/ca.pem")
///     .client_cert("/etc/etcd/client.pem", "/etc/etcd/client.key")
///     .connect()
///     .await?;
/// let client = distlock_core::Client::new(std::sync::Arc::new(backend), Default::default())?;
/// # let _ = client; Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdBuilder {
    url: String,
    opts: ClientOptions,
    user: Option<String>,
    password: Option<PasswordSource>,
    cacert: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    env: bool,
}

impl fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBuilder")
            .field("url", &redact(&self.url))
            .field("user", &self.user)
            .field("password", &self.password)
            .field("cacert", &self.cacert)
            .field("client_cert", &self.client_cert)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

impl EtcdBuilder {
    /// A builder for the cluster at `url` (`etcd://…` or `etcds://…`), with default
    /// [`ClientOptions`].
    pub fn new(url: impl Into<String>) -> Self {
        EtcdBuilder {
            url: url.into(),
            opts: ClientOptions::default(),
            user: None,
            password: None,
            cacert: None,
            client_cert: None,
            env: true,
        }
    }

    /// The client options (namespace = default prefix, timeouts, watchdog lease).
    pub fn options(mut self, opts: ClientOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The etcd user (overrides the URL's and `DLOCK_ETCD_USER`).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// The password (overrides the URL's and the environment's).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(PasswordSource::Text(Password::new(password)));
        self
    }

    /// Read the password from this file when connecting (its first line).
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password = Some(PasswordSource::File(path.into()));
        self
    }

    /// User and password at once.
    pub fn credentials(self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user(user).password(password)
    }

    /// Trust the CA certificates in this PEM file (instead of the system's). Needs an
    /// `etcds://` URL.
    pub fn cacert(mut self, path: impl Into<PathBuf>) -> Self {
        self.cacert = Some(path.into());
        self
    }

    /// Show this client certificate and key (PEM files) to servers that ask for one
    /// (`--client-cert-auth`). Needs an `etcds://` URL.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Do not read `DLOCK_ETCD_USER`, `DLOCK_ETCD_PASSWORD` and `DLOCK_ETCD_PASSWORD_FILE`.
    pub fn ignore_env(mut self) -> Self {
        self.env = false;
        self
    }

    /// The URL and every setting, resolved: the target with the user, password and TLS files
    /// it will use.
    pub(crate) fn resolve(&self) -> Result<Target> {
        self.resolve_with(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    fn resolve_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<Target> {
        let mut t = parse_url(&self.url)?;
        let env = |k: &str| if self.env { env(k) } else { None };
        if let Some(u) = &self.user {
            if u.is_empty() {
                return Err(Error::invalid("the etcd user name is empty"));
            }
            t.user = Some(u.clone());
        }
        let from_url = t.password.take();
        t.password = resolve_password(
            self.password.as_ref(),
            from_url,
            env,
            (PASSWORD_ENV, PASSWORD_FILE_ENV),
            "etcd",
        )?;
        if t.user.is_none() {
            t.user = env(USER_ENV);
        }
        match (&t.user, &t.password) {
            (Some(u), None) => {
                return Err(Error::invalid(format!(
                    "etcd user `{u}` has no password: give it in the URL \
                     (etcd://{u}:PASSWORD@…), with EtcdBuilder::password or password_file, or \
                     in {PASSWORD_ENV} or a file named by {PASSWORD_FILE_ENV}"
                )))
            }
            (None, Some(_)) => {
                return Err(Error::invalid(format!(
                    "an etcd password but no user: name the user in the URL \
                     (etcd://USER:…@…), with EtcdBuilder::user, or in {USER_ENV}"
                )))
            }
            _ => {}
        }
        if self.cacert.is_some() || self.client_cert.is_some() {
            let Some(tls) = t.tls.as_mut() else {
                return Err(Error::invalid_url(
                    redact(&self.url),
                    "a CA or client certificate needs TLS: write etcds://… (etcd:// is plain http)",
                ));
            };
            if let Some(ca) = &self.cacert {
                *tls = tls.clone().with_ca(ca);
            }
            if let Some((cert, key)) = &self.client_cert {
                *tls = tls.clone().with_client(cert, key);
            }
        }
        Ok(t)
    }

    /// Connects (see [`EtcdBackend::connect`]).
    ///
    /// # Errors
    ///
    /// As [`EtcdBackend::connect`]; and [`Error::InvalidArgument`] for a user without a
    /// password (or the other way round), or a password file that cannot be read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`EtcdBackend::connect`].
    pub async fn connect(self) -> Result<EtcdBackend> {
        let target = self.resolve()?;
        EtcdBackend::open(&self.url, target, &self.opts).await
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

    fn creds(t: &Target) -> (Option<&str>, Option<&str>) {
        (t.user.as_deref(), t.password.as_ref().map(|p| p.expose()))
    }

    #[test]
    fn builder_beats_url_beats_env() {
        let none = env_of(&[]);
        let env = env_of(&[(USER_ENV, "envuser"), (PASSWORD_ENV, "envpass")]);
        let b = EtcdBuilder::new("etcd://h");
        assert_eq!(creds(&b.resolve_with(&none).unwrap()), (None, None));
        assert_eq!(
            creds(&b.resolve_with(&env).unwrap()),
            (Some("envuser"), Some("envpass"))
        );
        assert_eq!(
            creds(&b.clone().ignore_env().resolve_with(&env).unwrap()),
            (None, None)
        );
        let b = EtcdBuilder::new("etcd://u:p@h");
        assert_eq!(
            creds(&b.resolve_with(&env).unwrap()),
            (Some("u"), Some("p"))
        );
        let b = EtcdBuilder::new("etcd://u@h");
        assert_eq!(
            creds(&b.resolve_with(&env).unwrap()),
            (Some("u"), Some("envpass"))
        );
        let b = EtcdBuilder::new("etcd://u:p@h").credentials("b", "bp");
        assert_eq!(
            creds(&b.resolve_with(&env).unwrap()),
            (Some("b"), Some("bp"))
        );
    }

    #[test]
    fn missing_halves_and_files() {
        let none = env_of(&[]);
        let e = EtcdBuilder::new("etcd://u@h")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("has no password"), "{e}");
        let e = EtcdBuilder::new("etcd://h")
            .password("secret-pw")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("but no user"), "{e}");
        assert!(!e.to_string().contains("secret-pw"), "{e}");
        let e = EtcdBuilder::new("etcd://u@h")
            .password_file("/nonexistent/pw")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/pw"), "{e}");
        let dir = std::env::temp_dir().join(format!("dlock-etcd-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "from-file\n").unwrap();
        let env = env_of(&[(PASSWORD_FILE_ENV, f.to_str().unwrap())]);
        let t = EtcdBuilder::new("etcd://u@h").resolve_with(&env).unwrap();
        assert_eq!(creds(&t), (Some("u"), Some("from-file")));
        let t = EtcdBuilder::new("etcd://h")
            .user("x")
            .password_file(&f)
            .resolve_with(&none)
            .unwrap();
        assert_eq!(creds(&t), (Some("x"), Some("from-file")));
        let _ = std::fs::remove_dir_all(&dir);
        let e = EtcdBuilder::new("etcd://h")
            .cacert("/ca.pem")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("etcds://"), "{e}");
        let t = EtcdBuilder::new("etcds://h?cacert=/url.pem")
            .cacert("/b.pem")
            .client_cert("/c", "/k")
            .resolve_with(&none)
            .unwrap();
        let tls = t.tls.unwrap();
        assert_eq!(tls.ca(), Some(std::path::Path::new("/b.pem")));
        assert_eq!(
            tls.client(),
            Some((std::path::Path::new("/c"), std::path::Path::new("/k")))
        );
    }

    #[test]
    fn debug_hides_the_password() {
        let b = EtcdBuilder::new("etcd://u:url-secret@h").password("builder-secret");
        let d = format!("{b:?}");
        assert!(
            !d.contains("url-secret") && !d.contains("builder-secret"),
            "{d}"
        );
    }
}
