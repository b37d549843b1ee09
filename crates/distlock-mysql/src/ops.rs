//! Operator commands on MySQL/MariaDB: `dlock list`, `dlock release --force`, `dlock doctor`;
//! docs/mysql.md, "Operator commands", has them in full. A forced release in table mode clears
//! the row and advances the counter in one transaction; in session mode it `KILL`s the
//! connection `IS_USED_LOCK` names, waits until the lock is free or someone else's, and only
//! then advances the counter.

use crate::common::{capabilities, col, election_key, key_of, last_row, sql_str, CLOCK_US};
use crate::error::{KIND, NOT_OWNER};
use crate::{Mode, MysqlBackend};
use distlock_core::operator::{clock_finding, evict, measure_clock, Eviction, TlsSession};
use distlock_core::{
    Error, Finding, ForceReleased, HolderInfo, ListedLock, LockKind, Operator, Result, Severity,
};
use mysql_async::prelude::Queryable;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[distlock_core::async_trait]
impl Operator for MysqlBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let ns = self.common.namespace.clone();
        let table = match self.mode() {
            Mode::Session => "dlock_holders",
            Mode::Table => "dlock_table_locks",
        };
        let sql = format!(
            "SELECT lock_key, name FROM dlock_fence WHERE ns = ? \
             UNION SELECT lock_key, name FROM {table} WHERE ns = ?"
        );
        let rows: Vec<(String, String)> = self
            .common
            .with_conn("listing locks", |c| c.exec(sql, (ns.clone(), ns.clone())))
            .await?;
        // The key tells a lock from the election of the same name.
        let mut names: Vec<(String, bool)> = rows
            .into_iter()
            .filter(|(_, n)| n.starts_with(prefix))
            .map(|(key, name)| (name.clone(), key != election_key(&ns, &name)))
            .collect();
        names.sort();
        names.dedup();
        let mut out = Vec::with_capacity(names.len());
        // An election before the lock of the same name.
        for (name, mutex) in names {
            let kind = [LockKind::Election, LockKind::Mutex][usize::from(mutex)];
            let info = distlock_core::Backend::inspect(self, &name, kind).await?;
            out.push(ListedLock::new(kind, info));
        }
        Ok(out)
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        capabilities().check(KIND, kind)?;
        let lk = key_of(&self.common.namespace, name, kind);
        let done = match self.mode() {
            Mode::Table => force_table(self, name, &lk).await?,
            Mode::Session => {
                let steps = Sessions {
                    b: self,
                    name,
                    lk: lk.clone(),
                };
                evict(&steps, KIND, name, self.common.op_timeout).await?
            }
        };
        if kind == LockKind::Election {
            crate::observe::wake(&self.common, &lk);
        }
        Ok(done)
    }

    async fn diagnose(&self) -> Result<Vec<Finding>> {
        let mode = self.mode();
        type Var = Option<(String, String)>;
        type Probe = (Option<(String, Option<u64>)>, Var, Var, bool);
        let (read, wsrep, tls, watchable): Probe = self
            .common
            .with_conn("diagnosing", |c| {
                Box::pin(async move {
                    // Whether a holder's client can see its connection closed (as a grant's).
                    let watchable = crate::socket::socket_of(c).is_some();
                    // Session mode enforces a holder's lease as its connection's wait_timeout:
                    // a proxy or a server cap that ignores SET SESSION would keep a dead
                    // holder's lock for the global timeout (8 hours by default).
                    c.query_drop("SET SESSION wait_timeout = 31").await?;
                    let read = c
                        .query_first("SELECT VERSION(), @@SESSION.wait_timeout")
                        .await?;
                    c.query_drop("SET SESSION wait_timeout = DEFAULT").await?;
                    let wsrep = c.query_first("SHOW VARIABLES LIKE 'wsrep_on'").await?;
                    let tls = c
                        .query_first("SHOW SESSION STATUS LIKE 'Ssl_version'")
                        .await?;
                    Ok((read, wsrep, tls, watchable))
                })
            })
            .await?;
        let (version, session_wait) = read.unwrap_or_default();
        let offset_ms = measure_clock(server_time(self)).await?;
        let mut out = vec![version_finding(&version)];
        out.push(tls_finding(self, tls.map(|(_, v)| v)));
        let (severity, text) = match (mode, session_wait) {
            (Mode::Table, _) => (
                Severity::Ok,
                "table mode: leases are the rows' expires_at, wait_timeout does not end them".into(),
            ),
            (Mode::Session, Some(31)) => (
                Severity::Ok,
                "SET SESSION wait_timeout takes effect: a holder that stops renewing is disconnected (and loses its lock) when its lease ends".into(),
            ),
            (Mode::Session, other) => (
                Severity::Unsafe,
                format!("SET SESSION wait_timeout = 31 read back as {other:?}: session mode enforces each holder's lease as its connection's wait_timeout, so a stalled holder would keep its lock far past its lease; connect to the server directly (not through a proxy that pins or rewrites session variables) or use ?mode=table"),
            ),
        };
        out.push(Finding::new(severity, "wait_timeout", text));
        out.push(close_finding(mode, watchable));
        let galera = wsrep.is_some_and(|(_, v)| v.eq_ignore_ascii_case("ON"));
        let (severity, text) = match (galera, mode) {
            (false, _) => (Severity::Ok, "not a Galera node"),
            (true, Mode::Session) => (
                Severity::Unsafe,
                "wsrep_on=ON (Galera / MariaDB Cluster): GET_LOCK is local to one node, so clients on other nodes get the same lock; use ?mode=table (lock rows replicate)",
            ),
            (true, Mode::Table) => (
                Severity::Warning,
                "wsrep_on=ON: table mode measures leases with the clock of the node that runs each statement, so the clock spread between nodes shortens or lengthens leases by that much (dlock cannot read other nodes' clocks from here); keep every node on NTP and leases far above the spread",
            ),
        };
        out.push(Finding::new(severity, "galera", text));
        out.push(clock_finding(
            offset_ms,
            "server",
            "on the server (table mode: its UTC_TIMESTAMP)",
        ));
        Ok(out)
    }

    async fn server_time(&self) -> Result<Option<SystemTime>> {
        server_time(self).await.map(Some)
    }
}

