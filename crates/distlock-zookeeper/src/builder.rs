//! [`ZkBuilder`]: the URL plus what should not be in it (the digest password), and where each
//! setting comes from.

use crate::url::{self, ZkUrl};
use crate::{NodeAcl, ZkBackend};
use distlock_core::conn::{redact, resolve_password, Password, PasswordSource};
use distlock_core::{ClientOptions, Error, Result};
use std::fmt;
use std::path::PathBuf;

/// Environment variable with the ZooKeeper digest user, used when neither the builder nor the
/// URL names one.
pub const USER_ENV: &str = "DLOCK_ZK_USER";
/// Environment variable with the digest password, used when neither the builder nor the URL
/// gives one.
pub const PASSWORD_ENV: &str = "DLOCK_ZK_PASSWORD";
/// Environment variable with the path of a file holding the digest password (its first line),
/// used when nothing else gives one. Suits secrets mounted as files.
pub const PASSWORD_FILE_ENV: &str = "DLOCK_ZK_PASSWORD_FILE";

/// Builds a [`ZkBackend`] from a URL and settings that do not belong in it.
///
/// Each setting is taken from the first place that has it:
///
/// | setting | 1. builder | 2. URL | 3. environment |
/// |---|---|---|---|
/// | digest user | [`user`](Self::user) / [`credentials`](Self::credentials) | `zk://USER@…` | `DLOCK_ZK_USER` |
/// | password | [`password`](Self::password) / [`password_file`](Self::password_file) | `zk://user:PASSWORD@…` | `DLOCK_ZK_PASSWORD`, then the file named by `DLOCK_ZK_PASSWORD_FILE` |
/// | ACL of dlock's nodes | [`acl`](Self::acl) | `?acl=open` / `?acl=creator` | — (`open`) |
///
/// [`ignore_env`](Self::ignore_env) turns the environment off. The session authenticates with
/// the `digest` scheme (`addauth digest user:password`, as `zkCli.sh` and Curator's
/// `authorization("digest", …)` do). The password never appears in a message, an error or
/// `Debug` output.
///
/// ZooKeeper does not check a digest password when the session authenticates: a wrong one
/// is simply another identity, refused ([`Error::Auth`]) by the first node whose ACL does not
/// let it in. [`connect`](Self::connect) reads the nearest existing node of the backend's
/// path, so a protected chroot refuses a wrong or missing credential there and then.
///
/// ```no_run
/// # async fn demo() -> distlock_core::Result<()> {
/// use distlock_zookeeper::{NodeAcl, ZkBackend};
/// let backend = ZkBackend::builder("zk://10.0.0.1:2181,10.0.0.2:2181/shop")
///     .user("shop")
///     .password_file("/run/secrets/zk-password")
///     .acl(NodeAcl::Creator)
///     .connect()
///     .await?;
/// let client = distlock_core::Client::new(std::sync::Arc::new(backend), Default::default())?;
/// # let _ = client; Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkBuilder {
    url: String,
    opts: ClientOptions,
    user: Option<String>,
    password: Option<PasswordSource>,
    acl: Option<NodeAcl>,
    env: bool,
}

impl fmt::Debug for ZkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBuilder")
            .field("url", &redact(&self.url))
            .field("user", &self.user)
            .field("password", &self.password)
            .field("acl", &self.acl)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

impl ZkBuilder {
    /// A builder for the ensemble at `url` (`zk://…` or `zks://…`), with default
    /// [`ClientOptions`].
    pub fn new(url: impl Into<String>) -> Self {
        ZkBuilder {
            url: url.into(),
            opts: ClientOptions::default(),
            user: None,
            password: None,
            acl: None,
            env: true,
        }
    }

    /// The client options (namespace, timeouts, watchdog lease).
    pub fn options(mut self, opts: ClientOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The digest user (overrides the URL's and `DLOCK_ZK_USER`).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// The digest password (overrides the URL's and the environment's).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(PasswordSource::Text(Password::new(password)));
        self
    }

    /// Read the digest password from this file when connecting (its first line).
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password = Some(PasswordSource::File(path.into()));
        self
    }

    /// User and password at once.
    pub fn credentials(self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user(user).password(password)
    }

    /// The ACL of the nodes dlock creates (overrides the URL's `acl=`); see [`NodeAcl`].
    pub fn acl(mut self, acl: NodeAcl) -> Self {
        self.acl = Some(acl);
        self
    }

    /// Do not read `DLOCK_ZK_USER`, `DLOCK_ZK_PASSWORD` and `DLOCK_ZK_PASSWORD_FILE`.
    pub fn ignore_env(mut self) -> Self {
        self.env = false;
        self
    }

