//! Reading a lock's state (`inspect`, and the holders a forced release removed): one
//! pipelined round trip, the same reading of the grants for every lock family.

use crate::cluster::Master;
use crate::error::KIND;
use crate::{family, Family, RedisBackend};
use distlock_core::{Error, HolderInfo, LockInfo, LockKind, Result, WaiterInfo};
use futures_util::future::join_all;
use redis::Value;
use std::collections::HashMap;
use std::time::Duration;

/// One grant of a read-write lock or semaphore as the scripts store it: `TOKEN:X:OWNER`, where
/// X is the side (`r`/`w`) or the permits. `None` for a value of another layout.
fn parse_grant(value: &str) -> Option<(u64, &str, &str)> {
    let (token, rest) = value.split_once(':')?;
    let (x, owner) = rest.split_once(':')?;
    Some((token.parse().ok()?, x, owner))
}

/// A PTTL (or any ms count) as a duration; `None` for Redis's negative "no expiry" / "no key".
pub(crate) fn ms(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// `TIME` (seconds, microseconds) in ms.
pub(crate) fn time_ms(secs: &str, micros: &str) -> Option<u64> {
    Some(secs.parse::<u64>().ok()? * 1000 + micros.parse::<u64>().ok()? / 1000)
}

/// The live holders in a grants hash: the mutex's one grant `{attempt, token, owner}` (its
/// lease the hash's PTTL), or a read-write lock's or semaphore's grants
/// `ATTEMPT → TOKEN:X:OWNER`, each with its own expiry (server ms; past ones are gone,
/// whether or not a script pruned them).
pub(crate) fn holders(
    fam: &Family,
    fields: &[(String, String)],
    pttl: i64,
    exps: &[(String, f64)],
    now_ms: u64,
) -> Vec<HolderInfo> {
    let left = ms(pttl);
    if let Family::Mutex { election, .. } = fam {
        let field = |name: &str| fields.iter().find(|(f, _)| f == name).map(|(_, v)| v);
        // An election's leader advertises its value (empty if none was stored).
        let value = election.then(|| field("value").cloned().unwrap_or_default());
        let holder = |owner: &String| HolderInfo::new(owner.clone(), 1).with_lease_left(left);
        return field("owner")
            .map(|o| holder(o).with_value(value))
            .into_iter()
            .collect();
    }
    let expiry: HashMap<&str, u64> = exps.iter().map(|(m, s)| (m.as_str(), *s as u64)).collect();
    let mut out = Vec::new();
    for (attempt, value) in fields {
        let Some((_, x, owner)) = parse_grant(value) else {
            continue;
        };
        let (count, side) = match (fam, x) {
            (Family::Rw { .. }, "r") => (1, Some(LockKind::Read)),
            (Family::Rw { .. }, "w") => (1, Some(LockKind::Write)),
            (Family::Sem { .. }, n) => match n.parse() {
                Ok(n) => (n, None),
                Err(_) => continue,
            },
            _ => continue,
        };
        let lease_left = match expiry.get(attempt.as_str()) {
            Some(&e) if e <= now_ms => continue,
            Some(&e) => Some(Duration::from_millis(e - now_ms)),
            None => left,
        };
        out.push(
            HolderInfo::new(owner, count)
                .with_lease_left(lease_left)
                .with_side(side),
        );
    }
    out
}

/// The waiter in one field of a waiter data hash: `EXPIRY_MS:LEASE_MS:OWNER` (a mutex),
/// `EXPIRY_MS:LEASE_MS:LEN:VALUE` then OWNER (an election's candidate), or
/// `EXPIRY_MS:LEASE_MS:X:OWNER` with X the side or the permits (read-write lock, semaphore):
/// its expiry (server ms), owner and side. `None` for data of another layout.
fn parse_waiter<'a>(fam: &Family, data: &'a str) -> Option<(u64, &'a str, Option<LockKind>)> {
    let (expiry, rest) = data.split_once(':')?;
    let (_lease, rest) = rest.split_once(':')?;
    let (owner, side) = match fam {
        Family::Mutex { election: true, .. } => {
            let (len, rest) = rest.split_once(':')?;
            (rest.get(len.parse::<usize>().ok()?..)?, None)
        }
        Family::Mutex { .. } => (rest, None),
        Family::Rw { .. } => match rest.split_once(':')? {
            ("r", o) => (o, Some(LockKind::Read)),
            ("w", o) => (o, Some(LockKind::Write)),
            _ => return None,
        },
        Family::Sem { .. } => rest.split_once(':').map(|(_, o)| (o, None))?,
    };
    Some((expiry.parse().ok()?, owner, side))
}

