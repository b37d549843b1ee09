//! MySQL / MariaDB backend for dlock.
//!
//! Two modes, chosen with `?mode=` in the URL:
//!
//! - **`session`** (default): `GET_LOCK` / `RELEASE_LOCK` on a **dedicated connection per
//!   holder**. The lock lives as long as that connection, so a crashed client's lock is freed
//!   by the server as soon as its connection closes. The lease is enforced server-side as the
//!   connection's `wait_timeout` (lease plus a grace of half of it, at most 5 s, rounded up to
//!   whole seconds): a holder that stops renewing is disconnected, and loses the lock, then. Waiting is server-side
//!   (`GET_LOCK(name, seconds left)`, stopped with `KILL QUERY`): no polling. A lost lock is
//!   noticed at the holder's next renewal (the driver cannot watch an idle connection).
//! - **`table`**: a lock row per name (owner, count, token, lease end by the server clock)
//!   changed in short row-locking transactions. Rows replicate, so this works on Galera /
//!   MariaDB Cluster and multi-primary setups where `GET_LOCK` is per node. Waiters wake at
//!   the holder's lease end or their heartbeat (MySQL has no notifications).
//!
//! Both are mutexes only: `GET_LOCK` has no shared mode, so read-write locks return
//! [`Error::Unsupported`](distlock_core::Error::Unsupported). Names map to `GET_LOCK` names with a documented, stable hash
//! ([`lock_key`]): `dlock:` + 32 hex digits (the server's limit is 64 characters and names are
//! case-insensitive there; lowercase hex makes that harmless). Fencing tokens are a counter
//! row per name (`LAST_INSERT_ID(token + 1)`), bumped on each fresh grant while the lock is
//! held; they survive restarts.
//!
//! URL: `mysql://user:password@host:port/database[?mode=session|table&namespace=NS]` plus
//! mysql_async's connection parameters (`socket`, `tcp_keepalive`, `compression`, …). TLS
//! is not built in. See `docs/mysql.md`.
#![warn(missing_docs)]

mod common;
mod error;
mod ops;
mod session;
mod table;

pub use common::lock_key;

use crate::common::Common;
use crate::error::KIND;
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, Backend, ClientOptions, GrantRef, Granted, LockInfo,
    LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result, Wake,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How locks are kept on the server (`?mode=` in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `GET_LOCK` on a dedicated connection per holder (the default).
    Session,
    /// A lock row per name, changed in row-locking transactions.
    Table,
}

impl Mode {
    /// `session` or `table`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Session => "session",
            Mode::Table => "table",
        }
    }
}

/// The URL with its password (in the user info or a `password=` parameter) replaced by `***`.
pub fn redact(url: &str) -> String {
    distlock_sql::url::redact(url)
}

#[derive(Debug)]
struct Parsed {
    opts: mysql_async::Opts,
    endpoint: String,
    mode: Mode,
    namespace: Option<String>,
}

fn parse_url(url: &str) -> Result<Parsed> {
    let bad = |reason: &str| distlock_sql::url::invalid(url, reason);
    let (mut u, params) = distlock_sql::url::parse(
        url,
        &["mysql"],
        &[("session", Mode::Session), ("table", Mode::Table)],
        "mode=session (GET_LOCK, the default) or mode=table (lock rows, for clusters)",
    )?;
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad(
            "no host; write mysql://user:password@host:port/database",
        ));
    }
    if u.username().is_empty() {
        return Err(bad(
            "no user; write mysql://user:password@host:port/database",
        ));
    }
    let (mode, namespace) = (params.mode, params.namespace);
    let prefer_socket = params
        .rest
        .iter()
        .any(|(k, v)| k == "prefer_socket" && v == "true");
    u.set_query(distlock_sql::url::query(&params.rest).as_deref());
    let opts = mysql_async::Opts::from_url(u.as_str()).map_err(|e| bad(&e.to_string()))?;
    let endpoint = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
    let opts: mysql_async::Opts = mysql_async::OptsBuilder::from_opts(opts)
        .prefer_socket(prefer_socket)
        // Renewals count matched rows, not changed ones.
        .client_found_rows(true)
        .into();
    Ok(Parsed {
        opts,
        endpoint,
        mode,
        namespace,
    })
}

enum Inner {
    Session(session::SessionMode),
    Table(table::TableMode),
}

/// The MySQL/MariaDB backend. Build it with [`MysqlBackend::connect`] (or `distlock::connect`).
pub struct MysqlBackend {
    common: Arc<Common>,
    inner: Inner,
}

