//! Fenced Redis commands over your own redis-rs connection: each one Lua script that checks
//! the fence, records the stamp and runs the command, atomically on the server.
//!
//! The fence of a resource is a hash of its own (`token`, `seq`) whose key you choose; keep it
//! in the same hash slot as the data it fences (`{stock:42}:fence` beside `{stock:42}:count`)
//! so the scripts run on Redis Cluster too. Tokens are compared as decimal strings, exactly,
//! whatever their size.
//!
//! ```no_run
//! # async fn f(mut con: redis::aio::MultiplexedConnection, token: u64) -> distlock_fence::Result<()> {
//! use distlock_fence::redis::RedisFence;
//! use distlock_fence::{Error, Stamp};
//!
//! let fence = RedisFence::new("{sku:42}:fence");
//! // Read under the fence: from now on older grants' writes are rejected.
//! let stock: Option<i64> = fence.get(&mut con, token, "{sku:42}:stock").await?;
//! if stock.unwrap_or(0) > 0 {
//!     match fence.decr_by(&mut con, Stamp::new(token).seq(1), "{sku:42}:stock", 1).await {
//!         Ok(left) => println!("sold; left {:?}", left.applied()),
//!         Err(Error::Stale { newer, .. }) => println!("our lease ended: {newer} holds it now"),
//!         Err(e) => return Err(e),
//!     }
//! }
//! # Ok(()) }
//! ```

use crate::{Error, Outcome, Result, Stamp};
use redis::aio::ConnectionLike;
use redis::{FromRedisValue, ToRedisArgs, Value};
use std::sync::LazyLock;

/// The fence check, shared by every script: KEYS[1] is the fence hash, ARGV[1] the token and
/// ARGV[2] the sequence number, both decimal. Returns `{0, newer}` for a stale token and `{2}`
/// for a duplicate; otherwise records the stamp and falls through. Mirrors `crate::decide`.
const CHECK: &str = r"
local function lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local token, seq = ARGV[1], ARGV[2]
local rec = redis.call('HMGET', KEYS[1], 'token', 'seq')
if rec[1] then
  if lt(token, rec[1]) then return {0, rec[1]} end
  if token == rec[1] then
    if seq ~= '0' and not lt(rec[2], seq) then return {2} end
    if lt(seq, rec[2]) then seq = rec[2] end
  end
end
redis.call('HSET', KEYS[1], 'token', token, 'seq', seq)
";

/// One of the built-in commands: ARGV[3] names it; KEYS[2..] and ARGV[4..] are its keys and
/// arguments, in that order.
static COMMAND: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{CHECK}
local all = {{}}
for i = 2, #KEYS do all[#all + 1] = KEYS[i] end
for i = 4, #ARGV do all[#all + 1] = ARGV[i] end
return {{1, redis.call(ARGV[3], unpack(all))}}
"
    ))
});

/// Your own Lua, run after the fence check in the same script. It sees its own `KEYS` and
/// `ARGV` (the fence's key and the stamp are taken off), may call `redis.call` as any
/// script, and its return value is the answer.
///
/// ```
/// use distlock_fence::redis::FencedScript;
/// // Decrement the stock and append the order, only while stock is left.
/// let sell = FencedScript::new(r"
///     local left = tonumber(redis.call('GET', KEYS[1]) or '0')
///     if left <= 0 then return -1 end
///     redis.call('RPUSH', KEYS[2], ARGV[1])
///     return redis.call('DECR', KEYS[1])
/// ");
/// ```
#[derive(Debug, Clone)]
pub struct FencedScript {
    script: redis::Script,
}

impl FencedScript {
    /// Wraps `body` (Lua, as for `EVAL`) so that it runs after the fence check.
    pub fn new(body: &str) -> FencedScript {
        FencedScript {
            script: redis::Script::new(&format!(
                "{CHECK}
local keys, argv = {{}}, {{}}
for i = 2, #KEYS do keys[#keys + 1] = KEYS[i] end
for i = 3, #ARGV do argv[#argv + 1] = ARGV[i] end
local function user(KEYS, ARGV)
{body}
end
return {{1, user(keys, argv)}}
"
            )),
        }
    }
}

