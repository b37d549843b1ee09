//! `dlock doctor` on PostgreSQL (the findings: docs/postgres.md, *Operator commands*).

use crate::common::{cols, first};
use crate::error::KIND;
use crate::{Mode, PostgresBackend};
use distlock_core::operator::{clock_finding, measure_clock, TlsSession};
use distlock_core::{Finding, Result, Severity};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Row};

/// The version finding. Both modes need `ON CONFLICT` (9.5). Session mode enforces each
/// holder's lease as its session's `idle_session_timeout` (14): before 14 a holder that
/// hangs with its connection open keeps the lock until the connection closes (its own lost
/// signal still fires at its lease end, so nobody else is let in: stuck, not unsafe).
fn version_finding(num: i32, version: &str, mode: Mode) -> Finding {
    if num < 90_500 {
        Finding::new(
            Severity::Unsafe,
            "version",
            format!("server {version} is older than 9.5: dlock's statements need INSERT … ON CONFLICT; upgrade"),
        )
    } else if num < 140_000 && mode == Mode::Session {
        Finding::new(
            Severity::Warning,
            "version",
            format!("server {version} is older than 14, which has no idle_session_timeout: session mode cannot end the session of a holder that hangs with its connection open, so its lock stays taken (nobody else gets it) until the connection closes; upgrade to 14 or later, or use ?mode=lease"),
        )
    } else {
        Finding::new(Severity::Ok, "version", format!("server {version}"))
    }
}

/// The replication finding from `pg_is_in_recovery()`, the number of streaming standbys,
/// how many of them are synchronous, and `synchronous_commit`.
fn replication_finding(recovery: bool, standbys: i64, sync: i64, commit: &str) -> Finding {
    if recovery {
        return Finding::new(
            Severity::Unsafe,
            "replication",
            "the server is a standby (in recovery): dlock's rows cannot be written there and its advisory locks are not shared with the primary; point the URL at the primary",
        );
    }
    if standbys == 0 {
        return Finding::new(
            Severity::Ok,
            "replication",
            "no standbys stream from this server (a failover cannot lose committed rows to a lagging standby)",
        );
    }
    let waits = !matches!(commit, "off" | "local");
    if sync > 0 && waits {
        Finding::new(
            Severity::Ok,
            "replication",
            format!("{sync} of {standbys} standbys are synchronous (synchronous_commit={commit})"),
        )
    } else {
        Finding::new(
            Severity::Warning,
            "replication",
            format!("{standbys} standbys replicate asynchronously (synchronous standbys: {sync}, synchronous_commit={commit}): a failover to one can lose the last lease rows (a lock granted twice; fencing tokens still increase, each at least the server clock in µs, as long as the new primary's clock is not behind the old one's by as much as the failover takes; session mode's advisory locks are never replicated, but their holders' sessions end with the old primary); set synchronous_standby_names and synchronous_commit=on (or remote_apply) if failovers happen"),
        )
    }
}

/// The one row `sql` returns on `client` (the control connection if `None`), with the
/// per-call timeout.
async fn row(b: &PostgresBackend, client: Option<&Client>, what: &str, sql: &str) -> Result<Row> {
    let control;
    let client = match client {
        Some(c) => c,
        None => {
            control = b.common.control().await?;
            &control
        }
    };
    b.common.run(what, client.query_one(sql, &[])).await
}

/// The server's clock (`clock_timestamp()`), for `Operator::server_time`.
pub(crate) async fn server_time(b: &PostgresBackend) -> Result<SystemTime> {
    let sql = "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::int8";
    let row = row(b, None, "reading the server clock", sql).await?;
    let (us,): (i64,) = cols(&row, "server_time")?;
    let us = u64::try_from(us).map_err(|_| {
        distlock_core::Error::unexpected(
            KIND,
            format!("the server clock reads {us} µs, before 1970"),
        )
    })?;
    Ok(UNIX_EPOCH + Duration::from_micros(us))
}

pub(crate) async fn diagnose(b: &PostgresBackend) -> Result<Vec<Finding>> {
    let mode = b.mode();
    let sql = "SELECT current_setting('server_version'), \
                      current_setting('server_version_num')::int4, \
                      pg_is_in_recovery(), \
                      (SELECT count(*) FROM pg_stat_replication), \
                      (SELECT count(*) FROM pg_stat_replication \
                       WHERE sync_state IN ('sync', 'quorum')), \
                      current_setting('synchronous_commit'), \
                      current_setting('synchronous_standby_names')";
    let row = row(b, None, "diagnosing", sql).await?;
    let (version, num, recovery, standbys, mut sync, commit, names) =
        cols::<(String, i32, bool, i64, i64, String, String)>(&row, "diagnose")?;
    // sync_state is hidden from roles without pg_monitor: then only the setting tells.
    if sync == 0 && standbys > 0 && !names.trim().is_empty() {
        sync = 1;
    }
    let offset_ms = measure_clock(server_time(b)).await?;
    let mut out = vec![version_finding(num, &version, mode)];
    out.push(tls_finding(b).await);
    out.push(pooler_finding(b, mode).await);
    out.push(timeout_finding(b, mode, num).await);
    out.push(replication_finding(recovery, standbys, sync, &commit));
    out.push(clock_finding(offset_ms, "server", "on the server (lease mode: its now(); session mode: its idle_session_timeout) and by the client's own clock"));
    Ok(out)
}