/// The commands of one lock's reading, appended to a pipeline, and what is needed to read
/// their replies ([`Reading::parse`]).
struct Reading<'a> {
    name: &'a str,
    fam: Family,
    /// Replies this lock's commands produce.
    replies: usize,
}

/// The replies a [`Reading`] turns into a [`LockInfo`]: holds, PTTL, fence, waiter data,
/// queue, TIME, expiries, limit.
type Replies = (
    Vec<(String, String)>,
    i64,
    Option<String>,
    Vec<(String, String)>,
    Vec<(String, f64)>,
    (String, String),
    Vec<(String, f64)>,
    Option<u32>,
);

impl<'a> Reading<'a> {
    /// Appends to `pipe` the commands that read lock `name` of `kind`: holds, their
    /// expiries (or the hash's PTTL), the fence, the queue and the server clock.
    fn add(
        b: &RedisBackend,
        pipe: &mut redis::Pipeline,
        name: &'a str,
        kind: LockKind,
    ) -> Result<Self> {
        let fam = family(kind)?;
        let k = b.keys(name, &fam);
        let zrange = |pipe: &mut redis::Pipeline, key| {
            pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
        };
        pipe.cmd("HGETALL").arg(&k.holds).cmd("PTTL").arg(&k.holds);
        pipe.cmd("GET").arg(&k.fence).cmd("HGETALL").arg(&k.waiters);
        zrange(pipe, &k.queue);
        pipe.cmd("TIME");
        if let Some(e) = &k.exp {
            zrange(pipe, e);
        }
        if let Some(l) = &k.limit {
            pipe.cmd("GET").arg(l);
        }
        let replies = 6 + usize::from(k.exp.is_some()) + usize::from(k.limit.is_some());
        Ok(Reading { name, fam, replies })
    }

    /// The lock's state from its replies (`vals`, as many as [`Reading::replies`]).
    fn parse(&self, b: &RedisBackend, mut vals: Vec<Value>) -> Result<LockInfo> {
        let (name, fam) = (self.name, &self.fam);
        // Same shape for every family: no expiries (the hash's PTTL counts) and no limit.
        if let Family::Mutex { .. } = fam {
            vals.push(Value::Array(Vec::new()));
        }
        if !matches!(fam, Family::Sem { .. }) {
            vals.push(Value::Nil);
        }
        let bad = |what: &str| crate::error::unexpected("inspect of", name, what);
        let (fields, pttl, fence, waiters, queue, (secs, micros), exps, limit): Replies =
            redis::from_redis_value(Value::Array(vals))
                .map_err(|e| bad(&format!("replies: {e}")))?;
        let now_ms = time_ms(&secs, &micros).ok_or_else(|| bad("TIME"))?;
        let data: HashMap<&str, &str> = waiters
            .iter()
            .map(|(m, d)| (m.as_str(), d.as_str()))
            .collect();
        // The live waiters in queue order (arrival ms as the score): a waiter whose data
        // expired is dead, whether or not a script has pruned it yet.
        let line: Vec<WaiterInfo> = queue
            .iter()
            .filter_map(|(m, arrived)| {
                let (expiry, owner, side) = parse_waiter(fam, data.get(m.as_str())?)?;
                (expiry > now_ms).then(|| {
                    let waited = (now_ms as f64 - arrived).max(0.0);
                    WaiterInfo::new(owner)
                        .with_waited(Some(Duration::from_millis(waited as u64)))
                        .with_side(side)
                })
            })
            .collect();
        let permits = match fam {
            Family::Sem { limit: l, .. } => Some(limit.unwrap_or(*l)),
            _ => None,
        };
        let mut fencing_token = b.counter(name, fence)?;
        if let Family::Mutex { election: true, .. } = fam {
            // The leader's own token (the counter is above it after a forced release).
            let leader = fields.iter().find(|(f, _)| f == "token");
            if let Some((_, t)) = leader.filter(|_| pttl != -2) {
                fencing_token = t.parse().map_err(|_| {
                    Error::unexpected(
                        KIND,
                        format!("election `{name}`: the leader's token is `{t}`, not a number"),
                    )
                })?;
            }
        }
        Ok(LockInfo::new(name)
            .with_holders(holders(fam, &fields, pttl, &exps, now_ms))
            .with_fencing_token(fencing_token)
            .with_waiters(Some(u32::try_from(line.len()).unwrap_or(u32::MAX)))
            .with_queue(line)
            .with_permits(permits))
    }
}

