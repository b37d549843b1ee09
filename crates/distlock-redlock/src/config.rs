//! The `redlock://` URL.

use crate::node::Node;
use distlock_core::conn::{scheme_of, ConnectionString, Host};
use distlock_core::{ClientOptions, Error, Result};
use std::time::Duration;

/// Per-node timeout when the URL does not set one (capped at a tenth of the watchdog lease).
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// How often each node's process and data are checked when the URL does not say.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Fewest nodes Redlock is useful with.
pub const MIN_NODES: usize = 3;

/// Everything the URL says but the nodes.
pub(crate) struct Config {
    /// Every node's `host:port`, joined by `,`.
    pub(crate) endpoint: String,
    pub(crate) node_timeout: Duration,
    /// `None`: the longest lease in use (the watchdog lease, or a longer fixed lease seen).
    pub(crate) quarantine: Option<Duration>,
    pub(crate) check_interval: Duration,
    /// `wait=queue` (the default): waiters wait in every node's wait queue, woken by the nodes;
    /// `false` for `wait=retry`: without a queue, every release wakes every waiter, which votes
    /// again (the behaviour of earlier versions; for comparisons).
    pub(crate) queue: bool,
}

/// The URL with any password (and any secret parameter) replaced by `***`.
pub use distlock_core::conn::redact;

/// The URL's settings and its nodes.
pub(crate) fn parse(url: &str, opts: &ClientOptions) -> Result<(Config, Vec<Node>)> {
    if scheme_of(url).is_none() {
        return Err(Error::invalid_url(
            redact(url),
            "no scheme; write redlock://host1:port1,host2:port2,host3:port3",
        ));
    }
    let cs = ConnectionString::parse(url)?;
    let node_scheme = match cs.scheme() {
        "redlock" => "redis",
        // Each node is reached with rediss://; distlock-redis says so if TLS is not built in.
        "redlocks" => "rediss",
        other => {
            return Err(cs.invalid(format!("scheme `{other}` is not redlock:// or redlocks://")))
        }
    };
    let path = cs.path()?;
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(cs.invalid(format!(
            "`/{db}` is not a database number; write redlock://h1:p1,h2:p2,h3:p3/0"
        )));
    }
    let nodes = nodes(&cs, node_scheme)?;
    let tls = node_scheme == "rediss";
    let known: Vec<&str> = [
        "namespace",
        "node_timeout",
        "quarantine",
        "check_interval",
        "wait",
        "protocol",
        "ca_file",
    ]
    .into_iter()
    .filter(|k| tls || *k != "ca_file")
    .collect();
    cs.check_params(&known)?;

    let lease = opts.get_watchdog_lease();
    let node_timeout = match cs.duration("node_timeout")? {
        None => DEFAULT_NODE_TIMEOUT.min(lease / 10),
        Some(t) if t.is_zero() => {
            return Err(cs.invalid("node_timeout=0 would never wait for a node; give e.g. 50ms"))
        }
        Some(t) if t > lease / 3 => {
            return Err(cs.invalid(format!(
                "node_timeout={t:?} is not far below the watchdog lease {lease:?}: renewals run \
                 every lease/3, and a grant is valid only for lease - time spent; use at most {:?}",
                lease / 3
            )))
        }
        Some(t) => t,
    };
    let quarantine = cs.duration("quarantine")?;
    if let Some(q) = quarantine.filter(|q| *q > distlock_core::MAX_LEASE) {
        return Err(cs.invalid(format!(
            "quarantine={q:?} is longer than the 30-day lease limit"
        )));
    }
    let check_interval = cs
        .duration("check_interval")?
        .unwrap_or(DEFAULT_CHECK_INTERVAL);
    if check_interval < Duration::from_millis(10) || check_interval > Duration::from_secs(60) {
        return Err(cs.invalid(format!(
            "check_interval={check_interval:?} must be between 10ms and 60s"
        )));
    }
    let queue = cs.choice("wait", &["queue", "retry"])? != Some("retry");
    let cfg = Config {
        endpoint: cs.endpoints(6379),
        node_timeout,
        quarantine,
        check_interval,
        queue,
    };
    Ok((cfg, nodes))
}

