//! The `redlock://` URL.

use distlock_core::{ClientOptions, Error, Result};
use std::time::Duration;

/// Per-node timeout when the URL does not set one (capped at a tenth of the watchdog lease).
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// How often each node's process and data are checked when the URL does not say.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Fewest nodes Redlock is useful with.
pub const MIN_NODES: usize = 3;

/// One node: the URL its `RedisBackend` connects with, and `host:port` for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeAddr {
    pub(crate) url: String,
    pub(crate) endpoint: String,
}

/// Everything the URL says.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) nodes: Vec<NodeAddr>,
    pub(crate) node_timeout: Duration,
    /// `None`: the longest lease in use (the watchdog lease, or a longer fixed lease seen).
    pub(crate) quarantine: Option<Duration>,
    pub(crate) check_interval: Duration,
}

/// The URL with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = match userinfo.split_once(':') {
                Some((u, _)) => format!("{u}:***"),
                None => userinfo.to_owned(),
            };
            format!("{scheme}://{user}@{hosts}{tail}")
        }
        None => url.to_owned(),
    }
}

pub(crate) fn parse(url: &str, opts: &ClientOptions) -> Result<Config> {
    let redacted = redact(url);
    let bad = |reason: String| Error::InvalidUrl {
        url: redacted.clone(),
        reason,
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        bad("no scheme; write redlock://host1:port1,host2:port2,host3:port3".into())
    })?;
    let node_scheme = match scheme {
        "redlock" => "redis",
        // Each node is reached with rediss://; distlock-redis says so if TLS is not built in.
        "redlocks" => "rediss",
        other => {
            return Err(bad(format!(
                "scheme `{other}` is not redlock:// or redlocks://"
            )))
        }
    };
    let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match main.find('/') {
        Some(i) => (&main[..i], &main[i + 1..]),
        None => (main, ""),
    };
    if !path.is_empty() && path.parse::<u32>().is_err() {
        return Err(bad(format!(
            "`/{path}` is not a database number; write redlock://h1:p1,h2:p2,h3:p3/0"
        )));
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut endpoints: Vec<String> = Vec::new();
    for h in hosts.split(',') {
        let h = h.trim();
        if h.is_empty() {
            return Err(bad(
                "an empty node in the list; write redlock://host1:port1,host2:port2,host3:port3"
                    .into(),
            ));
        }
        let has_port = match h.rfind(']') {
            Some(close) => h[close..].contains(':'),
            None => h.contains(':'),
        };
        let ep = if has_port {
            h.to_owned()
        } else {
            format!("{h}:6379")
        };
        if endpoints.contains(&ep) {
            return Err(bad(format!(
                "node `{ep}` is listed twice; Redlock needs independent nodes"
            )));
        }
        endpoints.push(ep);
    }
    if endpoints.len() < MIN_NODES {
        return Err(bad(format!(
            "Redlock needs at least {MIN_NODES} independent Redis nodes (an odd number such as 3 or 5 is best); \
             {} given. For one server use redis://",
            endpoints.len()
        )));
    }

    let mut node_timeout = None;
    let mut quarantine = None;
    let mut check_interval = DEFAULT_CHECK_INTERVAL;
    let mut pass = Vec::new();
    let duration = |k: &str, v: &str| {
        distlock_core::parse_duration(v).map_err(|e| bad(format!("{k}=`{v}`: {e}")))
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "node_timeout" => node_timeout = Some(duration(k, v)?),
            "quarantine" => quarantine = Some(duration(k, v)?),
            "check_interval" => check_interval = duration(k, v)?,
            "namespace" | "protocol" => pass.push(pair),
            "ca_file" if node_scheme == "rediss" => pass.push(pair),
            other => {
                return Err(bad(format!(
                    "unknown parameter `{other}` (known: namespace, node_timeout, quarantine, \
                     check_interval, protocol; ca_file with redlocks://)"
                )))
            }
        }
    }

    let lease = opts.get_watchdog_lease();
    let node_timeout = match node_timeout {
        None => DEFAULT_NODE_TIMEOUT.min(lease / 10),
        Some(t) if t.is_zero() => {
            return Err(bad(
                "node_timeout=0 would never wait for a node; give e.g. 50ms".into(),
            ))
        }
        Some(t) if t > lease / 3 => {
            return Err(bad(format!(
                "node_timeout={t:?} is not far below the watchdog lease {lease:?}: renewals run \
                 every lease/3, and a grant is valid only for lease - time spent; use at most {:?}",
                lease / 3
            )))
        }
        Some(t) => t,
    };
    if let Some(q) = quarantine {
        if q > distlock_core::MAX_LEASE {
            return Err(bad(format!(
                "quarantine={q:?} is longer than the 30-day lease limit"
            )));
        }
    }
    if check_interval < Duration::from_millis(10) || check_interval > Duration::from_secs(60) {
        return Err(bad(format!(
            "check_interval={check_interval:?} must be between 10ms and 60s"
        )));
    }

    let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let path = if path.is_empty() {
        String::new()
    } else {
        format!("/{path}")
    };
    let query = if pass.is_empty() {
        String::new()
    } else {
        format!("?{}", pass.join("&"))
    };
    let nodes = endpoints
        .into_iter()
        .map(|ep| NodeAddr {
            url: format!("{node_scheme}://{user}{ep}{path}{query}"),
            endpoint: ep,
        })
        .collect();
    Ok(Config {
        nodes,
        node_timeout,
        quarantine,
        check_interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ClientOptions {
        ClientOptions::default()
    }

    #[test]
    fn parses_nodes_and_options() {
        let c = parse(
            "redlock://u:p%40ss@a:1,b:2,c?namespace=shop&node_timeout=20ms&quarantine=1m",
            &opts(),
        )
        .unwrap();
        let urls: Vec<&str> = c.nodes.iter().map(|n| n.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "redis://u:p%40ss@a:1?namespace=shop",
                "redis://u:p%40ss@b:2?namespace=shop",
                "redis://u:p%40ss@c:6379?namespace=shop"
            ]
        );
        assert_eq!(c.nodes[2].endpoint, "c:6379");
        assert_eq!(c.node_timeout, Duration::from_millis(20));
        assert_eq!(c.quarantine, Some(Duration::from_secs(60)));
        assert_eq!(
            redact("redlock://u:p%40ss@a:1,b:2?x=1"),
            "redlock://u:***@a:1,b:2?x=1"
        );
        let c = parse(
            "redlocks://[::1]:7000,[::1]:7001,[::1]/3?ca_file=/x",
            &opts(),
        )
        .unwrap();
        assert_eq!(c.nodes[0].url, "rediss://[::1]:7000/3?ca_file=/x");
        assert_eq!(c.nodes[2].endpoint, "[::1]:6379");
        assert_eq!(c.node_timeout, DEFAULT_NODE_TIMEOUT);
        assert_eq!(c.quarantine, None);
    }

    #[test]
    fn default_node_timeout_follows_short_leases() {
        let o = opts().watchdog_lease(Duration::from_millis(300));
        let c = parse("redlock://a:1,b:1,c:1", &o).unwrap();
        assert_eq!(c.node_timeout, Duration::from_millis(30));
    }

    #[test]
    fn rejects_bad_urls() {
        for bad in [
            "redlock://a:1,b:1",
            "redlock://a:1,a:1,b:1",
            "redlock://a:1,,b:1",
            "redis://a:1,b:1,c:1",
            "redlock://a:1,b:1,c:1?wait_replicas=1",
            "redlock://a:1,b:1,c:1?node_timeout=0s",
            "redlock://a:1,b:1,c:1?node_timeout=20s",
            "redlock://a:1,b:1,c:1?node_timeout=fast",
            "redlock://a:1,b:1,c:1?check_interval=1ms",
            "redlock://a:1,b:1,c:1?ca_file=/x",
            "redlock://a:1,b:1,c:1/x",
            "a:1,b:1,c:1",
        ] {
            assert!(parse(bad, &opts()).is_err(), "{bad}");
        }
        let e = parse("redlock://u:secret@a:1,b:1", &opts())
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret") && e.contains("at least 3"), "{e}");
    }
}