/// The fence of one resource in Redis, and the fenced commands on it. Cheap to clone; the
/// connection is yours, passed to each call (a `MultiplexedConnection`, a
/// `ConnectionManager`, a cluster connection: anything that is a [`ConnectionLike`]).
#[derive(Debug, Clone)]
pub struct RedisFence {
    key: String,
}

impl RedisFence {
    /// The fence kept in the hash `fence_key`.
    pub fn new(fence_key: impl Into<String>) -> RedisFence {
        RedisFence {
            key: fence_key.into(),
        }
    }

    /// The fence hash's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The stamp of the last fenced command accepted, `None` before the first.
    ///
    /// # Errors
    /// [`Error::Store`] when Redis fails or the fence holds something else.
    pub async fn recorded<C: ConnectionLike>(&self, con: &mut C) -> Result<Option<Stamp>> {
        let (token, seq): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(&self.key)
            .arg("token")
            .arg("seq")
            .query_async(con)
            .await
            .map_err(|e| store_err(&self.key, "HMGET of the fence", e))?;
        Ok(match (token, seq) {
            (Some(token), Some(seq)) => Some(Stamp { token, seq }),
            _ => None,
        })
    }

    /// A fenced read: `GET key` after recording `token` in the fence, so that from now on
    /// the writes of older grants are rejected ([why](crate#fence-the-read-too)).
    ///
    /// # Errors
    /// [`Error::Stale`] when a newer grant wrote or read already; [`Error::Store`].
    pub async fn get<C: ConnectionLike, T: FromRedisValue>(
        &self,
        con: &mut C,
        token: u64,
        key: &str,
    ) -> Result<Option<T>> {
        let out: Outcome<Option<T>> = self
            .command(con, Stamp::new(token), "GET", &[key], &[])
            .await?;
        // A stamp without a sequence number is never a duplicate.
        Ok(out.applied().flatten())
    }

    /// `SET key value`, fenced.
    ///
    /// # Errors
    /// [`Error::Stale`] (nothing written); [`Error::Store`] (retry with the same stamp).
    pub async fn set<C: ConnectionLike, V: ToRedisArgs>(
        &self,
        con: &mut C,
        stamp: Stamp,
        key: &str,
        value: V,
    ) -> Result<Outcome<()>> {
        let out: Outcome<Value> = self
            .command(con, stamp, "SET", &[key], &value.to_redis_args())
            .await?;
        Ok(out.map(|_| ()))
    }

    /// `HSET key field value`, fenced; the number of fields added.
    ///
    /// # Errors
    /// [`Error::Stale`] (nothing written); [`Error::Store`] (retry with the same stamp).
    pub async fn hset<C: ConnectionLike, F: ToRedisArgs, V: ToRedisArgs>(
        &self,
        con: &mut C,
        stamp: Stamp,
        key: &str,
        field: F,
        value: V,
    ) -> Result<Outcome<i64>> {
        let mut args = field.to_redis_args();
        args.extend(value.to_redis_args());
        self.command(con, stamp, "HSET", &[key], &args).await
    }

    /// `INCRBY key delta`, fenced; the new value. Give it a sequence number
    /// ([`Stamp::seq`]) so that a retry is not counted twice.
    ///
    /// # Errors
    /// [`Error::Stale`] (nothing written); [`Error::Store`] (retry with the same stamp).
    pub async fn incr_by<C: ConnectionLike>(
        &self,
        con: &mut C,
        stamp: Stamp,
        key: &str,
        delta: i64,
    ) -> Result<Outcome<i64>> {
        self.by(con, stamp, "INCRBY", key, delta).await
    }

    /// `DECRBY key delta`, fenced; the new value. Give it a sequence number
    /// ([`Stamp::seq`]) so that a retry is not counted twice.
    ///
    /// # Errors
    /// [`Error::Stale`] (nothing written); [`Error::Store`] (retry with the same stamp).
    pub async fn decr_by<C: ConnectionLike>(
        &self,
        con: &mut C,
        stamp: Stamp,
        key: &str,
        delta: i64,
    ) -> Result<Outcome<i64>> {
        self.by(con, stamp, "DECRBY", key, delta).await
    }

    async fn by<C: ConnectionLike>(
        &self,
        con: &mut C,
        stamp: Stamp,
        command: &str,
        key: &str,
        delta: i64,
    ) -> Result<Outcome<i64>> {
        self.command(con, stamp, command, &[key], &delta.to_redis_args())
            .await
    }

