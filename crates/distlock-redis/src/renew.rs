//! Renewals: many grants in one round trip (docs/redis-lock.md, "Operations"; on a cluster
//! docs/redis-cluster.md, "Watchdog").
//!
//! `scripts/renew_many.lua` renews up to [`PER_SCRIPT`] grants of any family in one EVALSHA,
//! each checked by attempt id and token as a lone renewal is; a longer list goes out as one
//! pipeline of several scripts (still one round trip), so one script never blocks the server
//! for long. A chunk is one command (numbers written straight into its buffer) and its reply
//! one string of `0`/`1`: per grant only its key names are made. A script may not touch two
//! Cluster slots, so on `redis+cluster://` the grants are grouped by slot first, one pipeline
//! per master ([`renew_cluster`]).

use crate::cluster::{self, Cluster, Master};
use crate::error::shape;
use crate::error::KIND;
use crate::scripts::{self, SCRIPTS};
use crate::{family, Family, RedisBackend};
use distlock_core::backend::{GrantRef, RenewOutcome};
use distlock_core::{Error, Result};
use redis::Value;
use std::borrow::Cow;
use std::time::Duration;

/// The most grants one script renews.
pub(crate) const PER_SCRIPT: usize = 1000;

/// One grant's part of `renew_many.lua`: its keys (the first is the one its slot is computed
/// from), its family (`m` a mutex: the lock hash; `e` a read-write lock or semaphore: the holds
/// hash and the expiries zset; a dialect's `r` or `p`: scripts/dialect/renew.lua) and what it
/// is held by (the attempt id; a dialect grant's field or id).
pub(crate) struct RenewKeys<'a> {
    pub(crate) keys: Vec<String>,
    pub(crate) family: &'static str,
    pub(crate) held_by: Cow<'a, str>,
}

fn keys_of<'a>(b: &RedisBackend, grant: &'a GrantRef) -> Result<RenewKeys<'a>> {
    if let Some(d) = &b.dialect {
        return d.renew_keys(grant);
    }
    let name = &grant.key.name;
    let fam = family(grant.key.kind)?;
    let holds = b.key_of(name, &[fam.base()]);
    let (keys, family) = match fam {
        Family::Mutex { .. } => (vec![holds], "m"),
        _ => (vec![holds, b.key_of(name, &[fam.base(), ":exp"])], "e"),
    };
    let held_by = Cow::Borrowed(grant.attempt.as_str());
    Ok(RenewKeys {
        keys,
        family,
        held_by,
    })
}

/// The EVALSHA of `renew_many.lua` for `holds` (at most [`PER_SCRIPT`]).
pub(crate) fn command(b: &RedisBackend, holds: &[(GrantRef, Duration)]) -> Result<redis::Cmd> {
    let keys = holds
        .iter()
        .map(|(g, _)| keys_of(b, g))
        .collect::<Result<Vec<_>>>()?;
    let count: usize = keys.iter().map(|k| k.keys.len()).sum();
    let mut cmd = redis::Cmd::with_capacity(3 + count + 4 * holds.len(), 128 * holds.len());
    cmd.arg("EVALSHA").arg(&SCRIPTS.renew_many.sha).arg(count);
    for k in &keys {
        cmd.arg(&k.keys);
    }
    for ((grant, lease), k) in holds.iter().zip(&keys) {
        cmd.arg(k.family)
            .arg(&*k.held_by)
            .arg(grant.token)
            .arg(lease.as_millis().max(1) as u64);
    }
    Ok(cmd)
}

/// `Backend::renew` of the Redis backend: every grant of `holds` in one round trip (two when
/// a script failed on the server: see [`renew_on`]).
pub(crate) async fn renew(
    b: &RedisBackend,
    holds: &[(GrantRef, Duration)],
) -> Result<Vec<RenewOutcome>> {
    if holds.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(cluster) = b.con.cluster() {
        return renew_cluster(b, cluster, holds).await;
    }
    let scripts: Vec<&[(GrantRef, Duration)]> = holds.chunks(PER_SCRIPT).collect();
    let mut con = b.con.get();
    let results = renew_on(b, &mut con, &scripts, b.wait_replicas).await?;
    RenewOutcome::each(KIND, holds, results)
}

