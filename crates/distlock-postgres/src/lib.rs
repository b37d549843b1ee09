//! PostgreSQL backend for dlock.
//!
//! Two modes, chosen with `?mode=` in the URL:
//!
//! - **`session`** (default): PostgreSQL session-level advisory locks
//!   (`pg_try_advisory_lock` / `pg_advisory_lock`, `…_shared` for the read side of a
//!   read-write lock). Every grant gets a **dedicated connection**; the lock lives exactly as
//!   long as that session, so a crashed client's lock is freed by the server the moment its
//!   connection closes, and the guard's lost signal fires (`LostReason::SessionEnded`) as soon
//!   as the connection drops. The lease is enforced server-side as the session's
//!   `idle_session_timeout` (PostgreSQL 14+): renewals are queries on the holder's session,
//!   a holder that stops renewing loses its session and lock at lease end (plus a grace of
//!   half the lease, at most 5 s; its lost signal fires at the lease end itself). Waiting is
//!   server-side: a blocking `pg_advisory_lock` bounded by `lock_timeout`, cancelled with a
//!   CancelRequest — no polling, and waiters are served in arrival order.
//! - **`lease`**: a lease table (`dlock_leases`), one autocommit statement per operation and
//!   no session state, so it works behind PgBouncer in transaction-pooling mode. Expiry uses
//!   the server's clock. Waiters wake on `LISTEN/NOTIFY` (turn off with `listen=off` behind a
//!   pooler that drops notifications; waiters then wake at their heartbeat). Mutex only.
//!
//! Both modes address every grant by the core's attempt id and its fencing token: a retried
//! acquire of the attempt that holds the lock returns the same token and never shortens the
//! lease, renewals never shorten it either, and releases and give-ups touch only the grant they
//! name, so a request retried after a lost or late reply has the effect of one. Re-entrant
//! guards are counted in the client; the server sees one grant per hold.
//!
//! Names map to advisory keys with a documented, stable hash ([`lock_key`]); a collision of
//! two names on one key can only make one wait for the other, never let both in. Fencing
//! tokens come from the sequence `dlock_fence_seq`: strictly increasing per name, and they
//! survive restarts.
//!
//! URL: `postgres://user:password@host:port/db[?mode=session|lease&namespace=NS&listen=on|off]`
//! plus any connection parameter tokio-postgres understands (`application_name`, `options`,
//! `connect_timeout`, `keepalives_idle`, `host=/run/postgresql` for a unix socket, …).
//! TLS is not built in: `sslmode=require` and stricter are refused (use `disable`/`prefer`,
//! or a local TLS tunnel). See `docs/postgres.md`.
#![warn(missing_docs)]

mod common;
mod error;
mod lease;
mod listen;
mod ops;
mod session;

pub use common::{channel, lock_key};

use crate::common::Common;
use crate::error::KIND;
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, Backend, ClientOptions, GrantRef, Granted, LockInfo,
    LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result,
};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How locks are kept on the server (`?mode=` in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Session advisory locks on a dedicated connection per holder (the default).
    Session,
    /// A lease table; works behind PgBouncer in transaction mode.
    Lease,
}

impl Mode {
    /// `session` or `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Lease => "lease",
        }
    }
}

/// What the URL says, beyond what tokio-postgres understands.
#[derive(Debug)]
struct Parsed {
    config: tokio_postgres::Config,
    endpoint: String,
    mode: Mode,
    namespace: Option<String>,
    listen: bool,
}

/// The URL with its password (in the user info or a `password=` parameter) replaced by `***`.
pub fn redact(url: &str) -> String {
    distlock_sql::url::redact(url)
}

