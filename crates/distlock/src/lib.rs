//! # dlock — distributed locks for Rust
//!
//! One API over several lock services, chosen by URL:
//!
//! | URL | backend | cargo feature |
//! |---|---|---|
//! | `file://DIR` | OS file locks, processes on one host, no server | `file` (default) |
//! | `redis://[user:pass@]host:port[/db]` | one Redis server | `redis` (default) |
//! | `redis+sentinel://[:pass@]s1:p1[,s2:p2…]/MASTER[?sentinel_password=P]` | the Redis primary Sentinel names, followed across failovers | `redis` (default) |
//! | `redis+cluster://[:pass@]h1:p1[,h2:p2…]` | a Redis Cluster (any nodes as seeds; each lock on its slot's master) | `redis` (default) |
//! | `rediss+cluster://h1:p1[,…]?ca_file=PATH` | the same over TLS | `redis` + `tls` |
//! | `redlock://[user:pass@]h1:p1,h2:p2,h3:p3` | Redlock over N independent Redis masters | `redlock` (default) |
//! | `postgres://user:pass@host:port/db[?mode=lease]` | PostgreSQL advisory locks (or a lease table) | `postgres` |
//! | `mysql://user:pass@host:port/db[?mode=table]` | MySQL/MariaDB `GET_LOCK` (or lock rows) | `mysql` |
//! | `etcd://h1:p1[,h2:p2…][/prefix]` | an etcd cluster, etcd's own mutex and election recipes | `etcd` |
//! | `etcds://h1:p1[,h2:p2…][/prefix]?cacert=PATH` | the same over TLS | `etcd` |
//! | `zk://h1:p1[,h2:p2…][/chroot]` | ZooKeeper ensemble, Curator-style lock nodes | `zookeeper` |
//! | `zks://h1:p1[,h2:p2…][/chroot]?cacert=PATH` | the same over TLS | `zookeeper` + `tls` |
//!
//! Every lock hands its holder a **fencing token** (strictly increasing per lock name) and a
//! **lost signal** (fires as soon as the lease is known to be gone). By default a lock is kept
//! alive by a watchdog while its guard lives; locks are re-entrant per owner; waiters are woken
//! by the server, not by a polling loop (except in MySQL's table mode: MySQL has no
//! notifications, so its waiters wake at the holder's lease end or at their heartbeat).
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! let client = distlock::connect("redis://127.0.0.1:6379").await?;
//! let lock = client.lock("stock:sku-42")?;
//! let guard = lock.acquire_timeout(std::time::Duration::from_secs(5)).await?;
//! let token = guard.fencing_token(); // pass it to the storage you protect
//! // ... read stock, check, decrement, write (reject writes with a lower token) ...
//! # let _ = token;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Non-async code uses [`blocking::connect`].
//!
//! The scheme picks the backend through a [registry](registry()) built from the enabled cargo
//! features; a scheme whose feature is off fails with a message naming the feature, and a
//! program can add a scheme of its own with [`register`]. Every error shows the URL with its
//! password as `***`; [`conn::ConnectionString`] is the parser the backends share, for a
//! backend of one's own.
#![warn(missing_docs)]

pub use distlock_core::*;

#[cfg(feature = "etcd")]
pub use distlock_etcd as etcd;
#[cfg(feature = "file")]
pub use distlock_file as file;
#[cfg(feature = "mysql")]
pub use distlock_mysql as mysql;
#[cfg(feature = "postgres")]
pub use distlock_postgres as postgres;
#[cfg(feature = "redis")]
pub use distlock_redis as redis;
#[cfg(feature = "redlock")]
pub use distlock_redlock as redlock;
#[cfg(feature = "zookeeper")]
pub use distlock_zookeeper as zookeeper;

/// The backend used when none is given: the embedded file backend in its default directory.
pub const DEFAULT_BACKEND: &str = "file://";

/// Connects to the lock service named by `url` with default [`ClientOptions`].
/// Must be called inside a tokio runtime.
///
/// The scheme picks the backend through the program's [registry](registry()): the backends
/// of the enabled cargo features, plus any added with [`register`].
///
/// # Errors
///
/// [`Error::InvalidUrl`] (the URL shown with its password as `***`) when the URL has no
/// scheme, an unknown scheme (the message lists the known ones), the scheme of a backend
/// this program is built without (the message names the cargo feature), or a part or
/// parameter the backend does not accept; [`Error::Connection`] when the server cannot be
/// reached within the connect timeout; [`Error::Auth`] when it refuses the credentials.
///
/// # Cancel safety
///
/// Cancel safe: dropping the future closes the connections being set up; no lock is taken
/// by connecting.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let client = distlock::connect("redis://127.0.0.1:6379").await?;
/// let guard = client.lock("report")?.acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Client> {
    connect_with(url, ClientOptions::default()).await
}

/// Connects to the lock service named by `url` with `opts`; see [`connect`].
///
/// # Errors
///
/// [`Error::InvalidArgument`] when `opts` are inconsistent (see [`ClientOptions::validate`]),
/// then as [`connect`].
///
/// # Cancel safety
///
/// Cancel safe, as [`connect`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// use std::time::Duration;
/// let opts = distlock::ClientOptions::default()
///     .namespace("shop")
///     .watchdog_lease(Duration::from_secs(10));
/// let client = distlock::connect_with("redis://127.0.0.1:6379", opts).await?;
/// # let _ = client;
/// # Ok(()) }
/// ```
pub async fn connect_with(url: &str, opts: ClientOptions) -> Result<Client> {
    registry().connect(url, opts).await
}

mod backends;

pub use backends::{default_registry, register, registry};

/// The blocking API, for code without an async runtime.
pub mod blocking {
    pub use distlock_core::blocking::*;

    /// Connects with default options; see [`crate::connect`]. Starts the client's own
    /// runtime thread; must **not** be called from async code.
    ///
    /// # Errors
    ///
    /// [`Error::Runtime`](crate::Error::Runtime) when called inside a tokio runtime; otherwise
    /// as [`crate::connect`] (the URL shown with its password as `***`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = distlock::blocking::connect("redis://127.0.0.1:6379")?;
    /// let guard = client.lock("nightly-report")?.acquire()?;
    /// // ... the job that must run once ...
    /// guard.release()?;
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn connect(url: &str) -> crate::Result<Client> {
        connect_with(url, crate::ClientOptions::default())
    }

    /// Connects with `opts`; see [`crate::connect_with`] and [`connect`].
    ///
    /// # Errors
    ///
    /// As [`connect`], plus [`Error::InvalidArgument`](crate::Error::InvalidArgument) for
    /// inconsistent `opts`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let opts = distlock::ClientOptions::default().namespace("reports");
    /// let client = distlock::blocking::connect_with("file:///var/lib/app/locks", opts)?;
    /// # let _ = client;
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn connect_with(url: &str, opts: crate::ClientOptions) -> crate::Result<Client> {
        let url = url.to_owned();
        Client::new(move || async move { crate::connect_with(&url, opts).await })
    }
}

/// The code of the repository's README (its "Ten lines"), compiled by `cargo test --doc` so
/// that it cannot drift from the API. Not part of the API; only built for doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
