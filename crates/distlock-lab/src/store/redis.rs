//! The `redis://` store: three keys sharing the hash tag `{<run>}`; writes are MULTI/EXEC
//! transactions, the compare-and-set a Lua script.

use super::{Fenced, Store, StoreError, StoreResult};
use distlock::async_trait;
use distlock_fence::redis::{FencedScript, RedisFence};
use distlock_fence::Stamp;
use redis::aio::MultiplexedConnection;
use std::time::Duration;

const CAS: &str = r"
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('INCR', KEYS[2])
  return 1
end
return 0
";

/// The `fenced` strategy's write, after the fence check (distlock-fence): the stock and its
/// version together.
const FENCED_WRITE: &str = r"
redis.call('SET', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
";

/// Stock, version and orders in Redis; the fence of the stock in `<prefix>:{<run>}:fence`.
pub struct RedisStore {
    con: MultiplexedConnection,
    endpoint: String,
    namespace: String,
    stock: String,
    version: String,
    orders: String,
    cas: redis::Script,
    fence: RedisFence,
    fenced_write: FencedScript,
}

impl RedisStore {
    /// Connects to the server of `url` (its query string, which only dlock reads, is dropped).
    pub async fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Self> {
        let base = url.split(['?', '#']).next().unwrap_or(url);
        let endpoint = distlock::redis::redact(base);
        let client = redis::Client::open(base)
            .map_err(|e| StoreError(format!("invalid Redis URL `{endpoint}`: {e}")))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        let con = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| StoreError(format!("cannot connect to Redis at {endpoint}: {e}")))?;
        Ok(RedisStore {
            con,
            endpoint,
            namespace: super::parse(url).map(|cs| super::namespace(&cs))?,
            stock: format!("{prefix}:{{{run}}}:stock"),
            version: format!("{prefix}:{{{run}}}:version"),
            orders: format!("{prefix}:{{{run}}}:orders"),
            cas: redis::Script::new(CAS),
            fence: RedisFence::new(format!("{prefix}:{{{run}}}:fence")),
            fenced_write: FencedScript::new(FENCED_WRITE),
        })
    }

    fn err(&self, what: &str, e: redis::RedisError) -> StoreError {
        StoreError(format!("Redis at {}: {what} failed: {e}", self.endpoint))
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        let mut con = self.con.clone();
        redis::pipe()
            .atomic()
            .del(&[&self.stock, &self.version, &self.orders, self.fence.key()])
            .ignore()
            .set(&self.stock, stock)
            .ignore()
            .set(&self.version, 0)
            .ignore()
            .query_async::<()>(&mut con)
            .await
            .map_err(|e| self.err("setup", e))
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        let mut con = self.con.clone();
        let (stock, version): (Option<i64>, Option<u64>) = redis::cmd("MGET")
            .arg(&self.stock)
            .arg(&self.version)
            .query_async(&mut con)
            .await
            .map_err(|e| self.err("MGET of the stock", e))?;
        match (stock, version) {
            (Some(s), Some(v)) => Ok((s, v)),
            _ => Err(StoreError(format!(
                "Redis at {}: `{}` or `{}` is missing (was the run cleaned up?)",
                self.endpoint, self.stock, self.version
            ))),
        }
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        let mut con = self.con.clone();
        redis::pipe()
            .atomic()
            .set(&self.stock, stock)
            .ignore()
            .incr(&self.version, 1)
            .ignore()
            .query_async::<()>(&mut con)
            .await
            .map_err(|e| self.err("write of the stock", e))
    }

    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool> {
        let mut con = self.con.clone();
        let done: i64 = self
            .cas
            .key(&self.stock)
            .key(&self.version)
            .arg(expected_version)
            .arg(new_stock)
            .invoke_async(&mut con)
            .await
            .map_err(|e| self.err("compare-and-set of the stock", e))?;
        Ok(done == 1)
    }

    async fn fenced_read(&self, _lock: &str, token: u64) -> StoreResult<Fenced<i64>> {
        let mut con = self.con.clone();
        Fenced::from_fence(self.fence.get::<_, i64>(&mut con, token, &self.stock).await)?.found(
            || {
                StoreError(format!(
                    "Redis at {}: `{}` is missing (was the run cleaned up?)",
                    self.endpoint, self.stock
                ))
            },
        )
    }

    async fn fenced_write(&self, _lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>> {
        let mut con = self.con.clone();
        let r = self
            .fence
            .eval::<_, ()>(
                &mut con,
                Stamp::new(token),
                &self.fenced_write,
                &[&self.stock, &self.version],
                &[&stock],
            )
            .await;
        Ok(Fenced::from_fence(r)?.map(drop))
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        let mut con = self.con.clone();
        redis::cmd("RPUSH")
            .arg(&self.orders)
            .arg(buyer)
            .query_async::<()>(&mut con)
            .await
            .map_err(|e| self.err("RPUSH of an order", e))
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        let mut con = self.con.clone();
        redis::cmd("LRANGE")
            .arg(&self.orders)
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .map_err(|e| self.err("LRANGE of the orders", e))
    }

    async fn cleanup(&self) -> StoreResult<()> {
        let mut con = self.con.clone();
        redis::cmd("DEL")
            .arg(&self.stock)
            .arg(&self.version)
            .arg(&self.orders)
            .arg(self.fence.key())
            .query_async::<()>(&mut con)
            .await
            .map_err(|e| self.err("DEL of the run's keys", e))
    }

    /// Deletes the lock's fencing counter (`NS:{NAME}:fence`, the layout of distlock-redis);
    /// the lock key itself is gone once released.
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        let mut con = self.con.clone();
        redis::cmd("DEL")
            .arg(format!("{}:{{{name}}}:fence", self.namespace))
            .query_async::<()>(&mut con)
            .await
            .map_err(|e| self.err("DEL of the lock's fencing counter", e))
    }
}