/// `Backend::renew` on a cluster: one script per slot, one pipeline per master, the masters'
/// pipelines at once; what a master's pipeline could not renew is sent again by key, after
/// the topology is read again. A master that fails, or does not answer within the cluster's
/// renewal budget, leaves only its grants `Unconfirmed` ([`RenewOutcome::each`]).
async fn renew_cluster(
    b: &RedisBackend,
    cluster: &Cluster,
    holds: &[(GrantRef, Duration)],
) -> Result<Vec<RenewOutcome>> {
    let slots = holds
        .iter()
        .map(|(g, _)| keys_of(b, g).map(|k| cluster::slot(&k.keys[0])))
        .collect::<Result<Vec<_>>>()?;
    // One hold (an `extend`) has nothing to keep apart: it waits as any call does.
    let budget = (holds.len() > 1).then_some(cluster.renew_budget);
    let renew = |master: Option<Master>, scripts: Vec<Vec<usize>>| async move {
        let chunks: Vec<Vec<(GrantRef, Duration)>> = scripts
            .iter()
            .map(|idx| idx.iter().map(|&i| holds[i].clone()).collect())
            .collect();
        let n = chunks.iter().map(Vec::len).sum();
        let part = renew_at_master(b, cluster, master.as_ref(), &chunks);
        let Some(t) = budget else {
            return part.await;
        };
        tokio::time::timeout(t, part).await.unwrap_or_else(|_| {
            let at = master
                .as_ref()
                .map_or_else(|| "a master".to_owned(), Master::addr);
            let why = format!("{at} did not answer the renewal of its locks within {t:?}");
            failed(b, Error::connection(KIND, b.endpoint.clone(), why), n)
        })
    };
    let results = cluster.per_master(b, "renew", &slots, renew).await?;
    RenewOutcome::each(KIND, holds, results)
}

/// The grants of `chunks` (one script each, all of one slot) renewed on `master` (`None`: no
/// master known for their slots), those it could not renew sent again by key; one result
/// per grant, in order.
async fn renew_at_master(
    b: &RedisBackend,
    cluster: &Cluster,
    master: Option<&Master>,
    chunks: &[Vec<(GrantRef, Duration)>],
) -> Vec<Result<RenewOutcome>> {
    let n = chunks.iter().map(Vec::len).sum();
    let scripts: Vec<&[(GrantRef, Duration)]> = chunks.iter().map(Vec::as_slice).collect();
    // As on one server (`renew::renew`): with `?wait_replicas=N` a renewal counts once the
    // master's replicas have it.
    let mut out = match master {
        Some(m) => renew_on(b, &mut cluster.at(m), &scripts, b.wait_replicas)
            .await
            .unwrap_or_else(|e| failed(b, e, n)),
        None => failed(b, cluster::no_master(&b.endpoint), n),
    };
    let Some(Err(e)) = out.iter().find(|r| r.is_err()) else {
        return out;
    };
    tracing::debug!(error = %e, "a master's renewals failed; sending them by key");
    cluster.forget();
    let mut start = 0;
    for chunk in chunks {
        let (again, idx): (Vec<(GrantRef, Duration)>, Vec<usize>) = (start..start + chunk.len())
            .filter(|&i| out[i].is_err())
            .map(|i| (chunk[i - start].clone(), i))
            .unzip();
        start += chunk.len();
        let results = match b.wait_replicas {
            _ if again.is_empty() => continue,
            // Sent by key, the scripts could not share a WAIT on one master's connection:
            // the core renews again (the slot map is read anew).
            Some(wait) => failed(b, too_few_replicas(b, None, wait), again.len()),
            None => renew_on(b, &mut cluster.link(), &[&again], None)
                .await
                .unwrap_or_else(|e| failed(b, e, again.len())),
        };
        for (i, r) in idx.into_iter().zip(results) {
            out[i] = r;
        }
    }
    out
}

