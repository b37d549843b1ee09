//! Operator commands on PostgreSQL: `dlock list`, `dlock release --force`, `dlock doctor`,
//! as docs/postgres.md (*Operator commands*) describes them. A session-mode holder row counts
//! only while its backend holds the name's advisory key in `pg_locks`; a forced release draws
//! a token above the removed holder's.

use crate::common::params;
use crate::common::{channel, cols, election_key, first, key_of, key_oids, lease_left, one};
use crate::common::{lock_key, side, token_u64, Common};
use crate::error::{map, KIND};
use crate::{Mode, PostgresBackend};
use distlock_core::operator::{evict, Eviction};
use distlock_core::{
    Backend, Error, ForceReleased, HolderInfo, ListedLock, LockKind, Operator, Result,
};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use tokio_postgres::error::SqlState;

mod doctor;

const CURRENT_DB: &str = "(SELECT oid FROM pg_database WHERE datname = current_database())";

/// A new fencing token for a row whose last one is `token` (`1` with no row): above the
/// sequence's next value, above the last token, and at least the server clock in µs.
macro_rules! next_token {
    ($last:literal) => {
        concat!(
            "GREATEST(nextval('dlock_fence_seq'), ",
            $last,
            ", (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)"
        )
    };
}

#[distlock_core::async_trait]
impl Operator for PostgresBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        list(self, prefix).await
    }

    /// The kinds the mode locks (its capabilities): lease mode clears a row, session mode
    /// ends the holders' backends.
    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        self.capabilities().check(KIND, kind)?;
        match (self.mode(), kind) {
            (Mode::Lease, LockKind::Election) => force_lease_election(self, name).await,
            (Mode::Lease, _) => force_lease(self, name).await,
            (Mode::Session, _) => {
                let steps = Sessions {
                    b: self,
                    name,
                    key: key_oids(key_of(&self.common.namespace, name, kind)),
                    election: kind == LockKind::Election,
                    attempts: Default::default(),
                };
                evict(&steps, KIND, name, self.common.op_timeout).await
            }
        }
    }

    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        doctor::diagnose(self).await
    }

    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        doctor::server_time(self).await.map(Some)
    }
}

/// The kind a lock is listed as, from its rows' (kind, live): of the live rows if there are
/// any, else of all; a read-write lock is listed as `Write` (inspect then shows both sides);
/// no kind (lease mode's rows) is a mutex.
fn listed_kind(rows: &[(String, bool)]) -> LockKind {
    let live = rows.iter().any(|r| r.1);
    let has = |k: &[&str]| (rows.iter()).any(|(r, l)| (*l || !live) && k.contains(&r.as_str()));
    if has(&["read", "write"]) {
        LockKind::Write
    } else if has(&["fair"]) {
        LockKind::Fair
    } else {
        LockKind::Mutex
    }
}

async fn list(b: &PostgresBackend, prefix: &str) -> Result<Vec<ListedLock>> {
    let ns = b.common.namespace.as_str();
    let params = params![ns, prefix];
    // LIKE would need escaping of the prefix; a prefix comparison on the text is exact.
    let (sql, elections) = match b.mode() {
        Mode::Lease => (
            "SELECT name, NULL::text AS kind, true AS live FROM dlock_leases \
             WHERE ns = $1 AND left(name, length($2)) = $2"
                .to_owned(),
            "dlock_lease_elections",
        ),
        Mode::Session => (
            format!(
                "SELECT name, NULL::text, true FROM dlock_fence \
                 WHERE ns = $1 AND left(name, length($2)) = $2 \
                 UNION ALL \
                 SELECT h.name, h.kind, EXISTS (SELECT 1 FROM pg_locks l \
                     WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid \
                       AND l.objsubid = 1 AND l.database = {CURRENT_DB}) \
                 FROM dlock_holders h WHERE h.ns = $1 AND left(h.name, length($2)) = $2"
            ),
            "dlock_elections",
        ),
    };
    let rows = b.common.query("listing locks", &sql, &params).await?;
    let mut names: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
    for r in &rows {
        let (name, kind, live): (String, Option<String>, bool) = cols(r, "list")?;
        names
            .entry(name)
            .or_default()
            .extend(kind.map(|k| (k, live)));
    }
    let mut out = Vec::with_capacity(names.len());
    for (name, rows) in names {
        let kind = listed_kind(&rows);
        let mut info = b.inspect(&name, kind).await?;
        if b.mode() == Mode::Session {
            // Backends holding the key without a holder row for it.
            let key = key_oids(lock_key(ns, &name));
            let held = held(&b.common, &name, key, "listing lock holders").await?;
            let unnamed = held.into_iter().filter(|h| !h.named);
            info.holders.extend(unnamed.map(|h| h.info));
        }
        out.push(ListedLock::new(kind, info));
    }
    let sql = format!(
        "SELECT name FROM {elections} WHERE ns = $1 AND left(name, length($2)) = $2 ORDER BY name"
    );
    let rows = b.common.query("listing elections", &sql, &params).await?;
    for r in &rows {
        let (name,): (String,) = cols(r, "list")?;
        let info = b.inspect(&name, LockKind::Election).await?;
        out.push(ListedLock::new(LockKind::Election, info));
    }
    Ok(out)
}