    /// `DEL key…`, fenced; the number of keys removed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] without keys; [`Error::Stale`] (nothing removed);
    /// [`Error::Store`] (retry with the same stamp).
    pub async fn del<C: ConnectionLike>(
        &self,
        con: &mut C,
        stamp: Stamp,
        keys: &[&str],
    ) -> Result<Outcome<i64>> {
        if keys.is_empty() {
            return Err(Error::InvalidArgument(
                "a fenced DEL needs at least one key".into(),
            ));
        }
        self.command(con, stamp, "DEL", keys, &[]).await
    }

    /// Runs your own script after the fence check, in one script: `keys` and `args` are its
    /// `KEYS` and `ARGV`.
    ///
    /// # Errors
    /// [`Error::Stale`] (the script did not run); [`Error::Store`] when Redis or the script
    /// fails (a script that fails half-way keeps the writes it made, as any Redis script) or
    /// its answer is not a `T`.
    pub async fn eval<C: ConnectionLike, T: FromRedisValue>(
        &self,
        con: &mut C,
        stamp: Stamp,
        script: &FencedScript,
        keys: &[&str],
        args: &[&dyn ToRedisArgsDyn],
    ) -> Result<Outcome<T>> {
        let mut inv = script.script.key(&self.key);
        inv.arg(stamp.token).arg(stamp.seq);
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            for part in a.redis_args() {
                inv.arg(part);
            }
        }
        let reply: Value = inv
            .invoke_async(con)
            .await
            .map_err(|e| store_err(&self.key, "a fenced script", e))?;
        decode(&self.key, stamp, reply)
    }

    async fn command<C: ConnectionLike, T: FromRedisValue>(
        &self,
        con: &mut C,
        stamp: Stamp,
        command: &str,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> Result<Outcome<T>> {
        let mut inv = COMMAND.key(&self.key);
        inv.arg(stamp.token).arg(stamp.seq).arg(command);
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(a.as_slice());
        }
        let reply: Value = inv
            .invoke_async(con)
            .await
            .map_err(|e| store_err(&self.key, &format!("a fenced {command}"), e))?;
        decode(&self.key, stamp, reply)
    }
}

/// An argument of [`RedisFence::eval`]: anything redis-rs can send (`&1`, `&"x"`, `&vec`).
pub trait ToRedisArgsDyn: Sync {
    /// The argument's bytes, as redis-rs would send them.
    fn redis_args(&self) -> Vec<Vec<u8>>;
}

impl<T: ToRedisArgs + Sync> ToRedisArgsDyn for T {
    fn redis_args(&self) -> Vec<Vec<u8>> {
        self.to_redis_args()
    }
}

fn store_err(key: &str, what: &str, e: redis::RedisError) -> Error {
    Error::store("redis", format!("{what} on fence `{key}` failed: {e}"), e)
}

/// The scripts' answer: `{1, reply}` applied, `{0, newer}` stale, `{2}` duplicate.
fn decode<T: FromRedisValue>(key: &str, stamp: Stamp, reply: Value) -> Result<Outcome<T>> {
    let unexpected = |what: String| Error::Store {
        store: "redis".into(),
        message: format!("unexpected answer of a fenced script on `{key}`: {what}"),
        source: None,
    };
    let Value::Array(mut items) = reply else {
        return Err(unexpected(format!("{reply:?}")));
    };
    let code = items
        .first()
        .and_then(|v| i64::from_redis_value_ref(v).ok())
        .ok_or_else(|| unexpected(format!("{items:?}")))?;
    match code {
        1 => {
            let value = if items.len() > 1 {
                items.swap_remove(1)
            } else {
                Value::Nil
            };
            T::from_redis_value(value)
                .map(Outcome::Applied)
                .map_err(|e| store_err(key, "decoding the answer of a fenced command", e.into()))
        }
        0 => {
            let newer = items
                .get(1)
                .and_then(|v| String::from_redis_value_ref(v).ok())
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| unexpected(format!("{items:?}")))?;
            Err(Error::Stale {
                token: stamp.token,
                newer,
            })
        }
        2 => Ok(Outcome::Duplicate),
        _ => Err(unexpected(format!("{items:?}"))),
    }
}
