//! [`ZkBuilder`]: the URL plus what should not be in it (the digest password), and where each
//! setting comes from.

use crate::url::{self, ZkUrl};
use crate::{NodeAcl, ZkBackend};
use distlock_core::conn::{Builder, Connect, CredentialRule, Settings};
use distlock_core::{Error, Result};

/// Environment variable with the ZooKeeper digest user, used when neither the builder nor the
/// URL names one.
pub const USER_ENV: &str = "DLOCK_ZK_USER";
/// Environment variable with the digest password, used when neither the builder nor the URL
/// gives one.
pub const PASSWORD_ENV: &str = "DLOCK_ZK_PASSWORD";
/// Environment variable with the path of a file holding the digest password (its first line),
/// used when nothing else gives one. Suits secrets mounted as files.
pub const PASSWORD_FILE_ENV: &str = "DLOCK_ZK_PASSWORD_FILE";

/// Builds a [`ZkBackend`] from a URL and settings that do not belong in it: the core's
/// [`Builder`] with [`ZkSettings`] (its own setter is in [`ZkBuilderExt`]).
///
/// Each setting is taken from the first place that has it:
///
/// | setting | 1. builder | 2. URL | 3. environment |
/// |---|---|---|---|
/// | digest user | [`user`](Builder::user) / [`credentials`](Builder::credentials) | `zk://USER@…` | `DLOCK_ZK_USER` |
/// | password | [`password`](Builder::password) / [`password_file`](Builder::password_file) | `zk://user:PASSWORD@…` | `DLOCK_ZK_PASSWORD`, then the file named by `DLOCK_ZK_PASSWORD_FILE` |
/// | ACL of dlock's nodes | [`acl`](ZkBuilderExt::acl) | `?acl=open` / `?acl=creator` | — (`open`) |
/// | CA to trust (`zks://`) | [`ca_file`](Builder::ca_file) | `zks://…?cacert=PATH` | — (required) |
/// | client certificate (`zks://`) | [`client_cert`](Builder::client_cert) | `zks://…?cert=PATH&key=PATH` | — |
///
/// [`ignore_env`](Builder::ignore_env) turns the environment off. The session authenticates with
/// the `digest` scheme (`addauth digest user:password`, as `zkCli.sh` and Curator's
/// `authorization("digest", …)` do). The password never appears in a message, an error or
/// `Debug` output.
///
/// ZooKeeper does not check a digest password when the session authenticates: a wrong one
/// is simply another identity, refused ([`Error::Auth`]) by the first node whose ACL does not
/// let it in. [`connect`](Builder::connect) reads the nearest existing node of the backend's
/// path, so a protected chroot refuses a wrong or missing credential there and then.
///
/// ```no_run
/// # async fn demo() -> distlock_core::Result<()> {
/// use distlock_zookeeper::{NodeAcl, ZkBackend, ZkBuilderExt};
/// let backend = ZkBackend::builder("zk://10.0.0.1:2181,10.0.0.2:2181/shop")
///     .user("shop")
///     .password_file("/run/secrets/zk-password")
///     .acl(NodeAcl::Creator)
///     .connect()
///     .await?;
/// let client = distlock_core::Client::new(std::sync::Arc::new(backend), Default::default())?;
/// # let _ = client; Ok(()) }
/// ```
pub type ZkBuilder = Builder<ZkSettings>;

/// What only ZooKeeper takes beside the core [`Builder`]'s settings.
#[derive(Debug, Clone, Default)]
pub struct ZkSettings {
    acl: Option<NodeAcl>,
}

/// The setter of [`ZkBuilder`] that only ZooKeeper has.
pub trait ZkBuilderExt {
    /// The ACL of the nodes dlock creates (overrides the URL's `acl=`); see [`NodeAcl`].
    #[must_use]
    fn acl(self, acl: NodeAcl) -> Self;
}

impl ZkBuilderExt for ZkBuilder {
    fn acl(self, acl: NodeAcl) -> Self {
        self.map_settings(|s| s.acl = Some(acl))
    }
}

impl ZkSettings {
    const RULE: CredentialRule = CredentialRule {
        service: "ZooKeeper digest",
        env_prefix: "DLOCK_ZK",
        password_needs_user: true,
        ecosystem: None,
    };

    fn resolve(s: &Settings<Self>) -> Result<ZkUrl> {
        let mut u = url::from_parsed(s.url.clone())?;
        u.user = s.credentials.user.clone();
        u.password = s.credentials.password.clone();
        if let Some(a) = s.settings.acl {
            u.acl = Some(a);
        }
        u.tls = s.tls_files(u.tls.take(), url::NEEDS_TLS)?;
        if u.tls.as_ref().is_some_and(|t| t.ca().is_none()) {
            return Err(s.url.invalid(
                "zks:// needs `?cacert=PATH` (or the builder's ca_file), the PEM file of the CA \
                 that signed the servers' certificates (the driver has no system roots)",
            ));
        }
        if let Some(user) = u.user.as_deref().filter(|u| u.contains(':')) {
            return Err(Error::invalid(format!(
                "the ZooKeeper digest user `{user}` must be non-empty and have no `:`"
            )));
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
}

impl Connect for ZkSettings {
    type Backend = ZkBackend;
    const CREDENTIALS: CredentialRule = ZkSettings::RULE;

    async fn connect(settings: Settings<Self>) -> Result<ZkBackend> {
        let u = ZkSettings::resolve(&settings)?;
        ZkBackend::open(settings.url.redacted(), u, None, &settings.opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::conn::Env;

    fn env_of(vars: &[(&str, &str)]) -> Env {
        Env::from_pairs(vars)
    }

    trait ResolveWith {
        fn resolve_with(&self, env: &Env) -> Result<ZkUrl>;
    }

    impl ResolveWith for ZkBuilder {
        fn resolve_with(&self, env: &Env) -> Result<ZkUrl> {
            ZkSettings::resolve(&self.settings_with(&ZkSettings::RULE, env)?)
        }
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
        assert!(e.to_string().contains("but no user"), "{e}");
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
    fn tls_files_from_the_builder() {
        let none = env_of(&[]);
        let e = ZkBuilder::new("zks://h").resolve_with(&none).unwrap_err();
        assert!(e.to_string().contains("`?cacert=PATH`"), "{e}");
        let e = ZkBuilder::new("zk://h")
            .ca_file("/ca.pem")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("zks://"), "{e}");
        let u = ZkBuilder::new("zks://h?cacert=/url.pem")
            .ca_file("/b.pem")
            .client_cert("/c", "/k")
            .resolve_with(&none)
            .unwrap();
        let tls = u.tls.unwrap();
        assert_eq!(tls.ca(), Some(std::path::Path::new("/b.pem")));
        assert_eq!(
            tls.client(),
            Some((std::path::Path::new("/c"), std::path::Path::new("/k")))
        );
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