/// A backend holding an advisory key (one row per mode it holds the key in): its holder row
/// for the name (`named`) as a holder, or the backend described when it has none.
struct Held {
    pid: i32,
    attempt: Option<String>,
    named: bool,
    info: HolderInfo,
}

/// pid, application_name, and the holder row's owner, kind, attempt and ms left.
type HeldRow = (
    i32,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<f64>,
);

/// The backends holding the advisory key `(classid, objid)` of `name` in this database, each
/// joined with its `dlock_holders` rows for `name`.
async fn held(common: &Arc<Common>, name: &str, key: (u32, u32), what: &str) -> Result<Vec<Held>> {
    let sql = format!(
        "SELECT l.pid, a.application_name, h.owner, h.kind, h.attempt, \
                (EXTRACT(EPOCH FROM (h.expires_at - now())) * 1000)::float8 \
         FROM pg_locks l \
         LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         LEFT JOIN dlock_holders h ON h.ns = $3 AND h.name = $4 AND h.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2 \
           AND l.objsubid = 1 AND l.database = {CURRENT_DB} \
         ORDER BY l.pid, h.acquired_at"
    );
    let (classid, objid, ns) = (key.0, key.1, common.namespace.as_str());
    let params = params![classid, objid, ns, name];
    let rows = common.query(what, &sql, &params).await?;
    rows.iter()
        .map(|r| {
            let (pid, app, owner, kind, attempt, left): HeldRow = cols(r, what)?;
            let named = owner.is_some();
            let owner = owner.unwrap_or_else(|| {
                let app = app.unwrap_or_default();
                format!("pid {pid} (application_name {app:?}, no dlock_holders row)")
            });
            let info = HolderInfo::new(owner, 1).with_lease_left(lease_left(left));
            let info = info.with_side(kind.as_deref().and_then(side));
            Ok(Held {
                pid,
                attempt,
                named,
                info,
            })
        })
        .collect()
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
            &params![ns, name],
        )
        .await?;
        let old = tx
            .query_typed(
                "SELECT owner, attempt IS NOT NULL AND owner IS NOT NULL AND expires_at > now(), \
                        (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8 \
                 FROM dlock_leases WHERE ns = $1 AND name = $2 FOR UPDATE",
                &params![ns, name],
            )
            .await?;
        let up = tx
            .query_typed(
                concat!(
                    "UPDATE dlock_leases SET owner = NULL, attempt = NULL, acquired_at = NULL, \
                     expires_at = 'epoch', token = ",
                    next_token!("token + 1"),
                    " WHERE ns = $1 AND name = $2 RETURNING token, pg_notify($3, '') IS NULL"
                ),
                &params![ns, name, chan],
            )
            .await?;
        tx.commit().await?;
        Ok((old, up))
    };
    let (old, up) = b.common.run(what, run).await?;
    // The row exists (the transaction made sure of it).
    let (owner, held, left): (Option<String>, bool, f64) = one(&old, what)?;
    let removed = owner.filter(|_| held).map(|o| HolderInfo::new(o, 1));
    let removed = removed.map(|h| h.with_lease_left(lease_left(Some(left))));
    let token = token_u64(first(what, &up)?)?;
    Ok(ForceReleased::new(removed.into_iter().collect(), token))
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

