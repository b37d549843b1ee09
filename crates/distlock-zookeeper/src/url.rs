//! `zk://[user:password@]host:port[,host:port…][/chroot][?namespace=NS&session_timeout=DUR&acl=open|creator]`,
//! and `zks://…?cacert=PATH[&cert=PATH&key=PATH]` for TLS.

use crate::NodeAcl;
use distlock_core::conn::{ConnectionString, Password, TlsFiles, TlsNames};
use distlock_core::Result;
use std::time::Duration;

/// Default client port of ZooKeeper.
pub(crate) const DEFAULT_PORT: u16 = 2181;

/// What to write for TLS settings with a plain URL.
pub(crate) const NEEDS_TLS: &str = "write zks://… (zk:// is plain)";

/// What the URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Reads a `zk://` or `zks://` URL with the core's connection-string parser (which also
/// redacts it in every error), then checks what ZooKeeper needs: no credentials, a chroot of
/// plain segments outside `/zookeeper`, and the known parameters (the TLS ones only with
/// `zks://`).
pub(crate) fn parse(url: &str) -> Result<ZkUrl> {
    from_parsed(ConnectionString::parse(url)?)
}

/// As [`parse`], for a URL parsed already.
pub(crate) fn from_parsed(cs: ConnectionString) -> Result<ZkUrl> {
    let tls = TlsFiles::of_scheme(&cs, ["zk", "zks"], TlsNames::CACERT, NEEDS_TLS)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(tls.ca(), Some(std::path::Path::new("/c.pem")));
        assert_eq!(
            tls.client(),
            Some((
                std::path::Path::new("/u.pem"),
                std::path::Path::new("/u.key")
            ))
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
}
