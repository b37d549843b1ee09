//! [`EtcdBuilder`]: the URL — `etcd://[user[:password]@]host:port[,host:port…][/prefix]`, and
//! `etcds://…[?cacert=PATH][&cert=PATH&key=PATH]` for TLS — plus what should not be in it (the
//! password, TLS files), and where each setting comes from.

use crate::EtcdBackend;
use distlock_core::conn::{
    self, Builder, Connect, ConnectionString, CredentialRule, Password, Settings, TlsFiles,
};
use distlock_core::Result;

/// Default client port of etcd.
const DEFAULT_PORT: u16 = 2379;

/// What to write for TLS settings with a plain URL.
const NEEDS_TLS: &str = "write etcds://… (etcd:// is plain http)";

/// What the URL says, and once resolved what the builder and the environment add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// `host:port` for every member (the scheme is added by the connection: `http://`, or
    /// `https://` with TLS).
    pub(crate) hosts: Vec<String>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Password>,
    pub(crate) prefix: Option<String>,
    /// `Some` for `etcds://` (the files it names, if any).
    pub(crate) tls: Option<TlsFiles>,
}

/// Decodes `%XX` escapes (as in the user, password and prefix of an `etcd://` URL); `None` for
/// a bad escape or bytes that are not UTF-8. Other characters pass through unchanged.
pub fn percent_decode(s: &str) -> Option<String> {
    String::from_utf8(conn::percent_decode_strict(s).ok()?).ok()
}

/// Reads an `etcd://` or `etcds://` URL parsed by the core (which redacts it in every error):
/// the scheme, only the TLS parameters and only with `etcds://`, a non-empty user name, and a
/// prefix without control characters. A user without a password is accepted: the password may
/// come from the builder or the environment.
fn from_url(cs: &ConnectionString) -> Result<Target> {
    let tls = TlsFiles::of_scheme(cs, ["etcd", "etcds"], crate::tls::NAMES, NEEDS_TLS)?;
    if cs.fragment().is_some() {
        return Err(cs.invalid("the etcd URL has no #fragment"));
    }
    cs.check_params(&["cacert", "ca_file", "cert", "key"])?;
    if cs.user() == Some("") {
        return Err(cs.invalid("empty user name"));
    }
    if cs.user().is_none() && cs.password().is_some() {
        return Err(cs.invalid("a password without a user"));
    }
    if cs.hosts().is_empty() {
        return Err(cs.invalid("empty host; write etcd://host:port[,host:port…]"));
    }
    let hosts = cs
        .hosts()
        .iter()
        .map(|h| h.endpoint(DEFAULT_PORT))
        .collect();
    // Trimmed before decoding, so an escaped `/` (`%2F`) at either end stays in the prefix.
    let prefix = percent_decode(cs.raw_path().trim_matches('/'))
        .ok_or_else(|| cs.invalid("bad percent-encoding in the prefix"))?;
    if prefix.chars().any(char::is_control) {
        return Err(cs.invalid("the prefix must not contain control characters"));
    }
    Ok(Target {
        hosts,
        user: cs.user().map(str::to_owned),
        password: cs.password().cloned(),
        prefix: (!prefix.is_empty()).then_some(prefix),
        tls,
    })
}

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
/// Each setting is taken from the first place that has it: the builder, the URL, the
/// environment (`DLOCK_ETCD_*`; [`ignore_env`](Builder::ignore_env) turns it off);
/// docs/etcd.md, *Credentials outside the URL*, has the table. The password never appears in a
/// message, an error or `Debug` output.
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

/// The URL and every setting, resolved: the target with the user, password and TLS files it
/// will use.
fn resolve(s: &Settings<EtcdSettings>) -> Result<Target> {
    let mut t = from_url(&s.url)?;
    t.user = s.credentials.user.clone();
    t.password = s.credentials.password.clone();
    t.tls = s.tls_files(t.tls.take(), NEEDS_TLS)?;
    Ok(t)
}

impl Connect for EtcdSettings {
    type Backend = EtcdBackend;
    const CREDENTIALS: CredentialRule = CredentialRule {
        service: "etcd",
        env_prefix: "DLOCK_ETCD",
        password_needs_user: true,
        ecosystem: None,
    };

