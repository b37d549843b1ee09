//! Operator commands on PostgreSQL: `dlock list`, `dlock release --force`, `dlock doctor`.
//!
//! - `list`: the names of the namespace that have state — a lease row (`dlock_leases`, lease
//!   mode), or a fencing counter row (`dlock_fence`) or holder row (`dlock_holders`, session
//!   mode) — each inspected as `inspect` does. In session mode a holder row counts only while
//!   its backend holds the name's advisory key in `pg_locks`; a backend holding the key without
//!   a row (a holder between its `pg_try_advisory_lock` and its row, or a foreign program
//!   using the same key) is listed as `pid N (application_name …, no dlock_holders row)`.
//! - `force_release`: lease mode clears the row and draws a new token for it in one
//!   transaction (the holder's renewals then match no row); session mode
//!   `pg_terminate_backend`s every backend holding the key (both sides of a read-write lock;
//!   waiters are not touched), waits until `pg_locks` shows none of them holding it, deletes
//!   their rows and advances `dlock_fence`. Terminating another role's backend needs
//!   `pg_signal_backend` (or that role, or superuser for a superuser's backend).
//! - Elections (`dlock_elections`, lease mode `dlock_lease_elections`) are listed as
//!   elections, apart from the lock of the same name; a forced release of an election
//!   terminates the backend holding the election's key (session mode) or clears its row
//!   (lease mode), and draws a token above the revoked leader's.
//! - `diagnose`: version, a pooler in front (PgBouncer), whether the session's timeouts take
//!   effect, synchronous replication, and the server clock against the local one.

use crate::common::{channel, election_key, first, key_oids, lease_left, lock_key, side};
use crate::error::{is_code, map, shape, KIND};
use crate::{Inner, Mode, PostgresBackend};
use distlock_core::operator::{evict, Eviction};
use distlock_core::{
    Backend, Error, ForceReleased, HolderInfo, ListedLock, LockKind, Operator, Result,
};
use std::collections::{BTreeMap, HashSet};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::types::Type;

mod doctor;

const CURRENT_DB: &str = "(SELECT oid FROM pg_database WHERE datname = current_database())";

fn u64_token(t: i64) -> Result<u64> {
    u64::try_from(t).map_err(|_| shape("fencing token", t))
}

#[distlock_core::async_trait]
impl Operator for PostgresBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        list(self, prefix).await
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        force_release(self, name, kind).await
    }

    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        doctor::diagnose(self).await
    }

    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        doctor::server_time(self).await.map(Some)
    }
}

/// The kind a session-mode lock is listed as, from the kinds of its rows: a read-write
/// lock is listed as `Write` (inspect then shows both sides).
fn listed_kind(kinds: &[String]) -> LockKind {
    if kinds.iter().any(|k| k == "read" || k == "write") {
        LockKind::Write
    } else if kinds.iter().any(|k| k == "fair") {
        LockKind::Fair
    } else {
        LockKind::Mutex
    }
}

