//! [`EtcdBuilder`]: the URL plus what should not be in it (the password, TLS files), and
//! where each setting comes from.

use crate::url::{self, Target};
use crate::EtcdBackend;
use distlock_core::conn::{Builder, Connect, CredentialRule, Settings};
use distlock_core::Result;

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

/// Builds an [`EtcdBackend`] from a URL and settings that do not belong in it: the core's
/// [`Builder`] with [`EtcdSettings`].
///
/// Each setting is taken from the first place that has it:
///
/// | setting | 1. builder | 2. URL | 3. environment |
/// |---|---|---|---|
/// | user | [`user`](Builder::user) / [`credentials`](Builder::credentials) | `etcd://USER@…` | `DLOCK_ETCD_USER` |
/// | password | [`password`](Builder::password) / [`password_file`](Builder::password_file) | `etcd://user:PASSWORD@…` | `DLOCK_ETCD_PASSWORD`, then the file named by `DLOCK_ETCD_PASSWORD_FILE` |
/// | CA to trust | [`ca_file`](Builder::ca_file) | `etcds://…?cacert=PATH` | — (the system's CAs) |
/// | client certificate | [`client_cert`](Builder::client_cert) | `etcds://…?cert=PATH&key=PATH` | — |
///
/// [`ignore_env`](Builder::ignore_env) turns the environment off. A password is only sent with
/// a user; a password without one is an error. The password never appears in a message, an
/// error or `Debug` output.
///
/// ```no_run
/// # async fn demo() -> distlock_core::Result<()> {
/// use distlock_etcd::EtcdBackend;
/// let backend = EtcdBackend::builder("etcds://10.0.0.1:2379,10.0.0.2:2379/shop")
///     .user("shop")
///     .password_file("/run/secrets/etcd-password")
///     .ca_file("/etc/etcd/ca.pem")
///     .client_cert("/etc/etcd/client.pem", "/etc/etcd/client.key")
///     .connect()
///     .await?;
/// let client = distlock_core::Client::new(std::sync::Arc::new(backend), Default::default())?;
/// # let _ = client; Ok(()) }
/// ```
pub type EtcdBuilder = Builder<EtcdSettings>;

/// etcd's part of [`EtcdBuilder`]: none beside the core [`Builder`]'s settings.
#[derive(Debug, Clone, Default)]
pub struct EtcdSettings;

impl EtcdSettings {
    const RULE: CredentialRule = CredentialRule {
        service: "etcd",
        env_prefix: "DLOCK_ETCD",
        password_needs_user: true,
        ecosystem: None,
    };

    /// The URL and every setting, resolved: the target with the user, password and TLS files
    /// it will use.
    fn resolve(s: &Settings<Self>) -> Result<Target> {
        let mut t = url::from_parsed(s.url.clone())?;
        t.user = s.credentials.user.clone();
        t.password = s.credentials.password.clone();
        t.tls = s.tls_files(t.tls.take(), url::NEEDS_TLS)?;
        Ok(t)
    }
}

impl Connect for EtcdSettings {
    type Backend = EtcdBackend;
    const CREDENTIALS: CredentialRule = EtcdSettings::RULE;

    async fn connect(settings: Settings<Self>) -> Result<EtcdBackend> {
        let target = EtcdSettings::resolve(&settings)?;
        EtcdBackend::open(settings.url.redacted(), target, &settings.opts).await
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
        fn resolve_with(&self, env: &Env) -> Result<Target>;
    }

    impl ResolveWith for EtcdBuilder {
        fn resolve_with(&self, env: &Env) -> Result<Target> {
            EtcdSettings::resolve(&self.settings_with(&EtcdSettings::RULE, env)?)
        }
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
            .ca_file("/ca.pem")
            .resolve_with(&none)
            .unwrap_err();
        assert!(e.to_string().contains("etcds://"), "{e}");
        let t = EtcdBuilder::new("etcds://h?cacert=/url.pem")
            .ca_file("/b.pem")
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
