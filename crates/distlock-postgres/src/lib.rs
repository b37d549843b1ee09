#![doc = include_str!("../README.md")]
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
use distlock_core::conn::ConnectionString;
use distlock_core::{AcquireRequest, ClientOptions, ReleaseWatch, Result};
use std::str::FromStr;
use std::sync::Arc;

/// How locks are kept on the server (`?mode=` in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
    distlock_core::conn::redact(url)
}

fn parse_url(url: &str) -> Result<Parsed> {
    let cs = ConnectionString::parse(url)?;
    let bad = |reason: &str| cs.invalid(reason);
    if !matches!(cs.scheme(), "postgres" | "postgresql") {
        return Err(cs.invalid(format!(
            "scheme `{}` is not postgres:// or postgresql://",
            cs.scheme()
        )));
    }
    let distlock_sql::url::Params {
        mode, namespace, ..
    } = distlock_sql::url::params(
        &cs,
        &[("session", Mode::Session), ("lease", Mode::Lease)],
        "mode=session (advisory locks, the default) or mode=lease (lease table, for PgBouncer)",
    )?;
    let listen = cs.bool("listen")?.unwrap_or(true);
    if let Some(v) = cs.param("sslmode") {
        if !matches!(v, "disable" | "prefer" | "allow") {
            return Err(cs.invalid(format!(
                "sslmode={v} needs TLS, which distlock-postgres is built without; use \
                 sslmode=disable or prefer, or reach the server through a local TLS tunnel"
            )));
        }
    }
    if !listen && mode == Mode::Session {
        return Err(bad(
            "listen=off applies to mode=lease only (session mode waits on the server)",
        ));
    }
    let driver = distlock_sql::url::driver_url(&cs, &["mode", "namespace", "listen"]);
    let config = tokio_postgres::Config::from_str(&driver).map_err(|e| bad(&e.to_string()))?;
    if config.get_user().is_none() {
        return Err(bad(
            "no user; write postgres://user:password@host:port/database",
        ));
    }
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => {
            return Err(bad(
                "no host; write postgres://user:password@host:port/database",
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
    /// they are missing (or migrates those of an older version).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) (the URL redacted) for a URL
    /// this backend cannot use; `Connection` when the server cannot be reached within the
    /// connect timeout; `Auth` for refused credentials or missing privileges;
    /// `UnexpectedReply` when creating the tables fails.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes the connections it opened. A schema creation
    /// interrupted midway is rolled back by the server (it runs in one transaction).
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
                Inner::Session(session::new_mode(common.clone()))
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

    /// The operations of the mode in use.
    fn ops(&self) -> &dyn distlock_sql::ModeOps {
        match &self.inner {
            Inner::Session(s) => s,
            Inner::Lease(l) => l,
        }
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
    /// client (of one of its grants, if two clients' attempts share the owner id here).
    /// `SELECT pg_terminate_backend(pid)` revokes that lock at once. `None` in lease mode.
    ///
    /// # Errors
    /// None: `None` when no live grant matches.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads this client's state (waiting for a request of the attempt
    /// that is running).
    pub async fn holder_pid(&self, name: &str, owner: &str) -> Option<i32> {
        match &self.inner {
            Inner::Session(s) => session::holder_pid(s, name, owner).await,
            Inner::Lease(_) => None,
        }
    }

    /// Session mode: idle connections kept for the next grant.
    pub fn idle_sessions(&self) -> usize {
        match &self.inner {
            Inner::Session(s) => session::idle_sessions(s),
            Inner::Lease(_) => 0,
        }
    }

    /// Notification channels this client listens on right now (one per lock some caller of
    /// this client waits for through notifications).
    ///
    /// # Errors
    /// None.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads this client's state.
    pub async fn listening_channels(&self) -> usize {
        self.listener.listening().await
    }
}

distlock_sql::sql_backend!(PostgresBackend,
    kind: KIND,
    endpoint: common.endpoint,
    operator: ops,
{
    fn capabilities(&self) -> distlock_core::backend::Capabilities {
        match self.inner {
            Inner::Session(_) => session::capabilities(),
            Inner::Lease(_) => lease::capabilities(),
        }
    }

    /// Notifications are plain wake-ups (no grant travels in them: a woken waiter tries again
    /// with its own attempt), so one subscription per lock serves every waiting attempt.
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        if !self.listen {
            return Ok(Box::new(distlock_core::backend::NoWatch));
        }
        let chan = channel(lock_key(&self.common.namespace, &req.key.name));
        self.listener.watch(chan, &req.attempt).await
    }

});

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
