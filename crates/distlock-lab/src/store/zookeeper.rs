//! The `zk://` store: znodes under `<chroot>/dlock-store/<prefix>-<run>`: `stock` holds the
//! stock as text and its *data version* is the version, so `cas` is a `setData` with the
//! expected version; `orders` has one persistent sequential child `order-<seq>` per order
//! (data: the buyer id).

use super::{timed, timed_fenced, Fenced, Store, StoreError, StoreResult, OP_TIMEOUT};
use distlock::async_trait;
use distlock_fence::zookeeper::{ZkFence, ZkHolder};
use std::time::Duration;
use zookeeper_client as zk;

/// Session timeout the store asks for (the data is persistent; the session only carries it).
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Stock and orders in ZooKeeper.
pub struct ZkStore {
    zk: zk::Client,
    endpoint: String,
    chroot: String,
    namespace: String,
    dir: String,
    stock: String,
    orders: String,
}

/// `(hosts, chroot, namespace)` of `zk://host:port[,host:port…][/chroot][?namespace=NS&…]`.
fn parse_url(url: &str) -> StoreResult<(String, String, String)> {
    let bad = |why: &str| {
        StoreError(format!(
            "invalid ZooKeeper URL `{url}`: {why}; write zk://host:port[,host:port…][/chroot]"
        ))
    };
    let rest = url
        .split_once("://")
        .filter(|(s, _)| s.eq_ignore_ascii_case("zk"))
        .map(|(_, r)| r)
        .ok_or_else(|| bad("the scheme is not zk://"))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, chroot) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let chroot = chroot.trim_end_matches('/');
    if chroot
        .split('/')
        .skip(1)
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(bad("the chroot has an empty, `.` or `..` segment"));
    }
    let mut hosts = Vec::new();
    for h in authority.split(',') {
        let h = h.trim();
        if h.is_empty() || h.contains('@') {
            return Err(bad("an empty host, or credentials"));
        }
        let has_port = match h.rfind(']') {
            Some(close) => h[close..].contains(':'),
            None => h.contains(':'),
        };
        hosts.push(if has_port {
            h.to_owned()
        } else {
            format!("{h}:2181")
        });
    }
    let namespace = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("namespace="))
        .filter(|ns| !ns.is_empty())
        .map_or_else(
            || {
                distlock::ClientOptions::default()
                    .get_namespace()
                    .to_owned()
            },
            str::to_owned,
        );
    Ok((hosts.join(","), chroot.to_owned(), namespace))
}

fn anyone() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

impl ZkStore {
    /// Connects to the ensemble of `url` (a session of its own).
    pub async fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Self> {
        let (hosts, chroot, namespace) = parse_url(url)?;
        let endpoint = format!("ZooKeeper at {hosts}{chroot}");
        let zk = timed(
            &endpoint,
            "connecting",
            zk::Client::connector()
                .with_session_timeout(SESSION_TIMEOUT)
                .connect(&hosts),
        )
        .await?;
        let dir = format!("{chroot}/dlock-store/{prefix}-{run}");
        Ok(ZkStore {
            zk,
            endpoint,
            chroot,
            namespace,
            stock: format!("{dir}/stock"),
            orders: format!("{dir}/orders"),
            dir,
        })
    }

    fn missing(&self) -> StoreError {
        StoreError(format!(
            "{}: `{}` is missing (was the run cleaned up?)",
            self.endpoint, self.stock
        ))
    }

    /// The node of the grant of `lock` with `token`, as a fenced multi needs it.
    async fn holder(&self, lock: &str, token: u64) -> StoreResult<Fenced<ZkHolder>> {
        let fence = ZkFence::new(&self.namespace, lock)
            .map_err(|e| StoreError(e.to_string()))?
            .in_chroot(&self.chroot);
        timed_fenced(
            &self.endpoint,
            "finding the holder's lock node",
            fence.holder(&self.zk, token),
        )
        .await
    }

    /// Deletes `path` if it exists.
    async fn delete(&self, path: &str) -> StoreResult<()> {
        match tokio::time::timeout(OP_TIMEOUT, self.zk.delete(path, None)).await {
            Ok(Ok(())) | Ok(Err(zk::Error::NoNode)) => Ok(()),
            Ok(Err(e)) => Err(StoreError(format!(
                "{}: deleting `{path}` failed: {e}",
                self.endpoint
            ))),
            Err(_) => Err(StoreError(format!(
                "{}: deleting `{path}`: no answer within {OP_TIMEOUT:?}",
                self.endpoint
            ))),
        }
    }