async fn list(b: &PostgresBackend, prefix: &str) -> Result<Vec<ListedLock>> {
    let ns = b.common.namespace.as_str();
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&ns, Type::TEXT), (&prefix, Type::TEXT)];
    // LIKE would need escaping of the prefix; a prefix comparison on the text is exact.
    let sql = match b.mode() {
        Mode::Lease => {
            "SELECT name, NULL::text AS kind, true AS live FROM dlock_leases \
             WHERE ns = $1 AND left(name, length($2)) = $2"
        }
        Mode::Session => {
            "SELECT name, NULL::text, true FROM dlock_fence \
             WHERE ns = $1 AND left(name, length($2)) = $2 \
             UNION ALL \
             SELECT h.name, h.kind, EXISTS (SELECT 1 FROM pg_locks l \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid \
                   AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database \
                                                        WHERE datname = current_database())) \
             FROM dlock_holders h WHERE h.ns = $1 AND left(h.name, length($2)) = $2"
        }
    };
    let rows = b.common.query("listing locks", sql, &params).await?;
    // name -> (kinds of live rows, kinds of any row)
    let mut names: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for r in &rows {
        let name: String = r.try_get(0).map_err(|e| shape("list", e))?;
        let kind: Option<String> = r.try_get(1).map_err(|e| shape("list", e))?;
        let live: bool = r.try_get(2).map_err(|e| shape("list", e))?;
        let e = names.entry(name).or_default();
        if let Some(k) = kind {
            if live {
                e.0.push(k.clone());
            }
            e.1.push(k);
        }
    }
    let mut out = Vec::with_capacity(names.len());
    for (name, (live, any)) in names {
        let kind = match b.mode() {
            Mode::Lease => LockKind::Mutex,
            Mode::Session if !live.is_empty() => listed_kind(&live),
            Mode::Session => listed_kind(&any),
        };
        let mut info = b.inspect(&name, kind).await?;
        if b.mode() == Mode::Session {
            info.holders.extend(unnamed_holders(b, &name).await?);
        }
        out.push(ListedLock::new(kind, info));
    }
    let table = match b.mode() {
        Mode::Session => "dlock_elections",
        Mode::Lease => "dlock_lease_elections",
    };
    let sql = format!(
        "SELECT name FROM {table} WHERE ns = $1 AND left(name, length($2)) = $2 ORDER BY name"
    );
    let rows = b.common.query("listing elections", &sql, &params).await?;
    for r in &rows {
        let name: String = r.try_get(0).map_err(|e| shape("list", e))?;
        let info = b.inspect(&name, LockKind::Election).await?;
        out.push(ListedLock::new(LockKind::Election, info));
    }
    Ok(out)
}

/// Session mode: backends holding `name`'s advisory key that have no holder row for it.
async fn unnamed_holders(b: &PostgresBackend, name: &str) -> Result<Vec<HolderInfo>> {
    let (classid, objid) = key_oids(lock_key(&b.common.namespace, name));
    let ns = b.common.namespace.as_str();
    let sql = format!(
        "SELECT l.pid, l.mode, a.application_name FROM pg_locks l \
         LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 \
           AND l.objsubid = 1 AND l.database = {CURRENT_DB} \
           AND NOT EXISTS (SELECT 1 FROM dlock_holders h \
                           WHERE h.ns = $3 AND h.name = $4 AND h.pid = l.pid) \
         ORDER BY l.pid"
    );
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&classid, Type::OID),
        (&objid, Type::OID),
        (&ns, Type::TEXT),
        (&name, Type::TEXT),
    ];
    let rows = b
        .common
        .query("listing lock holders", &sql, &params)
        .await?;
    rows.iter()
        .map(|r| {
            let pid: i32 = r.try_get(0).map_err(|e| shape("list", e))?;
            let app: Option<String> = r.try_get(2).map_err(|e| shape("list", e))?;
            Ok(HolderInfo::new(
                format!(
                    "pid {pid} (application_name {:?}, no dlock_holders row)",
                    app.unwrap_or_default()
                ),
                1,
            ))
        })
        .collect()
}

async fn force_release(b: &PostgresBackend, name: &str, kind: LockKind) -> Result<ForceReleased> {
    match &b.inner {
        Inner::Lease(_) if kind == LockKind::Election => force_lease_election(b, name).await,
        Inner::Session(_) if kind == LockKind::Election => {
            evict(
                &Sessions::new(b, name, true),
                KIND,
                name,
                b.common.op_timeout,
            )
            .await
        }
        Inner::Lease(_) => {
            if kind != LockKind::Mutex {
                return Err(Error::unsupported(
                    KIND,
                    format!(
                        "forced release of lock kind {} in lease mode (mutexes only)",
                        kind.as_str()
                    ),
                ));
            }
            force_lease(b, name).await
        }
        Inner::Session(_) => match kind {
            LockKind::Mutex | LockKind::Fair | LockKind::Read | LockKind::Write => {
                evict(
                    &Sessions::new(b, name, false),
                    KIND,
                    name,
                    b.common.op_timeout,
                )
                .await
            }
            other => Err(Error::unsupported(
                KIND,
                format!("lock kind {}", other.as_str()),
            )),
        },
    }
}