/// The nodes of `cs` (each listed once, at least [`MIN_NODES`]), each with its own URL: the
/// node scheme `node_scheme`, its host, and the parameters a node takes.
fn nodes(cs: &ConnectionString, node_scheme: &str) -> Result<Vec<Node>> {
    let hosts = cs.hosts();
    if hosts.len() < MIN_NODES {
        return Err(cs.invalid(format!(
            "Redlock needs at least {MIN_NODES} independent Redis nodes (an odd number such as 3 or 5 is best); \
             {} given. For one server use redis://",
            hosts.len()
        )));
    }
    let endpoints: Vec<String> = hosts.iter().map(|h| h.endpoint(6379)).collect();
    let mut nodes = Vec::with_capacity(hosts.len());
    for (i, (h, endpoint)) in hosts.iter().zip(&endpoints).enumerate() {
        if endpoints[..i].contains(endpoint) {
            return Err(cs.invalid(format!(
                "node `{endpoint}` is listed twice; Redlock needs independent nodes"
            )));
        }
        let mut node = cs.clone();
        node.set_scheme(node_scheme);
        node.set_hosts(vec![Host::new(h.host.clone(), Some(h.port_or(6379)))]);
        node.retain_params(|k, _| matches!(k, "namespace" | "protocol" | "ca_file"));
        let mut n = Node::default();
        (n.url, n.endpoint) = (node.expose_url().to_owned(), endpoint.clone());
        nodes.push(n);
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ClientOptions {
        ClientOptions::default()
    }

    #[test]
    fn parses_nodes_and_options() {
        let (c, nodes) = parse(
            "redlock://u:p%40ss@a:1,b:2,c?namespace=shop&node_timeout=20ms&quarantine=1m",
            &opts(),
        )
        .unwrap();
        let urls: Vec<&str> = nodes.iter().map(|n| n.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "redis://u:p%40ss@a:1?namespace=shop",
                "redis://u:p%40ss@b:2?namespace=shop",
                "redis://u:p%40ss@c:6379?namespace=shop"
            ]
        );
        assert_eq!(nodes[2].endpoint, "c:6379");
        assert_eq!(c.node_timeout, Duration::from_millis(20));
        assert_eq!(c.quarantine, Some(Duration::from_secs(60)));
        assert_eq!(
            redact("redlock://u:p%40ss@a:1,b:2?x=1"),
            "redlock://u:***@a:1,b:2?x=1"
        );
        let (c, nodes) = parse(
            "redlocks://[::1]:7000,[::1]:7001,[::1]/3?ca_file=/x",
            &opts(),
        )
        .unwrap();
        // Parameters are passed on percent-encoded (redis:// reads them decoded: `/x`).
        assert_eq!(nodes[0].url, "rediss://[::1]:7000/3?ca_file=%2Fx");
        assert_eq!(nodes[2].endpoint, "[::1]:6379");
        assert_eq!(c.node_timeout, DEFAULT_NODE_TIMEOUT);
        assert_eq!(c.quarantine, None);
    }

    #[test]
    fn default_node_timeout_follows_short_leases() {
        let o = opts().watchdog_lease(Duration::from_millis(300));
        let (c, _) = parse("redlock://a:1,b:1,c:1", &o).unwrap();
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
            "redlock://a:1,b:1,c:1?wait=poll",
            "redlock://a:1,b:1,c:1?ca_file=/x",
            "redlock://a:1,b:1,c:1/x",
            "a:1,b:1,c:1",
        ] {
            assert!(parse(bad, &opts()).is_err(), "{bad}");
        }
        let e = parse("redlock://u:secret@a:1,b:1", &opts())
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret") && e.contains("at least 3"), "{e}");
    }
}
