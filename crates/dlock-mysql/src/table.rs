//! Table mode (`?mode=table`): the lock is a row (owner, count, token, lease end by the
//! server's clock) changed in short transactions that lock the row (`SELECT … FOR UPDATE`).
//!
//! Unlike `GET_LOCK`, rows replicate: this mode works on Galera / MariaDB Cluster and
//! multi-primary group replication, where a `GET_LOCK` taken on one node is unknown to the
//! others, and through proxies that multiplex connections. Locks expire only by lease.
//! MySQL has no notifications: waiters wake at the holder's lease end or their heartbeat
//! (at most every second, a quarter of the lease for short leases).

use crate::common::{lock_key, micros, Call, Common};
use crate::error::{shape, KIND};
use crate::session::BUMP_FENCE;
use dlock_core::{
    AcquireReply, AcquireRequest, Error, HoldKey, HolderInfo, LockInfo, LockKind, ReleaseOutcome,
    RenewOutcome, Result,
};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const DDL: &[&str] = &["CREATE TABLE IF NOT EXISTS dlock_table_locks (
        lock_key CHAR(38) CHARACTER SET ascii NOT NULL PRIMARY KEY,
        ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        owner VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        count INT UNSIGNED NOT NULL,
        token BIGINT UNSIGNED NOT NULL,
        acquired_at DATETIME(6) NULL,
        expires_at DATETIME(6) NOT NULL
    ) ENGINE=InnoDB"];

const ENSURE_ROW: &str = "INSERT IGNORE INTO dlock_table_locks \
     (lock_key, ns, name, owner, count, token, acquired_at, expires_at) \
     VALUES (?, ?, ?, NULL, 0, 0, NULL, '1970-01-02 00:00:00')";

const LOCK_ROW: &str = "SELECT owner, count, token, \
     TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
     FROM dlock_table_locks WHERE lock_key = ? FOR UPDATE";

type RowState = (Option<String>, u32, u64, i64);

pub(crate) struct TableMode {
    common: Arc<Common>,
}

fn check_kind(kind: LockKind) -> Result<()> {
    match kind {
        LockKind::Mutex => Ok(()),
        other => Err(Error::unsupported(
            KIND,
            format!(
                "lock kind {} (MySQL/MariaDB do mutexes only)",
                other.as_str()
            ),
        )),
    }
}

enum Acq {
    Granted(u64),
    Held(i64),
}

impl TableMode {
    pub(crate) fn new(common: Arc<Common>) -> Self {
        TableMode { common }
    }

    /// Runs `f` in a transaction on a pooled connection; a failed one is closed (the server
    /// rolls it back).
    async fn in_tx<T, F>(&self, what: &str, f: F) -> Result<T>
    where
        F: for<'c> FnOnce(
            &'c mut Conn,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = std::result::Result<T, mysql_async::Error>>
                    + Send
                    + 'c,
            >,
        >,
    {
        let mut conn = self.common.take().await?;
        let c = self
            .common
            .call(async {
                conn.query_drop("START TRANSACTION").await?;
                let v = f(&mut conn).await?;
                conn.query_drop("COMMIT").await?;
                Ok(v)
            })
            .await;
        if matches!(c, Call::Ok(_)) {
            self.common.put(conn);
        }
        self.common.result(what, c)
    }