/// Lease mode, one transaction on a connection of its own: make sure the row exists, lock
/// it and remember its holder, then clear it with a token drawn after the row lock (above the
/// row's last one, and at least the server clock in microseconds, as every grant's) and wake
/// waiters at commit. A holder's renewal, which names its attempt and token, then matches no row.
async fn force_lease(b: &PostgresBackend, name: &str) -> Result<ForceReleased> {
    let ns = b.common.namespace.as_str();
    let chan = channel(lock_key(ns, name));
    let mut client = b.common.client(None).await?;
    let what = "forced release";
    let run = async {
        let tx = client.transaction().await?;
        tx.query_typed(
            "INSERT INTO dlock_leases (ns, name, owner, attempt, token, acquired_at, expires_at) \
             VALUES ($1, $2, NULL, NULL, 0, NULL, 'epoch') \
             ON CONFLICT (ns, name) DO NOTHING",
            &[(&ns, Type::TEXT), (&name, Type::TEXT)],
        )
        .await?;
        let old = tx
            .query_typed(
                "SELECT owner, attempt IS NOT NULL AND owner IS NOT NULL AND expires_at > now(), \
                        (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8 \
                 FROM dlock_leases WHERE ns = $1 AND name = $2 FOR UPDATE",
                &[(&ns, Type::TEXT), (&name, Type::TEXT)],
            )
            .await?;
        let up = tx
            .query_typed(
                "UPDATE dlock_leases SET owner = NULL, attempt = NULL, acquired_at = NULL, \
                     expires_at = 'epoch', token = GREATEST(nextval('dlock_fence_seq'), \
                         token + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
                 WHERE ns = $1 AND name = $2 RETURNING token, pg_notify($3, '') IS NULL",
                &[(&ns, Type::TEXT), (&name, Type::TEXT), (&chan, Type::TEXT)],
            )
            .await?;
        tx.commit().await?;
        Ok((old, up))
    };
    let (old, up) = b.common.run(what, run).await?;
    let mut removed = Vec::new();
    if let Some(r) = old.first() {
        let owner: Option<String> = r.try_get(0).map_err(|e| shape(what, e))?;
        let held: bool = r.try_get(1).map_err(|e| shape(what, e))?;
        let left: f64 = r.try_get(2).map_err(|e| shape(what, e))?;
        if let Some(owner) = owner.filter(|_| held) {
            removed.push(HolderInfo::new(owner, 1).with_lease_left(lease_left(Some(left))));
        }
    }
    Ok(ForceReleased::new(removed, token_of(&up)?))
}

/// The fencing token a statement returned in its first row, first column.
fn token_of(rows: &[tokio_postgres::Row]) -> Result<u64> {
    u64_token(first("forced release", rows)?)
}

/// Session mode: the backends holding the advisory key of lock `name` (both sides of a
/// read-write lock; waiters are not touched) or of election `name`, ended by
/// [`distlock_core::operator::evict`]: terminated, waited for until `pg_locks` shows none of
/// them holding the key, their rows deleted (a lock's) or marked a past leader (an
/// election's), and a token drawn above every token handed out.
struct Sessions<'a> {
    b: &'a PostgresBackend,
    name: &'a str,
    key: (u32, u32),
    election: bool,
    /// The removed grants' attempts (a next holder that got the key meanwhile has another).
    attempts: std::sync::Mutex<Vec<String>>,
}

impl<'a> Sessions<'a> {
    fn new(b: &'a PostgresBackend, name: &'a str, election: bool) -> Self {
        let ns = b.common.namespace.as_str();
        let key = if election {
            election_key(ns, name)
        } else {
            lock_key(ns, name)
        };
        Sessions {
            b,
            name,
            key: key_oids(key),
            election,
            attempts: Default::default(),
        }
    }

    /// The leader's backends and the leader as `inspect` reports it.
    async fn leader(&self) -> Result<(Vec<i32>, Vec<HolderInfo>)> {
        let leader = self.b.inspect(self.name, LockKind::Election).await?;
        let sql = format!(
            "SELECT l.pid FROM pg_locks l \
             WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 \
               AND l.objsubid = 1 AND l.database = {CURRENT_DB} ORDER BY l.pid"
        );
        let (classid, objid) = self.key;
        let rows = self
            .b
            .common
            .query(
                "finding the leader",
                &sql,
                &[(&classid, Type::OID), (&objid, Type::OID)],
            )
            .await?;
        let pids = rows
            .iter()
            .map(|r| r.try_get(0).map_err(|e| shape("forced release", e)))
            .collect::<Result<_>>()?;
        Ok((pids, leader.holders))
    }
}

