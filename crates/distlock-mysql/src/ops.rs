//! Operator commands on MySQL/MariaDB: `dlock list`, `dlock release --force`, `dlock doctor`.
//!
//! - `list`: the names of the namespace that have state — a fencing counter row
//!   (`dlock_fence`), a holder row (`dlock_holders`, session mode) or a lock row
//!   (`dlock_table_locks`, table mode) — each inspected as `inspect` does (in session mode a
//!   holder counts only while `IS_USED_LOCK` names its connection); rows of an election's
//!   key are listed as that election, apart from the lock of the same name.
//! - `force_release`: table mode clears the lock row and advances the counter in one
//!   transaction; session mode `KILL`s the connection `IS_USED_LOCK` names (the server then
//!   frees its `GET_LOCK`; the holder's next renewal, a statement on that connection, fails),
//!   waits until the lock is free or taken by someone else, and advances the counter. `KILL`
//!   of another user's connection needs `CONNECTION_ADMIN` (MySQL) / `SUPER` or
//!   `CONNECTION ADMIN` (MariaDB).
//! - `diagnose`: version, the session `wait_timeout` the session mode relies on, Galera,
//!   and the server clock against the local one.

use crate::common::{check_kind, election_key, key_of, sql_str};
use crate::error::KIND;
use crate::{Mode, MysqlBackend};
use distlock_core::{
    Error, Finding, ForceReleased, HolderInfo, ListedLock, LockKind, Operator, Result, Severity,
};
use mysql_async::prelude::Queryable;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Server/local clock offset above which `diagnose` warns.
const CLOCK_WARN: Duration = Duration::from_secs(1);

#[distlock_core::async_trait]
impl Operator for MysqlBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        list(self, prefix).await
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        force_release(self, name, kind).await
    }

    async fn diagnose(&self) -> Result<Vec<Finding>> {
        diagnose(self).await
    }

    async fn server_time(&self) -> Result<Option<SystemTime>> {
        server_time(self).await.map(Some)
    }
}

async fn list(b: &MysqlBackend, prefix: &str) -> Result<Vec<ListedLock>> {
    let ns = b.common.namespace.clone();
    let table = match b.mode() {
        Mode::Session => "dlock_holders",
        Mode::Table => "dlock_table_locks",
    };
    let sql = format!(
        "SELECT lock_key, name FROM dlock_fence WHERE ns = ? \
         UNION SELECT lock_key, name FROM {table} WHERE ns = ?"
    );
    let rows: Vec<(String, String)> = b
        .common
        .with_conn("listing locks", move |c| {
            Box::pin(async move { c.exec(sql, (ns.as_str(), ns.as_str())).await })
        })
        .await?;
    // The key tells a lock from the election of the same name.
    let mut names: Vec<(String, LockKind)> = rows
        .into_iter()
        .filter(|(_, n)| n.starts_with(prefix))
        .map(|(key, name)| {
            let kind = if key == election_key(&b.common.namespace, &name) {
                LockKind::Election
            } else {
                LockKind::Mutex
            };
            (name, kind)
        })
        .collect();
    names.sort_by(|a, b| (&a.0, a.1.as_str()).cmp(&(&b.0, b.1.as_str())));
    names.dedup();
    let mut out = Vec::with_capacity(names.len());
    for (name, kind) in names {
        let info = distlock_core::Backend::inspect(b, &name, kind).await?;
        out.push(ListedLock::new(kind, info));
    }
    Ok(out)
}

async fn force_release(b: &MysqlBackend, name: &str, kind: LockKind) -> Result<ForceReleased> {
    check_kind(kind)?;
    let lk = key_of(&b.common.namespace, name, kind);
    let done = match b.mode() {
        Mode::Table => force_table(b, name, &lk).await?,
        Mode::Session => force_session(b, name, &lk).await?,
    };
    if kind == LockKind::Election {
        crate::observe::wake(&b.common, &lk);
    }
    Ok(done)
}

