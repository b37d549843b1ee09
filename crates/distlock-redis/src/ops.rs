//! Operator commands: `dlock list`, `dlock release --force`, `dlock doctor`.
//!
//! `list` walks the namespace with SCAN (never KEYS: it does not block the server) and groups
//! the per-lock names of the layout in the crate docs; `force_release` is one script that
//! removes the grants and advances the fencing counter atomically; `diagnose` reads INFO (and
//! CONFIG where allowed) and the server clock.

use super::{family, Family, RedisBackend};
use crate::cluster::Link;
use crate::error::KIND;
use crate::inspect::holders;
use crate::scripts::SCRIPTS;
use distlock_core::operator::{clock_finding, measure_clock, version_finding};
use distlock_core::{
    Error, Finding, ForceReleased, ListedLock, LockKind, Operator, Result, Severity,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The reply of force_release.lua: grants, PTTL, expiries, server ms, new counter.
type ForceReply = (Vec<(String, String)>, i64, Vec<(String, f64)>, u64, String);

/// The lowest Redis version the scripts run on: they read TIME before writing, which needs
/// script effects replication, the default from Redis 5.0 (earlier servers refuse the write).
const MIN_VERSION: (u32, u32, u32) = (5, 0, 0);

/// Which family of keys a name of the namespace belongs to (the order `list` reports them in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fam {
    Mutex,
    Rw,
    Sem,
    /// Only the fencing counter is left (a lock used and released).
    Fence,
    /// An election's keys (`NAME}:election...`).
    Election,
    /// Only an election's fencing counter is left.
    ElectionFence,
}

/// The lock name and family of key `key` of namespace `ns` (`NS:{NAME}SUFFIX`, the name up to
/// the last `}`), or `None` for a key that is not part of a lock (Redlock's epoch keys, an end
/// record, foreign data).
fn parse_key<'a>(ns: &str, key: &'a str) -> Option<(&'a str, Fam)> {
    let rest = key.strip_prefix(ns)?.strip_prefix(":{")?;
    let (name, suffix) = rest.rsplit_once('}')?;
    let fam = match suffix {
        "" | ":queue" | ":waiters" => Fam::Mutex,
        ":rw" | ":rw:queue" | ":rw:waiters" | ":rw:exp" => Fam::Rw,
        ":sem" | ":sem:queue" | ":sem:waiters" | ":sem:exp" | ":sem:limit" => Fam::Sem,
        ":fence" => Fam::Fence,
        ":election" | ":election:queue" | ":election:waiters" => Fam::Election,
        ":election:fence" => Fam::ElectionFence,
        _ => return None,
    };
    (!name.is_empty()).then_some((name, fam))
}

/// Escapes the glob characters of SCAN MATCH.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Every key matching `pattern` (of type `of` only when given: `SCAN … TYPE`, Redis 6.0 and
/// later), by SCAN (never KEYS: it does not block the server), one batch of up to 1000 at a
/// time given to `batch`.
pub(crate) async fn scan(
    b: &RedisBackend,
    pattern: &str,
    of: Option<&str>,
    mut batch: impl FnMut(Vec<String>),
) -> Result<()> {
    // On a cluster every master holds its own slots' keys: SCAN each.
    for (mut con, _) in b.con.masters().await.map_err(|e| b.err(e))? {
        let mut cursor = 0u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor).arg(&["MATCH", pattern, "COUNT", "1000"]);
            if let Some(of) = of {
                cmd.arg(&["TYPE", of]);
            }
            let (next, keys): (u64, Vec<String>) = b.query_on(&mut con, &cmd).await?;
            if !keys.is_empty() {
                batch(keys);
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(())
}

#[distlock_core::async_trait]
impl Operator for RedisBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        match &self.dialect {
            Some(l) => crate::dialect::list(self, l, prefix).await,
            None => list(self, prefix).await,
        }
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        match &self.dialect {
            Some(l) => {
                l.dialect.capabilities().check(KIND, kind)?;
                crate::dialect::force_release(self, l, name).await
            }
            None => force_release(self, name, kind).await,
        }
    }

    /// The dialect's finding, then the server's, or the cluster's and each of its masters'.
    async fn diagnose(&self) -> Result<Vec<Finding>> {
        let mut out = vec![crate::dialect::Layout::finding(self.dialect.as_ref())];
        if let Some(c) = self.con.cluster() {
            out.push(cluster_state(self, c).await?);
        }
        // Every master's findings (a cluster's each saying which master).
        for (con, addr) in self.con.masters().await.map_err(|e| self.err(e))? {
            for mut f in diagnose_on(self, con, addr.is_some()).await? {
                if let Some(addr) = &addr {
                    f.message = format!("master {addr}: {}", f.message);
                }
                out.push(f);
            }
        }
        Ok(out)
    }

    async fn server_time(&self) -> Result<Option<SystemTime>> {
        time(self, &mut self.con.get()).await.map(Some)
    }
}