    /// Deletes the orders node and its children, if any.
    async fn delete_orders(&self) -> StoreResult<()> {
        let children =
            match tokio::time::timeout(OP_TIMEOUT, self.zk.list_children(&self.orders)).await {
                Ok(Ok(c)) => c,
                Ok(Err(zk::Error::NoNode)) => return Ok(()),
                Ok(Err(e)) => {
                    return Err(StoreError(format!(
                        "{}: listing the orders failed: {e}",
                        self.endpoint
                    )))
                }
                Err(_) => {
                    return Err(StoreError(format!(
                        "{}: listing the orders: no answer within {OP_TIMEOUT:?}",
                        self.endpoint
                    )))
                }
            };
        for c in children {
            self.delete(&format!("{}/{c}", self.orders)).await?;
        }
        self.delete(&self.orders).await
    }
}

#[async_trait]
impl Store for ZkStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        timed(
            &self.endpoint,
            "creating the run's node",
            self.zk.mkdir(&self.dir, &anyone()),
        )
        .await?;
        self.delete_orders().await?;
        // A fresh node: data version 0.
        self.delete(&self.stock).await?;
        timed(
            &self.endpoint,
            "creating the stock",
            self.zk
                .create(&self.stock, stock.to_string().as_bytes(), &anyone()),
        )
        .await?;
        timed(
            &self.endpoint,
            "creating the orders node",
            self.zk.create(&self.orders, &[], &anyone()),
        )
        .await
        .map(drop)
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        // A read is served by the server this session is connected to, which may lag the
        // leader: without a `sync` first, a buyer that got the lock right after another's
        // write could read the stock from before it and write a lost update (the lab's
        // `zookeeper_store` bench saw one: `lost_updates: 1` with no overlap).
        // A missing stock is reported by the read below, as before.
        let sync = async {
            match self.zk.sync(&self.stock).await {
                Err(zk::Error::NoNode) => Ok(()),
                r => r,
            }
        };
        timed(&self.endpoint, "syncing before reading the stock", sync).await?;
        let (data, stat) =
            match tokio::time::timeout(OP_TIMEOUT, self.zk.get_data(&self.stock)).await {
                Ok(Ok(r)) => r,
                Ok(Err(zk::Error::NoNode)) => return Err(self.missing()),
                Ok(Err(e)) => {
                    return Err(StoreError(format!(
                        "{}: reading the stock failed: {e}",
                        self.endpoint
                    )))
                }
                Err(_) => {
                    return Err(StoreError(format!(
                        "{}: reading the stock: no answer within {OP_TIMEOUT:?}",
                        self.endpoint
                    )))
                }
            };
        let stock = std::str::from_utf8(&data)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| {
                StoreError(format!(
                    "{}: `{}` holds `{}`, not a stock",
                    self.endpoint,
                    self.stock,
                    String::from_utf8_lossy(&data).escape_debug()
                ))
            })?;
        let version = u64::try_from(stat.version).map_err(|_| {
            StoreError(format!(
                "{}: `{}` has a negative data version {}",
                self.endpoint, self.stock, stat.version
            ))
        })?;
        Ok((stock, version))
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        match tokio::time::timeout(
            OP_TIMEOUT,
            self.zk
                .set_data(&self.stock, stock.to_string().as_bytes(), None),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(zk::Error::NoNode)) => Err(self.missing()),
            Ok(Err(e)) => Err(StoreError(format!(
                "{}: writing the stock failed: {e}",
                self.endpoint
            ))),
            Err(_) => Err(StoreError(format!(
                "{}: writing the stock: no answer within {OP_TIMEOUT:?}",
                self.endpoint
            ))),
        }
    }

    async fn fenced_read(&self, lock: &str, token: u64) -> StoreResult<Fenced<i64>> {
        // The grant's node exists now: what follows is read under the grant.
        if let Fenced::Stale { newer } = self.holder(lock, token).await? {
            return Ok(Fenced::Stale { newer });
        }
        Ok(Fenced::Done(self.read().await?.0))
    }

    async fn fenced_write(&self, lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>> {
        let holder = match self.holder(lock, token).await? {
            Fenced::Done(h) => h,
            Fenced::Stale { newer } => return Ok(Fenced::Stale { newer }),
        };
        let data = stock.to_string();
        let written = timed_fenced(
            &self.endpoint,
            "a fenced write of the stock",
            holder.multi(&self.zk, |w| {
                w.add_set_data(&self.stock, data.as_bytes(), None)
            }),
        )
        .await?;
        Ok(written.map(drop))
    }

    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool> {
        let Ok(expected) = i32::try_from(expected_version) else {
            return Ok(false);
        };
        match tokio::time::timeout(
            OP_TIMEOUT,
            self.zk.set_data(
                &self.stock,
                new_stock.to_string().as_bytes(),
                Some(expected),
            ),
        )
        .await
        {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(zk::Error::BadVersion)) => Ok(false),
            Ok(Err(zk::Error::NoNode)) => Err(self.missing()),
            Ok(Err(e)) => Err(StoreError(format!(
                "{}: compare-and-set of the stock failed: {e}",
                self.endpoint
            ))),
            Err(_) => Err(StoreError(format!(
                "{}: compare-and-set of the stock: no answer within {OP_TIMEOUT:?}",
                self.endpoint
            ))),
        }
    }

    async fn sync(&self) -> StoreResult<()> {
        // ZooKeeper's `sync` has the server this session reads from catch up with the leader.
        timed(&self.endpoint, "syncing", self.zk.sync(&self.stock)).await
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        let opts = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
        timed(
            &self.endpoint,
            "adding an order",
            self.zk.create(
                &format!("{}/order-", self.orders),
                buyer.to_string().as_bytes(),
                &opts,
            ),
        )
        .await
        .map(drop)
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        let mut children = timed(
            &self.endpoint,
            "listing the orders",
            self.zk.list_children(&self.orders),
        )
        .await?;
        // `order-<10 digits>`: the name order is the creation order.
        children.sort();
        let mut out = Vec::with_capacity(children.len());
        for c in children {
            let path = format!("{}/{c}", self.orders);
            let (data, _) =
                timed(&self.endpoint, "reading an order", self.zk.get_data(&path)).await?;
            let buyer = std::str::from_utf8(&data)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| {
                    StoreError(format!(
                        "{}: `{path}` holds `{}`, not a buyer id",
                        self.endpoint,
                        String::from_utf8_lossy(&data).escape_debug()
                    ))
                })?;
            out.push(buyer);
        }
        Ok(out)
    }

    async fn cleanup(&self) -> StoreResult<()> {
        self.delete_orders().await?;
        self.delete(&self.stock).await?;
        self.delete(&self.dir).await
    }

    /// Deletes the lock's directory node `<chroot>/<ns>/<name>` (distlock-zookeeper keeps it,
    /// with the fencing counter, after the last release) if it is empty.
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        let dir = distlock::zookeeper::lock_dir(&self.namespace, name, distlock::LockKind::Mutex)
            .map_err(|e| StoreError(e.to_string()))?;
        let path = format!("{}{dir}", self.chroot);
        match tokio::time::timeout(OP_TIMEOUT, self.zk.delete(&path, None)).await {
            Ok(Ok(())) | Ok(Err(zk::Error::NoNode | zk::Error::NotEmpty)) => Ok(()),
            Ok(Err(e)) => Err(StoreError(format!(
                "{}: deleting `{path}` failed: {e}",
                self.endpoint
            ))),
            Err(_) => Err(StoreError(format!(
                "{}: deleting `{path}`: no answer within {OP_TIMEOUT:?}",
                self.endpoint
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("zk://a:1,b/app/x?namespace=shop&session_timeout=5s").unwrap(),
            ("a:1,b:2181".into(), "/app/x".into(), "shop".into())
        );
        assert_eq!(
            parse_url("zk://h:1").unwrap(),
            ("h:1".into(), String::new(), "dlock".into())
        );
        assert!(parse_url("zk://h:1//x").is_err());
        assert!(parse_url("etcd://h:1").is_err());
    }
}
