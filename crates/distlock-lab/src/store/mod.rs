//! The shared data a `seckill` run or a `bench contended` run works on, kept in the lock
//! backend's own store: a stock (or counter) with a version, and a list of orders.
//!
//! Every *single* operation of a [`Store`] is atomic (a short `flock` for `file://`, one command,
//! transaction or script for `redis://`), but a sequence of them is not: that is what the
//! experiments need, a read-check-write race that only a lock (or a compare-and-set) closes.
//!
//! | backend | where |
//! |---|---|
//! | `file://DIR` | `<lock dir>/<prefix>-<run>.state` (`"<stock> <version>\n"`) and `<prefix>-<run>.orders` (one buyer id a line) |
//! | `redis://` | `<prefix>:{<run>}:stock`, `<prefix>:{<run>}:version` (strings), `<prefix>:{<run>}:orders` (list, RPUSH) |
//! | `redlock://` | as `redis://`, on the **first** node of the URL only: the lock is spread over all nodes, the data is not |
//! | `postgres://` (feature `postgres`) | tables `dlock_<prefix>_stock(run, stock, version)` and `dlock_<prefix>_orders(id, run, buyer)` |
//! | `mysql://` (feature `mysql`) | the same two tables (InnoDB) |
//! | `etcd://` (feature `etcd`) | `<etcd prefix>/<prefix>/<run>/stock` (`"<stock> <version>"`), `…/<run>/orders/<n>` (one buyer id each) |
//! | `zk://` (feature `zookeeper`) | `<chroot>/dlock-store/<prefix>-<run>/stock` (`"<stock>"`, version = the znode's data version), `…/orders/order-<seq>` |
//!
//! A backend plugs in by implementing [`Store`] and adding a branch to [`open`] and to
//! [`SCHEMES`].

#[cfg(feature = "etcd")]
mod etcd;
mod file;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod redis;
mod redlock;
#[cfg(feature = "zookeeper")]
mod zookeeper;

use distlock::async_trait;
use distlock::conn::ConnectionString;
use std::fmt;

/// An error of the store: what failed, where, and why.
#[derive(Debug, Clone)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// The answer of a fenced operation of a [`Store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced<T> {
    /// Done, with its result.
    Done(T),
    /// Rejected: the store had seen the newer token `newer`; nothing was changed.
    Stale {
        /// The newer token.
        newer: u64,
    },
}

impl<T> Fenced<Option<T>> {
    /// A done read that found nothing is the error `missing`.
    pub(crate) fn found(self, missing: impl FnOnce() -> StoreError) -> StoreResult<Fenced<T>> {
        match self {
            Fenced::Done(Some(v)) => Ok(Fenced::Done(v)),
            Fenced::Done(None) => Err(missing()),
            Fenced::Stale { newer } => Ok(Fenced::Stale { newer }),
        }
    }
}

impl<T> Fenced<T> {
    /// Maps the result of a done operation.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Fenced<U> {
        match self {
            Fenced::Done(v) => Fenced::Done(f(v)),
            Fenced::Stale { newer } => Fenced::Stale { newer },
        }
    }

    /// A fenced helper's result as a store's: a stale token is an answer, not an error.
    pub(crate) fn from_fence(r: distlock_fence::Result<T>) -> StoreResult<Fenced<T>> {
        match r {
            Ok(v) => Ok(Fenced::Done(v)),
            Err(distlock_fence::Error::Stale { newer, .. }) => Ok(Fenced::Stale { newer }),
            Err(e) => Err(StoreError(e.to_string())),
        }
    }
}

/// The data of one run. Each method is one atomic operation; no method is atomic *with*
/// another.
#[async_trait]
pub trait Store: Send + Sync {
    /// (Re)creates the run's data: stock (or counter) `stock`, version 0, no orders.
    async fn setup(&self, stock: i64) -> StoreResult<()>;

    /// Reads the stock and its version.
    async fn read(&self) -> StoreResult<(i64, u64)>;

    /// Overwrites the stock (blindly: no check), incrementing the version.
    async fn write(&self, stock: i64) -> StoreResult<()>;

    /// Writes `new_stock` (incrementing the version) only if the version is still
    /// `expected_version`; returns whether it did.
    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool>;

    /// Appends an order by `buyer`.
    async fn add_order(&self, buyer: u64) -> StoreResult<()>;

    /// All orders, in the order they were appended.
    async fn orders(&self) -> StoreResult<Vec<u64>>;

    /// Deletes the run's data.
    async fn cleanup(&self) -> StoreResult<()>;