    pub(crate) async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        check_kind(req.key.kind)?;
        let lk = lock_key(&self.common.namespace, &req.key.name);
        let ns = self.common.namespace.clone();
        let name = req.key.name.to_string();
        let owner = req.key.owner.to_string();
        let us = micros(req.lease);
        let mut created = false;
        loop {
            let r = self
                .try_in_tx(lk.clone(), ns.clone(), name.clone(), owner.clone(), us)
                .await?;
            match r {
                Some(Acq::Granted(t)) if t > 0 => return Ok(AcquireReply::Granted { token: t }),
                Some(Acq::Held(us)) => {
                    return Ok(AcquireReply::Held {
                        ttl: Some(Duration::from_micros(us.max(0) as u64)),
                    })
                }
                Some(Acq::Granted(t)) => return Err(shape("fencing token", t)),
                None if !created => {
                    // First use of this name: create its row (outside the transaction, so
                    // concurrent first users cannot deadlock on gap locks), then try again.
                    created = true;
                    let (lk, ns, name) = (lk.clone(), ns.clone(), name.clone());
                    self.common
                        .with_conn("acquiring", move |c| {
                            Box::pin(async move { c.exec_drop(ENSURE_ROW, (lk, ns, name)).await })
                        })
                        .await?;
                }
                None => return Err(shape("acquire", "the lock row vanished")),
            }
        }
    }

    /// One acquisition transaction; `None` when the lock's row does not exist yet.
    async fn try_in_tx(
        &self,
        lk: String,
        ns: String,
        name: String,
        owner: String,
        us: i64,
    ) -> Result<Option<Acq>> {
        self.in_tx("acquiring", move |c| {
                Box::pin(async move {
                    let row: Option<RowState> = c.exec_first(LOCK_ROW, (lk.as_str(),)).await?;
                    let Some((cur, _count, token, left)) = row else {
                        return Ok(None);
                    };
                    let live = cur.is_some() && left > 0;
                    if live && cur.as_deref() == Some(owner.as_str()) {
                        c.exec_drop(
                            "UPDATE dlock_table_locks SET count = count + 1, \
                             expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
                             WHERE lock_key = ?",
                            (us, lk.as_str()),
                        )
                        .await?;
                        return Ok(Some(Acq::Granted(token)));
                    }
                    if live {
                        return Ok(Some(Acq::Held(left)));
                    }
                    c.exec_drop(BUMP_FENCE, (lk.as_str(), ns.as_str(), name.as_str()))
                        .await?;
                    let token: Option<u64> = c.query_first("SELECT LAST_INSERT_ID()").await?;
                    let token = token.unwrap_or(0);
                    c.exec_drop(
                        "UPDATE dlock_table_locks SET owner = ?, count = 1, token = ?, \
                         acquired_at = UTC_TIMESTAMP(6), \
                         expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                         WHERE lock_key = ?",
                        (owner.as_str(), token, us, lk.as_str()),
                    )
                    .await?;
                    Ok(Some(Acq::Granted(token)))
                })
            })
            .await
    }

    pub(crate) async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        check_kind(key.kind)?;
        let lk = lock_key(&self.common.namespace, &key.name);
        let owner = key.owner.to_string();
        self.in_tx("releasing", move |c| {
            Box::pin(async move {
                let row: Option<RowState> = c.exec_first(LOCK_ROW, (lk.as_str(),)).await?;
                let Some((cur, count, _token, left)) = row else {
                    return Ok(ReleaseOutcome::Expired);
                };
                let live = cur.is_some() && left > 0;
                if !live {
                    return Ok(ReleaseOutcome::Expired);
                }
                if cur.as_deref() != Some(owner.as_str()) {
                    return Ok(ReleaseOutcome::TakenByOther);
                }
                if count > 1 {
                    c.exec_drop(
                        "UPDATE dlock_table_locks SET count = count - 1 WHERE lock_key = ?",
                        (lk.as_str(),),
                    )
                    .await?;
                    return Ok(ReleaseOutcome::StillHeld {
                        remaining: count - 1,
                    });
                }
                c.exec_drop(
                    "UPDATE dlock_table_locks SET owner = NULL, count = 0, acquired_at = NULL, \
                     expires_at = '1970-01-02 00:00:00' WHERE lock_key = ?",
                    (lk.as_str(),),
                )
                .await?;
                Ok(ReleaseOutcome::Released)
            })
        })
        .await
    }

    pub(crate) async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        for (k, _) in holds {
            check_kind(k.kind)?;
        }
        let items: Vec<(String, String, i64)> = holds
            .iter()
            .map(|(k, l)| {
                (
                    lock_key(&self.common.namespace, &k.name),
                    k.owner.to_string(),
                    micros(*l),
                )
            })
            .collect();
        self.common
            .with_conn("renewing", move |c| {
                Box::pin(async move {
                    let mut out = Vec::with_capacity(items.len());
                    for (lk, owner, us) in items {
                        c.exec_drop(
                            "UPDATE dlock_table_locks \
                             SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
                             WHERE lock_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)",
                            (us, lk, owner),
                        )
                        .await?;
                        out.push(if c.affected_rows() == 1 {
                            RenewOutcome::Renewed
                        } else {
                            RenewOutcome::NotHeld
                        });
                    }
                    Ok(out)
                })
            })
            .await
    }

    pub(crate) async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        check_kind(kind)?;
        let lk = lock_key(&self.common.namespace, name);
        let (row, fence) = self
            .common
            .with_conn("inspecting", move |c| {
                Box::pin(async move {
                    let row: Option<RowState> = c
                        .exec_first(
                            "SELECT owner, count, token, \
                             TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
                             FROM dlock_table_locks WHERE lock_key = ?",
                            (lk.as_str(),),
                        )
                        .await?;
                    let fence: Option<u64> = c
                        .exec_first("SELECT token FROM dlock_fence WHERE lock_key = ?", (lk,))
                        .await?;
                    Ok((row, fence))
                })
            })
            .await?;
        let mut info = LockInfo {
            name: name.to_owned(),
            fencing_token: fence.unwrap_or(0),
            ..Default::default()
        };
        if let Some((Some(owner), count, _token, left)) = row {
            if left > 0 {
                info.holders.push(HolderInfo {
                    owner,
                    count,
                    lease_left: Some(Duration::from_micros(left as u64)),
                    side: None,
                });
            }
        }
        Ok(info)
    }
}
