//! Lease mode (`?mode=lease`): a lease table, one row per lock name, server time for expiry.
//!
//! Every operation is one autocommit statement on a shared connection and nothing depends on
//! session state, so it works behind PgBouncer in transaction-pooling mode. The row is never
//! deleted by dlock: a free lock has `owner IS NULL`, and the row keeps the name's last
//! fencing token (drawn from the sequence `dlock_fence_seq`, so tokens keep increasing even if
//! an operator deletes rows).

use crate::common::{channel, lock_key, Common};
use crate::error::{shape, KIND};
use dlock_core::{
    AcquireReply, AcquireRequest, Error, HoldKey, HolderInfo, LockInfo, LockKind, ReleaseOutcome,
    RenewOutcome, Result,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::Type;

pub(crate) const DDL: &str = "
CREATE SEQUENCE IF NOT EXISTS dlock_fence_seq;
CREATE TABLE IF NOT EXISTS dlock_leases (
    ns text NOT NULL,
    name text NOT NULL,
    owner text,
    count integer NOT NULL,
    token bigint NOT NULL,
    acquired_at timestamptz,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (ns, name)
);";

pub(crate) const TABLES: &[&str] = &["dlock_fence_seq", "dlock_leases"];

/// Grant (fresh or re-entrant) in one statement; on contention the second column is the
/// holder's remaining lease (from the statement's snapshot) in ms.
/// $1 ns, $2 name, $3 owner, $4 lease ms.
const ACQUIRE: &str = "
WITH up AS (
    INSERT INTO dlock_leases AS l (ns, name, owner, count, token, acquired_at, expires_at)
    VALUES ($1, $2, $3, 1, nextval('dlock_fence_seq'), now(), now() + $4 * interval '1 millisecond')
    ON CONFLICT (ns, name) DO UPDATE SET
        owner = EXCLUDED.owner,
        count = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                     THEN l.count + 1 ELSE 1 END,
        token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                     THEN l.token ELSE nextval('dlock_fence_seq') END,
        acquired_at = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                     THEN l.acquired_at ELSE now() END,
        expires_at = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                     THEN GREATEST(l.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END
    WHERE l.owner IS NULL OR l.expires_at <= now() OR l.owner = EXCLUDED.owner
    RETURNING l.token
)
SELECT (SELECT token FROM up),
       (SELECT (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8
        FROM dlock_leases WHERE ns = $1 AND name = $2 AND owner IS NOT NULL)";

/// One level of release; the third column tells, when nothing matched, whether another
/// owner holds the lock now. $1 ns, $2 name, $3 owner.
const RELEASE: &str = "
WITH u AS (
    UPDATE dlock_leases SET
        count = count - 1,
        owner = CASE WHEN count > 1 THEN owner END,
        acquired_at = CASE WHEN count > 1 THEN acquired_at END,
        expires_at = CASE WHEN count > 1 THEN expires_at ELSE 'epoch' END
    WHERE ns = $1 AND name = $2 AND owner = $3 AND expires_at > now()
    RETURNING count
)
SELECT (SELECT count FROM u),
       (SELECT owner IS NOT NULL AND owner <> $3 AND expires_at > now()
        FROM dlock_leases WHERE ns = $1 AND name = $2)";

/// Renews many holds at once. $1 ns, $2 names, $3 owners, $4 leases (ms).
const RENEW: &str = "
UPDATE dlock_leases l SET expires_at = now() + v.ms * interval '1 millisecond'
FROM unnest($2::text[], $3::text[], $4::float8[]) AS v(name, owner, ms)
WHERE l.ns = $1 AND l.name = v.name AND l.owner = v.owner AND l.expires_at > now()
RETURNING l.name, l.owner";

const INSPECT: &str = "
SELECT owner, count, token, (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8
FROM dlock_leases WHERE ns = $1 AND name = $2";

pub(crate) struct LeaseMode {
    common: Arc<Common>,
}

fn check_kind(kind: LockKind) -> Result<()> {
    match kind {
        LockKind::Mutex => Ok(()),
        other => Err(Error::unsupported(
            KIND,
            format!(
                "lock kind {} in lease mode (use the default session mode for read-write locks)",
                other.as_str()
            ),
        )),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl LeaseMode {
    pub(crate) fn new(common: Arc<Common>) -> Self {
        LeaseMode { common }
    }

    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        check_kind(req.key.kind)?;
        let client = self.common.control().await?;
        let ns = self.common.namespace.as_str();
        let name: &str = &req.key.name;
        let owner: &str = &req.key.owner;
        let lease = ms(req.lease);
        let rows = self
            .common
            .run(
                "acquiring",
                client.query_typed(
                    ACQUIRE,
                    &[
                        (&ns, Type::TEXT),
                        (&name, Type::TEXT),
                        (&owner, Type::TEXT),
                        (&lease, Type::FLOAT8),
                    ],
                ),
            )
            .await?;
        let row = rows.first().ok_or_else(|| shape("acquire", "no row"))?;
        let token: Option<i64> = row.try_get(0).map_err(|e| shape("acquire", e))?;
        if let Some(t) = token {
            return Ok(AcquireReply::Granted {
                token: u64::try_from(t).map_err(|_| shape("fencing token", t))?,
            });
        }
        let left: Option<f64> = row.try_get(1).map_err(|e| shape("acquire", e))?;
        Ok(AcquireReply::Held {
            ttl: left
                .filter(|l| l.is_finite())
                .map(|l| Duration::from_secs_f64(l.max(0.0) / 1000.0)),
        })
    }

    pub(crate) async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        check_kind(key.kind)?;
        let client = self.common.control().await?;
        let ns = self.common.namespace.as_str();
        let name: &str = &key.name;
        let owner: &str = &key.owner;
        let rows = self
            .common
            .run(
                "releasing",
                client.query_typed(
                    RELEASE,
                    &[(&ns, Type::TEXT), (&name, Type::TEXT), (&owner, Type::TEXT)],
                ),
            )
            .await?;
        let row = rows.first().ok_or_else(|| shape("release", "no row"))?;
        let left: Option<i32> = row.try_get(0).map_err(|e| shape("release", e))?;
        match left {
            Some(0) => {
                // Wake waiters (after the release committed).
                let chan = channel(lock_key(&self.common.namespace, name));
                if let Err(e) = self
                    .common
                    .run(
                        "notifying waiters",
                        client.query_typed("SELECT pg_notify($1, '')", &[(&chan, Type::TEXT)]),
                    )
                    .await
                {
                    tracing::debug!(error = %e, "NOTIFY after release failed; waiters wake at their heartbeat");
                }
                Ok(ReleaseOutcome::Released)
            }
            Some(n) => Ok(ReleaseOutcome::StillHeld {
                remaining: u32::try_from(n).unwrap_or(0),
            }),
            None => {
                let other: Option<bool> = row.try_get(1).map_err(|e| shape("release", e))?;
                Ok(if other == Some(true) {
                    ReleaseOutcome::TakenByOther
                } else {
                    ReleaseOutcome::Expired
                })
            }
        }
    }

    pub(crate) async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        for (k, _) in holds {
            check_kind(k.kind)?;
        }
        let names: Vec<&str> = holds.iter().map(|(k, _)| &*k.name).collect();
        let owners: Vec<&str> = holds.iter().map(|(k, _)| &*k.owner).collect();
        let leases: Vec<f64> = holds.iter().map(|(_, l)| ms(*l)).collect();
        let client = self.common.control().await?;
        let ns = self.common.namespace.as_str();
        let rows = self
            .common
            .run(
                "renewing",
                client.query_typed(
                    RENEW,
                    &[
                        (&ns, Type::TEXT),
                        (&names, Type::TEXT_ARRAY),
                        (&owners, Type::TEXT_ARRAY),
                        (&leases, Type::FLOAT8_ARRAY),
                    ],
                ),
            )
            .await?;
        let mut renewed = HashSet::with_capacity(rows.len());
        for r in &rows {
            let name: String = r.try_get(0).map_err(|e| shape("renew", e))?;
            let owner: String = r.try_get(1).map_err(|e| shape("renew", e))?;
            renewed.insert((name, owner));
        }
        Ok(holds
            .iter()
            .map(|(k, _)| {
                if renewed.contains(&(k.name.to_string(), k.owner.to_string())) {
                    RenewOutcome::Renewed
                } else {
                    RenewOutcome::NotHeld
                }
            })
            .collect())
    }

    pub(crate) async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        check_kind(kind)?;
        let client = self.common.control().await?;
        let ns = self.common.namespace.as_str();
        let rows = self
            .common
            .run(
                "inspecting",
                client.query_typed(INSPECT, &[(&ns, Type::TEXT), (&name, Type::TEXT)]),
            )
            .await?;
        let mut info = LockInfo {
            name: name.to_owned(),
            ..Default::default()
        };
        if let Some(r) = rows.first() {
            let owner: Option<String> = r.try_get(0).map_err(|e| shape("inspect", e))?;
            let count: i32 = r.try_get(1).map_err(|e| shape("inspect", e))?;
            let token: i64 = r.try_get(2).map_err(|e| shape("inspect", e))?;
            let left: f64 = r.try_get(3).map_err(|e| shape("inspect", e))?;
            info.fencing_token = u64::try_from(token).map_err(|_| shape("fencing token", token))?;
            if let Some(owner) = owner.filter(|_| left.is_finite() && left > 0.0) {
                info.holders.push(HolderInfo {
                    owner,
                    count: u32::try_from(count).unwrap_or(0),
                    lease_left: Some(Duration::from_secs_f64(left / 1000.0)),
                    ..Default::default()
                });
            }
        }
        Ok(info)
    }
}
