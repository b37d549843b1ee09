//! `etcd://[user[:password]@]host:port[,host:port…][/prefix]`, and
//! `etcds://…[?cacert=PATH][&cert=PATH&key=PATH]` for TLS.

use distlock_core::conn::{self, ConnectionString, Password, TlsFiles};
use distlock_core::Result;

/// Default client port of etcd.
pub(crate) const DEFAULT_PORT: u16 = 2379;

/// The TLS parameters of `etcds://` (`ca_file` is `cacert` as `rediss://` spells it).
const TLS_PARAMS: &[&str] = &["cacert", "ca_file", "cert", "key"];

/// What to write for TLS settings with a plain URL.
pub(crate) const NEEDS_TLS: &str = "write etcds://… (etcd:// is plain http)";

/// What the URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// `host:port` for every member (the scheme is added by the connection: `http://`, or
    /// `https://` with TLS).
    pub(crate) hosts: Vec<String>,
    /// `host:port,host:port` for messages.
    pub(crate) display: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Password>,
    pub(crate) prefix: Option<String>,
    /// `Some` for `etcds://` (the files it names, if any).
    pub(crate) tls: Option<TlsFiles>,
}

/// The URL with its password replaced by `***` (the core's [`conn::redact`]).
pub use distlock_core::conn::redact;

/// Decodes `%XX` escapes (as in the user, password and prefix of an `etcd://` URL); `None` for
/// a bad escape or bytes that are not UTF-8. Other characters pass through unchanged.
pub fn percent_decode(s: &str) -> Option<String> {
    String::from_utf8(conn::percent_decode_strict(s).ok()?).ok()
}

/// Reads an `etcd://` or `etcds://` URL with the core's connection-string parser (which
/// redacts it in every error), then checks what this backend needs: the scheme, only the TLS
/// parameters and only with `etcds://`, a non-empty user name, and a prefix without control
/// characters. A user without a password is accepted: the password may come from the builder
/// or the environment.
#[cfg(test)]
pub(crate) fn parse_url(url: &str) -> Result<Target> {
    from_parsed(ConnectionString::parse(url)?)
}

/// As [`parse_url`], for a URL parsed already.
pub(crate) fn from_parsed(cs: ConnectionString) -> Result<Target> {
    let tls = TlsFiles::of_scheme(&cs, ["etcd", "etcds"], crate::tls::NAMES, NEEDS_TLS)?;
    if cs.fragment().is_some() {
        return Err(cs.invalid("the etcd URL has no #fragment"));
    }
    if let Some((k, _)) = cs
        .params()
        .iter()
        .find(|(k, _)| !TLS_PARAMS.contains(&k.as_str()))
    {
        return Err(cs.invalid(format!(
            "unknown parameter `{k}`: the etcd URL takes only the TLS parameters of etcds:// \
             (cacert, cert, key); write etcd[s]://host:port[,host:port…][/prefix]"
        )));
    }
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
        display: cs.endpoints(DEFAULT_PORT),
        user: cs.user().map(str::to_owned),
        password: cs.password().cloned(),
        prefix: (!prefix.is_empty()).then_some(prefix),
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("etcd://127.0.0.1:1,127.0.0.1:2/shop/a").unwrap();
        assert_eq!(t.hosts, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(t.display, "127.0.0.1:1,127.0.0.1:2");
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
        assert_eq!(tls.ca(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(
            tls.client(),
            Some((
                std::path::Path::new("/c.pem"),
                std::path::Path::new("/c.key")
            ))
        );
        assert_eq!(t.prefix.as_deref(), Some("p"));
        let t = parse_url("etcds://h?ca_file=/ca.pem").unwrap();
        let tls = t.tls.expect("tls");
        assert_eq!(tls.ca(), Some(std::path::Path::new("/ca.pem")));
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
        assert_eq!(redact("etcd://u:secret@h:1/p"), "etcd://u:***@h:1/p");
        assert_eq!(redact("etcd://h:1/p"), "etcd://h:1/p");
    }
}