#[distlock_core::async_trait]
impl Eviction for Sessions<'_> {
    type Session = i32;
    const SESSIONS: &'static str = "backends";

    /// The holders' backends and the holders: an election's leader as `inspect` reports it,
    /// a lock's from its rows.
    async fn holders(&self) -> Result<(Vec<i32>, Vec<HolderInfo>)> {
        let (leader, what) = match self.election {
            true => {
                let leader = self.b.inspect(self.name, LockKind::Election).await?;
                (Some(leader), "finding the leader")
            }
            false => (None, "finding the holders"),
        };
        let (mut pids, mut removed, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
        let mut seen: HashSet<(i32, Option<String>)> = HashSet::new();
        for h in held(&self.b.common, self.name, self.key, what).await? {
            if !pids.contains(&h.pid) {
                pids.push(h.pid);
            }
            // A downgraded holder's session holds the key twice (both modes): one row each.
            if leader.is_some() || !seen.insert((h.pid, h.attempt.clone())) {
                continue;
            }
            removed.push(h.info);
            attempts.extend(h.attempt);
        }
        if let Ok(mut a) = self.attempts.lock() {
            *a = attempts;
        }
        Ok((pids, leader.map_or(removed, |l| l.holders)))
    }

    /// `pg_terminate_backend(pid)`, with the privilege error spelled out.
    async fn end(&self, pid: i32) -> Result<()> {
        let (common, name) = (&self.b.common, self.name);
        let client = common.control().await?;
        let sql = "SELECT pg_terminate_backend($1)";
        let call = async { Ok(client.query_typed(sql, &params![pid]).await) };
        match common.run("terminating the holder", call).await? {
            // false: the backend ended meanwhile; its lock is gone with it.
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                let msg = e.as_db_error().map_or("", |d| d.message());
                Err(Error::unsupported(
                    KIND,
                    format!(
                        "forced release of `{name}`: the lock is held by backend {pid}, which this role may not terminate ({msg}); GRANT pg_signal_backend TO this role (a superuser's backend needs a superuser), run it as the holder's role, or stop the holder process"
                    ),
                ))
            }
            Err(e) => Err(map(&common.endpoint, e)),
        }
    }

    async fn still_held(&self, pids: &[i32]) -> Result<bool> {
        let what = "waiting for the terminated holders";
        let held = held(&self.b.common, self.name, self.key, what).await?;
        Ok(held.iter().any(|h| pids.contains(&h.pid)))
    }

    async fn advance(&self, ended: &[i32]) -> Result<u64> {
        let (ns, name, pids) = (self.b.common.namespace.as_str(), self.name, ended.to_vec());
        let attempts = self.attempts.lock().map(|a| a.clone()).unwrap_or_default();
        let election = concat!(
            "WITH u AS (UPDATE dlock_elections SET pid = NULL, expires_at = now(), token = ",
            next_token!("token + 1"),
            " WHERE ns = $1 AND name = $2 AND pid = ANY($3) RETURNING token) \
             SELECT COALESCE((SELECT max(token) FROM u), ",
            next_token!("(SELECT max(token) + 1 FROM dlock_elections WHERE ns = $1 AND name = $2)"),
            ")"
        );
        let lock = concat!(
            "WITH d AS (DELETE FROM dlock_holders \
                        WHERE ns = $1 AND name = $2 AND pid = ANY($3) AND attempt = ANY($4)) \
             INSERT INTO dlock_fence AS f (ns, name, token) VALUES ($1, $2, ",
            next_token!("1"),
            ") ON CONFLICT (ns, name) DO UPDATE SET token = ",
            next_token!("f.token + 1"),
            " RETURNING f.token"
        );
        // An election's statement takes the first three.
        let params = params![ns, name, pids, attempts];
        let (sql, n) = [(lock, 4), (election, 3)][usize::from(self.election)];
        let what = "advancing the fencing token";
        let rows = self.b.common.query(what, sql, &params[..n]).await?;
        token_u64(first(what, &rows)?)
    }
}

/// Lease mode, an election: clear the election's row with a token drawn after its row lock
/// (above the row's last one, at least the server clock in microseconds) and wake candidates and observers, in one statement.
async fn force_lease_election(b: &PostgresBackend, name: &str) -> Result<ForceReleased> {
    let ns = b.common.namespace.as_str();
    let chan = channel(election_key(ns, name));
    let leader = b.inspect(name, LockKind::Election).await?;
    let sql = concat!(
        "WITH u AS (UPDATE dlock_lease_elections SET owner = NULL, attempt = NULL, \
                        acquired_at = NULL, expires_at = 'epoch', token = ",
        next_token!("token + 1"),
        " WHERE ns = $1 AND name = $2 RETURNING token), \
              n AS (SELECT pg_notify($3, '') FROM u) \
         SELECT COALESCE((SELECT token FROM u), ",
        next_token!("1"),
        "), (SELECT count(*) FROM n)"
    );
    let rows = b
        .common
        .query("forced release", sql, &params![ns, name, chan])
        .await?;
    let token = token_u64(first("forced release", &rows)?)?;
    Ok(ForceReleased::new(leader.holders, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_kinds() {
        let k = |rows: &[(&str, bool)]| {
            listed_kind(
                &rows
                    .iter()
                    .map(|(k, l)| (k.to_string(), *l))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(k(&[("read", true)]), LockKind::Write);
        assert_eq!(k(&[("fair", false)]), LockKind::Fair);
        assert_eq!(k(&[]), LockKind::Mutex);
        // The live rows' kinds win over a dead row's.
        assert_eq!(k(&[("write", false), ("fair", true)]), LockKind::Fair);
    }
}
