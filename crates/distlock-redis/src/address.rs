//! The `redis://` URL, read with the core's [`ConnectionString`]: what redis-rs should see,
//! the endpoint for messages, and the settings that are ours.

use crate::dialect::Dialect;
use crate::sentinel::Sentinels;
use distlock_core::conn::{ConnectionString, Credentials, Password, TlsFiles, TlsNames};
use distlock_core::{Error, Result};
use std::time::Duration;

/// Everything the URL says.
#[derive(Debug)]
pub(crate) struct Address {
    /// The URL as parsed, for errors (they show it redacted).
    pub(crate) conn: ConnectionString,
    /// Where the calls go: one server, the master the sentinels name, or a cluster.
    pub(crate) route: Route,
    /// `host:port` (or what stands for the deployment), for messages.
    pub(crate) endpoint: String,
    pub(crate) namespace: Option<String>,
    pub(crate) wait_replicas: Option<(u32, Duration)>,
    /// `rediss://`, `rediss+cluster://` (`None`: plain): `ca_file=` (or `cacert=`), `cert=`
    /// and `key=`, the CA to trust and the client certificate with its key (PEM files).
    pub(crate) tls: Option<TlsFiles>,
    /// `?dialect=`: another library's key layout to speak (`None`: dlock's own).
    pub(crate) dialect: Option<Dialect>,
    /// `?handoff_after=DUR`: the plain mutex's contended mode (see [`crate::contended`]).
    pub(crate) handoff_after: crate::contended::HandoffAfter,
}

/// The deployment a URL names: the connection layer's business, not the lock protocol's.
#[derive(Debug)]
pub(crate) enum Route {
    /// `redis://`, `rediss://`: the URL for redis-rs (our parameters taken out).
    Single(String),
    /// `redis+sentinel://`: the sentinels, the master's name, and the sentinels' own
    /// password (`?sentinel_password=`); the timeout is the connect timeout's, set at connect.
    Sentinel(Box<Sentinels>),
    /// `redis+cluster://`: the seed nodes, as driver URLs (`redis://h:p` or `rediss://h:p`).
    Cluster(Vec<String>),
}

/// How long a grant waits for its replicas when the URL does not say.
const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(200);

#[cfg(test)]
pub(crate) fn parse(url: &str) -> Result<Address> {
    from_parsed(ConnectionString::parse(url)?)
}

/// As [`parse`], for a URL parsed already.
pub(crate) fn from_parsed(cs: ConnectionString) -> Result<Address> {
    let (route, endpoint, tls) = match cs.scheme() {
        "redis+sentinel" => sentinel_route(&cs)?,
        "rediss+sentinel" => return Err(cs.invalid(
            "rediss+sentinel:// (TLS to the sentinels and the master) is not built yet; use redis+sentinel:// on a trusted network, or rediss://MASTER (no failover following)",
        )),
        s if s.ends_with("+cluster") => cluster_route(&cs)?,
        _ => single_route(&cs)?,
    };
    Ok(Address {
        route,
        endpoint,
        namespace: cs.param("namespace").map(str::to_owned),
        wait_replicas: wait_replicas(&cs)?,
        tls,
        dialect: Dialect::from_url(&cs)?,
        handoff_after: crate::contended::handoff_after(&cs)?,
        conn: cs,
    })
}