    /// Makes this client's following reads see every write acknowledged before the call, by
    /// any client. Needed before a final check from another client than the writers' where
    /// reads may be served by a lagging replica (ZooKeeper followers); a no-op elsewhere.
    async fn sync(&self) -> StoreResult<()> {
        Ok(())
    }

    /// `fenced` strategy: reads the stock through the store's fence with the fencing `token`
    /// of the holder of the lock `lock`: stores that keep a fence beside the data record the
    /// token (so that from now on the writes of older tokens are rejected); etcd and ZooKeeper
    /// check that the grant's key or node still exists.
    async fn fenced_read(&self, lock: &str, token: u64) -> StoreResult<Fenced<i64>>;

    /// `fenced` strategy: overwrites the stock through the store's fence (checked in the same
    /// atomic step as the write), incrementing the version.
    async fn fenced_write(&self, lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>>;

    /// What the lock service does when the lease of the holder of the lock `name` in the
    /// stopped process `pid` has run out (`--pause`): where the server keeps leases (every
    /// backend but `file://`), nothing is left to do: it hands the lock on by itself.
    async fn expire_stopped_holder(&self, pid: u32, name: &str) -> StoreResult<()> {
        let _ = (pid, name);
        Ok(())
    }

    /// Removes what the lock backend keeps for the lock `name` (the `file://` backend keeps one
    /// file per name, forever). Call only when no process uses that lock any more.
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        let _ = name;
        Ok(())
    }
}

/// The lower-case scheme of a backend URL (`file`, `redis`, …), or `None` without `://`.
pub fn scheme(url: &str) -> Option<String> {
    distlock::conn::scheme_of(url)
}

/// `url` split into its parts by dlock's one connection-string parser (the error shows the
/// URL with its password masked).
pub(crate) fn parse(url: &str) -> StoreResult<ConnectionString> {
    ConnectionString::parse(url).map_err(|e| StoreError(e.to_string()))
}

/// The dlock namespace a URL names: its `namespace` parameter, else the default.
pub(crate) fn namespace(cs: &ConnectionString) -> String {
    cs.param("namespace")
        .filter(|ns| !ns.is_empty())
        .map_or_else(
            || {
                distlock::ClientOptions::default()
                    .get_namespace()
                    .to_owned()
            },
            str::to_owned,
        )
}

/// A SQL backend's URL for its driver: dlock's own parameters (`namespace` and `ours`) taken
/// out; with the dlock namespace.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn driver_url(url: &str, ours: &[&str]) -> StoreResult<(ConnectionString, String)> {
    let mut cs = parse(url)?;
    let namespace = namespace(&cs);
    cs.retain_params(|k, _| k != "namespace" && !ours.contains(&k));
    Ok((cs, namespace))
}

/// Checks that `s` can name a run: 1 to 80 characters out of `[A-Za-z0-9-]` (it becomes part
/// of file names and keys).
pub fn check_run_id(s: &str) -> StoreResult<()> {
    if s.is_empty() || s.len() > 80 || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(StoreError(format!(
            "run id `{}` must be 1 to 80 characters out of A-Z, a-z, 0-9 and `-`",
            s.escape_debug()
        )));
    }
    Ok(())
}

/// Opens the store of run `run` (data names start with `prefix`) on the backend `url`.
/// Fails with a clear message for backends that have no store yet.
pub async fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Box<dyn Store>> {
    check_run_id(run)?;
    let Some(scheme) = scheme(url) else {
        return Err(StoreError(format!(
            "backend URL `{url}` has no scheme; write e.g. file:///tmp/locks or redis://127.0.0.1:6380"
        )));
    };
    check_prefix(prefix)?;
    match scheme.as_str() {
        "file" => Ok(Box::new(file::FileStore::open(url, prefix, run)?)),
        "redis" | "rediss" => Ok(Box::new(redis::RedisStore::open(url, prefix, run).await?)),
        "redlock" | "redlocks" => Ok(Box::new(
            redlock::RedlockStore::open(url, prefix, run).await?,
        )),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Box::new(postgres::PgStore::open(url, prefix, run).await?)),
        #[cfg(feature = "mysql")]
        "mysql" => Ok(Box::new(mysql::MySqlStore::open(url, prefix, run).await?)),
        #[cfg(feature = "etcd")]
        "etcd" => Ok(Box::new(etcd::EtcdStore::open(url, prefix, run).await?)),
        #[cfg(feature = "zookeeper")]
        "zk" => Ok(Box::new(zookeeper::ZkStore::open(url, prefix, run).await?)),
        other => Err(unsupported(other)),
    }
}