#[distlock_core::async_trait]
impl Eviction for Sessions<'_> {
    type Session = i32;
    const SESSIONS: &'static str = "backends";

    async fn holders(&self) -> Result<(Vec<i32>, Vec<HolderInfo>)> {
        if self.election {
            return self.leader().await;
        }
        let (ns, name) = (self.b.common.namespace.as_str(), self.name);
        let sql = format!(
            "SELECT l.pid, l.mode, a.application_name, h.owner, h.kind, h.attempt, \
                    (EXTRACT(EPOCH FROM (h.expires_at - now())) * 1000)::float8 \
             FROM pg_locks l \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             LEFT JOIN dlock_holders h ON h.ns = $3 AND h.name = $4 AND h.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 \
               AND l.objsubid = 1 AND l.database = {CURRENT_DB} \
             ORDER BY l.pid, h.acquired_at"
        );
        let (classid, objid) = self.key;
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (&classid, Type::OID),
            (&objid, Type::OID),
            (&ns, Type::TEXT),
            (&name, Type::TEXT),
        ];
        let rows = self
            .b
            .common
            .query("finding the holders", &sql, &params)
            .await?;
        let (mut pids, mut removed, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
        let mut seen: HashSet<(i32, Option<String>)> = HashSet::new();
        let get = |e| shape("forced release", e);
        for r in &rows {
            let pid: i32 = r.try_get(0).map_err(get)?;
            let app: Option<String> = r.try_get(2).map_err(get)?;
            let owner: Option<String> = r.try_get(3).map_err(get)?;
            let kind: Option<String> = r.try_get(4).map_err(get)?;
            let attempt: Option<String> = r.try_get(5).map_err(get)?;
            let left: Option<f64> = r.try_get(6).map_err(get)?;
            if !pids.contains(&pid) {
                pids.push(pid);
            }
            // A downgraded holder's session holds the key twice (both modes): one row each.
            if !seen.insert((pid, attempt.clone())) {
                continue;
            }
            attempts.extend(attempt);
            let owner = owner.unwrap_or_else(|| {
                format!(
                    "pid {pid} (application_name {:?}, no dlock_holders row)",
                    app.unwrap_or_default()
                )
            });
            removed.push(
                HolderInfo::new(owner, 1)
                    .with_lease_left(lease_left(left))
                    .with_side(kind.as_deref().and_then(side)),
            );
        }
        if let Ok(mut a) = self.attempts.lock() {
            *a = attempts;
        }
        Ok((pids, removed))
    }

    async fn end(&self, pid: i32) -> Result<()> {
        terminate(self.b, self.name, pid).await
    }

    async fn still_held(&self, pids: &[i32]) -> Result<bool> {
        let sql = format!(
            "SELECT count(*) FROM pg_locks l \
             WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 \
               AND l.objsubid = 1 AND l.database = {CURRENT_DB} AND l.pid = ANY($3)"
        );
        let (classid, objid, pids) = (self.key.0, self.key.1, pids.to_vec());
        let rows = self
            .b
            .common
            .query(
                "waiting for the terminated holders",
                &sql,
                &[
                    (&classid, Type::OID),
                    (&objid, Type::OID),
                    (&pids, Type::INT4_ARRAY),
                ],
            )
            .await?;
        Ok(first::<i64>("forced release", &rows)? > 0)
    }

    async fn advance(&self, ended: &[i32]) -> Result<u64> {
        let (ns, name, pids) = (self.b.common.namespace.as_str(), self.name, ended.to_vec());
        if self.election {
            let rows = self
                .b
                .common
                .query(
                    "advancing the fencing token",
                    "WITH u AS (UPDATE dlock_elections SET pid = NULL, expires_at = now(), \
                                token = GREATEST(nextval('dlock_fence_seq'), token + 1, \
                                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
                            WHERE ns = $1 AND name = $2 AND pid = ANY($3) RETURNING token) \
                 SELECT COALESCE((SELECT max(token) FROM u), GREATEST(nextval('dlock_fence_seq'), \
                     (SELECT max(token) + 1 FROM dlock_elections WHERE ns = $1 AND name = $2), \
                     (extract(epoch FROM clock_timestamp()) * 1000000)::bigint))",
                    &[
                        (&ns, Type::TEXT),
                        (&name, Type::TEXT),
                        (&pids, Type::INT4_ARRAY),
                    ],
                )
                .await?;
            return token_of(&rows);
        }
        let attempts = self.attempts.lock().map(|a| a.clone()).unwrap_or_default();
        let rows = self.b.common.query(
            "advancing the fencing token",
            "WITH d AS (DELETE FROM dlock_holders \
                        WHERE ns = $1 AND name = $2 AND attempt = ANY($3) AND pid = ANY($4)) \
             INSERT INTO dlock_fence AS f (ns, name, token) \
             VALUES ($1, $2, GREATEST(nextval('dlock_fence_seq'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)) \
             ON CONFLICT (ns, name) DO UPDATE SET token = GREATEST( \
                 nextval('dlock_fence_seq'), f.token + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
             RETURNING f.token",
            &[
                (&ns, Type::TEXT),
                (&name, Type::TEXT),
                (&attempts, Type::TEXT_ARRAY),
                (&pids, Type::INT4_ARRAY),
            ],
        ).await?;
        token_of(&rows)
    }
}

