//! One node's part in Redlock (`dlock-redlock`, several independent Redis masters).
//!
//! The quorum logic lives in `dlock-redlock`; these are the single-node steps it is built from,
//! each one round trip: a vote on an acquisition (with the node's epoch check and its fencing
//! counter), raising the counter to the token a majority chose, taking back a minority grant
//! quietly, the node epoch (the marker that this node's counters are complete), and seeding
//! counters of a node that lost them. The scripts are in `scripts/quorum_*.lua`.
//!
//! Keys used beyond the mutex's own (`NS:{NAME}`, `NS:{NAME}:fence`):
//!
//! | name | type | what |
//! |---|---|---|
//! | `NS:{NAME}` field `"\u{1}token"` | hash field | the token the quorum handed out for the current hold |
//! | `NS:redlock:epoch` | string `RANDOM:RUN_ID` | exists only while the node's counters are complete |

use crate::error::{shape, KIND};
use crate::scripts::Script;
use crate::{int, lease_ms, RedisBackend};
use dlock_core::{Error, HoldKey, LockKind, Result};
use redis::Value;
use std::sync::OnceLock;
use std::time::Duration;

/// The lock-hash field that keeps the token of the current hold (owner ids never contain
/// control characters, so it cannot collide with an owner).
pub const TOKEN_FIELD: &str = "\u{1}token";

/// Counters seeded per script call.
const SEED_BATCH: usize = 256;

struct QuorumScripts {
    acquire: Script,
    raise: Script,
    abort: Script,
    epoch: Script,
    seed: Script,
}

fn script(source: &'static str) -> Script {
    Script {
        source,
        sha: redis::Script::new(source).get_hash().to_owned(),
    }
}

fn quorum_scripts() -> &'static QuorumScripts {
    static SCRIPTS: OnceLock<QuorumScripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| QuorumScripts {
        acquire: script(include_str!("../scripts/quorum_acquire.lua")),
        raise: script(include_str!("../scripts/quorum_raise.lua")),
        abort: script(include_str!("../scripts/quorum_abort.lua")),
        epoch: script(include_str!("../scripts/quorum_epoch.lua")),
        seed: script(include_str!("../scripts/quorum_seed.lua")),
    })
}

/// One node's answer to [`RedisBackend::quorum_acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuorumReply {
    /// The node's epoch is not the one the caller knows: it lost its data or was re-seeded
    /// since the caller looked. Nothing was changed; the vote must not count.
    EpochMismatch,
    /// Granted afresh; the node's fencing counter was incremented to `counter`.
    Granted {
        /// The node's counter after the increment.
        counter: u64,
    },
    /// The owner already held the lock on this node: one more hold was counted.
    Reentered {
        /// The node's counter.
        counter: u64,
        /// The token stored with the hold on this node.
        token: u64,
        /// The owner's hold count after this re-entry.
        count: u32,
    },
    /// Another owner holds the lock on this node.
    Held {
        /// The node's counter.
        counter: u64,
        /// How long that owner's lease still runs here, if it expires.
        ttl: Option<Duration>,
    },
}

/// [`QuorumReply`] and whether the node had forgotten the scripts (`NOSCRIPT`: it restarted,
/// or someone ran `SCRIPT FLUSH`) — a hint that the node may have restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumVote {
    /// The node's answer.
    pub reply: QuorumReply,
    /// The scripts had to be loaded again before the vote could run.
    pub scripts_reloaded: bool,
}

/// What `INFO server` says about the process behind a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Changes on every start of the server process.
    pub run_id: String,
    /// Time since the process started (whole seconds, rounded down).
    pub uptime: Duration,
}

fn unexpected(message: String) -> Error {
    Error::UnexpectedReply {
        backend: KIND,
        message,
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

fn uint(what: &str, v: &Value) -> Result<u64> {
    int(v)
        .and_then(|i| u64::try_from(i).ok())
        .ok_or_else(|| shape(what, v))
}

/// `*?[]\` escaped for a SCAN MATCH pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn parse_info(text: &str) -> Result<ServerInfo> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k == name).then(|| v.trim().to_owned())
        })
    };
    let run_id = field("run_id")
        .filter(|r| !r.is_empty())
        .ok_or_else(|| unexpected("INFO server has no run_id".into()))?;
    let uptime = field("uptime_in_seconds")
        .and_then(|u| u.parse::<u64>().ok())
        .ok_or_else(|| unexpected("INFO server has no uptime_in_seconds".into()))?;
    Ok(ServerInfo {
        run_id,
        uptime: Duration::from_secs(uptime),
    })
}

impl RedisBackend {
    /// The key prefix of this node's locks.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `NS:redlock:epoch`: see the module docs.
    fn epoch_key(&self) -> String {
        format!("{}:redlock:epoch", self.namespace)
    }

