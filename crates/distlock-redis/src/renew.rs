//! Renewals: many grants in one round trip.
//!
//! `scripts/renew_many.lua` renews up to [`PER_SCRIPT`] grants of any family in one EVALSHA
//! (each checked by attempt id and token as a lone renewal is: `renew.lua`'s `renew_mutex` for
//! a mutex, `expiring_renew.lua`'s `renew_expiring` for a read-write lock or a semaphore). The
//! watchdog sends at most 1,000 holds per call, so a tick costs one round trip and one script
//! per 1,000 holds; a longer list goes out as one pipeline of several scripts (still one round
//! trip), so one script never blocks the server for long.
//!
//! A chunk is one command (numbers are written straight into its buffer) and its reply one
//! string of `0`/`1`: per grant only its key names are made, no command, reply value or
//! number string.
//!
//! The keys of one script belong to many locks, so to many Cluster slots: fine on the one
//! standalone node `redis://` talks to; on `redis+cluster://` the grants are grouped by slot
//! first, one pipeline per master ([`renew_cluster`]).

use crate::cluster::{self, Cluster, Master};
use crate::error::shape;
use crate::error::KIND;
use crate::scripts::{self, Script};
use crate::{family, Family, RedisBackend};
use distlock_core::backend::{GrantRef, RenewOutcome};
use distlock_core::{Error, Result};
use futures_util::future::join_all;
use redis::Value;
use std::sync::LazyLock;
use std::time::Duration;

/// The most grants one script renews.
pub(crate) const PER_SCRIPT: usize = 1000;

const SOURCE: &str = concat!(
    include_str!("../scripts/renew.lua"),
    include_str!("../scripts/expiring_renew.lua"),
    include_str!("../scripts/dialect/renew.lua"),
    include_str!("../scripts/renew_many.lua")
);

/// The script (its command is built here, keys first, then the arguments).
static RENEW_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The script `renew_many.lua` with the functions it calls, for loading at connect time.
pub(crate) fn script() -> &'static Script {
    &RENEW_MANY
}

/// One grant's keys: the lock hash of a mutex; the holds hash and the expiries zset of a
/// read-write lock or semaphore; a dialect's keys and the grant's field or id
/// ([`crate::dialect::RenewKeys`]).
enum Keys {
    Mutex(String),
    Expiring(String, String),
    Dialect(crate::dialect::RenewKeys),
}

impl Keys {
    fn of(b: &RedisBackend, grant: &GrantRef) -> Result<Keys> {
        let name = &grant.key.name;
        if let Some(d) = &b.dialect {
            return Ok(Keys::Dialect(d.renew_keys(grant)?));
        }
        let fam = family(grant.key.kind)?;
        let holds = b.key_of(name, &[fam.base()]);
        Ok(match fam {
            Family::Mutex { .. } => Keys::Mutex(holds),
            _ => Keys::Expiring(holds, b.key_of(name, &[fam.base(), ":exp"])),
        })
    }
}

/// The first key of `grant` (the one its slot is computed from).
pub(crate) fn first_key(b: &RedisBackend, grant: &GrantRef) -> Result<String> {
    Ok(match Keys::of(b, grant)? {
        Keys::Mutex(k) | Keys::Expiring(k, _) => k,
        Keys::Dialect(d) => d.keys[0].clone(),
    })
}