/// Table mode: one transaction clears the row (the holder's renewals then match no row) and
/// advances the counter, so no grant falls between the two.
async fn force_table(b: &MysqlBackend, name: &str, lk: &str) -> Result<ForceReleased> {
    let ns = sql_str(&b.common.namespace);
    let n = sql_str(name);
    let (next, free) = (crate::common::next_token("token"), crate::table::FREE);
    let sql = format!(
        "SET @dl_owner = NULL, @dl_left = NULL; \
         INSERT IGNORE INTO dlock_fence (lock_key, ns, name, token) VALUES ('{lk}', {ns}, {n}, 0); \
         START TRANSACTION; \
         SELECT owner, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
             INTO @dl_owner, @dl_left \
             FROM dlock_table_locks WHERE lock_key = '{lk}' AND owner IS NOT NULL \
             AND expires_at > UTC_TIMESTAMP(6) FOR UPDATE; \
         UPDATE dlock_table_locks SET owner = NULL, count = 0, acquired_at = NULL, \
             expires_at = {free}, last_released = attempt \
             WHERE lock_key = '{lk}' AND owner IS NOT NULL; \
         UPDATE dlock_fence SET token = LAST_INSERT_ID({next}) WHERE lock_key = '{lk}'; \
         SELECT @dl_owner, @dl_left, LAST_INSERT_ID(); \
         COMMIT"
    );
    // Even a refused statement may leave the transaction open, holding the lock's row: the
    // connection is closed then.
    let what = "forced release";
    let sets = b.common.query(what, sql).await?;
    let row = last_row(what, &sets)?;
    let owner: Option<String> = col(what, row, 0)?;
    let token: u64 = col(what, row, 2)?;
    let removed = match owner {
        Some(owner) => vec![crate::common::holder(owner, col(what, row, 1)?)],
        None => Vec::new(),
    };
    Ok(ForceReleased::new(removed, token))
}

