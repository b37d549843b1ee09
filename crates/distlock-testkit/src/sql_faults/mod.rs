//! Test code both SQL backends (`distlock-postgres`, `distlock-mysql`) share: one server per
//! test binary, the conformance harness of one mode of a backend, and the fault cases both
//! run ([`sql_fault_cases!`](crate::sql_fault_cases): a dropped backend, a holder process
//! killed with SIGKILL, a holder's connection reset by a proxy, connection errors).
//!
//! The backends are not dependencies of this crate (they dev-depend on it): a test binary
//! hands in how it connects ([`Connect`]) and how an operator breaks a lock ([`BreakLock`]).

use crate::conformance::{fast_opts, poll_until, unique_name, Caps, Harness};
use crate::{MariaDbServer, PostgresServer, ProxyControl};
use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, ClientOptions, HoldKey, LockKind, LostSignal,
};
mod closed;
mod election;
mod late;
mod tokens;

pub use closed::reset_holder_connection_fires_lost_at_once;
pub use election::{
    election_cancelled_campaign, election_operator_commands, election_proclamations,
};
pub use late::{late_request_of_an_ended_attempt, Ended};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
pub use tokens::tokens_rise_after_a_rollback;

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
    /// [`url`](Self::url) with another password.
    fn url_with_password(&self, password: &str) -> String;
    /// The URL scheme (`postgres`, `mysql`).
    fn scheme(&self) -> &'static str;
    /// Kills the server and starts it again on the same port, with its data.
    fn restart(&mut self) -> crate::Result<()>;
}

/// `SqlServer` for a testkit server type with the inherent methods of the same names.
macro_rules! sql_server {
    ($ty:ty, $scheme:literal, $start:literal) => {
        impl SqlServer for $ty {
            fn start_for_tests() -> Self {
                <$ty>::start().expect($start)
            }
            fn url(&self) -> String {
                <$ty>::url(self)
            }
            fn addr(&self) -> SocketAddr {
                <$ty>::addr(self)
            }
            fn sql(&self, sql: &str) -> crate::Result<String> {
                <$ty>::sql(self, sql)
            }
            fn url_with_password(&self, password: &str) -> String {
                <$ty>::url_with_password(self, password)
            }
            fn scheme(&self) -> &'static str {
                $scheme
            }
            fn restart(&mut self) -> crate::Result<()> {
                <$ty>::restart(self)
            }
        }
    };
}

sql_server!(PostgresServer, "postgres", "start postgres");
sql_server!(MariaDbServer, "mysql", "start mariadbd");

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

    /// A backend of this mode connected to `hosts` (a proxy's `host:port`) instead of the
    /// server's address.
    ///
    /// # Errors
    /// None: panics if it cannot connect.
    ///
    /// # Cancel safety
    /// As [`backend`](Self::backend).
    pub async fn backend_via(&self, hosts: &str, opts: &ClientOptions) -> B {
        let url = self
            .url()
            .replace(&format!("127.0.0.1:{}", self.server.addr().port()), hosts);
        (self.connect)(url, opts.clone())
            .await
            .expect("connect through the proxy")
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
        let proxy = ProxyControl::start(&[self.server.addr()]).expect("proxy");
        let backend = self.backend_via(&proxy.hosts(), &opts).await;
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

/// A backend dropped without releasing (its connections closed) leaves nothing held: another
/// client gets the lock at once, not at the end of the dropped grant's lease.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test.
pub async fn dropped_backend_frees_its_locks<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
) {
    let name = unique_name("dropped");
    let opts = fast_opts();
    let backend = mode.backend(&opts).await;
    let req = AcquireRequest::new(
        HoldKey {
            name: name.as_str().into(),
            owner: "gone".into(),
            kind: LockKind::Mutex,
        },
        Duration::from_secs(30),
        LostSignal::new(),
    );
    assert!(matches!(
        backend.acquire(&req).await.expect("acquire"),
        AcquireReply::Granted { .. }
    ));
    drop(backend);
    let b = mode.client_with(opts).await;
    let t = Instant::now();
    let g = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(15))
        .await
        .expect("freed by the closed connection");
    // Freed by the closed connection, not at the end of the 30 s lease of the request: 5 s is
    // generous on a loaded machine and far below the lease.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    g.release().await.expect("release");
}