/// Table mode: one transaction clears the row (the holder's renewals then match no row) and
/// advances the counter, so no grant falls between the two.
async fn force_table(b: &MysqlBackend, name: &str, lk: &str) -> Result<ForceReleased> {
    let ns = sql_str(&b.common.namespace);
    let n = sql_str(name);
    let next = crate::common::next_token("token");
    let sql = format!(
        "SET @dl_owner = NULL, @dl_left = NULL; \
         INSERT IGNORE INTO dlock_fence (lock_key, ns, name, token) VALUES ('{lk}', {ns}, {n}, 0); \
         START TRANSACTION; \
         SELECT owner, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
             INTO @dl_owner, @dl_left \
             FROM dlock_table_locks WHERE lock_key = '{lk}' AND owner IS NOT NULL \
             AND expires_at > UTC_TIMESTAMP(6) FOR UPDATE; \
         UPDATE dlock_table_locks SET owner = NULL, count = 0, acquired_at = NULL, \
             expires_at = '1970-01-02 00:00:00', last_released = attempt \
             WHERE lock_key = '{lk}' AND owner IS NOT NULL; \
         UPDATE dlock_fence SET token = LAST_INSERT_ID({next}) WHERE lock_key = '{lk}'; \
         SELECT @dl_owner, @dl_left, LAST_INSERT_ID(); \
         COMMIT"
    );
    let mut conn = b.common.take().await?;
    let c = b
        .common
        .call(crate::common::query_sets(&mut conn, sql))
        .await;
    // Even a refused statement may leave the transaction open, holding the lock's row.
    b.common.put_if_ok(conn, &c);
    let sets = b.common.result("forced release", c)?;
    let what = "forced release";
    let row = sets
        .iter()
        .rev()
        .find_map(|s| s.first())
        .ok_or_else(|| crate::error::shape(what, "no result row"))?;
    let owner: Option<String> = crate::common::col(what, row, 0)?;
    let left: Option<i64> = crate::common::col(what, row, 1)?;
    let token: u64 = crate::common::col(what, row, 2)?;
    let removed = owner
        .map(|owner| {
            HolderInfo::new(owner, 1)
                .with_lease_left(left.map(|us| Duration::from_micros(us.max(0) as u64)))
        })
        .into_iter()
        .collect();
    Ok(ForceReleased::new(removed, token))
}