    async fn connect(settings: Settings<Self>) -> Result<EtcdBackend> {
        let target = resolve(&settings)?;
        EtcdBackend::open(settings.url.redacted(), target, &settings.opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse_url(url: &str) -> Result<Target> {
        from_url(&ConnectionString::parse(url)?)
    }

    #[test]
    fn urls() {
        let t = parse_url("etcd://127.0.0.1:1,127.0.0.1:2/shop/a").unwrap();
        assert_eq!(t.hosts, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(t.prefix.as_deref(), Some("shop/a"));
        assert_eq!(t.user, None);
        assert_eq!(t.tls, None);
        let t = parse_url("etcd://u:p%40ss@h").unwrap();
        assert_eq!(t.hosts, ["h:2379"]);
        assert_eq!(t.user.as_deref(), Some("u"));
        assert_eq!(t.password.as_ref().map(|p| p.expose()), Some("p@ss"));
        assert_eq!(t.prefix, None);
        let t = parse_url("etcd://u@h").unwrap();
        assert_eq!((t.user.as_deref(), t.password), (Some("u"), None));
        let t = parse_url("etcd://[::1]:5,[::1]/").unwrap();
        assert_eq!(t.hosts, ["[::1]:5", "[::1]:2379"]);
        let t = parse_url("etcds://h/p?cacert=/ca.pem&cert=/c.pem&key=/c.key").unwrap();
        let tls = t.tls.expect("tls");
        assert_eq!(tls.ca(), Some(Path::new("/ca.pem")));
        assert_eq!(
            tls.client(),
            Some((Path::new("/c.pem"), Path::new("/c.key")))
        );
        assert_eq!(t.prefix.as_deref(), Some("p"));
        let t = parse_url("etcds://h?ca_file=/ca.pem").unwrap();
        let tls = t.tls.expect("tls");
        assert_eq!(tls.ca(), Some(Path::new("/ca.pem")));
        assert_eq!(
            parse_url("etcds://h").unwrap().tls,
            Some(TlsFiles::new(crate::tls::NAMES))
        );
        for (bad, says) in [
            ("etcd://h?cacert=/x", "etcds://"),
            ("etcds://h?cert=/x", "add `&key=PATH`"),
            ("etcds://h?sslmode=require", "unknown parameter `sslmode`"),
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        for bad in [
            "etcd://",
            "etcd://h:1,",
            "etcd://h:x",
            "etcd://h:0",
            "etcd://h?x=1",
            "etcd://:p@h",
            "etcd://h#f",
            "http://h",
            "nothing",
            "etcd://[::1",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let e = parse_url("etcd://u:secret@h:x").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(conn::redact("etcd://u:secret@h:1/p"), "etcd://u:***@h:1/p");
        assert_eq!(conn::redact("etcd://h:1/p"), "etcd://h:1/p");
    }
    use distlock_core::conn::Env;

    fn resolve_with(b: &EtcdBuilder, env: &[(&str, &str)]) -> Result<Target> {
        let env = Env::from_pairs(env);
        resolve(&b.settings_with(&EtcdSettings::CREDENTIALS, &env)?)
    }

    fn creds(t: &Target) -> (Option<&str>, Option<&str>) {
        (t.user.as_deref(), t.password.as_ref().map(|p| p.expose()))
    }

    #[test]
    fn builder_beats_url_beats_env() {
        let env = [(USER_ENV, "envuser"), (PASSWORD_ENV, "envpass")];
        let b = EtcdBuilder::new;
        for (builder, env, want) in [
            (b("etcd://h"), &[][..], (None, None)),
            (b("etcd://h"), &env, (Some("envuser"), Some("envpass"))),
            (b("etcd://h").ignore_env(), &env, (None, None)),
            (b("etcd://u:p@h"), &env, (Some("u"), Some("p"))),
            (b("etcd://u@h"), &env, (Some("u"), Some("envpass"))),
            (
                b("etcd://u:p@h").credentials("b", "bp"),
                &env,
                (Some("b"), Some("bp")),
            ),
        ] {
            assert_eq!(
                creds(&resolve_with(&builder, env).unwrap()),
                want,
                "{builder:?}"
            );
        }
    }

    #[test]
    fn missing_halves_and_files() {
        let b = EtcdBuilder::new;
        for (builder, says) in [
            (b("etcd://u@h"), "has no password"),
            (b("etcd://h").password("secret-pw"), "but no user"),
            (
                b("etcd://u@h").password_file("/nonexistent/pw"),
                "/nonexistent/pw",
            ),
            (b("etcd://h").ca_file("/ca.pem"), "etcds://"),
        ] {
            let e = resolve_with(&builder, &[]).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains("secret-pw"), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("dlock-etcd-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "from-file\n").unwrap();
        let env = [(PASSWORD_FILE_ENV, f.to_str().unwrap())];
        let t = resolve_with(&b("etcd://u@h"), &env).unwrap();
        assert_eq!(creds(&t), (Some("u"), Some("from-file")));
        let t = resolve_with(&b("etcd://h").user("x").password_file(&f), &[]).unwrap();
        assert_eq!(creds(&t), (Some("x"), Some("from-file")));
        let _ = std::fs::remove_dir_all(&dir);
        let t = b("etcds://h?cacert=/url.pem")
            .ca_file("/b.pem")
            .client_cert("/c", "/k");
        let tls = resolve_with(&t, &[]).unwrap().tls.unwrap();
        assert_eq!(tls.ca(), Some(Path::new("/b.pem")));
        assert_eq!(tls.client(), Some((Path::new("/c"), Path::new("/k"))));
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
