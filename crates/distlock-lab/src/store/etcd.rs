//! The `etcd://` store: keys under the backend's prefix (the URL's path, else the namespace
//! `dlock`): `<prefix>/<store prefix>/<run>/stock` holds `"<stock> <version>"`, each order is
//! a key `…/<run>/orders/<random>` (value: the buyer id), listed by creation revision.
//!
//! `write` and `cas` read the stock key and put it back in a transaction that compares its mod
//! revision (retrying when another writer came in between), so each is atomic.
//!
//! The `fenced` strategy reads and writes the stock in transactions guarded on the holder's
//! lock key (distlock-fence's `EtcdFence`): they do nothing once the grant's key is gone.

use super::{timed, timed_fenced, Fenced, Store, StoreError, StoreResult, OP_TIMEOUT};
use distlock::async_trait;
use distlock_fence::etcd::{EtcdFence, EtcdHolder};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, SortOrder,
    SortTarget, Txn, TxnOp,
};

/// Stock and orders in etcd.
pub struct EtcdStore {
    kv: KvClient,
    endpoint: String,
    prefix: String,
    stock: String,
    orders: String,
    run_dir: String,
}

/// A parsed `etcd://[user:password@]host:port[,host:port…][/prefix]`.
#[derive(Debug, PartialEq)]
struct Target {
    endpoints: Vec<String>,
    display: String,
    user: Option<(String, String)>,
    prefix: String,
}

fn parse_url(url: &str) -> StoreResult<Target> {
    let cs = super::parse(url)?;
    let bad = |why: &str| {
        StoreError(format!(
            "invalid etcd URL `{}`: {why}; write etcd://host:port[,host:port…][/prefix]",
            cs.redacted()
        ))
    };
    if cs.scheme() != "etcd" {
        return Err(bad("the scheme is not etcd://"));
    }
    let user = match (cs.user(), cs.password()) {
        (None, _) => None,
        (Some(u), Some(p)) => Some((u.to_owned(), p.expose().to_owned())),
        (Some(_), None) => return Err(bad("credentials need both user and password")),
    };
    if cs.hosts().is_empty() {
        return Err(bad("an empty host"));
    }
    let shown: Vec<String> = cs.hosts().iter().map(|h| h.endpoint(2379)).collect();
    let prefix = cs.raw_path().trim_matches('/');
    let prefix = if prefix.is_empty() {
        distlock::ClientOptions::default()
            .get_namespace()
            .to_owned()
    } else {
        distlock::etcd::percent_decode(prefix)
            .ok_or_else(|| bad("bad percent-encoding in the prefix"))?
    };
    Ok(Target {
        endpoints: shown.iter().map(|ep| format!("http://{ep}")).collect(),
        display: shown.join(","),
        user,
        prefix,
    })
}

/// `%` → `%25`, `/` → `%2F`: how distlock-etcd puts a lock name into a key.
fn escape(s: &str) -> String {
    s.replace('%', "%25").replace('/', "%2F")
}

fn parse_state(s: &[u8]) -> Option<(i64, u64)> {
    let s = std::str::from_utf8(s).ok()?;
    let mut it = s.split_whitespace();
    let stock = it.next()?.parse().ok()?;
    let version = it.next()?.parse().ok()?;
    it.next().is_none().then_some((stock, version))
}

impl EtcdStore {
    /// Connects to the cluster of `url`.
    pub async fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Self> {
        let t = parse_url(url)?;
        let endpoint = format!("etcd at {}", t.display);
        let mut co = ConnectOptions::new()
            .with_connect_timeout(OP_TIMEOUT)
            .with_timeout(OP_TIMEOUT);
        if let Some((u, p)) = &t.user {
            co = co.with_user(u.clone(), p.clone());
        }
        let client = timed(
            &endpoint,
            "connecting",
            Client::connect(&t.endpoints, Some(co)),
        )
        .await?;
        let run_dir = format!("{}/{prefix}/{run}/", t.prefix);
        Ok(EtcdStore {
            kv: client.kv_client(),
            endpoint,
            prefix: t.prefix,
            stock: format!("{run_dir}stock"),
            orders: format!("{run_dir}orders/"),
            run_dir,
        })
    }

    /// The stock, its version and the key's mod revision.
    async fn get_stock(&self) -> StoreResult<(i64, u64, i64)> {
        let mut kv = self.kv.clone();
        let resp = timed(
            &self.endpoint,
            "reading the stock",
            kv.get(self.stock.as_str(), None),
        )
        .await?;
        let Some(kv) = resp.kvs().first() else {
            return Err(StoreError(format!(
                "{}: `{}` is missing (was the run cleaned up?)",
                self.endpoint, self.stock
            )));
        };
        let (stock, version) = parse_state(kv.value()).ok_or_else(|| {
            StoreError(format!(
                "{}: `{}` holds `{}`, not `<stock> <version>`",
                self.endpoint,
                self.stock,
                String::from_utf8_lossy(kv.value()).escape_debug()
            ))
        })?;
        Ok((stock, version, kv.mod_revision()))
    }

    /// The key of the grant of `lock` with `token`, as a fenced transaction needs it.
    async fn holder(&self, lock: &str, token: u64) -> StoreResult<Fenced<EtcdHolder>> {
        let mut kv = self.kv.clone();
        timed_fenced(
            &self.endpoint,
            "finding the holder's lock key",
            EtcdFence::new(&self.prefix, lock).holder(&mut kv, token),
        )
        .await
    }

