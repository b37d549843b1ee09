//! Test code both SQL backends (`distlock-postgres`, `distlock-mysql`) share: one server per
//! test binary, the conformance harness of one mode of a backend, and the fault case of a
//! holder process killed with SIGKILL.
//!
//! The backends are not dependencies of this crate (they dev-depend on it): a test binary
//! hands in how it connects ([`Connect`]) and how an operator breaks a lock ([`BreakLock`]).

use crate::conformance::{fast_opts, poll_until, unique_name, Caps, Harness};
use crate::{MariaDbServer, PostgresServer, ProxyControl};
use distlock_core::{Backend, Client, ClientOptions};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A real SQL server of the testkit.
pub trait SqlServer: Send + Sync + 'static {
    /// Starts one (panics if it cannot: a test needs it).
    fn start_for_tests() -> Self
    where
        Self: Sized;
    /// The URL of its test database, with credentials.
    fn url(&self) -> String;
    /// Its TCP address.
    fn addr(&self) -> SocketAddr;
    /// Runs `sql` as the administrator and returns the output.
    fn sql(&self, sql: &str) -> crate::Result<String>;
}

impl SqlServer for PostgresServer {
    fn start_for_tests() -> Self {
        PostgresServer::start().expect("start postgres")
    }
    fn url(&self) -> String {
        PostgresServer::url(self)
    }
    fn addr(&self) -> SocketAddr {
        PostgresServer::addr(self)
    }
    fn sql(&self, sql: &str) -> crate::Result<String> {
        PostgresServer::sql(self, sql)
    }
}

impl SqlServer for MariaDbServer {
    fn start_for_tests() -> Self {
        MariaDbServer::start().expect("start mariadbd")
    }
    fn url(&self) -> String {
        MariaDbServer::url(self)
    }
    fn addr(&self) -> SocketAddr {
        MariaDbServer::addr(self)
    }
    fn sql(&self, sql: &str) -> crate::Result<String> {
        MariaDbServer::sql(self, sql)
    }
}

/// The server of one test binary: started by the first test that needs it, stopped when the
/// last one using it ends (cases use distinct lock names).
pub struct Shared<S>(Mutex<Weak<S>>);

impl<S: SqlServer> Shared<S> {
    /// An empty slot (for a `static`).
    pub const fn new() -> Self {
        Shared(Mutex::new(Weak::new()))
    }

    /// The running server, started if there is none.
    pub fn get(&self) -> Arc<S> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slot.upgrade() {
            return s;
        }
        let s = Arc::new(S::start_for_tests());
        *slot = Arc::downgrade(&s);
        s
    }
}

impl<S: SqlServer> Default for Shared<S> {
    fn default() -> Self {
        Self::new()
    }
}

/// A boxed future of a connection.
pub type Connecting<B> = Pin<Box<dyn Future<Output = distlock_core::Result<B>> + Send>>;
/// How a test binary connects its backend: URL and options to a backend.
pub type Connect<B> = fn(String, ClientOptions) -> Connecting<B>;
/// How an operator removes `name`'s lock behind its holder's back, on this server.
pub type BreakLock<S> = fn(&S, &str);

/// One mode of an SQL backend on a shared server: the conformance harness, and what the
/// backend's own tests use to connect.
pub struct SqlMode<S: SqlServer, B> {
    /// The server.
    pub server: Arc<S>,
    /// The URL parameters of the mode (`""`, `"?mode=lease"`, …).
    pub params: &'static str,
    connect: Connect<B>,
    break_lock: BreakLock<S>,
}

impl<S: SqlServer, B: Backend + 'static> SqlMode<S, B> {
    /// The mode of URL parameters `params` on `server`.
    pub fn new(
        server: Arc<S>,
        params: &'static str,
        connect: Connect<B>,
        break_lock: BreakLock<S>,
    ) -> Self {
        SqlMode {
            server,
            params,
            connect,
            break_lock,
        }
    }

    /// The URL of this mode.
    pub fn url(&self) -> String {
        format!("{}{}", self.server.url(), self.params)
    }

    /// A backend of this mode, connected with `opts`.
    ///
    /// # Errors
    /// None: panics if it cannot connect (a test needs it).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped connect closes its connections.
    pub async fn backend(&self, opts: &ClientOptions) -> B {
        (self.connect)(self.url(), opts.clone())
            .await
            .expect("connect")
    }

    /// A client of this mode.
    ///
    /// # Errors
    /// None: panics if it cannot connect.
    ///
    /// # Cancel safety
    /// As [`backend`](Self::backend).
    pub async fn client_with(&self, opts: ClientOptions) -> Client {
        let backend = self.backend(&opts).await;
        Client::new(Arc::new(backend), opts).expect("client")
    }
}

