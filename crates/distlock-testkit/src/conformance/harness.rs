//! How the suite reaches a backend: the [`Harness`] trait, and [`ServerHarness`], a harness
//! put together from a connect function and a few closures.

use super::prelude::*;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

/// What a backend can do; cases that need a capability the backend lacks are skipped (and say so).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// A lock whose holder stops renewing frees itself when its lease ends.
    /// (False for `file://`, where the lease is the holder process's lifetime.)
    pub lease_expiry: bool,
    /// [`Harness::break_lock`] can remove a lock's server state behind the holder's back.
    pub break_lock: bool,
}

/// How the suite reaches one backend.
#[async_trait::async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A new client with its own connections, as a separate process would have.
    async fn client(&self, opts: ClientOptions) -> Client;
    /// What this backend can do.
    fn caps(&self) -> Caps;
    /// Deletes the lock's state on the server (as an operator or another program might).
    async fn break_lock(&self, _name: &str) {}
    /// A new client (as [`client`](Self::client)) whose traffic goes through proxies the case
    /// controls: one per server or node, all of them in the [`ProxyControl`]. `None` (the
    /// default) when the backend has no network connection to cut (e.g. `file://`): the cases
    /// that need one are skipped, saying so.
    async fn proxied_client(&self, _opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        None
    }
    /// Loses all of the lock service's data at once, as a crash of a server without
    /// persistence would (e.g. `FLUSHALL`). Returns false (the default) if the harness cannot;
    /// the data-loss case then uses [`break_lock`](Self::break_lock).
    async fn lose_data(&self) -> bool {
        false
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type ConnectFn = dyn Fn(String, ClientOptions) -> BoxFuture<distlock_core::Result<Arc<dyn distlock_core::Backend>>>
    + Send
    + Sync;
type ServerFn<S> = dyn Fn(Arc<S>) -> BoxFuture<()> + Send + Sync;
type BreakFn<S> = dyn Fn(Arc<S>, String) -> BoxFuture<()> + Send + Sync;

/// A [`Harness`] put together from parts: the server (or servers) it keeps alive, the URL to
/// reach them, a connect function, and what the backend can do. The proxied client is
/// derived: the same URL with its host list replaced by the proxies' addresses (see
/// [`proxy`](Self::proxy)).
///
/// A backend's conformance test is then a few lines:
///
/// ```ignore
/// fn redis() -> ServerHarness<RedisServer> {
///     let server = RedisServer::start().expect("start redis-server");
///     ServerHarness::new(server, RedisServer::url, |url, opts| async move {
///         RedisBackend::connect(&url, &opts).await
///     })
///     .proxy(|s| vec![s.addr()])
///     .break_lock(|s, name| async move {
///         assert_eq!(s.command(&["DEL", &format!("dlock:{{{name}}}")]).expect("DEL"), "1");
///     })
/// }
/// distlock_testkit::conformance_suite!(redis());
/// distlock_testkit::adversarial_suite!(redis());
/// ```
pub struct ServerHarness<S> {
    server: Arc<S>,
    url: String,
    connect: Box<ConnectFn>,
    proxied: Option<Vec<SocketAddr>>,
    lease_expiry: bool,
    break_lock: Option<Box<BreakFn<S>>>,
    lose_data: Option<Box<ServerFn<S>>>,
    before_client: Option<Box<ServerFn<S>>>,
}

impl<S> std::fmt::Debug for ServerHarness<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHarness")
            .field("url", &self.url)
            .field("proxied", &self.proxied)
            .field("lease_expiry", &self.lease_expiry)
            .field("break_lock", &self.break_lock.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Send + Sync + 'static> ServerHarness<S> {
    /// A harness over `server`, reached at `url(&server)` by `connect(url, options)` (e.g.
    /// `|url, o| async move { RedisBackend::connect(&url, &o).await }`). Leases end on the
    /// server ([`Caps::lease_expiry`]) unless [`no_lease_expiry`](Self::no_lease_expiry)
    /// says otherwise; there is no proxied client nor lock breaking until they are set.
    pub fn new<B, F, Fut>(server: S, url: impl FnOnce(&S) -> String, connect: F) -> Self
    where
        B: distlock_core::Backend,
        F: Fn(String, ClientOptions) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = distlock_core::Result<B>> + Send + 'static,
    {
        let url = url(&server);
        ServerHarness {
            server: Arc::new(server),
            url,
            connect: Box::new(move |url, opts| {
                let fut = connect(url, opts);
                Box::pin(async move {
                    fut.await
                        .map(|b| Arc::new(b) as Arc<dyn distlock_core::Backend>)
                })
            }),
            proxied: None,
            lease_expiry: true,
            break_lock: None,
            lose_data: None,
            before_client: None,
        }
    }

    /// Puts a proxy in front of each of `addrs(&server)` for
    /// [`proxied_client`](Harness::proxied_client): its URL is the harness URL with the host
    /// list (what stands between `://` or `user@` and the first `/`, `?` or `#`) replaced by
    /// the proxies' addresses, in the same order. Give one member of a cluster whose client
    /// balances over its members, so that a fault on the proxy is sure to meet the traffic.
    pub fn proxy(mut self, addrs: impl FnOnce(&S) -> Vec<SocketAddr>) -> Self {
        self.proxied = Some(addrs(&self.server));
        self
    }

    /// A lock lasts as long as its holder (a session, a process), not a lease: the cases
    /// about leases ending on the server are skipped.
    pub fn no_lease_expiry(mut self) -> Self {
        self.lease_expiry = false;
        self
    }

    /// How to delete a lock's state on the server behind its holder's back
    /// ([`Harness::break_lock`]); sets [`Caps::break_lock`].
    pub fn break_lock<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<S>, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.break_lock = Some(Box::new(move |s, name| Box::pin(f(s, name))));
        self
    }

    /// How to lose all the lock service's data at once ([`Harness::lose_data`]).
    pub fn lose_data<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.lose_data = Some(Box::new(move |s| Box::pin(f(s))));
        self
    }

    /// Something to await before every new client (e.g. until fresh servers are old enough).
    pub fn before_client<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Arc<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.before_client = Some(Box::new(move |s| Box::pin(f(s))));
        self
    }

    /// The server the harness keeps alive.
    pub fn server(&self) -> &S {
        &self.server
    }

    /// The URL clients connect to.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn connect_to(&self, url: String, opts: ClientOptions) -> Client {
        if let Some(hook) = &self.before_client {
            hook(self.server.clone()).await;
        }
        let backend = (self.connect)(url.clone(), opts.clone())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", distlock_core::conn::redact(&url)));
        Client::new(backend, opts).expect("client")
    }
}

