//! The `redlock://` store: the data of a run lives on the **first** node of the URL, as with
//! `redis://` (the lock is on a majority of the nodes; the stock and orders are not replicated).
//! [`Store::forget_lock`] deletes the lock's fencing counter on every node.

use super::redis::RedisStore;
use super::{Fenced, Store, StoreError, StoreResult};
use distlock::async_trait;
use distlock::conn::Host;

/// A [`RedisStore`] on the first Redlock node, plus the URLs of all nodes.
pub struct RedlockStore {
    first: RedisStore,
    nodes: Vec<String>,
    prefix: String,
    run: String,
}

impl RedlockStore {
    /// Connects to the first node of `url`.
    pub async fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Self> {
        let nodes = node_urls(url)?;
        let Some(first) = nodes.first() else {
            return Err(StoreError(format!(
                "`{}` names no Redis node",
                distlock::redis::redact(url)
            )));
        };
        Ok(RedlockStore {
            first: RedisStore::open(first, prefix, run).await?,
            nodes,
            prefix: prefix.to_owned(),
            run: run.to_owned(),
        })
    }
}

/// `redis://[auth@]host:port[/db][?namespace=NS]` for every node of a Redlock URL (the
/// layout distlock-redlock reads: `redlock://[auth@]h1:p1,h2:p2,…[/db][?params]`; only
/// `namespace` among the parameters matters to the data).
pub(crate) fn node_urls(url: &str) -> StoreResult<Vec<String>> {
    let cs = super::parse(url)?;
    let bad = |why: &str| {
        StoreError(format!(
            "invalid Redlock URL `{}`: {why}; write redlock://host1:port1,host2:port2,host3:port3",
            cs.redacted()
        ))
    };
    let node_scheme = match cs.scheme() {
        "redlock" => "redis",
        "redlocks" => "rediss",
        _ => return Err(bad("the scheme is not redlock:// or redlocks://")),
    };
    if cs.hosts().is_empty() {
        return Err(bad("no node in the list"));
    }
    let mut node = cs.clone();
    node.set_scheme(node_scheme);
    node.retain_params(|k, _| k == "namespace");
    Ok(cs
        .hosts()
        .iter()
        .map(|h| {
            let mut one = node.clone();
            one.set_hosts(vec![Host::new(h.host.clone(), Some(h.port_or(6379)))]);
            one.expose_url().to_owned()
        })
        .collect())
}

#[async_trait]
impl Store for RedlockStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        self.first.setup(stock).await
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        self.first.read().await
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        self.first.write(stock).await
    }

    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool> {
        self.first.cas(expected_version, new_stock).await
    }

    async fn fenced_read(&self, lock: &str, token: u64) -> StoreResult<Fenced<i64>> {
        self.first.fenced_read(lock, token).await
    }

    async fn fenced_write(&self, lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>> {
        self.first.fenced_write(lock, token, stock).await
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        self.first.add_order(buyer).await
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        self.first.orders().await
    }

    async fn cleanup(&self) -> StoreResult<()> {
        self.first.cleanup().await
    }

    /// Deletes the lock's fencing counter on every node (each node keeps distlock-redis's
    /// layout); the first error is returned after trying them all.
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        let mut first_err = self.first.forget_lock(name).await.err();
        for node in self.nodes.iter().skip(1) {
            let r = match RedisStore::open(node, &self.prefix, &self.run).await {
                Ok(s) => s.forget_lock(name).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_of_redlock_urls() {
        assert_eq!(
            node_urls("redlock://u:p%40w@a:1,b:2,c/3?namespace=shop&node_timeout=20ms").unwrap(),
            vec![
                "redis://u:p%40w@a:1/3?namespace=shop",
                "redis://u:p%40w@b:2/3?namespace=shop",
                "redis://u:p%40w@c:6379/3?namespace=shop",
            ]
        );
        assert_eq!(
            node_urls("redlocks://[::1]:7,h:8").unwrap(),
            vec!["rediss://[::1]:7", "rediss://h:8"]
        );
        assert!(node_urls("redlock://a:1,,b:2").is_err());
        assert!(node_urls("redis://a:1").is_err());
    }
}
