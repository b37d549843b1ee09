//! # dlock — distributed locks for Rust
//!
//! One API over several lock services, chosen by URL:
//!
//! | URL | backend | cargo feature |
//! |---|---|---|
//! | `file://DIR` | OS file locks, processes on one host, no server | `file` (default) |
//! | `redis://[user:pass@]host:port[/db]` | one Redis server | `redis` (default) |
//!
//! Every lock hands its holder a **fencing token** (strictly increasing per lock name) and a
//! **lost signal** (fires as soon as the lease is known to be gone). By default a lock is kept
//! alive by a watchdog while its guard lives; locks are re-entrant per owner; waiters are woken
//! by the server, not by a polling loop.
//!
//! ```no_run
//! # async fn demo() -> dlock::Result<()> {
//! let client = dlock::connect("redis://127.0.0.1:6379").await?;
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

pub use dlock_core::*;

#[cfg(feature = "file")]
pub use dlock_file as file;
#[cfg(feature = "redis")]
pub use dlock_redis as redis;

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

#[cfg(not(all(feature = "redis", feature = "file")))]
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
                    dlock_redis::RedisBackend::connect(url, opts).await?,
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
                Ok(std::sync::Arc::new(dlock_file::FileBackend::from_url(
                    url, opts,
                )?))
            }
            #[cfg(not(feature = "file"))]
            {
                let _ = opts;
                Err(not_built(url, scheme, "file"))
            }
        }
        "redlock" | "etcd" | "zk" | "postgres" | "postgresql" | "mysql" => Err(Error::InvalidUrl {
            url: url.to_owned(),
            reason: format!(
                "the {scheme}:// backend is not available in this version of dlock yet"
            ),
        }),
        other => Err(Error::InvalidUrl {
            url: url.to_owned(),
            reason: format!(
                "unknown scheme `{other}`; dlock understands file:// and redis:// in this build"
            ),
        }),
    }
}

/// The blocking API, for code without an async runtime.
pub mod blocking {
    pub use dlock_core::blocking::*;

    /// Connects with default options; see [`crate::connect`].
    ///
    /// ```no_run
    /// let client = dlock::blocking::connect("redis://127.0.0.1:6379")?;
    /// let guard = client.lock("nightly-report")?.acquire()?;
    /// // ... the job that must run once ...
    /// guard.release()?;
    /// # Ok::<(), dlock::Error>(())
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
