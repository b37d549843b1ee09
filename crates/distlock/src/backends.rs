//! The default registry: one entry per backend scheme, built or not by its cargo feature.

use distlock_core::registry::Registry;
use distlock_core::Result;
#[allow(unused_imports)] // unused when no backend feature is on
use distlock_core::{conn::ConnectionString, ClientOptions};
use std::sync::{PoisonError, RwLock};

/// Registers `$scheme`s with the async expression `$open` (given `url: ConnectionString`,
/// `opts: ClientOptions`) when `$feature` is on, else as not built with that feature.
macro_rules! backend {
    ($r:ident, $feature:literal, [$($scheme:literal),+], |$url:ident, $opts:ident| $open:expr) => {
        $(
            #[cfg(feature = $feature)]
            let _ = $r.register($scheme, |$url: ConnectionString, $opts: ClientOptions| async move {
                $open
            });
            #[cfg(not(feature = $feature))]
            let _ = $r.register_not_built($scheme, $feature);
        )+
    };
}

/// Registers `$scheme`s to open the backend of settings type `$settings` (its
/// [`Connect`](distlock_core::conn::Connect)) with the parsed URL, when `$feature` is on.
macro_rules! connect {
    ($r:ident, $feature:literal, [$($scheme:literal),+], $settings:ty) => {
        $(
            #[cfg(feature = $feature)]
            let _ = $r.register_connect::<$settings>($scheme);
            #[cfg(not(feature = $feature))]
            let _ = $r.register_not_built($scheme, $feature);
        )+
    };
}

/// A fresh registry with the backends of the enabled cargo features, and the schemes of the
/// others recorded as not built (opening them names the feature to enable).
///
/// | schemes | feature |
/// |---|---|
/// | `file` | `file` |
/// | `redis`, `rediss`, `redis+sentinel`, `redis+cluster`, `rediss+cluster` | `redis` (`rediss`, `rediss+cluster` need `tls` too) |
/// | `redlock`, `redlocks` | `redlock` (`redlocks` needs `tls` too) |
/// | `etcd`, `etcds` | `etcd` |
/// | `postgres`, `postgresql` | `postgres` |
/// | `mysql` | `mysql` |
/// | `zk`, `zks` | `zookeeper` (`zks` needs `tls` too) |
///
/// # Examples
///
/// ```
/// let registry = distlock::default_registry();
/// if cfg!(feature = "redis") {
///     assert!(registry.is_built("redis"));
/// }
/// assert!(registry.schemes().len() + registry.not_built().len() >= 15);
/// ```
pub fn default_registry() -> Registry {
    let mut r = Registry::new();
    backend!(r, "file", ["file"], |url, opts| {
        distlock_file::FileBackend::from_url(url.expose_url(), &opts)
    });
    connect!(
        r,
        "redis",
        [
            "redis",
            "rediss",
            "redis+sentinel",
            "redis+cluster",
            "rediss+cluster"
        ],
        distlock_redis::RedisSettings
    );
    backend!(r, "redlock", ["redlock", "redlocks"], |url, opts| {
        distlock_redlock::RedlockBackend::connect(url.expose_url(), &opts).await
    });
    connect!(r, "etcd", ["etcd", "etcds"], distlock_etcd::EtcdSettings);
    connect!(
        r,
        "postgres",
        ["postgres", "postgresql"],
        distlock_postgres::PgSettings
    );
    connect!(r, "mysql", ["mysql"], distlock_mysql::MysqlSettings);
    connect!(
        r,
        "zookeeper",
        ["zk", "zks"],
        distlock_zookeeper::ZkSettings
    );
    r
}

fn global() -> &'static RwLock<Registry> {
    static REGISTRY: std::sync::OnceLock<RwLock<Registry>> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(default_registry()))
}

/// The registry [`connect`](crate::connect) and [`connect_with`](crate::connect_with) use (a
/// snapshot: cheap to clone, later [`register`] calls do not change it).
///
/// # Examples
///
/// ```
/// let schemes = distlock::registry().schemes().join(", ");
/// println!("this program opens {schemes}");
/// ```
pub fn registry() -> Registry {
    global()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Adds (or replaces) the backend of `scheme` in the registry of [`connect`](crate::connect),
/// for this whole process: `scheme://…` URLs then call `connect(url, opts)`.
///
/// # Errors
///
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `scheme` is not a URL
/// scheme (a letter, then letters, digits, `+`, `-` or `.`).
///
/// # Examples
///
/// A scheme of one's own for the embedded backend in a fixed directory:
///
/// ```no_run
/// # #[cfg(feature = "file")]
/// # async fn demo() -> distlock::Result<()> {
/// distlock::register("applocks", |url, opts| async move {
///     let dir = format!("file:///var/lib/app/locks{}", url.raw_path());
///     distlock::file::FileBackend::from_url(&dir, &opts)
/// })?;
/// let client = distlock::connect("applocks:///jobs").await?;
/// # let _ = client;
/// # Ok(()) }
/// ```
pub fn register<F, Fut, B>(scheme: &str, connect: F) -> Result<()>
where
    F: Fn(ConnectionString, ClientOptions) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<B>> + Send + 'static,
    B: distlock_core::registry::IntoBackend,
{
    global()
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .register(scheme, connect)?;
    Ok(())
}