impl MysqlBackend {
    /// Connects to the server at `url`, checks the credentials and creates dlock's tables if
    /// they are missing.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        let p = parse_url(url)?;
        let namespace = p
            .namespace
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        let common = Arc::new(Common::new(
            p.opts,
            p.endpoint,
            namespace,
            opts.get_connect_timeout(),
            opts.get_op_timeout(),
        ));
        common.ensure_schema(session::DDL).await?;
        let inner = match p.mode {
            Mode::Session => Inner::Session(session::SessionMode::new(common.clone())),
            Mode::Table => {
                common.ensure_schema(table::DDL).await?;
                let t = table::TableMode::new(common.clone());
                t.migrate().await?;
                Inner::Table(t)
            }
        };
        Ok(MysqlBackend { common, inner })
    }

    /// The mode this backend runs in.
    pub fn mode(&self) -> Mode {
        match self.inner {
            Inner::Session(_) => Mode::Session,
            Inner::Table(_) => Mode::Table,
        }
    }

    /// The namespace (hashed into every lock key).
    pub fn namespace(&self) -> &str {
        &self.common.namespace
    }

    /// Session mode: the connection id holding `name` for `owner` in this client
    /// (`KILL id` revokes that lock at once). `None` in table mode, or if this client holds
    /// no grant of `name` for `owner`.
    pub async fn holder_connection(&self, name: &str, owner: &str) -> Option<u32> {
        match &self.inner {
            Inner::Session(s) => s.holder_connection(name, owner).await,
            Inner::Table(_) => None,
        }
    }
}

/// MySQL has no notifications: the watch never fires, and waiters (table mode) wake at the
/// holder's lease end or their heartbeat. Session mode waits on the server instead.
struct NoWatch;

#[async_trait]
impl ReleaseWatch for NoWatch {
    async fn changed(&mut self) -> Result<Wake> {
        std::future::pending().await
    }
}

#[async_trait]
impl Backend for MysqlBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.common.endpoint.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        match &self.inner {
            Inner::Session(s) => s.acquire(req).await,
            Inner::Table(t) => t.acquire(req).await,
        }
    }

    async fn watch(&self, _req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        Ok(Box::new(NoWatch))
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        match &self.inner {
            Inner::Session(s) => s.acquire_wait(self, req, deadline, cancel).await,
            Inner::Table(_) => {
                distlock_core::wait::watch_and_retry(self, req, deadline, cancel).await
            }
        }
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        match &self.inner {
            Inner::Session(s) => s.give_up(req).await,
            Inner::Table(t) => t.give_up(req).await,
        }
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        match &self.inner {
            Inner::Session(s) => s.release(grant).await,
            Inner::Table(t) => t.release(grant).await,
        }
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        match &self.inner {
            Inner::Session(s) => s.renew(holds).await,
            Inner::Table(t) => t.renew(holds).await,
        }
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        match &self.inner {
            Inner::Session(s) => s.inspect(name, kind).await,
            Inner::Table(t) => t.inspect(name, kind).await,
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

    #[test]
    fn urls() {
        let p = parse_url("mysql://u:pw@127.0.0.1:7000/db?namespace=shop&mode=table").unwrap();
        assert_eq!(p.endpoint, "127.0.0.1:7000");
        assert_eq!(p.mode, Mode::Table);
        assert_eq!(p.namespace.as_deref(), Some("shop"));
        assert_eq!(p.opts.user(), Some("u"));
        assert_eq!(p.opts.db_name(), Some("db"));
        assert!(!p.opts.prefer_socket());
        assert!(p.opts.client_found_rows());
        let p = parse_url("mysql://u@h/db?tcp_keepalive=1000").unwrap();
        assert_eq!(p.endpoint, "h:3306");
        assert_eq!(p.mode, Mode::Session);
        for bad in [
            "mysql://",
            "mysql://h/db",
            "postgres://u@h/db",
            "mysql://u@h/db?mode=x",
            "mysql://u@h/db?nope=1",
            "mysql://u@h:notaport/db",
            "mysql://u@h/db?namespace=",
            "not a url",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let e = parse_url("mysql://u:secret@h/db?nope=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(redact("mysql://u:secret@h:1/d"), "mysql://u:***@h:1/d");
        assert_eq!(redact("mysql://u:secret@h:x/d"), "mysql://u:***@h:x/d");
    }
}