/// Whether the control connection is encrypted and what was checked: a warning for a server
/// off this machine reached in clear text or without checking its certificate.
async fn tls_finding(b: &PostgresBackend) -> Finding {
    use tokio_postgres::config::Host;
    let config = &b.common.config;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => return Finding::new(Severity::Ok, "tls", "unix socket: no TLS needed"),
    };
    let loopback = match config.get_hostaddrs().first() {
        Some(addr) => addr.is_loopback(),
        None => distlock_core::conn::is_loopback(&host),
    };
    let sql = "SELECT coalesce((SELECT ssl::text || ' ' || coalesce(version, '') \
               FROM pg_stat_ssl WHERE pid = pg_backend_pid()), 'unknown')";
    let rows = b.common.query("reading pg_stat_ssl", sql, &[]).await;
    let seen = rows
        .ok()
        .and_then(|r| first::<String>("pg_stat_ssl", &r).ok());
    let seen = seen.unwrap_or_else(|| "unknown".into());
    let checks = b.common.tls.checks();
    let t = TlsSession {
        host: &host,
        loopback,
        setting: crate::tls::MODES.setting(b.common.tls.mode()),
        checks,
        verified: checks != "certificate not checked",
        fix_unchecked: "use sslmode=verify-full with sslrootcert",
        fix_plain: "lock names, tokens and an md5 password exchange travel in clear; turn on ssl in the server and use sslmode=verify-full",
    };
    t.finding(match seen.split_once(' ') {
        Some(("true", version)) => Some(Some(version)),
        Some(("false", _)) => Some(None),
        _ => None,
    })
}

/// What the probe connection saw of the server session behind it.
struct Probe {
    /// The `options` startup parameter took effect (`-c dlock.doctor=on`).
    options_applied: bool,
    /// A transaction pooler is in front: the backend pid changed over statements of one
    /// connection, a session setting did not survive to the next statement, or two client
    /// connections were served by one backend.
    pooled: bool,
}

/// Probes with a connection like the backend's, plus `-c dlock.doctor=on` in `options`.
async fn probe(b: &PostgresBackend) -> Result<Probe> {
    let mut config = b.common.config.clone();
    config.options(&match config.get_options() {
        Some(o) if !o.is_empty() => format!("{o} -c dlock.doctor=on"),
        _ => "-c dlock.doctor=on".to_owned(),
    });
    let one = b.common.client(Some(&config)).await?;
    let two = b.common.client(None).await?;
    let what = "probing the session";
    let first = "SELECT pg_backend_pid(), current_setting('dlock.doctor', true), \
                        set_config('dlock.doctor_kept', 'yes', false)";
    let (pid1, opt): (i32, Option<String>) =
        cols(&row(b, Some(&one), what, first).await?, "probe")?;
    let other = row(b, Some(&two), what, "SELECT pg_backend_pid()").await?;
    let (pid_other,): (i32,) = cols(&other, "probe")?;
    let second = "SELECT pg_backend_pid(), current_setting('dlock.doctor_kept', true)";
    let (pid2, kept): (i32, Option<String>) =
        cols(&row(b, Some(&one), what, second).await?, "probe")?;
    Ok(Probe {
        options_applied: opt.as_deref() == Some("on"),
        pooled: pid1 != pid2
            || kept.as_deref() != Some("yes")
            || pid_other == pid1
            || pid_other == pid2,
    })
}