/// The server's clock (`TIME`), asked over `con`.
async fn time(b: &RedisBackend, con: &mut Link) -> Result<SystemTime> {
    let (secs, micros): (u64, u64) = b.query_on(con, &redis::cmd("TIME")).await?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros))
}

pub(crate) async fn list(b: &RedisBackend, prefix: &str) -> Result<Vec<ListedLock>> {
    let pattern = format!("{}:{{{}*", glob_escape(&b.namespace), glob_escape(prefix));
    let mut names: BTreeMap<String, BTreeSet<Fam>> = BTreeMap::new();
    scan(b, &pattern, None, |keys| {
        for key in &keys {
            if let Some((name, fam)) = parse_key(&b.namespace, key) {
                if name.starts_with(prefix) {
                    names.entry(name.to_owned()).or_default().insert(fam);
                }
            }
        }
    })
    .await?;
    // Which kinds of which names to read, then all of them read in pipelines
    // (`inspect_many`): a refresh of 10,000 locks is a few round trips, not 10,000.
    let mut wanted: Vec<(String, LockKind)> = Vec::new();
    for (name, fams) in names {
        let has_election = fams.contains(&Fam::Election);
        // The counter is shared by every family of the name: report it alone only when
        // nothing else of the name is left.
        let only_fence = fams
            .iter()
            .all(|f| matches!(f, Fam::Fence | Fam::ElectionFence));
        for fam in fams {
            let kind = match fam {
                Fam::Mutex => LockKind::Mutex,
                Fam::Rw => LockKind::Write,
                // The permit count comes from the limit key; 0 when it is gone.
                Fam::Sem => LockKind::Semaphore {
                    permits: 1,
                    limit: 0,
                },
                Fam::Fence if only_fence => LockKind::Mutex,
                Fam::Fence => continue,
                Fam::Election => LockKind::Election,
                // An election used and resigned: reported once, as the election.
                Fam::ElectionFence if !has_election => LockKind::Election,
                Fam::ElectionFence => continue,
            };
            wanted.push((name.clone(), kind));
        }
    }
    let infos = crate::inspect::inspect_many(b, &wanted).await?;
    let listed = wanted.into_iter().zip(infos).map(|((_, kind), mut info)| {
        let kind = match kind {
            LockKind::Semaphore { permits, .. } => {
                info.permits = info.permits.filter(|limit| *limit > 0);
                let limit = info.permits.unwrap_or(0);
                LockKind::Semaphore { permits, limit }
            }
            k => k,
        };
        ListedLock::new(kind, info)
    });
    Ok(listed.collect())
}

