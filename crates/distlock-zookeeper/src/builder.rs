//! [`ZkBuilder`]: the URL —
//! `zk://[user:password@]host:port[,host:port…][/chroot][?namespace=NS&session_timeout=DUR&acl=open|creator]`,
//! and `zks://…?cacert=PATH[&cert=PATH&key=PATH]` for TLS — plus what should not be in it (the
//! digest password), and where each setting comes from.

use crate::{NodeAcl, ZkBackend};
use distlock_core::conn::{
    Builder, Connect, ConnectionString, CredentialRule, Password, Settings, TlsFiles, TlsNames,
};
use distlock_core::{Error, Result};
use std::time::Duration;

/// Default client port of ZooKeeper.
const DEFAULT_PORT: u16 = 2181;

/// What to write for TLS settings with a plain URL.
const NEEDS_TLS: &str = "write zks://… (zk:// is plain)";

/// What the URL says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ZkUrl {
    /// `host:port,host:port` for the driver (no chroot: dlock prefixes paths itself).
    pub(crate) hosts: String,
    /// `/a/b`, or empty for none.
    pub(crate) chroot: String,
    pub(crate) namespace: Option<String>,
    pub(crate) session_timeout: Option<Duration>,
    /// `zks://`: the PEM files of the TLS settings.
    pub(crate) tls: Option<TlsFiles>,
    /// The digest user of `zk://USER:…@…` (or, once resolved, of the builder or environment).
    pub(crate) user: Option<String>,
    /// Its password (`Debug` shows `***`).
    pub(crate) password: Option<Password>,
    /// `acl=`: the ACL of the nodes dlock creates (`None`: not in the URL).
    pub(crate) acl: Option<NodeAcl>,
}

impl ZkUrl {
    /// `hosts` plus the chroot, for messages.
    pub(crate) fn endpoint(&self) -> String {
        format!("{}{}", self.hosts, self.chroot)
    }
}

/// Reads a `zk://` or `zks://` URL with the core's parser (which redacts it in every error),
/// then checks a chroot of plain segments outside `/zookeeper` and the known parameters.
pub(crate) fn parse(url: &str) -> Result<ZkUrl> {
    from_url(&ConnectionString::parse(url)?)
}