/// The TLS files of `cs`, a URL of `plain` (`redis`, `redis+cluster`, …) or its TLS scheme
/// (`None` for the plain one), after refusing a parameter it does not take: the common ones,
/// `extra`, and the TLS files with the TLS scheme only (`redis+sentinel` has none yet).
fn check_params(
    cs: &ConnectionString,
    plain: &str,
    extra: Option<&str>,
) -> Result<Option<TlsFiles>> {
    let secure = format!("rediss{}", &plain["redis".len()..]);
    let hint = match plain {
        "redis+sentinel" => format!("{plain}:// has no TLS yet ({secure}:// is not built)"),
        _ => format!("use {secure}:// instead of {plain}://"),
    };
    if cs.scheme() == secure && !cfg!(feature = "tls") {
        return Err(cs.invalid(format!(
            "{secure}:// (TLS) needs distlock built with the `tls` feature (distlock = {{ features = [\"tls\"] }})"
        )));
    }
    let tls = TlsFiles::of_scheme(cs, [plain, &secure], TLS_NAMES, &hint)?;
    let mut known = vec![
        "namespace",
        "wait_replicas",
        "wait_timeout",
        "dialect",
        "handoff_after",
    ];
    known.extend(extra);
    if tls.is_some() {
        known.extend(["ca_file", "cacert", "cert", "key"]);
    }
    cs.check_params(&known)?;
    Ok(tls)
}

/// The `host:port` of each host of `cs` (`port` where none is given); `none` when it names no
/// host (or an empty one).
fn hosts(cs: &ConnectionString, port: u16, none: &str) -> Result<Vec<String>> {
    if cs.hosts().is_empty() || cs.hosts().iter().any(|h| h.host.is_empty()) {
        return Err(cs.invalid(none));
    }
    Ok(cs.hosts().iter().map(|h| h.endpoint(port)).collect())
}

/// `redis://host:port[/DB]` (`rediss://` with `tls`): one server.
fn single_route(cs: &ConnectionString) -> Result<(Route, String, Option<TlsFiles>)> {
    let tls = check_params(cs, "redis", Some("protocol"))?;
    let hosts = hosts(cs, 6379, "no host; write redis://host:port")?;
    let [endpoint] = <[String; 1]>::try_from(hosts).map_err(|_| {
        cs.invalid("more than one host; write redis://host:port (several independent masters are redlock://)")
    })?;
    let path = cs.path()?;
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(cs.invalid(format!(
            "`/{db}` is not a database number; write redis://host:port/0"
        )));
    }
    let mut driver = cs.clone();
    driver.retain_params(|k, _| k == "protocol");
    Ok((Route::Single(driver.expose_url().to_owned()), endpoint, tls))
}

/// `redis+cluster://[user:password@]h1:p1[,h2:p2…][?namespace=…]` (`rediss+cluster://` with
/// TLS): any nodes of the cluster, as seeds (the client learns the rest from them).
fn cluster_route(cs: &ConnectionString) -> Result<(Route, String, Option<TlsFiles>)> {
    let tls = check_params(cs, "redis+cluster", None)?;
    let seeds = hosts(cs, 6379, "no node; write redis+cluster://h1:6379,h2:6379")?;
    let path = cs.path()?;
    if !matches!(path.trim_start_matches('/'), "" | "0") {
        return Err(cs.invalid("a Redis Cluster has database 0 only: drop the `/DB` path"));
    }
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    let seed_urls = seeds.iter().map(|s| format!("{scheme}://{s}")).collect();
    let endpoint = format!("cluster {}", seeds.join(","));
    Ok((Route::Cluster(seed_urls), endpoint, tls))
}

/// How `rediss://` names its TLS files.
pub(crate) const TLS_NAMES: TlsNames = TlsNames {
    ca: &["ca_file", "cacert"],
    ..TlsNames::CACERT
};