/// Session mode: the connection `IS_USED_LOCK` names, ended by
/// [`distlock_core::operator::evict`]: `KILL`ed, waited for until the server freed its
/// `GET_LOCK`, its holder row deleted and the counter advanced.
struct Sessions<'a> {
    b: &'a MysqlBackend,
    name: &'a str,
    lk: String,
}

#[distlock_core::async_trait]
impl Eviction for Sessions<'_> {
    type Session = u64;
    const SESSIONS: &'static str = "connections";

    async fn holders(&self) -> Result<(Vec<u64>, Vec<HolderInfo>)> {
        let Some(id) = self.b.common.used_by(&self.lk).await? else {
            return Ok((Vec::new(), Vec::new()));
        };
        let sql = "SELECT owner, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
                   FROM dlock_holders WHERE lock_key = ? AND conn_id = ?";
        let lk = self.lk.clone();
        let rows: Vec<(String, Option<i64>)> = self
            .b
            .common
            .with_conn("finding the holder", |c| c.exec(sql, (lk, id)))
            .await?;
        let mut removed: Vec<HolderInfo> = rows
            .into_iter()
            .map(|(owner, us)| crate::common::holder(owner, us))
            .collect();
        if removed.is_empty() {
            // GET_LOCK held by a connection without a holder row: a holder between its
            // GET_LOCK and its row, or a foreign user of the same lock key.
            removed.push(HolderInfo::new(
                format!("connection {id} (no holder row)"),
                1,
            ));
        }
        Ok((vec![id], removed))
    }

    async fn end(&self, id: u64) -> Result<()> {
        match self.b.common.kill("KILL", "KILL", id).await? {
            Some(s) if s.code == NOT_OWNER => {
                let message = format!("{} (error {}, SQLSTATE {})", s.message, s.code, s.state);
                Err(Error::unsupported(
                    KIND,
                    format!(
                        "forced release of `{}`: the lock is held by connection {id} of another user, and this user may not KILL it ({message}); grant CONNECTION_ADMIN (MySQL) or CONNECTION ADMIN / SUPER (MariaDB), run it as that user, or stop the holder process",
                        self.name
                    ),
                ))
            }
            // Killed, or unknown (it ended meanwhile): the lock is free anyway.
            _ => Ok(()),
        }
    }

    async fn still_held(&self, ids: &[u64]) -> Result<bool> {
        // KILL returns before the session has ended.
        Ok(self
            .b
            .common
            .used_by(&self.lk)
            .await?
            .is_some_and(|id| ids.contains(&id)))
    }

    async fn advance(&self, ended: &[u64]) -> Result<u64> {
        let (lk, what) = (&self.lk, "advancing the fencing token");
        let (ns, n) = (sql_str(&self.b.common.namespace), sql_str(self.name));
        let next = crate::common::next_token("token");
        let mut sql = String::new();
        for id in ended {
            sql +=
                &format!("DELETE FROM dlock_holders WHERE lock_key = '{lk}' AND conn_id = {id}; ");
        }
        sql += &format!(
            "INSERT IGNORE INTO dlock_fence (lock_key, ns, name, token) VALUES ('{lk}', {ns}, {n}, 0); \
             UPDATE dlock_fence SET token = LAST_INSERT_ID({next}) WHERE lock_key = '{lk}'; \
             SELECT LAST_INSERT_ID()"
        );
        let sets = self.b.common.query(what, sql).await?;
        col(what, last_row(what, &sets)?, 0)
    }
}