    fn check_mutex(key: &HoldKey) -> Result<()> {
        match key.kind {
            LockKind::Mutex => Ok(()),
            other => Err(Error::unsupported(
                "redlock",
                format!("lock kind {}", other.as_str()),
            )),
        }
    }

    /// Loads the Redlock scripts (one pipelined round trip). They are also loaded on demand.
    pub async fn load_quorum_scripts(&self) -> Result<()> {
        let s = quorum_scripts();
        let mut p = redis::pipe();
        for sc in [&s.acquire, &s.raise, &s.abort, &s.epoch, &s.seed] {
            p.add_command(sc.load_cmd()).ignore();
        }
        let mut con = self.con.clone();
        p.query_async::<()>(&mut con).await.map_err(|e| self.err(e))
    }

    /// Runs one quorum script; on NOSCRIPT loads them and retries once. Also says whether it
    /// had to reload.
    async fn run_quorum(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<(Value, bool)> {
        let cmd = script.cmd(keys, args);
        let mut con = self.con.clone();
        match cmd.query_async::<Value>(&mut con).await {
            Ok(v) => Ok((v, false)),
            Err(e) if is_noscript(&e) => {
                self.load_quorum_scripts().await?;
                let v = cmd
                    .query_async::<Value>(&mut con)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok((v, true))
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// This node's vote on `key` with `lease`, if the node's epoch is `epoch`: a fresh grant
    /// (incrementing the fencing counter), a re-entry (one more hold of the same owner), or
    /// "held by another owner". Never queues the caller. Every answer carries the node's
    /// fencing counter.
    pub async fn quorum_acquire(
        &self,
        key: &HoldKey,
        lease: Duration,
        epoch: &str,
    ) -> Result<QuorumVote> {
        Self::check_mutex(key)?;
        let s = quorum_scripts();
        let (lock, fence, ek) = (
            self.lock_key(&key.name),
            self.fence_key(&key.name),
            self.epoch_key(),
        );
        let (v, reloaded) = self
            .run_quorum(
                &s.acquire,
                &[&lock, &fence, &ek],
                &[&key.owner, &lease_ms(lease), epoch],
            )
            .await?;
        let Value::Array(items) = &v else {
            return Err(shape("quorum acquire", &v));
        };
        let nums: Vec<i64> = items.iter().filter_map(int).collect();
        let reply = match nums.as_slice() {
            [-1, ..] => QuorumReply::EpochMismatch,
            [1, c, _, _] if *c > 0 => QuorumReply::Granted { counter: *c as u64 },
            [2, c, t, n] if *c >= 0 && *t >= 0 && *n > 0 => QuorumReply::Reentered {
                counter: *c as u64,
                token: *t as u64,
                count: u32::try_from(*n).unwrap_or(u32::MAX),
            },
            [0, c, pttl, _] if *c >= 0 => QuorumReply::Held {
                counter: *c as u64,
                ttl: (*pttl >= 0).then(|| Duration::from_millis(*pttl as u64)),
            },
            _ => return Err(shape("quorum acquire", &v)),
        };
        Ok(QuorumVote {
            reply,
            scripts_reloaded: reloaded,
        })
    }

    /// Raises this node's fencing counter of `key.name` to at least `token`, records `token`
    /// as the hold's token and, if `count > 0`, sets the owner's hold count — only where
    /// `key.owner` still holds the lock. Returns the counter afterwards (`>= token`), or `None`
    /// if the owner does not hold the lock here (nothing changed).
    pub async fn raise_fence(&self, key: &HoldKey, token: u64, count: u32) -> Result<Option<u64>> {
        Self::check_mutex(key)?;
        let s = quorum_scripts();
        let (lock, fence) = (self.lock_key(&key.name), self.fence_key(&key.name));
        let (v, _) = self
            .run_quorum(
                &s.raise,
                &[&lock, &fence],
                &[&key.owner, &token.to_string(), &count.to_string()],
            )
            .await?;
        match &v {
            Value::Array(items) if items.len() == 2 => match (int(&items[0]), int(&items[1])) {
                (Some(1), Some(c)) if c >= 0 => Ok(Some(c as u64)),
                (Some(0), Some(_)) => Ok(None),
                _ => Err(shape("raise fence", &v)),
            },
            _ => Err(shape("raise fence", &v)),
        }
    }

    /// Takes back one hold of `key` on this node without publishing a release (for the grants
    /// of a quorum attempt that failed). True if the owner held something here.
    pub async fn quorum_abort(&self, key: &HoldKey) -> Result<bool> {
        Self::check_mutex(key)?;
        let lock = self.lock_key(&key.name);
        let (v, _) = self
            .run_quorum(&quorum_scripts().abort, &[&lock], &[&key.owner])
            .await?;
        Ok(uint("quorum abort", &v)? == 1)
    }

    /// This node's fencing counter of `name` (0 if none was ever issued).
    pub async fn read_fence(&self, name: &str) -> Result<u64> {
        let mut con = self.con.clone();
        let v: Option<String> = redis::cmd("GET")
            .arg(self.fence_key(name))
            .query_async(&mut con)
            .await
            .map_err(|e| self.err(e))?;
        match v {
            None => Ok(0),
            Some(s) => s.parse().map_err(|_| {
                unexpected(format!(
                    "fencing counter `{}` holds `{s}`, not a number",
                    self.fence_key(name)
                ))
            }),
        }
    }

    /// The server's run id and uptime (`INFO server`).
    pub async fn server_info(&self) -> Result<ServerInfo> {
        let mut con = self.con.clone();
        let text: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut con)
            .await
            .map_err(|e| self.err(e))?;
        parse_info(&text)
    }

    /// The server's run id and uptime, and the node epoch if it exists, in one round trip.
    pub async fn node_epoch(&self) -> Result<(ServerInfo, Option<String>)> {
        let mut con = self.con.clone();
        let (text, epoch): (String, Option<String>) = redis::pipe()
            .cmd("INFO")
            .arg("server")
            .cmd("GET")
            .arg(self.epoch_key())
            .query_async(&mut con)
            .await
            .map_err(|e| self.err(e))?;
        Ok((parse_info(&text)?, epoch))
    }

    /// Creates the node epoch with `value` unless it exists, provided the server process still
    /// has run id `run_id` (so counters seeded into an earlier process are not vouched for).
    /// Returns `Ok(epoch)` with the epoch now in place (ours or an earlier one), or `Err(run_id)`
    /// with the run id the server has now.
    pub async fn create_epoch(
        &self,
        value: &str,
        run_id: &str,
    ) -> Result<std::result::Result<String, String>> {
        let ek = self.epoch_key();
        let (v, _) = self
            .run_quorum(&quorum_scripts().epoch, &[&ek], &["create", value, run_id])
            .await?;
        let bad = || shape("create epoch", &v);
        let Value::Array(items) = &v else {
            return Err(bad());
        };
        let [ok, current] = items.as_slice() else {
            return Err(bad());
        };
        let current: String = redis::from_redis_value(current.clone()).map_err(|_| bad())?;
        match int(ok) {
            Some(1) if !current.is_empty() => Ok(Ok(current)),
            Some(0) => Ok(Err(current)),
            _ => Err(bad()),
        }
    }

    /// Deletes the node epoch if it still has `value` (its process restarted since it was
    /// created, so its counters must be seeded again).
    pub async fn drop_epoch(&self, value: &str) -> Result<()> {
        let ek = self.epoch_key();
        self.run_quorum(&quorum_scripts().epoch, &[&ek], &["drop", value, ""])
            .await
            .map(|_| ())
    }

    /// Every fencing counter of this namespace on this node: `(lock name, counter)`. One SCAN
    /// over the keyspace; counters that do not hold a number are skipped.
    pub async fn fence_counters(&self) -> Result<Vec<(String, u64)>> {
        let prefix = format!("{}:{{", self.namespace);
        let suffix = "}:fence";
        let pattern = format!("{}*{suffix}", glob_escape(&prefix));
        let mut con = self.con.clone();
        let mut out = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut con)
                .await
                .map_err(|e| self.err(e))?;
            if !keys.is_empty() {
                let vals: Vec<Option<String>> = redis::cmd("MGET")
                    .arg(&keys)
                    .query_async(&mut con)
                    .await
                    .map_err(|e| self.err(e))?;
                for (k, v) in keys.iter().zip(vals) {
                    let name = k.strip_prefix(&prefix).and_then(|r| r.strip_suffix(suffix));
                    if let (Some(name), Some(v)) = (name, v.and_then(|v| v.parse::<u64>().ok())) {
                        out.push((name.to_owned(), v));
                    }
                }
            }
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// Raises this node's fencing counters to at least the given values (never lowers one).
    /// Returns how many were raised.
    pub async fn seed_fences(&self, counters: &[(String, u64)]) -> Result<u64> {
        let mut raised = 0;
        for batch in counters.chunks(SEED_BATCH) {
            let keys: Vec<String> = batch.iter().map(|(n, _)| self.fence_key(n)).collect();
            let vals: Vec<String> = batch.iter().map(|(_, v)| v.to_string()).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let vals: Vec<&str> = vals.iter().map(String::as_str).collect();
            let (v, _) = self
                .run_quorum(&quorum_scripts().seed, &keys, &vals)
                .await?;
            raised += uint("seed fences", &v)?;
        }
        Ok(raised)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_and_glob() {
        let info = parse_info("# Server\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n").unwrap();
        assert_eq!(info.run_id, "abc123");
        assert_eq!(info.uptime, Duration::from_secs(42));
        assert!(parse_info("uptime_in_seconds:1\r\n").is_err());
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