    /// Puts `"<stock> <version>"` if the key's mod revision is still `rev`; whether it did.
    async fn put_if(&self, rev: i64, stock: i64, version: u64) -> StoreResult<bool> {
        let mut kv = self.kv.clone();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.stock.as_str(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::put(
                self.stock.as_str(),
                format!("{stock} {version}"),
                None,
            )]);
        let resp = timed(&self.endpoint, "writing the stock", kv.txn(txn)).await?;
        Ok(resp.succeeded())
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        let mut kv = self.kv.clone();
        let txn = Txn::new().and_then([
            TxnOp::delete(
                self.orders.as_str(),
                Some(DeleteOptions::new().with_prefix()),
            ),
            TxnOp::put(self.stock.as_str(), format!("{stock} 0"), None),
        ]);
        timed(&self.endpoint, "setup", kv.txn(txn)).await.map(drop)
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        let (stock, version, _) = self.get_stock().await?;
        Ok((stock, version))
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        loop {
            let (_, version, rev) = self.get_stock().await?;
            if self.put_if(rev, stock, version.wrapping_add(1)).await? {
                return Ok(());
            }
        }
    }

    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool> {
        loop {
            let (_, version, rev) = self.get_stock().await?;
            if version != expected_version {
                return Ok(false);
            }
            if self.put_if(rev, new_stock, version.wrapping_add(1)).await? {
                return Ok(true);
            }
        }
    }

    async fn fenced_read(&self, lock: &str, token: u64) -> StoreResult<Fenced<i64>> {
        let holder = match self.holder(lock, token).await? {
            Fenced::Done(h) => h,
            Fenced::Stale { newer } => return Ok(Fenced::Stale { newer }),
        };
        let mut kv = self.kv.clone();
        let read = timed_fenced(
            &self.endpoint,
            "a fenced read of the stock",
            holder.txn(&mut kv, vec![TxnOp::get(self.stock.as_str(), None)]),
        )
        .await?;
        let resp = match read {
            Fenced::Done(r) => r,
            Fenced::Stale { newer } => return Ok(Fenced::Stale { newer }),
        };
        let value = resp.op_responses().into_iter().find_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        let value = value.ok_or_else(|| {
            StoreError(format!(
                "{}: `{}` is missing (was the run cleaned up?)",
                self.endpoint, self.stock
            ))
        })?;
        parse_state(&value)
            .map(|(stock, _)| Fenced::Done(stock))
            .ok_or_else(|| {
                StoreError(format!(
                    "{}: `{}` holds `{}`, not `<stock> <version>`",
                    self.endpoint,
                    self.stock,
                    String::from_utf8_lossy(&value).escape_debug()
                ))
            })
    }

    async fn fenced_write(&self, lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>> {
        let holder = match self.holder(lock, token).await? {
            Fenced::Done(h) => h,
            Fenced::Stale { newer } => return Ok(Fenced::Stale { newer }),
        };
        let (_, version, _) = self.get_stock().await?;
        let mut kv = self.kv.clone();
        let put = TxnOp::put(
            self.stock.as_str(),
            format!("{stock} {}", version.wrapping_add(1)),
            None,
        );
        let written = timed_fenced(
            &self.endpoint,
            "a fenced write of the stock",
            holder.txn(&mut kv, vec![put]),
        )
        .await?;
        Ok(written.map(drop))
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        loop {
            let key = format!("{}{:016x}", self.orders, fastrand::u64(..));
            let mut kv = self.kv.clone();
            // Never overwrite an order, however unlikely a clash of 64 random bits is.
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), buyer.to_string(), None)]);
            let resp = timed(&self.endpoint, "adding an order", kv.txn(txn)).await?;
            if resp.succeeded() {
                return Ok(());
            }
        }
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        let mut kv = self.kv.clone();
        let opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = timed(
            &self.endpoint,
            "reading the orders",
            kv.get(self.orders.as_str(), Some(opts)),
        )
        .await?;
        resp.kvs()
            .iter()
            .map(|o| {
                std::str::from_utf8(o.value())
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| {
                        StoreError(format!(
                            "{}: order `{}` holds `{}`, not a buyer id",
                            self.endpoint,
                            String::from_utf8_lossy(o.key()),
                            String::from_utf8_lossy(o.value()).escape_debug()
                        ))
                    })
            })
            .collect()
    }

    async fn cleanup(&self) -> StoreResult<()> {
        let mut kv = self.kv.clone();
        timed(
            &self.endpoint,
            "deleting the run's keys",
            kv.delete(
                self.run_dir.as_str(),
                Some(DeleteOptions::new().with_prefix()),
            ),
        )
        .await
        .map(drop)
    }

    /// Deletes the lock's fencing key `<prefix>/<name>` (distlock-etcd's layout; its queue keys
    /// are gone once released).
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        let mut kv = self.kv.clone();
        let key = format!("{}/{}", self.prefix, escape(name));
        timed(
            &self.endpoint,
            "deleting the lock's fencing key",
            kv.delete(key, None),
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("etcd://u:p%40w@a:1,b/shop/x").unwrap();
        assert_eq!(t.endpoints, vec!["http://a:1", "http://b:2379"]);
        assert_eq!(t.user, Some(("u".into(), "p@w".into())));
        assert_eq!(t.prefix, "shop/x");
        assert_eq!(parse_url("etcd://h:1").unwrap().prefix, "dlock");
        assert!(parse_url("redis://h:1").is_err());
        assert_eq!(parse_state(b"10 3"), Some((10, 3)));
        assert_eq!(parse_state(b"10"), None);
        assert_eq!(escape("a/b%c"), "a%2Fb%25c");
    }
}
