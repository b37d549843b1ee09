//! # dlock — distributed locks for Rust
//!
//! One API over several lock services, chosen by URL:
//!
//! | URL | backend | cargo feature |
//! |---|---|---|
//! | `file://DIR` | OS file locks, processes on one host, no server | `file` (default) |
//! | `redis://[user:pass@]host:port[/db]` | one Redis server | `redis` (default) |
//! | `redlock://[user:pass@]h1:p1,h2:p2,h3:p3` | Redlock over N independent Redis masters | `redlock` (default) |
//! | `postgres://user:pass@host:port/db[?mode=lease]` | PostgreSQL advisory locks (or a lease table) | `postgres` |
//! | `mysql://user:pass@host:port/db[?mode=table]` | MySQL/MariaDB `GET_LOCK` (or lock rows) | `mysql` |
//! | `zk://h1:p1[,h2:p2…][/chroot]` | ZooKeeper ensemble, Curator-style lock nodes | `zookeeper` |
//!
//! Every lock hands its holder a **fencing token** (strictly increasing per lock name) and a
//! **lost signal** (fires as soon as the lease is known to be gone). By default a lock is kept
//! alive by a watchdog while its guard lives; locks are re-entrant per owner; waiters are woken
//! by the server, not by a polling loop.
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
pub async fn connect(url: &str) -> Result<Client> {
    connect_with(url, ClientOptions::default()).await
}

/// Connects to the lock service named by `url` with `opts`.
pub async fn connect_with(url: &str, opts: ClientOptions) -> Result<Client> {
    opts.validate()?;
    let backend = open_backend(url, &opts).await?;
    Client::new(backend, opts)
}

#[cfg(not(all(
    feature = "redis",
    feature = "file",
    feature = "etcd",
    feature = "redlock",
    feature = "postgres",
    feature = "mysql",
    feature = "zookeeper"
)))]
fn not_built(url: &str, scheme: &str, feature: &str) -> Error {
    Error::InvalidUrl {
        url: url.to_owned(),
        reason: format!(
            "the {scheme}:// backend is not built into this program; enable the `{feature}` cargo feature of dlock"
        ),
    }
}

async fn open_backend(url: &str, opts: &ClientOptions) -> Result<std::sync::Arc<dyn Backend>> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(Error::InvalidUrl {
            url: url.to_owned(),
            reason: "no scheme; write e.g. redis://127.0.0.1:6379 or file:///tmp/locks".into(),
        });
    };
    match scheme {
        "redis" | "rediss" => {
            #[cfg(feature = "redis")]
            {
                Ok(std::sync::Arc::new(
                    distlock_redis::RedisBackend::connect(url, opts).await?,
                ))
            }
            #[cfg(not(feature = "redis"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "redis"))
            }
        }
        "file" => {
            #[cfg(feature = "file")]
            {
                Ok(std::sync::Arc::new(distlock_file::FileBackend::from_url(
                    url, opts,
                )?))
            }
            #[cfg(not(feature = "file"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "file"))
            }
        }
        "etcd" | "etcds" => {
            #[cfg(feature = "etcd")]
            {
                Ok(std::sync::Arc::new(
                    distlock_etcd::EtcdBackend::connect(url, opts).await?,
                ))
            }
            #[cfg(not(feature = "etcd"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "etcd"))
            }
        }
        "redlock" | "redlocks" => {
            #[cfg(feature = "redlock")]
            {
                Ok(std::sync::Arc::new(
                    distlock_redlock::RedlockBackend::connect(url, opts).await?,
                ))
            }
            #[cfg(not(feature = "redlock"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "redlock"))
            }
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            {
                Ok(std::sync::Arc::new(
                    distlock_postgres::PostgresBackend::connect(url, opts).await?,
                ))
            }
            #[cfg(not(feature = "postgres"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "postgres"))
            }
        }
        "mysql" => {
            #[cfg(feature = "mysql")]
            {
                Ok(std::sync::Arc::new(
                    distlock_mysql::MysqlBackend::connect(url, opts).await?,
                ))
            }
            #[cfg(not(feature = "mysql"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "mysql"))
            }
        }
        "zk" => {
            #[cfg(feature = "zookeeper")]
            {
                Ok(std::sync::Arc::new(
                    distlock_zookeeper::ZkBackend::connect(url, opts).await?,
                ))
            }
            #[cfg(not(feature = "zookeeper"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "zookeeper"))
            }
        }
        other => Err(Error::InvalidUrl {
            url: url.to_owned(),
            reason: format!(
                "unknown scheme `{other}`; dlock understands file://, redis://, rediss://, redlock://, \
                 etcd://, zk://, postgres:// and mysql:// (some need a cargo feature)"
            ),
        }),
    }
}

/// The blocking API, for code without an async runtime.
pub mod blocking {
    pub use distlock_core::blocking::*;

    /// Connects with default options; see [`crate::connect`].
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

    /// Connects with `opts`; see [`crate::connect_with`].
    pub fn connect_with(url: &str, opts: crate::ClientOptions) -> crate::Result<Client> {
        let url = url.to_owned();
        Client::new(move || async move { crate::connect_with(&url, opts).await })
    }
}