/// The error a connect to `url` with `mode`'s connector fails with (panics if it succeeds).
async fn connect_error<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    url: String,
    why: &str,
) -> distlock_core::Error {
    (mode.connect)(url, fast_opts()).await.err().expect(why)
}

/// A wrong password is an `Auth` error whose text has the server's `refusal` and never the
/// password.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test.
pub async fn wrong_password_is_an_auth_error<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    refusal: &str,
) {
    let url = mode.server.url_with_password("not-the-password");
    let e = connect_error(mode, url, "refused").await;
    assert!(matches!(e, distlock_core::Error::Auth { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(refusal), "{msg}");
    assert!(!msg.contains("not-the-password"), "{msg}");
}

/// Nothing listening is a `Connection` error, at once, naming the address and not the
/// password.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test.
pub async fn unreachable_server_is_a_connection_error<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
) {
    let port = crate::free_port();
    let t = Instant::now();
    let url = format!("{}://u:secret@127.0.0.1:{port}/db", mode.server.scheme());
    let e = connect_error(mode, url, "nothing listens there").await;
    assert!(e.is_connection(), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(!msg.contains("secret"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(3));
}

/// Each of `urls` is refused as `InvalidUrl`, without the password (`secret`) in the message.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test.
pub async fn invalid_urls<S: SqlServer, B: Backend + 'static>(mode: &SqlMode<S, B>, urls: &[&str]) {
    for url in urls {
        let e = connect_error(mode, (*url).to_owned(), "invalid").await;
        assert!(
            matches!(e, distlock_core::Error::InvalidUrl { .. }),
            "{url}: {e:?}"
        );
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}

/// A missing database is reported as such (naming it), not as a connection problem to retry.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test.
pub async fn missing_database_is_reported<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
) {
    let url = mode.server.url();
    let url = match url.rfind('/') {
        Some(at) => format!("{}/no_such_db", &url[..at]),
        None => panic!("no database in {url}"),
    };
    let e = connect_error(mode, url, "no database").await;
    assert!(!e.is_retryable(), "{e:?}");
    assert!(e.to_string().contains("no_such_db"), "{e}");
}

/// Expands to the fault cases both SQL backends run, one `#[tokio::test]` each, on the mode
/// `$mode` (a [`SqlMode`] expression): a dropped backend, a holder process killed with SIGKILL
/// (its child side is the test `child_holder`, started with the environment prefix `$env`;
/// `$waiters` counts a lock's waiters on the server), a wrong password (the server's
/// `$refusal` text), an unreachable server, the invalid URLs `$invalid`, a missing database.
/// `$connect` is the test binary's [`Connect`].
#[macro_export]
macro_rules! sql_fault_cases {
    (
        mode: $mode:expr,
        connect: $connect:expr,
        env: $env:literal,
        waiters: $waiters:expr,
        refusal: $refusal:literal,
        invalid: [$($invalid:literal),* $(,)?] $(,)?
    ) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_backend_frees_its_locks() {
            $crate::sql_faults::dropped_backend_frees_its_locks(&$mode).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn child_holder() {
            $crate::sql_faults::child_holder($env, $connect).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn killed_process_frees_its_lock() {
            $crate::sql_faults::killed_process_frees_its_lock(&$mode, "child_holder", $env, $waiters)
                .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn reset_holder_connection_fires_lost_at_once() {
            $crate::sql_faults::reset_holder_connection_fires_lost_at_once(&$mode).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn wrong_password_is_an_auth_error() {
            $crate::sql_faults::wrong_password_is_an_auth_error(&$mode, $refusal).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unreachable_server_is_a_connection_error() {
            $crate::sql_faults::unreachable_server_is_a_connection_error(&$mode).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn invalid_urls() {
            $crate::sql_faults::invalid_urls(&$mode, &[$($invalid),*]).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn missing_database_is_reported() {
            $crate::sql_faults::missing_database_is_reported(&$mode).await;
        }
    };
}

/// A timed-out wait, a dropped one and an aborted one leave no connection waiting on the
/// server (`waiters` counts a lock's waiters there); the deadline is honoured promptly. Returns
/// the holder's client and guard for backend-specific checks.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is the whole of a test.
pub async fn abandoned_waits_leave_no_server_waiters<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    waiters: fn(&S, &str) -> String,
) -> (Client, distlock_core::LockGuard) {
    let name = unique_name("abandon");
    let a = mode.client_with(fast_opts()).await;
    let b = mode.client_with(fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let lb = b.lock(&name).expect("lock");
    let t = Instant::now();
    assert!(lb
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err()
        .is_timeout());
    // The 300 ms deadline is honoured promptly, not after a long server-side wait (the
    // safety net stops it 300 ms late; without the deadline passed on, a wait lasts an hour):
    // 3 s is generous on a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), lb.acquire())
            .await
            .is_err()
    );
    // Waiters on this lock only (other tests share the server). Stopping a wait on the server
    // takes a round trip after the caller has gone: poll.
    let waiting = async || waiters(&mode.server, &name);
    poll_until(
        "the timed-out waits left a waiter on the server",
        waiting,
        |n| n == "0",
    )
    .await;
    let w = tokio::spawn({
        let lb = lb.clone();
        async move { lb.acquire().await }
    });
    poll_until("the waiter never waited on the server", waiting, |n| {
        n == "1"
    })
    .await;
    w.abort();
    let _ = w.await;
    poll_until(
        "the aborted waiter left a waiter on the server",
        waiting,
        |n| n == "0",
    )
    .await;
    (a, g)
}

/// A client of `connect` on `url` holds `name`; then `server` restarts. Returns the client,
/// its guard and the guard's token.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is part of a test.
pub async fn hold_across_restart<S: SqlServer, B: Backend + 'static>(
    server: &mut S,
    connect: Connect<B>,
    url: &str,
    opts: &ClientOptions,
    name: &str,
) -> (Client, distlock_core::LockGuard, u64) {
    let backend = connect(url.to_owned(), opts.clone())
        .await
        .expect("connect");
    let a = Client::new(Arc::new(backend), opts.clone()).expect("client");
    let g = a
        .lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let token = g.fencing_token();
    server.restart().expect("restart");
    (a, g, token)
}

/// After a server restart: a new client of `connect` on `url` gets `name` within 15 s, with a
/// token above the last one before the restart (`token`: the counters are durable).
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is part of a test.
pub async fn next_holder_after_restart<B: Backend + 'static>(
    connect: Connect<B>,
    url: &str,
    opts: &ClientOptions,
    name: &str,
    token: u64,
) {
    let backend = connect(url.to_owned(), opts.clone())
        .await
        .expect("reconnect");
    let b = Client::new(Arc::new(backend), opts.clone()).expect("client");
    let g2 = b
        .lock(name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(15))
        .await
        .expect("acquire after restart");
    assert!(
        g2.fencing_token() > token,
        "{} after {token}",
        g2.fencing_token()
    );
    g2.release().await.expect("release");
}

/// Expands, in a test binary's `support` module, to its shared server (`shared_server()`),
/// `connect` (a [`Connect`] of `$backend`), the harness type `$alias` and a trait `Modes`
/// with one constructor per mode: `$mode` is the URL parameters `$params` and breaks a lock
/// with `$break` (a [`BreakLock`]).
#[macro_export]
macro_rules! sql_test_support {
    (
        $alias:ident = $server:ty, $backend:ty;
        $($(#[$doc:meta])* $mode:ident: $params:literal => $break:path),+ $(,)?
    ) => {
        static SERVER: $crate::sql_faults::Shared<$server> = $crate::sql_faults::Shared::new();

        /// The server of this test binary.
        pub fn shared_server() -> ::std::sync::Arc<$server> {
            SERVER.get()
        }

        /// A mode of the backend on the shared server.
        pub type $alias = $crate::sql_faults::SqlMode<$server, $backend>;

        /// Connects a backend (the harness's `Connect`).
        pub fn connect(
            url: ::std::string::String,
            opts: ::distlock_core::ClientOptions,
        ) -> $crate::sql_faults::Connecting<$backend> {
            ::std::boxed::Box::pin(async move { <$backend>::connect(&url, &opts).await })
        }

        /// The modes of the backend.
        pub trait Modes {
            $($(#[$doc])* fn $mode() -> Self;)+
        }

        impl Modes for $alias {
            $(fn $mode() -> Self {
                $crate::sql_faults::SqlMode::new(shared_server(), $params, connect, $break)
            })+
        }
    };
}