fn parse_url(url: &str) -> Result<Parsed> {
    let bad = |reason: String| distlock_sql::url::invalid(url, reason);
    let (mut u, params) = distlock_sql::url::parse(
        url,
        &["postgres", "postgresql"],
        &[("session", Mode::Session), ("lease", Mode::Lease)],
        "mode=session (advisory locks, the default) or mode=lease (lease table, for PgBouncer)",
    )?;
    let (mode, namespace) = (params.mode, params.namespace);
    let mut listen = true;
    let mut keep = Vec::new();
    for (k, v) in params.rest {
        match k.as_str() {
            "listen" => {
                listen = match v.as_str() {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    other => return Err(bad(format!("listen=`{other}`: use on or off"))),
                }
            }
            "sslmode" if !matches!(v.as_str(), "disable" | "prefer" | "allow") => {
                return Err(bad(format!(
                    "sslmode={v} needs TLS, which distlock-postgres is built without; use \
                     sslmode=disable or prefer, or reach the server through a local TLS tunnel"
                )));
            }
            _ => keep.push((k, v)),
        }
    }
    if !listen && mode == Mode::Session {
        return Err(bad(
            "listen=off applies to mode=lease only (session mode waits on the server)".into(),
        ));
    }
    // Percent-encoded by hand: `query_pairs_mut` writes a space as `+`, which tokio-postgres
    // does not decode (`options=-c%20search_path%3Dx` became `-c+search_path`).
    u.set_query(distlock_sql::url::query(&keep).as_deref());
    let config = tokio_postgres::Config::from_str(u.as_str()).map_err(|e| bad(e.to_string()))?;
    if config.get_user().is_none() {
        return Err(bad(
            "no user; write postgres://user:password@host:port/database".into(),
        ));
    }
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => {
            return Err(bad(
                "no host; write postgres://user:password@host:port/database".into(),
            ))
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Ok(Parsed {
        config,
        endpoint: format!("{host}:{port}"),
        mode,
        namespace,
        listen,
    })
}

enum Inner {
    Session(session::SessionMode),
    Lease(lease::LeaseMode),
}

/// The PostgreSQL backend. Build it with [`PostgresBackend::connect`] (or `distlock::connect`).
pub struct PostgresBackend {
    common: Arc<Common>,
    listener: Arc<listen::Listener>,
    inner: Inner,
    listen: bool,
}

impl PostgresBackend {
    /// Connects to the server at `url`, checks the credentials and creates dlock's tables if
    /// they are missing.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        let p = parse_url(url)?;
        let mut config = p.config;
        config.connect_timeout(opts.get_connect_timeout());
        if config.get_application_name().is_none() {
            config.application_name("dlock");
        }
        let namespace = p
            .namespace
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        let common = Common::connect(
            config,
            p.endpoint,
            namespace,
            opts.get_connect_timeout(),
            opts.get_op_timeout(),
        )
        .await?;
        let listener = listen::Listener::new(common.clone());
        let inner = match p.mode {
            Mode::Session => {
                common
                    .ensure_schema(session::TABLES, session::COLUMNS, session::DDL)
                    .await?;
                Inner::Session(session::SessionMode::new(common.clone()))
            }
            Mode::Lease => {
                common
                    .ensure_schema(lease::TABLES, lease::COLUMNS, lease::DDL)
                    .await?;
                Inner::Lease(lease::LeaseMode::new(common.clone()))
            }
        };
        Ok(PostgresBackend {
            common,
            listener,
            inner,
            listen: p.listen,
        })
    }

    /// The mode this backend runs in.
    pub fn mode(&self) -> Mode {
        match self.inner {
            Inner::Session(_) => Mode::Session,
            Inner::Lease(_) => Mode::Lease,
        }
    }

    /// The namespace (the `ns` column of dlock's tables).
    pub fn namespace(&self) -> &str {
        &self.common.namespace
    }

    /// The server's `server_version_num` (e.g. 150004). Below 140000 the session mode cannot
    /// enforce leases on the server (no `idle_session_timeout`): a hung holder keeps its lock
    /// until its connection closes.
    pub fn server_version(&self) -> i32 {
        self.common.server_version
    }

    /// Session mode: the backend pid of a connection holding `name` for `owner` in this
    /// client (of one of its grants, if two clients' attempts share the owner id here). `SELECT pg_terminate_backend(pid)` revokes that lock at once.
    pub async fn holder_pid(&self, name: &str, owner: &str) -> Option<i32> {
        match &self.inner {
            Inner::Session(s) => s.holder_pid(name, owner).await,
            Inner::Lease(_) => None,
        }
    }

    /// Session mode: idle connections kept for the next grant.
    pub fn idle_sessions(&self) -> usize {
        match &self.inner {
            Inner::Session(s) => s.idle_sessions(),
            Inner::Lease(_) => 0,
        }
    }

    /// Notification channels this client listens on right now (one per lock some caller of
    /// this client waits for through notifications).
    pub async fn listening_channels(&self) -> usize {
        self.listener.listening().await
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.common.endpoint.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        match &self.inner {
            Inner::Session(s) => s.acquire(req).await,
            Inner::Lease(l) => l.acquire(req).await,
        }
    }

    /// Notifications are plain wake-ups (no grant travels in them: a woken waiter tries again
    /// with its own attempt), so one subscription per lock serves every waiting attempt.
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        if !self.listen {
            return Ok(Box::new(listen::NoWatch));
        }
        let chan = channel(lock_key(&self.common.namespace, &req.key.name));
        self.listener.watch(chan).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        match &self.inner {
            Inner::Session(s) => s.give_up(req).await,
            Inner::Lease(l) => l.give_up(req).await,
        }
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        match &self.inner {
            Inner::Session(s) => s.acquire_wait(self, req, deadline, cancel).await,
            Inner::Lease(_) => {
                distlock_core::wait::watch_and_retry(self, req, deadline, cancel).await
            }
        }
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        match &self.inner {
            Inner::Session(s) => s.release(grant).await,
            Inner::Lease(l) => l.release(grant).await,
        }
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        match &self.inner {
            Inner::Session(s) => s.renew(holds).await,
            Inner::Lease(l) => l.renew(holds).await,
        }
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        match &self.inner {
            Inner::Session(s) => s.inspect(name, kind).await,
            Inner::Lease(l) => l.inspect(name, kind).await,
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<distlock_core::ListedLock>> {
        ops::list(self, prefix).await
    }

    async fn force_release(
        &self,
        name: &str,
        kind: LockKind,
    ) -> Result<distlock_core::ForceReleased> {
        ops::force_release(self, name, kind).await
    }

    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        ops::diagnose(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::Error;

    #[test]
    fn urls() {
        let p = parse_url("postgres://u:pw@127.0.0.1:7000/db?namespace=shop&mode=lease").unwrap();
        assert_eq!(p.endpoint, "127.0.0.1:7000");
        assert_eq!(p.mode, Mode::Lease);
        assert_eq!(p.namespace.as_deref(), Some("shop"));
        assert_eq!(p.config.get_user(), Some("u"));
        assert_eq!(p.config.get_dbname(), Some("db"));
        let p = parse_url("postgresql://u@h/db?application_name=x&sslmode=disable").unwrap();
        assert_eq!(p.endpoint, "h:5432");
        assert_eq!(p.mode, Mode::Session);
        assert_eq!(p.config.get_application_name(), Some("x"));
        let p = parse_url("postgres:///db?host=/run/postgresql&user=u").unwrap();
        assert_eq!(p.endpoint, "/run/postgresql:5432");
        let p = parse_url("postgres://u@h/db?mode=lease&listen=off").unwrap();
        assert!(!p.listen);
        let p = parse_url("postgres://u@h/db?mode=lease&options=-c%20search_path%3Dx%2By").unwrap();
        assert_eq!(p.config.get_options(), Some("-c search_path=x+y"));
        for bad in [
            "postgres://",
            "postgres://h/db",
            "mysql://u@h/db",
            "postgres://u@h/db?mode=x",
            "postgres://u@h/db?listen=maybe",
            "postgres://u@h/db?listen=off",
            "postgres://u@h/db?sslmode=require",
            "postgres://u@h/db?nope=1",
            "postgres://u@h:notaport/db",
            "postgres://u@h/db?namespace=",
            "not a url",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        for secret in [
            "postgres://u:secret@h/db?nope=1",
            "postgres://u@h/db?password=secret&mode=x",
            "postgres://u:secret@h:notaport/db",
        ] {
            let e = parse_url(secret).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
            assert!(matches!(parse_url(secret), Err(Error::InvalidUrl { .. })));
        }
        assert_eq!(
            redact("postgres://u:secret@h:1/d"),
            "postgres://u:***@h:1/d"
        );
    }
}