/// Renews `scripts` (each at most [`PER_SCRIPT`] grants, one `renew_many.lua`) on `con` in one
/// pipeline, with `WAIT` at its end when `wait` is set (`?wait_replicas=N`). Each script's
/// reply is read on its own: a script the server failed (Redis stops a script at its first
/// error, e.g. WRONGTYPE on a lock key an operator overwrote with another type) is sent again
/// one script per grant, in one more round trip, so only a grant whose own renewal fails gets
/// an error. Returns one result per grant, in the order of `scripts`.
///
/// # Errors
/// The whole batch's: the connection failed, too few replicas confirmed the first pipeline.
pub(crate) async fn renew_on<C: redis::aio::ConnectionLike>(
    b: &RedisBackend,
    con: &mut C,
    scripts: &[&[(GrantRef, Duration)]],
    wait: Option<(u32, Duration)>,
) -> Result<Vec<Result<RenewOutcome>>> {
    let cmds = scripts
        .iter()
        .map(|chunk| command(b, chunk))
        .collect::<Result<Vec<_>>>()?;
    let vals = send(b, con, &cmds, wait).await?;
    let mut out = Vec::new();
    let mut again = Vec::new();
    for (v, chunk) in vals.iter().zip(scripts) {
        match v {
            Value::ServerError(e) => {
                tracing::debug!(error = %e, grants = chunk.len(), "a renewal script failed; renewing its grants one by one");
                again.extend(out.len()..out.len() + chunk.len());
                out.extend(chunk.iter().map(|_| Ok(RenewOutcome::Unconfirmed)));
            }
            v => match flags(v, chunk.len()) {
                Ok(f) => out.extend(f.into_iter().map(Ok)),
                Err(_) => out.extend(chunk.iter().map(|_| Err(shape("renew", v)))),
            },
        }
    }
    if again.is_empty() {
        return Ok(out);
    }
    let grants: Vec<&(GrantRef, Duration)> = scripts.iter().flat_map(|c| c.iter()).collect();
    let one_by_one = (again.iter())
        .map(|&i| command(b, std::slice::from_ref(grants[i])))
        .collect::<Result<Vec<_>>>()?;
    let results = match send(b, con, &one_by_one, wait).await {
        Ok(vals) => (vals.into_iter())
            .map(|v| match v {
                Value::ServerError(e) => Err(b.err(e.into())),
                v => flags(&v, 1).map(|f| f[0]),
            })
            .collect(),
        Err(e) => failed(b, e, again.len()),
    };
    for (i, r) in again.into_iter().zip(results) {
        out[i] = r;
    }
    Ok(out)
}

/// `n` grants whose renewal failed with `e`: the first keeps the error itself (the one
/// [`RenewOutcome::each`] returns if every grant failed); the others carry its text, to log.
pub(crate) fn failed(b: &RedisBackend, e: Error, n: usize) -> Vec<Result<RenewOutcome>> {
    let text = e.to_string();
    let mut first = Some(e);
    (0..n)
        .map(|_| {
            Err(first
                .take()
                .unwrap_or_else(|| Error::connection(KIND, b.endpoint.clone(), text.clone())))
        })
        .collect()
}

/// Sends `cmds` (and a `WAIT` when `wait` is set) in one pipeline whose replies are read one
/// by one (a script's error is its `Value::ServerError`), one per command.
async fn send<C: redis::aio::ConnectionLike>(
    b: &RedisBackend,
    con: &mut C,
    cmds: &[redis::Cmd],
    wait: Option<(u32, Duration)>,
) -> Result<Vec<Value>> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for c in cmds {
        pipe.add_command(c.clone());
    }
    // With `?wait_replicas=N` a renewal counts only once N replicas have it, as a grant: the
    // replica a failover promotes then never holds an older expiry than the holder believes.
    if let Some((n, timeout)) = wait {
        pipe.cmd("WAIT").arg(n).arg(timeout.as_millis() as u64);
    }
    let mut vals = scripts::eval_pipe(con, &[&SCRIPTS.renew_many], &pipe)
        .await
        .map_err(|e| b.err(e))?;
    if let Some(wait) = wait {
        let acked = vals.pop().as_ref().and_then(crate::int);
        if acked.is_none_or(|a| a < i64::from(wait.0)) {
            return Err(too_few_replicas(b, acked, wait));
        }
    }
    if vals.len() != cmds.len() {
        return Err(shape("renew", &Value::Array(vals)));
    }
    Ok(vals)
}

/// A renewal's `WAIT` answered `acked` replicas (`None`: no answer), fewer than the `n`
/// required within `timeout`: not an answer about the grants — the core tries the renewal
/// again, and the holder's deadline stays that of the last confirmed one.
fn too_few_replicas(b: &RedisBackend, acked: Option<i64>, (n, timeout): (u32, Duration)) -> Error {
    Error::connection(
        KIND,
        b.endpoint.clone(),
        format!(
            "a renewal was confirmed by {} of the {n} required replicas within {timeout:?}; the leases are not extended until they are",
            acked.unwrap_or(0)
        ),
    )
}

/// The outcomes in the reply `v` of one script that renewed `n` grants.
pub(crate) fn flags(v: &Value, n: usize) -> Result<Vec<RenewOutcome>> {
    let flags = match v {
        Value::BulkString(b) if b.len() == n => b.as_slice(),
        _ => return Err(shape("renew", v)),
    };
    flags
        .iter()
        .map(|f| match f {
            b'1' => Ok(RenewOutcome::Renewed),
            b'0' => Ok(RenewOutcome::NotHeld),
            _ => Err(shape("renew", v)),
        })
        .collect()
}