/// The CA and client certificate of `tls` for redis-rs, read now (an unreadable file is a
/// bad URL, named).
#[cfg(feature = "tls")]
pub(crate) fn tls_certificates(
    cs: &ConnectionString,
    tls: &TlsFiles,
) -> Result<redis::TlsCertificates> {
    let bad = |e: Error| cs.scrub_error(cs.invalid(e.to_string()));
    let root_cert = tls.read_ca().map_err(bad)?;
    let client_tls = tls
        .read_client()
        .map_err(bad)?
        .map(|(client_cert, client_key)| redis::ClientTlsConfig {
            client_cert,
            client_key,
        });
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// `?wait_replicas=N&wait_timeout=DUR` (`None`: no replicas to wait for).
fn wait_replicas(cs: &ConnectionString) -> Result<Option<(u32, Duration)>> {
    let replicas = cs.parse_param("wait_replicas", "a number of replicas", |v| {
        v.parse::<u32>().ok()
    })?;
    let wait_timeout = cs.duration("wait_timeout")?.unwrap_or(DEFAULT_WAIT_TIMEOUT);
    match replicas.filter(|n| *n > 0) {
        Some(_) if wait_timeout.is_zero() => {
            Err(cs.invalid("wait_timeout=0 would wait forever; give a bound such as 200ms"))
        }
        Some(n) => Ok(Some((n, wait_timeout))),
        None => Ok(None),
    }
}

/// `redis+sentinel://[user:password@]s1:p1[,s2:p2…]/MASTER[?namespace=…]`: the password is
/// the master's (and its replicas'); the sentinels' own is `?sentinel_password=`.
fn sentinel_route(cs: &ConnectionString) -> Result<(Route, String, Option<TlsFiles>)> {
    check_params(cs, "redis+sentinel", Some("sentinel_password"))?;
    let none = "no sentinel; write redis+sentinel://s1:26379,s2:26379/MASTER";
    let hosts = hosts(cs, 26379, none)?;
    let path = cs.path()?;
    let master = path.trim_start_matches('/').to_owned();
    if master.is_empty() || master.contains('/') {
        return Err(cs.invalid(
            "name the master after the sentinels: redis+sentinel://s1:26379,s2:26379/MASTER",
        ));
    }
    let endpoint = format!("master `{master}` of sentinels {}", hosts.join(","));
    let password = cs
        .param("sentinel_password")
        .filter(|p| !p.is_empty())
        .map(Password::new);
    let route = Route::Sentinel(Box::new(Sentinels {
        conn: cs.clone(),
        hosts,
        master,
        password,
        timeout: Duration::ZERO,
    }));
    Ok((route, endpoint, None))
}

/// The redis-rs client for `driver_url` (with `tls`, a `rediss://` URL's files: trusting only
/// its CA when given, and showing its client certificate when given). The user and password
/// of `creds` (when given) replace the URL's.
pub(crate) fn open_client(
    cs: &ConnectionString,
    driver_url: &str,
    tls: Option<&TlsFiles>,
    creds: &Credentials,
) -> Result<redis::Client> {
    let invalid = |reason: String| -> Error { cs.scrub_error(cs.invalid(reason)) };
    let info = redis::IntoConnectionInfo::into_connection_info(driver_url)
        .map_err(|e| invalid(e.to_string()))?;
    let mut settings = info.redis_settings().clone();
    if let Some(u) = &creds.user {
        settings = settings.set_username(u);
    }
    if let Some(p) = &creds.password {
        settings = settings.set_password(p.expose());
    }
    let info = info.set_redis_settings(settings);
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        // The process-wide rustls provider: dlock's one unless the program chose.
        distlock_core::conn::install_crypto_provider();
        let certs = tls_certificates(cs, tls)?;
        let pem = "check that ca_file=, cert= and key= name PEM files: a certificate, and its unencrypted key";
        return redis::Client::build_with_tls(info, certs)
            .map_err(|e| invalid(format!("{e} ({pem})")));
    }
    let _ = tls;
    redis::Client::open(info).map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::conn::redact;

    fn driver_url(a: &Address) -> &str {
        match &a.route {
            Route::Single(url) => url,
            other => panic!("not one server: {other:?}"),
        }
    }

    #[test]
    fn urls() {
        let a = parse("redis://127.0.0.1:7000/2?namespace=shop").unwrap();
        assert_eq!(driver_url(&a), "redis://127.0.0.1:7000/2");
        assert_eq!(a.endpoint, "127.0.0.1:7000");
        assert_eq!(a.namespace.as_deref(), Some("shop"));
        assert_eq!(parse("redis://h").unwrap().endpoint, "h:6379");
        assert_eq!(parse("redis://[::1]:7").unwrap().endpoint, "[::1]:7");
        let a = parse("redis://h?wait_replicas=1&wait_timeout=50ms").unwrap();
        assert_eq!(a.wait_replicas, Some((1, Duration::from_millis(50))));
        let a = parse("redis://u:p%40ss@h:1/0?protocol=resp3&namespace=x").unwrap();
        assert_eq!(driver_url(&a), "redis://u:p%40ss@h:1/0?protocol=resp3");
        for bad in [
            "redis://",
            "http://h:1",
            "redis://h/x",
            "redis://h?nope=1",
            "redis://h?ca_file=/x",
            "redis://h?wait_replicas=x",
            "redis://h?wait_replicas=1&wait_timeout=0s",
            "redis://a:1,b:2",
            "not a url",
            "redis+sentinel://s1",
            "redis+sentinel://s1/a/b",
            "redis+sentinel://s1/m?protocol=resp3",
            "redis+cluster://",
            "redis+cluster://h/3",
            "redis+cluster://h?ca_file=/x",
            "redis+cluster://h?protocol=resp3",
            "redis+cluster://h?nope=1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse("rediss://h").is_ok(), cfg!(feature = "tls"));
        for (url, dialect) in [
            ("redis://h", None),
            ("redis://h?dialect=redisson", Some(Dialect::Redisson)),
            (
                "redis+sentinel://s/m?dialect=python-redis-lock",
                Some(Dialect::PythonRedisLock),
            ),
            (
                "redis+cluster://h?dialect=redisson",
                Some(Dialect::Redisson),
            ),
        ] {
            assert_eq!(parse(url).unwrap().dialect, dialect, "{url}");
        }
        let e = parse("redis://h?dialect=jedis").unwrap_err().to_string();
        assert!(e.contains("redisson, python-redis-lock"), "{e}");
        let sentinels = |url| match parse(url).unwrap() {
            Address {
                route: Route::Sentinel(s),
                namespace,
                ..
            } => (*s, namespace),
            other => panic!("{other:?}"),
        };
        let (s, namespace) = sentinels("redis+sentinel://:pw@s1,s2:7/mymaster?namespace=n");
        assert_eq!(s.hosts, &["s1:26379", "s2:7"]);
        assert_eq!(s.master, "mymaster");
        assert_eq!(namespace.as_deref(), Some("n"));
        let (s, _) = sentinels("redis+sentinel://s1/m?sentinel_password=sp%40ss");
        assert_eq!(s.password.as_ref().map(Password::expose), Some("sp@ss"));
        assert_eq!(
            redact("redis+sentinel://s1/m?sentinel_password=hidden"),
            "redis+sentinel://s1/m?sentinel_password=***"
        );
        let e = parse("rediss+sentinel://s1/m").unwrap_err().to_string();
        assert!(e.contains("not built yet"), "{e}");
    }

    #[test]
    fn cluster_urls() {
        let a = parse("redis+cluster://:pw@h1:7000,h2:7001?namespace=n&wait_replicas=1").unwrap();
        let Route::Cluster(seeds) = &a.route else {
            panic!("{a:?}")
        };
        assert_eq!(seeds, &["redis://h1:7000", "redis://h2:7001"]);
        assert_eq!(a.namespace.as_deref(), Some("n"));
        assert_eq!(a.wait_replicas, Some((1, DEFAULT_WAIT_TIMEOUT)));
        assert_eq!(
            parse("rediss+cluster://h?ca_file=/ca").is_ok(),
            cfg!(feature = "tls")
        );
        let e = parse("redis+cluster://u:secret@h/x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
        let e = parse("redis://u:secret@h/x").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(redact("redis://u:secret@h:1"), "redis://u:***@h:1");
    }
}
