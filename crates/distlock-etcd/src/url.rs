//! `etcd://[user:password@]host:port[,host:port…][/prefix]`.

use distlock_core::conn::{self, ConnectionString};
use distlock_core::Result;

/// Default client port of etcd.
pub(crate) const DEFAULT_PORT: u16 = 2379;

/// What the URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// `http://host:port` for every member.
    pub(crate) endpoints: Vec<String>,
    /// `host:port,host:port` for messages.
    pub(crate) display: String,
    pub(crate) user: Option<(String, String)>,
    pub(crate) prefix: Option<String>,
}

/// The URL with its password replaced by `***` (the core's [`conn::redact`]).
pub fn redact(url: &str) -> String {
    conn::redact(url)
}

/// Decodes `%XX` escapes (as in the user, password and prefix of an `etcd://` URL); `None` for
/// a bad escape or bytes that are not UTF-8. Other characters pass through unchanged.
pub fn percent_decode(s: &str) -> Option<String> {
    String::from_utf8(conn::percent_decode_strict(s).ok()?).ok()
}

/// Reads an `etcd://` URL with the core's connection-string parser (which redacts it in every
/// error), then checks what this backend needs: the scheme, no parameters, a user with a
/// password, and a prefix without control characters.
pub(crate) fn parse_url(url: &str) -> Result<Target> {
    let cs = ConnectionString::parse(url)?;
    match cs.scheme() {
        "etcd" => {}
        "etcds" => {
            return Err(cs.invalid(
                "etcds:// (TLS) is not supported by this version of the etcd backend; \
                 reach etcd over a TLS-terminating proxy or a trusted network with etcd://",
            ))
        }
        s => return Err(cs.invalid(format!("scheme `{s}` is not etcd://"))),
    }
    if !cs.params().is_empty() || cs.fragment().is_some() {
        return Err(cs.invalid(
            "the etcd URL takes no parameters; write etcd://host:port[,host:port…][/prefix]",
        ));
    }
    let user = match (cs.user(), cs.password()) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(cs.invalid("credentials need both parts: etcd://user:password@host:port"))
        }
        (Some(""), Some(_)) => return Err(cs.invalid("empty user name")),
        (Some(u), Some(p)) => Some((u.to_owned(), p.expose().to_owned())),
    };
    if cs.hosts().is_empty() {
        return Err(cs.invalid("empty host; write etcd://host:port[,host:port…]"));
    }
    let endpoints = cs
        .hosts()
        .iter()
        .map(|h| format!("http://{}", h.endpoint(DEFAULT_PORT)))
        .collect();
    // Trimmed before decoding, so an escaped `/` (`%2F`) at either end stays in the prefix.
    let prefix = percent_decode(cs.raw_path().trim_matches('/'))
        .ok_or_else(|| cs.invalid("bad percent-encoding in the prefix"))?;
    if prefix.chars().any(char::is_control) {
        return Err(cs.invalid("the prefix must not contain control characters"));
    }
    Ok(Target {
        endpoints,
        display: cs.endpoints(DEFAULT_PORT),
        user,
        prefix: (!prefix.is_empty()).then_some(prefix),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("etcd://127.0.0.1:1,127.0.0.1:2/shop/a").unwrap();
        assert_eq!(t.endpoints, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert_eq!(t.display, "127.0.0.1:1,127.0.0.1:2");
        assert_eq!(t.prefix.as_deref(), Some("shop/a"));
        assert_eq!(t.user, None);
        let t = parse_url("etcd://u:p%40ss@h").unwrap();
        assert_eq!(t.endpoints, ["http://h:2379"]);
        assert_eq!(t.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(t.prefix, None);
        let t = parse_url("etcd://[::1]:5,[::1]/").unwrap();
        assert_eq!(t.endpoints, ["http://[::1]:5", "http://[::1]:2379"]);
        for bad in [
            "etcd://",
            "etcd://h:1,",
            "etcd://h:x",
            "etcd://h:0",
            "etcd://h?x=1",
            "etcd://u@h",
            "etcd://:p@h",
            "etcds://h",
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