/// PgBouncer (or another pooler) in front: a transaction-pooling one shares backends between
/// clients and drops session state between transactions, which breaks session mode (its
/// advisory locks and lease live in the server session); `options` ignored is PgBouncer's
/// `ignore_startup_parameters`.
async fn pooler_finding(b: &PostgresBackend, mode: Mode) -> Finding {
    let f = |sev, text: &str| Finding::new(sev, "pooler", text);
    let p = match probe(b).await {
        Ok(p) => p,
        Err(e) => {
            let text = e.to_string();
            let sev = if mode == Mode::Session {
                Severity::Unsafe
            } else {
                Severity::Warning
            };
            return f(
                sev,
                &if text.contains("unsupported startup parameter") {
                    format!("a pooler (PgBouncer) in front refuses the `options` startup parameter ({text}): session mode needs a direct connection to the server; lease mode works behind PgBouncer (add options to ignore_startup_parameters)")
                } else {
                    format!("could not probe the session behind the URL: {text}")
                },
            );
        }
    };
    match (p.pooled, mode) {
        (true, Mode::Session) => f(
            Severity::Unsafe,
            "a transaction-pooling proxy (PgBouncer pool_mode=transaction/statement) is in front: one client connection was served by several server backends, or two by one, or a session setting was lost; session mode's advisory locks and leases live in the server session, so another client can be handed a session that holds a lock, and a dead holder's lock is never freed; connect to the server directly (or a session-pooling PgBouncer) or use ?mode=lease",
        ),
        (true, Mode::Lease) if b.listen => f(
            Severity::Warning,
            "a transaction-pooling proxy is in front: lease mode works there, but LISTEN/NOTIFY does not, so waiters wake only at their heartbeat; add listen=off to the URL to say so (or connect directly for prompt wake-ups)",
        ),
        (true, Mode::Lease) => f(
            Severity::Ok,
            "a transaction-pooling proxy is in front: fine for lease mode with listen=off",
        ),
        (false, _) if !p.options_applied => f(
            Severity::Warning,
            "the `options` startup parameter (-c settings in the URL) is ignored: a pooler (PgBouncer with options in ignore_startup_parameters) is in front, so settings passed that way do not apply; dlock sets its own session settings with set_config, which worked",
        ),
        (false, _) => f(
            Severity::Ok,
            "one client connection is one server session (no transaction pooling in front), and startup options apply",
        ),
    }
}

/// Session mode: the lease is the session's `idle_session_timeout`; check that a short one
/// really ends an idle session (a pooler keeping the client connection, or a server that
/// ignores it, would let a hung holder keep its lock).
async fn timeout_finding(b: &PostgresBackend, mode: Mode, num: i32) -> Finding {
    let f = |sev, text: &str| Finding::new(sev, "session-timeout", text);
    if mode == Mode::Lease {
        return f(
            Severity::Ok,
            "lease mode: leases are the rows' expires_at (server time), no session setting ends them",
        );
    }
    if num < 140_000 {
        return f(
            Severity::Warning,
            "no idle_session_timeout before PostgreSQL 14: a holder that hangs with its connection open keeps its lock until the connection closes (see version)",
        );
    }
    let (client, conn) = match b.common.open(None).await {
        Ok(c) => c,
        Err(e) => {
            return f(
                Severity::Warning,
                &format!("could not open a session to check idle_session_timeout: {e}"),
            )
        }
    };
    let ended = tokio::spawn(async move { conn.await.err() });
    let sql = "SELECT set_config('idle_session_timeout', '300', false), \
                      current_setting('idle_session_timeout')";
    let set = row(b, Some(&client), "setting idle_session_timeout", sql).await;
    if let Err(e) = set {
        return f(
            Severity::Unsafe,
            &format!("SET idle_session_timeout failed ({e}): session mode carries each holder's lease in it; connect to the server directly or use ?mode=lease"),
        );
    }
    // The server should end the session 300 ms after that statement; allow a loaded machine.
    match tokio::time::timeout(Duration::from_secs(5), ended).await {
        Ok(Ok(Some(e))) if e.code() == Some(&SqlState::IDLE_SESSION_TIMEOUT) || e.as_db_error().is_none() => {
            f(
                Severity::Ok,
                "idle_session_timeout set by dlock ends an idle session: a holder that stops renewing loses its session (and lock) when its lease ends",
            )
        }
        Ok(Ok(other)) => f(
            Severity::Warning,
            &format!("the probe session ended otherwise than by idle_session_timeout: {other:?}"),
        ),
        Ok(Err(_)) | Err(_) => f(
            Severity::Unsafe,
            "idle_session_timeout = 300 ms did not end an idle session within 5 s: session mode enforces each holder's lease that way, so a hung holder would keep its lock; connect to the server directly (not through a pooler that keeps the client connection) or use ?mode=lease",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings() {
        use Severity::{Ok, Unsafe, Warning};
        for (num, mode, want) in [
            (160_002, Mode::Session, Ok),
            (130_009, Mode::Session, Warning),
            (130_009, Mode::Lease, Ok),
            (90_400, Mode::Lease, Unsafe),
        ] {
            assert_eq!(version_finding(num, "v", mode).severity, want, "{num}");
        }
        for (recovery, standbys, sync, commit, want) in [
            (false, 0, 0, "on", Ok),
            (false, 2, 0, "on", Warning),
            (false, 2, 1, "local", Warning),
            (false, 2, 1, "on", Ok),
            (true, 0, 0, "on", Unsafe),
        ] {
            let f = replication_finding(recovery, standbys, sync, commit);
            assert_eq!(f.severity, want, "{standbys} {sync} {commit}");
        }
    }
}
