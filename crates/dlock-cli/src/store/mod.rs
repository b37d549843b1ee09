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
//!
//! Other backends (`redlock://` through its first node, `postgres://`, `mysql://`, …) plug in
//! by implementing [`Store`] and adding a branch to [`open`].

mod file;
mod redis;

use dlock::async_trait;
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

    /// Removes what the lock backend keeps for the lock `name` (the `file://` backend keeps one
    /// file per name, forever). Call only when no process uses that lock any more.
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        let _ = name;
        Ok(())
    }
}

/// The lower-case scheme of a backend URL (`file`, `redis`, …), or `None` without `://`.
pub fn scheme(url: &str) -> Option<String> {
    url.split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .filter(|s| !s.is_empty())
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
    match scheme.as_str() {
        "file" => Ok(Box::new(file::FileStore::open(url, prefix, run)?)),
        "redis" => Ok(Box::new(redis::RedisStore::open(url, prefix, run).await?)),
        other => Err(unsupported(other)),
    }
}

/// Checks, without touching anything, that `url` names a backend with a store.
pub fn check_supported(url: &str) -> StoreResult<()> {
    match scheme(url).as_deref() {
        Some("file") | Some("redis") => Ok(()),
        Some(other) => Err(unsupported(other)),
        None => Err(StoreError(format!(
            "backend URL `{url}` has no scheme; write e.g. file:///tmp/locks or redis://127.0.0.1:6380"
        ))),
    }
}

fn unsupported(scheme: &str) -> StoreError {
    StoreError(format!(
        "the {scheme}:// backend has no store for the stock and orders yet; use file://DIR or redis://host:port"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_run_ids() {
        assert_eq!(scheme("file://").as_deref(), Some("file"));
        assert_eq!(scheme("REDIS://x:1").as_deref(), Some("redis"));
        assert_eq!(scheme("/tmp"), None);
        assert!(check_supported("file:///tmp/x").is_ok());
        let e = check_supported("postgres://db/x").unwrap_err();
        assert!(e.0.contains("postgres://"), "{e}");
        assert!(check_run_id("abc-12").is_ok());
        assert!(check_run_id("../x").is_err());
        assert!(check_run_id("").is_err());
    }
}