/// Lease mode, an election: clear the election's row with a token drawn after its row lock
/// (above the row's last one, at least the server clock in microseconds) and wake candidates and observers, in one statement.
async fn force_lease_election(b: &PostgresBackend, name: &str) -> Result<ForceReleased> {
    let ns = b.common.namespace.as_str();
    let chan = channel(election_key(ns, name));
    let leader = b.inspect(name, LockKind::Election).await?;
    let rows = b
        .common
        .query(
            "forced release",
            "WITH u AS (UPDATE dlock_lease_elections SET owner = NULL, attempt = NULL, \
                            acquired_at = NULL, expires_at = 'epoch', \
                            token = GREATEST(nextval('dlock_fence_seq'), token + 1, \
                                (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
                        WHERE ns = $1 AND name = $2 RETURNING token), \
                  n AS (SELECT pg_notify($3, '') FROM u) \
             SELECT COALESCE((SELECT token FROM u), \
                     GREATEST(nextval('dlock_fence_seq'), (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)), \
                    (SELECT count(*) FROM n)",
            &[(&ns, Type::TEXT), (&name, Type::TEXT), (&chan, Type::TEXT)],
        )
        .await?;
    Ok(ForceReleased::new(leader.holders, token_of(&rows)?))
}

/// `pg_terminate_backend(pid)`, with the privilege error spelled out.
async fn terminate(b: &PostgresBackend, name: &str, pid: i32) -> Result<()> {
    let client = b.common.control().await?;
    let op = b.common.op_timeout;
    let res = tokio::time::timeout(
        op,
        client.query_typed("SELECT pg_terminate_backend($1)", &[(&pid, Type::INT4)]),
    )
    .await
    .map_err(|_| crate::error::timeout(&b.common.endpoint, "terminating the holder", op))?;
    match res {
        // false: the backend ended meanwhile; its lock is gone with it.
        Ok(_) => Ok(()),
        Err(e) if is_code(&e, &SqlState::INSUFFICIENT_PRIVILEGE) => {
            let msg = e
                .as_db_error()
                .map(|d| d.message().to_owned())
                .unwrap_or_default();
            Err(Error::unsupported(
                KIND,
                format!(
                    "forced release of `{name}`: the lock is held by backend {pid}, which this role may not terminate ({msg}); GRANT pg_signal_backend TO this role (a superuser's backend needs a superuser), run it as the holder's role, or stop the holder process"
                ),
            ))
        }
        Err(e) => Err(map(&b.common.endpoint, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_kinds() {
        assert_eq!(listed_kind(&["read".into()]), LockKind::Write);
        assert_eq!(listed_kind(&["fair".into()]), LockKind::Fair);
        assert_eq!(listed_kind(&[]), LockKind::Mutex);
    }
}