#[async_trait::async_trait]
impl<S: Send + Sync + 'static> Harness for ServerHarness<S> {
    async fn client(&self, opts: ClientOptions) -> Client {
        self.connect_to(self.url.clone(), opts).await
    }

    fn caps(&self) -> Caps {
        Caps {
            lease_expiry: self.lease_expiry,
            break_lock: self.break_lock.is_some(),
        }
    }

    async fn break_lock(&self, name: &str) {
        if let Some(f) = &self.break_lock {
            f(self.server.clone(), name.to_string()).await;
        }
    }

    async fn proxied_client(&self, opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        let addrs = self.proxied.as_ref()?;
        let proxy = ProxyControl::start(addrs).expect("proxies");
        let url = with_hosts(&self.url, &proxy.hosts());
        Some((self.connect_to(url, opts).await, proxy))
    }

    async fn lose_data(&self) -> bool {
        match &self.lose_data {
            Some(f) => {
                f(self.server.clone()).await;
                true
            }
            None => false,
        }
    }
}

/// `url` with its host list (between `://` or `user@` and the first `/`, `?` or `#`)
/// replaced by `hosts`.
pub(crate) fn with_hosts(url: &str, hosts: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return hosts.to_string();
    };
    let rest = &url[scheme_end..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host_start = rest[..end].rfind('@').map_or(0, |i| i + 1);
    format!("{}{hosts}{}", &url[..scheme_end + host_start], &rest[end..])
}

#[cfg(test)]
mod tests {
    use super::with_hosts;

    #[test]
    fn host_list_is_replaced() {
        let p = "127.0.0.1:9";
        assert_eq!(with_hosts("redis://127.0.0.1:1", p), "redis://127.0.0.1:9");
        assert_eq!(
            with_hosts("redis://:pw@127.0.0.1:1", p),
            "redis://:pw@127.0.0.1:9"
        );
        assert_eq!(
            with_hosts("postgres://u:p@127.0.0.1:1/db?x=1", p),
            "postgres://u:p@127.0.0.1:9/db?x=1"
        );
        assert_eq!(
            with_hosts("redlock://h:1,h:2,h:3?quarantine=500ms", "a:1,a:2,a:3"),
            "redlock://a:1,a:2,a:3?quarantine=500ms"
        );
        assert_eq!(with_hosts("etcd://h:1,h:2", p), "etcd://127.0.0.1:9");
    }
}