/// The EVALSHA of `renew_many.lua` for `holds` (at most [`PER_SCRIPT`]).
pub(crate) fn command(b: &RedisBackend, holds: &[(GrantRef, Duration)]) -> Result<redis::Cmd> {
    let keys = holds
        .iter()
        .map(|(g, _)| Keys::of(b, g))
        .collect::<Result<Vec<_>>>()?;
    let count: usize = keys
        .iter()
        .map(|k| match k {
            Keys::Mutex(_) => 1,
            Keys::Expiring(..) => 2,
            Keys::Dialect(d) => d.keys.len(),
        })
        .sum();
    let mut cmd = redis::Cmd::with_capacity(3 + count + 4 * holds.len(), 128 * holds.len());
    cmd.arg("EVALSHA").arg(&RENEW_MANY.sha).arg(count);
    for k in &keys {
        match k {
            Keys::Mutex(key) => cmd.arg(key),
            Keys::Expiring(holds, exp) => cmd.arg(holds).arg(exp),
            Keys::Dialect(d) => cmd.arg(&d.keys),
        };
    }
    for ((grant, lease), k) in holds.iter().zip(&keys) {
        let (family, held_by) = match k {
            Keys::Mutex(_) => ("m", grant.attempt.as_str()),
            Keys::Expiring(..) => ("e", grant.attempt.as_str()),
            Keys::Dialect(d) => (d.family, d.held_by.as_str()),
        };
        cmd.arg(family)
            .arg(held_by)
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

/// `Backend::renew` on a cluster: one script per slot (a script may not touch two slots),
/// one pipeline per master, the masters' pipelines at once: a tick costs one round trip to
/// each master that owns a held lock. The grants a master's pipeline could not renew (a
/// failover or a resharding moved a slot, a new master lacks the script, the master does not
/// answer, a grant's own error) are sent again script by script, routed by key (redis-rs
/// follows `MOVED`), after the topology is read again. Each grant gets its own outcome: a
/// master that fails, or does not answer within the cluster's renewal budget, leaves only its
/// grants `Unconfirmed` ([`RenewOutcome::each`]).
async fn renew_cluster(
    b: &RedisBackend,
    cluster: &Cluster,
    holds: &[(GrantRef, Duration)],
) -> Result<Vec<RenewOutcome>> {
    let slots = holds
        .iter()
        .map(|(g, _)| first_key(b, g).map(|k| cluster::slot(&k)))
        .collect::<Result<Vec<_>>>()?;
    let masters = cluster
        .masters()
        .await
        .map_err(|e| crate::error::map(&b.endpoint, e))?;
    let plan = cluster::plan(&slots, &masters);
    let masters = &masters;
    // One hold (an `extend`) has nothing to keep apart: it waits as any call does.
    let budget = (holds.len() > 1).then_some(cluster.renew_budget);
    let sends = plan.iter().map(|(owner, scripts)| async move {
        let chunks: Vec<Vec<(GrantRef, Duration)>> = scripts
            .iter()
            .map(|idx| idx.iter().map(|&i| holds[i].clone()).collect())
            .collect();
        let n = chunks.iter().map(Vec::len).sum();
        let part = renew_at_master(b, cluster, owner.map(|m| &masters[m]), &chunks);
        let results = match budget {
            Some(t) => match tokio::time::timeout(t, part).await {
                Ok(r) => r,
                Err(_) => {
                    let at = owner.map_or_else(|| "a master".to_owned(), |m| masters[m].addr());
                    let e = Error::connection(
                        KIND,
                        b.endpoint.clone(),
                        format!("{at} did not answer the renewal of its locks within {t:?}"),
                    );
                    failed(b, e, n)
                }
            },
            None => part.await,
        };
        scripts
            .iter()
            .flatten()
            .copied()
            .zip(results)
            .collect::<Vec<_>>()
    });
    let mut out: Vec<Option<Result<RenewOutcome>>> = (0..holds.len()).map(|_| None).collect();
    for part in join_all(sends).await {
        for (i, r) in part {
            out[i] = Some(r);
        }
    }
    let results = out
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Err(shape("renew", &Value::Nil))))
        .collect();
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
        None => failed(
            b,
            Error::connection(KIND, b.endpoint.clone(), "no master known for the slot"),
            n,
        ),
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
        if again.is_empty() {
            continue;
        }
        let results = match b.wait_replicas {
            // Sent by key, the scripts could not share a WAIT on one master's connection:
            // the core renews again (the slot map is read anew).
            Some(wait) => match check_replicas(b, None, wait) {
                Err(e) => failed(b, e, again.len()),
                Ok(()) => continue,
            },
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
                again.push(out.len()..out.len() + chunk.len());
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
    let grants: Vec<&(GrantRef, Duration)> = scripts
        .iter()
        .flat_map(|c| c.iter())
        .enumerate()
        .filter(|(i, _)| again.iter().any(|r| r.contains(i)))
        .map(|(_, g)| g)
        .collect();
    let one_by_one = grants
        .iter()
        .map(|g| command(b, std::slice::from_ref(*g)))
        .collect::<Result<Vec<_>>>()?;
    let idx = again.into_iter().flatten();
    match send(b, con, &one_by_one, wait).await {
        Ok(vals) => {
            for (i, v) in idx.zip(vals) {
                out[i] = match v {
                    Value::ServerError(e) => Err(b.err(e.into())),
                    v => flags(&v, 1).map(|f| f[0]),
                };
            }
        }
        Err(e) => {
            for (i, r) in idx.zip(failed(b, e, grants.len())) {
                out[i] = r;
            }
        }
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
    let mut vals = scripts::eval_pipe(con, &[&*RENEW_MANY], &pipe)
        .await
        .map_err(|e| b.err(e))?;
    if let Some(wait) = wait {
        let acked = vals.pop().as_ref().and_then(crate::int);
        check_replicas(b, acked, wait)?;
    }
    if vals.len() != cmds.len() {
        return Err(shape("renew", &Value::Array(vals)));
    }
    Ok(vals)
}

/// A renewal's `WAIT` answered `acked` replicas (`None`: no answer) of the `n` required
/// within `timeout`: fewer is not an answer about the grants — the core tries the renewal
/// again, and the holder's deadline stays that of the last confirmed one.
pub(crate) fn check_replicas(
    b: &RedisBackend,
    acked: Option<i64>,
    (n, timeout): (u32, Duration),
) -> Result<()> {
    if acked.is_some_and(|a| a >= i64::from(n)) {
        return Ok(());
    }
    Err(Error::connection(
        KIND,
        b.endpoint.clone(),
        format!(
            "a renewal was confirmed by {} of the {n} required replicas within {timeout:?}; the leases are not extended until they are",
            acked.unwrap_or(0)
        ),
    ))
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