pub(crate) async fn force_release(
    b: &RedisBackend,
    name: &str,
    kind: LockKind,
) -> Result<ForceReleased> {
    let fam = family(kind)?;
    let k = b.keys(name, &fam);
    // KEYS[3] must be a name of the same slot; for the mutex (its queue) it is only passed,
    // never written. A mutex's waiter data is KEYS[4].
    let keys = match &k.exp {
        Some(exp) => vec![&*k.holds, &k.fence, exp],
        None => vec![&*k.holds, &k.fence, &k.queue, &k.waiters],
    };
    let (channel, observe) = (b.release_channel(name, &fam), b.observe_channel(name));
    let mut args = vec![&*channel, if k.exp.is_some() { "1" } else { "0" }];
    if let Family::Mutex { election: true, .. } = fam {
        args.push(&observe);
    }
    // With `?wait_replicas`, the removal must survive a failover as a grant must (else a
    // promoted replica still has the old holder, and a counter below its token): a WAIT
    // right behind the script, as an acquire's.
    let cmd = SCRIPTS.force_release.cmd(&keys, &args);
    let (reply, acked) = (b.eval_ending(&SCRIPTS.all(), &cmd, None, b.wait_replicas)).await?;
    let bad = |what: &str| crate::error::unexpected("forced release of", name, what);
    let (fields, pttl, exps, now_ms, token): ForceReply =
        redis::from_redis_value(reply).map_err(|_| bad("reply"))?;
    let fencing_token = token.parse().map_err(|_| bad("counter"))?;
    if let (Some((n, timeout)), Some(acked)) = (b.wait_replicas, acked) {
        if acked < i64::from(n) {
            return Err(Error::unexpected(KIND, format!(
                    "forced release of `{name}` done on the primary, but only {acked} of {n} replicas confirmed it within {timeout:?} (a failover could bring the old holder back); check replication and run it again"
                )));
        }
    }
    let removed = holders(&fam, &fields, pttl, &exps, now_ms);
    Ok(ForceReleased::new(removed, fencing_token))
}

/// Reads `maxmemory-policy` and warns unless it is `noeviction` ([`eviction_finding`]). (An
/// evicted fencing counter is as harmless as an expired one: a token is never below the server
/// clock, see `scripts/fence.lua`.) A server where CONFIG is disabled or renamed only gets a
/// debug line.
pub(crate) async fn check_eviction(con: &mut redis::aio::ConnectionManager, endpoint: &str) {
    let r: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(con)
        .await;
    match r.as_ref().map(|v| v.get(1).map(|p| eviction_finding(p))) {
        Ok(Some((Severity::Ok, _))) => {}
        Ok(Some((_, message))) => tracing::warn!(endpoint, "{message}"),
        Ok(None) => tracing::debug!(endpoint, "CONFIG GET maxmemory-policy returned nothing"),
        Err(e) => tracing::debug!(
            endpoint,
            error = %e,
            "cannot read maxmemory-policy (CONFIG disabled or renamed?)"
        ),
    }
}

/// `key:value` lines of an INFO reply.
pub(crate) fn parse_info(info: &str) -> HashMap<&str, &str> {
    info.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end().split_once(':'))
        .collect()
}

/// The fencing rule, for every server (the assumption it rests on is not something one look
/// at a server can check).
fn fencing_finding() -> Finding {
    Finding::new(
        Severity::Ok,
        "fencing",
        format!(
            "every grant's token is max(counter + 1, the server clock in µs), so a token for a name is above every token issued for it before — across a restart from any snapshot, the appendfsync window and failovers — as long as the server clock does not step back and the clocks of a master and the replicas that may replace it agree within the time a failover takes (keep them on NTP); a name's counter expires {} min after its last grant's lease",
            crate::FENCE_MARGIN.as_secs() / 60
        ),
    )
}

/// The `cluster` finding of `CLUSTER INFO`.
async fn cluster_state(b: &RedisBackend, c: &crate::cluster::Cluster) -> Result<Finding> {
    let info: String = b
        .query_on(&mut c.link(), redis::cmd("CLUSTER").arg("INFO"))
        .await?;
    let info = parse_info(&info);
    let state = info.get("cluster_state").copied().unwrap_or("unknown");
    Ok(match state {
        "ok" => Finding::new(Severity::Ok, "cluster", format!("cluster_state:ok, {} slots served", info.get("cluster_slots_ok").copied().unwrap_or("?"))),
        _ => Finding::new(Severity::Warning, "cluster", format!("cluster_state:{state}: some slots have no live master, and locks in them fail until a replica takes over")),
    })
}