/// As [`parse`], for a URL parsed already.
fn from_url(cs: &ConnectionString) -> Result<ZkUrl> {
    let tls = TlsFiles::of_scheme(cs, ["zk", "zks"], TlsNames::CACERT, NEEDS_TLS)?;
    let user = cs.user().map(str::to_owned);
    if user.as_deref() == Some("") {
        return Err(cs.invalid("the digest user name before `@` is empty"));
    }
    let password = cs.password().cloned();
    if cs.hosts().is_empty() {
        return Err(cs.invalid("no host; write zk://host:port[,host:port…][/chroot]"));
    }
    if cs.fragment().is_some() {
        return Err(cs.invalid("a zk:// URL takes no `#fragment`"));
    }
    let chroot = cs.raw_path().trim_end_matches('/');
    if !chroot.is_empty() {
        for seg in chroot[1..].split('/') {
            if seg.is_empty() || seg == "." || seg == ".." {
                return Err(cs.invalid(format!(
                    "chroot `{chroot}` has an empty, `.` or `..` segment"
                )));
            }
            if seg.chars().any(char::is_control) {
                return Err(cs.invalid(format!("chroot `{chroot}` has a control character")));
            }
        }
        if chroot == "/zookeeper" || chroot.starts_with("/zookeeper/") {
            return Err(cs.invalid("/zookeeper is reserved by ZooKeeper itself"));
        }
    }
    cs.check_params(&[
        "namespace",
        "session_timeout",
        "acl",
        "cacert",
        "cert",
        "key",
    ])?;
    let namespace = match cs.param("namespace") {
        Some("") => return Err(cs.invalid("namespace must not be empty")),
        other => other.map(str::to_owned),
    };
    let session_timeout = cs.duration("session_timeout")?;
    if session_timeout.is_some_and(|d| d < Duration::from_millis(100)) {
        return Err(cs.invalid(
            "session_timeout is too short; ZooKeeper needs at least two ticks (typically 4s)",
        ));
    }
    let acl = cs.choice("acl", &["open", "creator"])?.map(|a| match a {
        "creator" => NodeAcl::Creator,
        _ => NodeAcl::Open,
    });
    Ok(ZkUrl {
        hosts: cs.endpoints(DEFAULT_PORT),
        chroot: chroot.to_owned(),
        namespace,
        session_timeout,
        tls,
        user,
        password,
        acl,
    })
}

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
/// the `digest` scheme, as `zkCli.sh` and Curator do; the password never appears in a message,
/// an error or `Debug` output. ZooKeeper does not check it at authentication (a wrong one is
/// another identity), so [`connect`](Builder::connect) reads the nearest existing node of the
/// backend's path: a protected chroot refuses a wrong or missing credential ([`Error::Auth`]).
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
        let mut u = from_url(&s.url)?;
        u.user = s.credentials.user.clone();
        u.password = s.credentials.password.clone();
        if let Some(a) = s.settings.acl {
            u.acl = Some(a);
        }
        u.tls = s.tls_files(u.tls.take(), NEEDS_TLS)?;
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
    use std::path::Path;

    #[test]
    fn good_urls() {
        let u = parse("zk://127.0.0.1:2181").unwrap();
        assert_eq!(u.hosts, "127.0.0.1:2181");
        assert_eq!(u.chroot, "");
        let u = parse("zk://a:1,b:2,c/app/locks/?namespace=shop&session_timeout=10s").unwrap();
        assert_eq!(u.hosts, "a:1,b:2,c:2181");
        assert_eq!(u.chroot, "/app/locks");
        assert_eq!(u.namespace.as_deref(), Some("shop"));
        assert_eq!(u.session_timeout, Some(Duration::from_secs(10)));
        assert_eq!(u.endpoint(), "a:1,b:2,c:2181/app/locks");
        assert_eq!(parse("zk://[::1]:7/x").unwrap().hosts, "[::1]:7");
        assert_eq!(parse("zk://a").unwrap().tls, None);
        let u = parse("zks://a:1,b/app?cacert=/c.pem&cert=/u.pem&key=/u.key").unwrap();
        assert_eq!(u.hosts, "a:1,b:2181");
        assert_eq!(u.chroot, "/app");
        let tls = u.tls.unwrap();
        assert_eq!(tls.ca(), Some(Path::new("/c.pem")));
        assert_eq!(
            tls.client(),
            Some((Path::new("/u.pem"), Path::new("/u.key")))
        );
        let u = parse("zk://shop:s%40cret@a/app?acl=creator").unwrap();
        assert_eq!(u.user.as_deref(), Some("shop"));
        assert_eq!(u.password.as_ref().map(|p| p.expose()), Some("s@cret"));
        assert_eq!(u.acl, Some(NodeAcl::Creator));
        assert!(!format!("{u:?}").contains("cret"));
        assert_eq!(parse("zk://a?acl=open").unwrap().acl, Some(NodeAcl::Open));
        let u = parse("zks://a?cacert=/c.pem&namespace=n").unwrap();
        assert_eq!(u.tls.unwrap().client(), None);
    }

    #[test]
    fn bad_urls() {
        for (url, want) in [
            ("redis://h", "zk://"),
            ("zk://a?cacert=/c.pem", "zks://"),
            ("zks://a?cacert=", "is empty"),
            ("zks://a?cacert=/c&cert=/u.pem", "add `&key=PATH`"),
            ("zks://a?cacert=/c&key=/u.key", "add `&cert=PATH`"),
            ("zks://a?cacert=/c&sslmode=x", "unknown parameter"),
            ("zk://", "no host"),
            ("zk://a:1,,b:2", "empty entry"),
            ("zk://a:x", "not a port"),
            ("zk://a:0", "not a port"),
            ("zk://:p@a:1", "user name"),
            ("zk://a?acl=all", "acl=`all`"),
            ("zk://a//b", "empty"),
            ("zk://a/../b", "segment"),
            ("zk://a/zookeeper", "reserved"),
            ("zk://a?nope=1", "unknown parameter"),
            ("zk://a?namespace=", "empty"),
            ("zk://a?session_timeout=1ms", "too short"),
            ("zk://a?session_timeout=abc", "session"),
        ] {
            let e = parse(url).expect_err(url).to_string();
            assert!(e.contains(want), "{url}: {e}");
        }
    }

    use distlock_core::conn::Env;

    fn resolve(b: &ZkBuilder, env: &Env) -> Result<ZkUrl> {
        ZkSettings::resolve(&b.settings_with(&ZkSettings::RULE, env)?)
    }

    fn creds(u: &ZkUrl) -> (Option<&str>, Option<&str>) {
        (u.user.as_deref(), u.password.as_ref().map(|p| p.expose()))
    }

    #[test]
    fn builder_beats_url_beats_env() {
        let none = Env::from_pairs(&[]);
        let env = Env::from_pairs(&[(USER_ENV, "envuser"), (PASSWORD_ENV, "envpass")]);
        let b = ZkBuilder::new;
        for (b, env, want) in [
            (b("zk://h"), &none, (None, None)),
            (b("zk://h"), &env, (Some("envuser"), Some("envpass"))),
            (b("zk://h").ignore_env(), &env, (None, None)),
            (b("zk://u:p@h"), &env, (Some("u"), Some("p"))),
            (b("zk://u@h"), &env, (Some("u"), Some("envpass"))),
            (
                b("zk://u:p@h").credentials("b", "bp"),
                &env,
                (Some("b"), Some("bp")),
            ),
        ] {
            assert_eq!(creds(&resolve(&b, env).unwrap()), want);
        }
        let b = b("zk://h?acl=open").acl(NodeAcl::Creator);
        let u = resolve(&b, &env).unwrap();
        assert_eq!(u.acl, Some(NodeAcl::Creator));
    }

    #[test]
    fn missing_halves_files_and_acl() {
        let none = Env::from_pairs(&[]);
        let b = ZkBuilder::new;
        for (b, want) in [
            (b("zk://u@h"), "has no password"),
            (b("zk://h").password("secret-pw"), "but no user"),
            (b("zk://h").credentials("a:b", "secret-pw"), "no `:`"),
            (b("zk://h?acl=creator"), "acl=creator"),
            (
                b("zk://u@h").password_file("/nonexistent/pw"),
                "/nonexistent/pw",
            ),
            (b("zks://h"), "`?cacert=PATH`"),
            (b("zk://h").ca_file("/ca.pem"), "zks://"),
        ] {
            let e = resolve(&b, &none).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains("secret-pw"), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("dlock-zk-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, "from-file\n").unwrap();
        let env = Env::from_pairs(&[(USER_ENV, "u"), (PASSWORD_FILE_ENV, f.to_str().unwrap())]);
        let u = resolve(&ZkBuilder::new("zk://h"), &env).unwrap();
        assert_eq!(creds(&u), (Some("u"), Some("from-file")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tls_files_from_the_builder() {
        let u = ZkBuilder::new("zks://h?cacert=/url.pem")
            .ca_file("/b.pem")
            .client_cert("/c", "/k");
        let tls = resolve(&u, &Env::from_pairs(&[])).unwrap().tls.unwrap();
        assert_eq!(tls.ca(), Some(Path::new("/b.pem")));
        assert_eq!(tls.client(), Some((Path::new("/c"), Path::new("/k"))));
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