/// `Backend::inspect`: holds, their expiries (or the hash's PTTL), the fence, the queue and
/// the server clock, in one pipeline.
pub(crate) async fn inspect(b: &RedisBackend, name: &str, kind: LockKind) -> Result<LockInfo> {
    let mut pipe = redis::pipe();
    let reading = Reading::add(b, &mut pipe, name, kind)?;
    reading.parse(b, b.query_pipe(&pipe).await?)
}

/// Locks read per pipeline by [`inspect_many`]: a few thousand commands a round trip.
const PER_PIPELINE: usize = 500;

/// [`inspect`] of many locks (`dlock list`, `dlock top`): one pipeline per
/// [`PER_PIPELINE`] locks, not a round trip per lock. On a cluster, one series of pipelines
/// per master, each with the locks of its slots (the keys of one lock share a slot); the
/// locks of a master whose pipeline fails (a slot moved) are read one by one, routed by key.
pub(crate) async fn inspect_many(
    b: &RedisBackend,
    locks: &[(String, LockKind)],
) -> Result<Vec<LockInfo>> {
    let Some(cluster) = b.con.cluster() else {
        return pipelined(b, &mut b.con.get(), locks).await;
    };
    let slots: Vec<u16> = (locks.iter())
        .map(|(name, _)| crate::cluster::slot(&b.fence_key(name)))
        .collect();
    let read = |master: Option<Master>, groups: Vec<Vec<usize>>| async move {
        let part: Vec<(String, LockKind)> =
            groups.concat().iter().map(|&i| locks[i].clone()).collect();
        let read = match master {
            Some(m) => pipelined(b, &mut cluster.at(&m), &part).await,
            None => Err(crate::cluster::no_master(&b.endpoint)),
        };
        match read {
            Ok(infos) => infos.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::debug!(error = %e, "a master's pipelined reads failed; reading its locks by key");
                cluster.forget();
                join_all(part.iter().map(|(name, kind)| inspect(b, name, *kind))).await
            }
        }
    };
    let infos = cluster.per_master(b, "inspect", &slots, read).await?;
    infos.into_iter().collect()
}

/// The locks `locks` read over `con`, [`PER_PIPELINE`] a round trip.
async fn pipelined(
    b: &RedisBackend,
    con: &mut crate::cluster::Link,
    locks: &[(String, LockKind)],
) -> Result<Vec<LockInfo>> {
    let mut out = Vec::with_capacity(locks.len());
    for chunk in locks.chunks(PER_PIPELINE) {
        let mut pipe = redis::pipe();
        let readings = chunk
            .iter()
            .map(|(name, kind)| Reading::add(b, &mut pipe, name, *kind))
            .collect::<Result<Vec<_>>>()?;
        let vals: Vec<Value> = pipe.query_async(con).await.map_err(|e| b.err(e))?;
        let expected: usize = readings.iter().map(|r| r.replies).sum();
        if vals.len() != expected {
            return Err(Error::unexpected(
                KIND,
                format!(
                    "inspect of {} locks: {} replies, not {expected}",
                    readings.len(),
                    vals.len()
                ),
            ));
        }
        let mut rest = vals.into_iter();
        for r in readings {
            out.push(r.parse(b, rest.by_ref().take(r.replies).collect())?);
        }
    }
    Ok(out)
}