    pub(crate) fn resolve(&self) -> Result<ZkUrl> {
        self.resolve_with(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    fn resolve_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<ZkUrl> {
        let mut u = url::parse(&self.url)?;
        let env = |k: &str| if self.env { env(k) } else { None };
        if let Some(user) = &self.user {
            u.user = Some(user.clone());
        }
        let from_url = u.password.take();
        u.password = resolve_password(
            self.password.as_ref(),
            from_url,
            env,
            (PASSWORD_ENV, PASSWORD_FILE_ENV),
            "ZooKeeper",
        )?;
        if u.user.is_none() {
            u.user = env(USER_ENV);
        }
        if let Some(a) = self.acl {
            u.acl = Some(a);
        }
        match (&u.user, &u.password) {
            (Some(user), _) if user.is_empty() || user.contains(':') => {
                return Err(Error::invalid(format!(
                    "the ZooKeeper digest user `{user}` must be non-empty and have no `:`"
                )))
            }
            (Some(user), None) => {
                return Err(Error::invalid(format!(
                    "ZooKeeper digest user `{user}` has no password: give it in the URL \
                     (zk://{user}:PASSWORD@…), with ZkBuilder::password or password_file, or in \
                     {PASSWORD_ENV} or a file named by {PASSWORD_FILE_ENV}"
                )))
            }
            (None, Some(_)) => {
                return Err(Error::invalid(format!(
                    "a ZooKeeper password but no digest user: name the user in the URL \
                     (zk://USER:…@…), with ZkBuilder::user, or in {USER_ENV}"
                )))
            }
            _ => {}
        }
        if u.acl == Some(NodeAcl::Creator) && u.user.is_none() {
            return Err(Error::invalid(format!(
                "acl=creator gives dlock's nodes to the session's digest identity, and there is \
                 none: give a user and password (zk://USER:PASSWORD@…, ZkBuilder::credentials, \
                 or {USER_ENV} and {PASSWORD_ENV}), or use acl=open"
            )));
        }
        Ok(u)
    }

    /// Connects (see [`ZkBackend::connect`]).
    ///
    /// # Errors
    ///
    /// As [`ZkBackend::connect`]; and [`Error::InvalidArgument`] for a user without a
    /// password (or the other way round), a password file that cannot be read, or
    /// `acl=creator` without credentials.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`ZkBackend::connect`].
    pub async fn connect(self) -> Result<ZkBackend> {
        let u = self.resolve()?;
        ZkBackend::open(&self.url, u, None, &self.opts).await
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

    fn creds(u: &ZkUrl) -> (Option<&str>, Option<&str>) {
        (u.user.as_deref(), u.password.as_ref().map(|p| p.expose()))
    }

    #[test]
    fn builder_beats_url_beats_env() {
        let none = env_of(&[]);
        let env = env_of(&[(USER_ENV, "envuser"), (PASSWORD_ENV, "envpass")]);
        let b = ZkBuilder::new("zk://h");
        assert_eq!(creds(&b.resolve_with(&none).unwrap()), (None, None));
        assert_eq!(
            creds(&b.resolve_with(&env).unwrap()),
            (Some("envuser"), Some("envpass"))
        );
        assert_eq!(
            creds(&b.clone().ignore_env().resolve_with(&env).unwrap()),
            (None, None)
        );
        let b = ZkBuilder::new("zk://u:p@h");
        assert_eq!(
            creds(&b.resolve_with(&env).unwrap()),
            (Some("u"), Some("p"))
        );
        let b = ZkBuilder::new("zk://u@h");
        assert_eq!(
            creds(&b.resolve_with(&env).unwrap()),
            (Some("u"), Some("envpass"))
        );
        let b = ZkBuilder::new("zk://u:p@h?acl=open")
            .credentials("b", "bp")
            .acl(NodeAcl::Creator);
        let u = b.resolve_with(&env).unwrap();
        assert_eq!(creds(&u), (Some("b"), Some("bp")));
        assert_eq!(u.acl, Some(NodeAcl::Creator));
    }

    #[test]
    fn missing_halves_files_and_acl() {
        let none = env_of(&[]);
        let e = ZkBuilder::new("zk://u@h").resolve_with(&none).unwrap_err();
        assert!(e.to_string().contains("has no password"), "{e}");
        let e = ZkBuilder::new("zk://h")
            .password("secret-pw")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("but no digest user"), "{e}");
        assert!(!e.to_string().contains("secret-pw"), "{e}");
        let e = ZkBuilder::new("zk://h")
            .credentials("a:b", "secret-pw")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("no `:`"), "{e}");
        let e = ZkBuilder::new("zk://h?acl=creator")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("acl=creator"), "{e}");
        let e = ZkBuilder::new("zk://u@h")
            .password_file("/nonexistent/pw")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/pw"), "{e}");
        let dir = std::env::temp_dir().join(format!("dlock-zk-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "from-file\n").unwrap();
        let env = env_of(&[(USER_ENV, "u"), (PASSWORD_FILE_ENV, f.to_str().unwrap())]);
        let u = ZkBuilder::new("zk://h").resolve_with(&env).unwrap();
        assert_eq!(creds(&u), (Some("u"), Some("from-file")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn debug_hides_the_password() {
        let b = ZkBuilder::new("zk://u:url-secret@h").password("builder-secret");
        let d = format!("{b:?}");
        assert!(
            !d.contains("url-secret") && !d.contains("builder-secret"),
            "{d}"
        );
    }
}
