//! `zk://host:port[,host:port…][/chroot][?namespace=NS&session_timeout=DUR]`.

use distlock_core::{Error, Result};
use std::time::Duration;

/// Default client port of ZooKeeper.
pub(crate) const DEFAULT_PORT: u16 = 2181;

/// What the URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZkUrl {
    /// `host:port,host:port` for the driver (no chroot: dlock prefixes paths itself).
    pub(crate) hosts: String,
    /// `/a/b`, or empty for none.
    pub(crate) chroot: String,
    pub(crate) namespace: Option<String>,
    pub(crate) session_timeout: Option<Duration>,
}

impl ZkUrl {
    /// `hosts` plus the chroot, for messages.
    pub(crate) fn endpoint(&self) -> String {
        format!("{}{}", self.hosts, self.chroot)
    }
}

pub(crate) fn parse(url: &str) -> Result<ZkUrl> {
    let bad = |reason: String| Error::InvalidUrl {
        url: url.to_owned(),
        reason,
    };
    let rest = url
        .strip_prefix("zk://")
        .ok_or_else(|| bad("the scheme must be zk://".into()))?;
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, chroot) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(bad(
            "credentials in the URL are not supported by the ZooKeeper backend; use ACLs on the chroot instead".into(),
        ));
    }
    let mut hosts = Vec::new();
    for entry in authority.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(bad(
                "no host; write zk://host:port[,host:port…][/chroot]".into()
            ));
        }
        let (host, port) = split_host_port(entry).map_err(bad)?;
        if host.contains(':') {
            hosts.push(format!("[{host}]:{port}"));
        } else {
            hosts.push(format!("{host}:{port}"));
        }
    }
    let chroot = chroot.trim_end_matches('/');
    if !chroot.is_empty() {
        for seg in chroot[1..].split('/') {
            if seg.is_empty() || seg == "." || seg == ".." {
                return Err(bad(format!(
                    "chroot `{chroot}` has an empty, `.` or `..` segment"
                )));
            }
            if seg.chars().any(char::is_control) {
                return Err(bad(format!("chroot `{chroot}` has a control character")));
            }
        }
        if chroot == "/zookeeper" || chroot.starts_with("/zookeeper/") {
            return Err(bad("/zookeeper is reserved by ZooKeeper itself".into()));
        }
    }
    let mut out = ZkUrl {
        hosts: hosts.join(","),
        chroot: chroot.to_owned(),
        namespace: None,
        session_timeout: None,
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "namespace" => {
                if v.is_empty() {
                    return Err(bad("namespace must not be empty".into()));
                }
                out.namespace = Some(v.to_owned());
            }
            "session_timeout" => {
                let d = distlock_core::parse_duration(v)
                    .map_err(|e| bad(format!("session_timeout={v}: {e}")))?;
                if d < Duration::from_millis(100) {
                    return Err(bad(format!(
                        "session_timeout={v} is too short; ZooKeeper needs at least two ticks (typically 4s)"
                    )));
                }
                out.session_timeout = Some(d);
            }
            other => {
                return Err(bad(format!(
                    "unknown parameter `{other}` (known: namespace, session_timeout)"
                )))
            }
        }
    }
    Ok(out)
}

fn split_host_port(entry: &str) -> std::result::Result<(&str, u16), String> {
    // [v6]:port, [v6], host:port, host
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{entry}`: unclosed `[`"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(format!("`{entry}`: expected `:port` after `]`")),
        };
        (h, port)
    } else {
        match entry.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err(format!("`{entry}` is not host:port"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{p}` in `{entry}` is not a port number"))?,
    };
    Ok((host, port))
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
    }

    #[test]
    fn bad_urls() {
        for (url, want) in [
            ("redis://h", "zk://"),
            ("zk://", "no host"),
            ("zk://a:1,,b:2", "no host"),
            ("zk://a:x", "not a port"),
            ("zk://a:0", "not a port"),
            ("zk://u:p@a:1", "credentials"),
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
