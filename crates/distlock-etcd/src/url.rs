//! `etcd://[user:password@]host:port[,host:port…][/prefix]`.

use distlock_core::{Error, Result};

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

/// The URL with its password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{hosts}{tail}")
            } else {
                format!("{scheme}://{user}@{hosts}{tail}")
            }
        }
        None => url.to_owned(),
    }
}

/// Decodes `%XX` escapes (as in the user, password and prefix of an `etcd://` URL); `None` for
/// a bad escape or bytes that are not UTF-8. Other characters pass through unchanged.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

pub(crate) fn parse_url(url: &str) -> Result<Target> {
    let bad = |reason: String| Error::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("no scheme; write etcd://host:port".into()))?;
    match scheme {
        "etcd" => {}
        "etcds" => {
            return Err(bad(
                "etcds:// (TLS) is not supported by this version of the etcd backend; \
                 reach etcd over a TLS-terminating proxy or a trusted network with etcd://"
                    .into(),
            ))
        }
        s => return Err(bad(format!("scheme `{s}` is not etcd://"))),
    }
    if rest.contains('?') || rest.contains('#') {
        return Err(bad(
            "the etcd URL takes no parameters; write etcd://host:port[,host:port…][/prefix]".into(),
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (u, p) = userinfo.split_once(':').ok_or_else(|| {
                bad("credentials need both parts: etcd://user:password@host:port".into())
            })?;
            let u =
                percent_decode(u).ok_or_else(|| bad("bad percent-encoding in the user".into()))?;
            let p = percent_decode(p)
                .ok_or_else(|| bad("bad percent-encoding in the password".into()))?;
            if u.is_empty() {
                return Err(bad("empty user name".into()));
            }
            (Some((u, p)), hosts)
        }
        None => (None, authority),
    };
    let mut endpoints = Vec::new();
    let mut shown = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = split_host_port(h).map_err(bad)?;
        endpoints.push(format!("http://{host}:{port}"));
        shown.push(format!("{host}:{port}"));
    }
    let prefix = path.trim_matches('/');
    let prefix = if prefix.is_empty() {
        None
    } else {
        let p = percent_decode(prefix)
            .ok_or_else(|| bad("bad percent-encoding in the prefix".into()))?;
        if p.chars().any(char::is_control) {
            return Err(bad("the prefix must not contain control characters".into()));
        }
        Some(p)
    };
    Ok(Target {
        endpoints,
        display: shown.join(","),
        user,
        prefix,
    })
}

pub(crate) fn split_host_port(h: &str) -> std::result::Result<(String, u16), String> {
    if h.is_empty() {
        return Err("empty host; write etcd://host:port[,host:port…]".into());
    }
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (ip6, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{h}`: unclosed `[` in an IPv6 address"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("`{h}`: expected `:port` after `]`"))?,
            ),
        };
        (format!("[{ip6}]"), port)
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (h.to_owned(), None),
        }
    };
    if host.is_empty() || host.contains(['@', ' ']) {
        return Err(format!("`{h}` is not a valid host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{p}` in `{h}` is not a port number"))?,
    };
    Ok((host, port))
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