/// The schemes whose store this build has.
pub const SCHEMES: &[&str] = &[
    "file",
    "redis",
    "rediss",
    "redlock",
    "redlocks",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "postgres")]
    "postgresql",
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "etcd")]
    "etcd",
    #[cfg(feature = "zookeeper")]
    "zk",
];

/// Checks, without touching anything, that `url` names a backend with a store in this build.
pub fn check_supported(url: &str) -> StoreResult<()> {
    match scheme(url).as_deref() {
        Some(s) if SCHEMES.contains(&s) => Ok(()),
        Some(other) => Err(unsupported(other)),
        None => Err(StoreError(format!(
            "backend URL `{url}` has no scheme; write e.g. file:///tmp/locks or redis://127.0.0.1:6380"
        ))),
    }
}

/// The cargo feature (of the facade, the lab and the dlock CLI alike) that builds the backend
/// of `scheme`, when this build lacks it: the facade's registry knows.
fn feature_of(scheme: &str) -> Option<String> {
    distlock::default_registry()
        .not_built()
        .into_iter()
        .find(|(s, _)| *s == scheme)
        .map(|(_, feature)| feature.to_owned())
}

fn unsupported(scheme: &str) -> StoreError {
    match feature_of(scheme) {
        Some(feature) => StoreError(format!(
            "this dlock is built without the {scheme}:// backend; rebuild it with \
             `cargo build -p distlock-cli --features {feature}` (or `cargo install distlock-cli --features {feature}`)"
        )),
        None => StoreError(format!(
            "the {scheme}:// backend has no store for the stock and orders; supported here: {}",
            SCHEMES
                .iter()
                .map(|s| format!("{s}://"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Store prefixes are ours (`seckill`, `bench`), but they end up in table names: keep them
/// to `[a-z0-9_]`.
fn check_prefix(prefix: &str) -> StoreResult<()> {
    if prefix.is_empty()
        || prefix.len() > 32
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(StoreError(format!(
            "store prefix `{}` must be 1 to 32 characters out of a-z, 0-9 and `_`",
            prefix.escape_debug()
        )));
    }
    Ok(())
}

/// Runs `fut` with a time limit; `what` and `endpoint` make the error message.
#[cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
pub(crate) async fn timed<T, E: fmt::Display>(
    endpoint: &str,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> StoreResult<T> {
    match tokio::time::timeout(OP_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(StoreError(format!("{endpoint}: {what} failed: {e}"))),
        Err(_) => Err(StoreError(format!(
            "{endpoint}: {what}: no answer within {OP_TIMEOUT:?}"
        ))),
    }
}

/// Runs a fenced operation with the time limit of [`timed`]: a stale token is an answer
/// ([`Fenced::Stale`]), other errors name `what` and `endpoint`.
#[cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
pub(crate) async fn timed_fenced<T>(
    endpoint: &str,
    what: &str,
    fut: impl std::future::Future<Output = distlock_fence::Result<T>>,
) -> StoreResult<Fenced<T>> {
    // A stale token passes through `timed` as a value.
    let r = timed(endpoint, what, async {
        match fut.await {
            Err(e) if !e.is_stale() => Err(e),
            r => Ok(r),
        }
    })
    .await?;
    Fenced::from_fence(r)
}

/// Time limit of one store operation (connecting included).
#[cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
pub(crate) const OP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        let ns = |url: &str| namespace(&parse(url).expect("parses"));
        assert_eq!(ns("redis://h:1"), "dlock");
        assert_eq!(ns("redis://h:1/0?namespace=shop&x=1"), "shop");
        assert_eq!(ns("redis://h:1?wait_replicas=1&namespace=a"), "a");
        assert_eq!(ns("redis://h:1?namespace="), "dlock");
    }

    #[test]
    fn schemes_and_run_ids() {
        assert_eq!(scheme("file://").as_deref(), Some("file"));
        assert_eq!(scheme("REDIS://x:1").as_deref(), Some("redis"));
        assert_eq!(scheme("/tmp"), None);
        assert!(check_supported("file:///tmp/x").is_ok());
        assert!(check_supported("redlock://a:1,b:2,c:3").is_ok());
        let e = check_supported("nope://db/x").unwrap_err();
        assert!(e.0.contains("nope://"), "{e}");
        #[cfg(not(feature = "postgres"))]
        {
            let e = check_supported("postgres://db/x").unwrap_err();
            assert!(e.0.contains("--features postgres"), "{e}");
        }
        #[cfg(feature = "postgres")]
        assert!(check_supported("postgresql://u@db/x").is_ok());
        assert!(check_run_id("abc-12").is_ok());
        assert!(check_run_id("../x").is_err());
        assert!(check_run_id("").is_err());
    }
}