#[async_trait::async_trait]
impl<S: SqlServer, B: Backend + 'static> Harness for SqlMode<S, B> {
    async fn client(&self, opts: ClientOptions) -> Client {
        self.client_with(opts).await
    }

    /// A proxy in front of the server: the URL with the proxy's port.
    async fn proxied_client(&self, opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        let addr = self.server.addr();
        let proxy = ProxyControl::start(&[addr]).expect("proxy");
        let url = self
            .url()
            .replace(&format!("127.0.0.1:{}", addr.port()), &proxy.hosts());
        let backend = (self.connect)(url, opts.clone())
            .await
            .expect("connect through the proxy");
        let client = Client::new(Arc::new(backend), opts).expect("client");
        Some((client, proxy))
    }

    fn caps(&self) -> Caps {
        Caps {
            // Session modes: the lease is the holder connection's idle timeout, so the server
            // ends a connection that stops renewing, and with it the lock. Table modes: the
            // lease end is on the lock's row.
            lease_expiry: true,
            break_lock: true,
        }
    }

    async fn break_lock(&self, name: &str) {
        (self.break_lock)(&self.server, name);
    }
}

/// The child side of [`killed_process_frees_its_lock`]: when started by it (the environment
/// variables `{env}_URL` and `{env}_NAME` set), connects, holds the lock, prints
/// `HOLDING <token>` and sleeps until killed; otherwise does nothing.
///
/// # Errors
/// None: panics when it cannot hold the lock (the parent then fails).
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a child test.
pub async fn child_holder<B: Backend + 'static>(env: &str, connect: Connect<B>) {
    let (Ok(url), Ok(name)) = (
        std::env::var(format!("{env}_URL")),
        std::env::var(format!("{env}_NAME")),
    ) else {
        return; // Only meaningful when started by the parent test.
    };
    let opts = ClientOptions::default();
    let backend = connect(url, opts.clone()).await.expect("connect");
    let c = Client::new(Arc::new(backend), opts).expect("client");
    let g = c
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    println!("HOLDING {}", g.fencing_token());
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// A holder process killed with SIGKILL loses its lock as soon as the kernel closes its
/// connection; a waiter blocked on the server gets it at once (no lease to wait out).
///
/// Runs this test binary's `child_test` (which calls [`child_holder`] with `env`) as the
/// holder on `mode`'s URL; `waiters` counts the connections waiting on the server for a lock
/// name (the wait must have reached the server before the kill).
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test (a child left behind by a cancelled
/// case ends by itself after its 60 s sleep).
pub async fn killed_process_frees_its_lock<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    child_test: &str,
    env: &str,
    waiters: fn(&S, &str) -> String,
) {
    use std::io::{BufRead, BufReader};
    let name = unique_name("killed");
    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(format!("{env}_URL"), mode.url())
        .env(format!("{env}_NAME"), &name)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let token: u64 = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
            // libtest may print `test child_holder ... ` on the same line first.
            .find_map(|l| {
                let at = l.find("HOLDING ")?;
                l[at + 8..].trim().parse().ok()
            })
    })
    .await
    .expect("reader")
    .expect("child never held the lock");
    let b = mode.client_with(fast_opts()).await;
    let lock = b.lock(&name).expect("lock");
    assert!(
        lock.try_acquire().await.expect("try").is_none(),
        "child holds it"
    );
    let waiter = tokio::spawn(async move {
        let g = lock.acquire_timeout(Duration::from_secs(20)).await;
        (g, Instant::now())
    });
    poll_until(
        "the waiter never waited on the server",
        async || waiters(&mode.server, &name),
        |n| n == "1",
    )
    .await;
    let killed_at = Instant::now();
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let (g, got_at) = waiter.await.expect("waiter");
    let g = g.expect("lock freed by the killed process's connection");
    // As soon as the kernel closes the connection; the child's lease (30 s, the default) is
    // what a lease-based lock would wait out. 5 s is generous on a loaded machine.
    let latency = got_at.saturating_duration_since(killed_at);
    assert!(latency < Duration::from_secs(5), "took {latency:?}");
    assert!(g.fencing_token() > token);
    g.release().await.expect("release");
}