/// Session mode: KILL the holder's connection, wait until the server has freed its lock,
/// advance the counter.
async fn force_session(b: &MysqlBackend, name: &str, lk: &str) -> Result<ForceReleased> {
    let lk = lk.to_owned();
    let k = lk.clone();
    type Found = (Option<u64>, Vec<(String, Option<i64>)>);
    let (conn_id, rows): Found = b
        .common
        .with_conn("finding the holder", move |c| {
            Box::pin(async move {
                let id: Option<Option<u64>> =
                    c.exec_first("SELECT IS_USED_LOCK(?)", (k.as_str(),)).await?;
                let id = id.flatten();
                let rows: Vec<(String, Option<i64>)> = match id {
                    Some(id) => {
                        c.exec(
                            "SELECT owner, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
                             FROM dlock_holders WHERE lock_key = ? AND conn_id = ?",
                            (k.as_str(), id),
                        )
                        .await?
                    }
                    None => Vec::new(),
                };
                Ok((id, rows))
            })
        })
        .await?;
    let mut removed: Vec<HolderInfo> = rows
        .into_iter()
        .map(|(owner, us)| {
            HolderInfo::new(owner, 1)
                .with_lease_left(us.map(|us| Duration::from_micros(us.max(0) as u64)))
        })
        .collect();
    if let Some(id) = conn_id {
        if removed.is_empty() {
            // GET_LOCK held by a connection without a holder row: a holder between its
            // GET_LOCK and its row, or a foreign user of the same lock key.
            removed.push(HolderInfo::new(
                format!("connection {id} (no holder row)"),
                1,
            ));
        }
        let killed = b
            .common
            .with_conn("KILL", move |c| {
                Box::pin(async move { c.query_drop(format!("KILL CONNECTION {id}")).await })
            })
            .await;
        match killed {
            Ok(()) => {}
            // 1094: unknown thread (it ended meanwhile): the lock is free anyway.
            Err(Error::UnexpectedReply { message, .. }) if message.contains("1094") => {}
            Err(Error::UnexpectedReply { message, .. }) if message.contains("1095") => {
                return Err(Error::unsupported(
                    KIND,
                    format!(
                        "forced release of `{name}`: the lock is held by connection {id} of another user, and this user may not KILL it ({message}); grant CONNECTION_ADMIN (MySQL) or CONNECTION ADMIN / SUPER (MariaDB), run it as that user, or stop the holder process"
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
        // KILL returns before the session has ended; the lock is free once IS_USED_LOCK no
        // longer names that connection.
        let limit = Instant::now() + b.common.op_timeout.max(Duration::from_secs(5));
        loop {
            let k = lk.clone();
            let now: Option<Option<u64>> = b
                .common
                .with_conn("waiting for the kill", move |c| {
                    Box::pin(
                        async move { c.exec_first("SELECT IS_USED_LOCK(?)", (k.as_str(),)).await },
                    )
                })
                .await?;
            if now.flatten() != Some(id) {
                break;
            }
            if Instant::now() >= limit {
                return Err(Error::UnexpectedReply {
                    backend: KIND,
                    message: format!(
                        "forced release of `{name}`: connection {id} was killed but still holds the lock; try again"
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let k = lk.clone();
    let ns = b.common.namespace.clone();
    let n = name.to_owned();
    let token: Option<u64> = b
        .common
        .with_conn("advancing the fencing token", move |c| {
            Box::pin(async move {
                if let Some(id) = conn_id {
                    c.exec_drop(
                        "DELETE FROM dlock_holders WHERE lock_key = ? AND conn_id = ?",
                        (k.as_str(), id),
                    )
                    .await?;
                }
                c.exec_drop(
                    "INSERT IGNORE INTO dlock_fence (lock_key, ns, name, token) VALUES (?, ?, ?, 0)",
                    (k.as_str(), ns.as_str(), n.as_str()),
                )
                .await?;
                c.exec_drop(
                    format!(
                        "UPDATE dlock_fence SET token = LAST_INSERT_ID({}) WHERE lock_key = ?",
                        crate::common::next_token("token")
                    ),
                    (k.as_str(),),
                )
                .await?;
                c.query_first("SELECT LAST_INSERT_ID()").await
            })
        })
        .await?;
    Ok(ForceReleased::new(removed, token.unwrap_or(0)))
}

/// `(major, minor, patch)` of a `VERSION()` string, and whether it is MariaDB.
fn parse_version(v: &str) -> Option<((u32, u32, u32), bool)> {
    let maria = v.to_ascii_lowercase().contains("mariadb");
    let num = v.split(['-', '+']).next()?;
    let mut it = num.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        (it.next()??, it.next()??, it.next().flatten().unwrap_or(0)),
        maria,
    ))
}

/// The version finding: session mode needs several `GET_LOCK`s per server (one per
/// connection, fine everywhere) and `IS_USED_LOCK`; both modes need `DATETIME(6)` and
/// multi-statement transactions. MySQL 5.7.5 and MariaDB 10.0.2 made `GET_LOCK` names up to
/// 64 characters and several locks per connection; older servers are out of support.
fn version_finding(v: &str) -> Finding {
    match parse_version(v) {
        Some((ver, maria)) => {
            let min = if maria { (10, 0, 2) } else { (5, 7, 5) };
            if ver >= min {
                Finding::new(Severity::Ok, "version", format!("server {v}"))
            } else {
                Finding::new(
                    Severity::Unsafe,
                    "version",
                    format!(
                        "server {v} is older than {}.{}.{} ({}): its GET_LOCK keeps one lock per connection and has other known limits; upgrade to a supported release",
                        min.0, min.1, min.2,
                        if maria { "MariaDB" } else { "MySQL" }
                    ),
                )
            }
        }
        None => Finding::new(
            Severity::Warning,
            "version",
            format!("cannot read the server version `{v}`"),
        ),
    }
}

fn clock_finding(offset_ms: i64) -> Finding {
    if Duration::from_millis(offset_ms.unsigned_abs()) > CLOCK_WARN {
        Finding::new(
            Severity::Warning,
            "clock",
            format!("the server clock is {offset_ms} ms off the local clock: leases are measured on the server (table mode: its UTC_TIMESTAMP), so they stay correct, but lease times shown locally are off; run NTP (chrony) on both"),
        )
    } else {
        Finding::new(
            Severity::Ok,
            "clock",
            format!("the server clock is within {offset_ms} ms of the local clock"),
        )
    }
}

/// Whether the control connection is encrypted (`Ssl_version`, empty when not) and what was
/// checked: a warning for a server off this machine reached in clear text or without
/// checking its certificate.
fn tls_finding(b: &MysqlBackend, version: Option<String>) -> Finding {
    let host = b.common.host();
    let loopback = distlock_core::conn::is_loopback(&host);
    let mode = b.common.tls_mode();
    let checks = match mode {
        crate::SslMode::VerifyCa | crate::SslMode::VerifyIdentity => {
            "certificate chain and host name checked"
        }
        _ => "certificate not checked",
    };
    match version.as_deref() {
        Some(v) if !v.is_empty() => {
            let text = format!("encrypted ({v}), ssl-mode={mode}: {checks}");
            if checks == "certificate not checked" && !loopback {
                Finding::new(
                    Severity::Warning,
                    "tls",
                    format!(
                        "{text}: a machine in the middle can read and change the traffic; use \
                         ssl-mode=VERIFY_IDENTITY with ssl-ca"
                    ),
                )
            } else {
                Finding::new(Severity::Ok, "tls", text)
            }
        }
        Some(_) if !loopback => Finding::new(
            Severity::Warning,
            "tls",
            format!(
                "not encrypted (ssl-mode={mode}) to {host}, off this machine: lock names and \
                 tokens travel in clear; give the server ssl_cert/ssl_key and use \
                 ssl-mode=VERIFY_IDENTITY"
            ),
        ),
        Some(_) => Finding::new(
            Severity::Ok,
            "tls",
            format!("not encrypted (ssl-mode={mode}), to this machine"),
        ),
        None => Finding::new(
            Severity::Ok,
            "tls",
            format!("ssl-mode={mode}; the server does not say whether this session is encrypted"),
        ),
    }
}

/// The server's clock (UTC, microseconds), for `Operator::server_time`.
async fn server_time(b: &MysqlBackend) -> Result<SystemTime> {
    let us: Option<i64> = b
        .common
        .with_conn("reading the server clock", |c| {
            Box::pin(async move {
                c.query_first(format!("SELECT {}", crate::common::CLOCK_US))
                    .await
            })
        })
        .await?;
    let us = us.and_then(|us| u64::try_from(us).ok()).ok_or_else(|| {
        Error::unexpected(KIND, format!("the server clock reads {us:?} µs since 1970"))
    })?;
    Ok(UNIX_EPOCH + Duration::from_micros(us))
}

async fn diagnose(b: &MysqlBackend) -> Result<Vec<Finding>> {
    let mode = b.mode();
    type Probe = (
        String,
        Option<u64>,
        Option<String>,
        i64,
        Option<String>,
        bool,
    );
    let before = SystemTime::now();
    let (version, session_wait, wsrep, server_us, tls_version, watchable): Probe = b
        .common
        .with_conn("diagnosing", |c| {
            Box::pin(async move {
                // Whether a holder's client can see its connection closed (as a grant's).
                let watchable = crate::socket::socket_of(c).is_some();
                let version: Option<String> = c.query_first("SELECT VERSION()").await?;
                // Session mode enforces a holder's lease as its connection's wait_timeout:
                // a proxy or a server cap that ignores SET SESSION would keep a dead
                // holder's lock for the global timeout (8 hours by default).
                c.query_drop("SET SESSION wait_timeout = 31").await?;
                let wait: Option<u64> = c.query_first("SELECT @@SESSION.wait_timeout").await?;
                c.query_drop("SET SESSION wait_timeout = DEFAULT").await?;
                let wsrep: Option<(String, String)> =
                    c.query_first("SHOW VARIABLES LIKE 'wsrep_on'").await?;
                let now: Option<i64> = c
                    .query_first("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
                    .await?;
                let tls: Option<(String, String)> = c
                    .query_first("SHOW SESSION STATUS LIKE 'Ssl_version'")
                    .await?;
                Ok((
                    version.unwrap_or_default(),
                    wait,
                    wsrep.map(|(_, v)| v),
                    now.unwrap_or(0),
                    tls.map(|(_, v)| v),
                    watchable,
                ))
            })
        })
        .await?;
    let after = SystemTime::now();
    let ms = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    };
    let local_ms = (ms(before) + ms(after)) / 2;
    let mut out = vec![version_finding(&version)];
    out.push(tls_finding(b, tls_version));
    out.push(match (mode, session_wait) {
        (Mode::Table, _) => Finding::new(
            Severity::Ok,
            "wait_timeout",
            "table mode: leases are the rows' expires_at, wait_timeout does not end them",
        ),
        (Mode::Session, Some(31)) => Finding::new(
            Severity::Ok,
            "wait_timeout",
            "SET SESSION wait_timeout takes effect: a holder that stops renewing is disconnected (and loses its lock) when its lease ends",
        ),
        (Mode::Session, other) => Finding::new(
            Severity::Unsafe,
            "wait_timeout",
            format!("SET SESSION wait_timeout = 31 read back as {other:?}: session mode enforces each holder's lease as its connection's wait_timeout, so a stalled holder would keep its lock far past its lease; connect to the server directly (not through a proxy that pins or rewrites session variables) or use ?mode=table"),
        ),
    });
    out.push(close_finding(mode, watchable));
    let galera = wsrep
        .as_deref()
        .is_some_and(|v| v.eq_ignore_ascii_case("ON"));
    out.push(match (galera, mode) {
        (false, _) => Finding::new(Severity::Ok, "galera", "not a Galera node"),
        (true, Mode::Session) => Finding::new(
            Severity::Unsafe,
            "galera",
            "wsrep_on=ON (Galera / MariaDB Cluster): GET_LOCK is local to one node, so clients on other nodes get the same lock; use ?mode=table (lock rows replicate)",
        ),
        (true, Mode::Table) => Finding::new(
            Severity::Warning,
            "galera",
            "wsrep_on=ON: table mode measures leases with the clock of the node that runs each statement, so the clock spread between nodes shortens or lengthens leases by that much (dlock cannot read other nodes' clocks from here); keep every node on NTP and leases far above the spread",
        ),
    });
    out.push(clock_finding(server_us / 1000 - local_ms));
    Ok(out)
}

/// The `connection-close` check: whether a holder learns at once that its connection was
/// closed from the other side (and what session mode assumes about that).
fn close_finding(mode: Mode, watchable: bool) -> Finding {
    match (mode, watchable) {
        (Mode::Table, _) => Finding::new(
            Severity::Ok,
            "connection-close",
            "table mode: a lock is its row's lease, not a connection; a closed connection frees nothing",
        ),
        (Mode::Session, true) => Finding::new(
            Severity::Ok,
            "connection-close",
            "a holder's connection is watched: when the server or a proxy between closes or resets it (KILL, a timeout, a failover), the server frees the lock and the holder's lost signal fires at once. Assumed: nothing between ends the server's side of a holder's connection and keeps the client's side open (a pooling proxy may, e.g. ProxySQL or MaxScale depending on its settings); through such a proxy use ?mode=table",
        ),
        (Mode::Session, false) => Finding::new(
            Severity::Warning,
            "connection-close",
            "a holder's connection cannot be watched here (not a TCP socket, or a driver whose connection text changed): when the server or a proxy closes it, the server frees the lock at once but the holder learns it only at its next renewal, a third of the lease later, while another client may hold the lock (fencing tokens still stop its writes to stores that check them); use ?mode=table for a lease the client can count on",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(
            version_finding("10.11.6-MariaDB-0+deb12u1").severity,
            Severity::Ok
        );
        assert_eq!(version_finding("8.0.36").severity, Severity::Ok);
        assert_eq!(version_finding("5.6.51-log").severity, Severity::Unsafe);
        assert_eq!(version_finding("5.5.68-MariaDB").severity, Severity::Unsafe);
        assert_eq!(version_finding("weird").severity, Severity::Warning);
        assert_eq!(clock_finding(2000).severity, Severity::Warning);
        assert_eq!(clock_finding(-10).severity, Severity::Ok);
    }
}