/// The findings an INFO reply (and `CONFIG GET save`, when allowed) tells: version, cluster,
/// eviction, persistence, replication (`cluster`: a master of the `redis+cluster://` cluster).
fn info_findings(
    info: &HashMap<&str, &str>,
    save: Option<&str>,
    cluster: bool,
    wait_replicas: Option<(u32, Duration)>,
) -> Vec<Finding> {
    let version = info.get("redis_version").copied().unwrap_or("unknown");
    let policy = info.get("maxmemory_policy").copied().unwrap_or("unknown");
    let aof = info.get("aof_enabled") == Some(&"1");
    let found =
        |check, (severity, message): (Severity, String)| Finding::new(severity, check, message);
    vec![
        version_finding(
            "Redis",
            version,
            MIN_VERSION,
            "the lock scripts' reading of the server clock (TIME) before writing, which needs script effects replication,",
            "the server refuses the scripts' writes",
        ),
        found("cluster", cluster_finding(info, cluster)),
        found("maxmemory-policy", eviction_finding(policy)),
        found("persistence", persistence_finding(aof, save)),
        found("replication", replication_finding(info, wait_replicas)),
    ]
}

/// Whether this is a standalone server, a master of the `redis+cluster://` cluster
/// (`cluster`), or a cluster node reached by `redis://`.
fn cluster_finding(info: &HashMap<&str, &str>, cluster: bool) -> (Severity, String) {
    let (severity, message) = if cluster {
        (
            Severity::Ok,
            "a master of the cluster, reached by redis+cluster://",
        )
    } else if info.get("cluster_enabled") == Some(&"1") {
        (
            Severity::Unsafe,
            "this is a Redis Cluster node: a redis:// URL talks to this one node only (locks whose slot lives elsewhere fail with MOVED, and a failover of this node's shard loses its grants); point dlock at a standalone or Sentinel-managed primary, or write redis+cluster://host:port,… for the whole cluster",
        )
    } else {
        (Severity::Ok, "standalone server (not a cluster node)")
    };
    (severity, message.to_owned())
}

/// Whether a held lock may be evicted, by `maxmemory-policy`: an evicting server may drop a
/// held lock (a second holder).
fn eviction_finding(policy: &str) -> (Severity, String) {
    match policy {
        "noeviction" => (Severity::Ok, "noeviction: held locks are never evicted".into()),
        _ => (
            Severity::Unsafe,
            format!("maxmemory-policy is `{policy}`: under memory pressure Redis may evict a held lock (a second holder gets it); set `maxmemory-policy noeviction` in redis.conf (and CONFIG SET maxmemory-policy noeviction)"),
        ),
    }
}

/// Whether grants survive a restart: `aof` (appendonly), or the RDB `save` points (`None`:
/// CONFIG not allowed).
fn persistence_finding(aof: bool, save: Option<&str>) -> (Severity, String) {
    let lost = "so a restarted server can grant a held lock again (fencing tokens still go up, see `fencing`); set `appendonly yes` if locks must survive restarts";
    match (aof, save) {
        (true, _) => (
            Severity::Ok,
            "appendonly yes: grants survive a restart (up to the appendfsync window; fencing tokens go up across it too, see `fencing`)".into(),
        ),
        (false, Some(s)) if !s.trim().is_empty() => (
            Severity::Warning,
            format!("only RDB snapshots (save {s}): grants made since the last snapshot are lost on a restart, {lost}"),
        ),
        (false, Some(_)) => (
            Severity::Warning,
            format!("no persistence (appendonly no, no save points): every grant is lost on a restart, {lost}"),
        ),
        (false, None) => (
            Severity::Warning,
            "appendonly no, and CONFIG GET save is not allowed: grants since the last snapshot (or all, without snapshots) are lost on a restart; set `appendonly yes` if locks must survive restarts".into(),
        ),
    }
}