/// The version finding: session mode needs several `GET_LOCK`s per server (one per
/// connection, fine everywhere) and `IS_USED_LOCK`; both modes need `DATETIME(6)` and
/// multi-statement transactions. MySQL 5.7.5 and MariaDB 10.0.2 made `GET_LOCK` names up to
/// 64 characters and several locks per connection; older servers are out of support.
fn version_finding(v: &str) -> Finding {
    let (product, min) = if v.to_ascii_lowercase().contains("mariadb") {
        ("MariaDB", (10, 0, 2))
    } else {
        ("MySQL", (5, 7, 5))
    };
    distlock_core::operator::version_finding(
        product,
        v,
        min,
        "a GET_LOCK with several locks per connection",
        "its GET_LOCK keeps one lock per connection and has other known limits",
    )
}

/// Whether the control connection is encrypted (`Ssl_version`, empty when not) and what was
/// checked: a warning for a server off this machine reached in clear text or without
/// checking its certificate.
fn tls_finding(b: &MysqlBackend, version: Option<String>) -> Finding {
    let host = b.common.connector.opts.ip_or_hostname();
    let mode = b.common.tls_mode();
    // With this driver VERIFY_CA checks the name too.
    let verified = mode.verifies();
    let t = TlsSession {
        host,
        loopback: distlock_core::conn::is_loopback(host),
        setting: crate::tls::MODES.setting(mode),
        checks: crate::SslMode::checked(verified, verified),
        verified,
        fix_unchecked: "use ssl-mode=VERIFY_IDENTITY with ssl-ca",
        fix_plain: "lock names and tokens travel in clear; give the server ssl_cert/ssl_key and use ssl-mode=VERIFY_IDENTITY",
    };
    let encrypted = version
        .as_deref()
        .map(|v| Some(v).filter(|v| !v.is_empty()));
    t.finding(encrypted)
}

/// The server's clock (UTC, microseconds), for `Operator::server_time`.
async fn server_time(b: &MysqlBackend) -> Result<SystemTime> {
    let (what, sql) = ("reading the server clock", format!("SELECT {CLOCK_US}"));
    let us: Option<i64> = b.common.with_conn(what, |c| c.query_first(sql)).await?;
    let us = us.and_then(|us| u64::try_from(us).ok()).ok_or_else(|| {
        Error::unexpected(KIND, format!("the server clock reads {us:?} µs since 1970"))
    })?;
    Ok(UNIX_EPOCH + Duration::from_micros(us))
}

/// The `connection-close` check: whether a holder learns at once that its connection was
/// closed from the other side (and what session mode assumes about that).
fn close_finding(mode: Mode, watchable: bool) -> Finding {
    let (severity, text) = match (mode, watchable) {
        (Mode::Table, _) => (
            Severity::Ok,
            "table mode: a lock is its row's lease, not a connection; a closed connection frees nothing",
        ),
        (Mode::Session, true) => (
            Severity::Ok,
            "a holder's connection is watched: when the server or a proxy between closes or resets it (KILL, a timeout, a failover), the server frees the lock and the holder's lost signal fires at once. Assumed: nothing between ends the server's side of a holder's connection and keeps the client's side open (a pooling proxy may, e.g. ProxySQL or MaxScale depending on its settings); through such a proxy use ?mode=table",
        ),
        (Mode::Session, false) => (
            Severity::Warning,
            "a holder's connection cannot be watched here (not a TCP socket, or a driver whose connection text changed): when the server or a proxy closes it, the server frees the lock at once but the holder learns it only at its next renewal, a third of the lease later, while another client may hold the lock (fencing tokens still stop its writes to stores that check them); use ?mode=table for a lease the client can count on",
        ),
    };
    Finding::new(severity, "connection-close", text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for (v, want) in [
            ("10.11.6-MariaDB-0+deb12u1", Severity::Ok),
            ("8.0.36", Severity::Ok),
            ("5.6.51-log", Severity::Unsafe),
            ("5.5.68-MariaDB", Severity::Unsafe),
            ("weird", Severity::Warning),
        ] {
            assert_eq!(version_finding(v).severity, want, "{v}");
        }
    }
}