/// Whether a failover can lose a grant: the replicas against `?wait_replicas`.
fn replication_finding(
    info: &HashMap<&str, &str>,
    wait_replicas: Option<(u32, Duration)>,
) -> (Severity, String) {
    let role = info.get("role").copied().unwrap_or("unknown");
    let replicas: u32 = info
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    match (role, replicas, wait_replicas) {
        ("slave", _, _) => (
            Severity::Unsafe,
            "this server is a replica: locks cannot be taken here (writes are refused) and it may be far behind its primary; point the URL at the primary".into(),
        ),
        (_, 0, None) => (Severity::Ok, "no replicas".into()),
        (_, 0, Some((n, _))) => (
            Severity::Warning,
            format!("?wait_replicas={n} but no replica is connected: every grant will time out waiting for them; start the replicas or drop the parameter"),
        ),
        (_, r, None) => (
            Severity::Warning,
            format!("{r} replica(s) connected and no ?wait_replicas: a failover can promote a replica that never received a grant, and the lock is granted twice; add ?wait_replicas={r} to the URL (or accept it for a single primary that is never failed over)"),
        ),
        (_, r, Some((n, _))) if r < n => (
            Severity::Warning,
            format!("?wait_replicas={n} but only {r} replica(s) connected: grants will time out until enough replicas are back"),
        ),
        (_, r, Some((n, _))) => (
            Severity::Ok,
            format!("{r} replica(s); every grant waits for {n} of them"),
        ),
    }
}

/// The findings of one server (`cluster`: a master of the `redis+cluster://` cluster).
async fn diagnose_on(b: &RedisBackend, mut con: Link, cluster: bool) -> Result<Vec<Finding>> {
    let info: String = b.query_on(&mut con, &redis::cmd("INFO")).await?;
    let info = parse_info(&info);

    // CONFIG may be renamed or forbidden by ACL: then only AOF is known.
    let save: Option<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query_async::<Vec<String>>(&mut con)
        .await
        .ok()
        .and_then(|v| v.get(1).cloned());
    let mut out = info_findings(&info, save.as_deref(), cluster, b.wait_replicas);

    // Clock: the server's TIME against the local clock at the middle of the round trip.
    let offset_ms = measure_clock(time(b, &mut con)).await?;
    out.push(clock_finding(offset_ms, "server", "on the server"));
    out.push(fencing_finding());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_names_and_families() {
        for (key, want) in [
            ("dlock:{a}", Some(("a", Fam::Mutex))),
            ("dlock:{a}:queue", Some(("a", Fam::Mutex))),
            ("dlock:{a:b}:rw:exp", Some(("a:b", Fam::Rw))),
            ("dlock:{s}:sem:limit", Some(("s", Fam::Sem))),
            ("dlock:{f}:fence", Some(("f", Fam::Fence))),
            ("dlock:{e}:election", Some(("e", Fam::Election))),
            ("dlock:{e}:election:queue", Some(("e", Fam::Election))),
            ("dlock:{e}:election:fence", Some(("e", Fam::ElectionFence))),
            ("dlock:{x}:epoch", None),
            ("other:{x}", None),
            ("dlock:{}", None),
        ] {
            assert_eq!(parse_key("dlock", key), want, "{key}");
        }
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }

    #[test]
    fn versions() {
        let f = |v| version_finding("Redis", v, MIN_VERSION, "", "").severity;
        assert_eq!(f("7.0.15"), Severity::Ok);
        assert_eq!(f("5.0.0"), Severity::Ok);
        assert_eq!(f("4.0.14"), Severity::Unsafe);
    }
}
