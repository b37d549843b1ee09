#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod common;
mod error;
mod ops;
mod session;
mod table;

pub use common::lock_key;

use crate::common::Common;
use crate::error::KIND;
use distlock_core::conn::ConnectionString;
use distlock_core::{AcquireRequest, ClientOptions, ReleaseWatch, Result};
use std::sync::Arc;

/// How locks are kept on the server (`?mode=` in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
    distlock_core::conn::redact(url)
}

#[derive(Debug)]
struct Parsed {
    opts: mysql_async::Opts,
    endpoint: String,
    mode: Mode,
    namespace: Option<String>,
}

fn parse_url(url: &str) -> Result<Parsed> {
    let cs = ConnectionString::parse(url)?;
    if cs.scheme() != "mysql" {
        return Err(cs.invalid(format!("scheme `{}` is not mysql://", cs.scheme())));
    }
    if cs.hosts().is_empty() {
        return Err(cs.invalid("no host; write mysql://user:password@host:port/database"));
    }
    if cs.user().is_none_or(str::is_empty) {
        return Err(cs.invalid("no user; write mysql://user:password@host:port/database"));
    }
    let distlock_sql::url::Params {
        mode, namespace, ..
    } = distlock_sql::url::params(
        &cs,
        &[("session", Mode::Session), ("table", Mode::Table)],
        "mode=session (GET_LOCK, the default) or mode=table (lock rows, for clusters)",
    )?;
    let prefer_socket = cs.bool("prefer_socket")?.unwrap_or(false);
    let driver = distlock_sql::url::driver_url(&cs, &["mode", "namespace"]);
    let opts = mysql_async::Opts::from_url(&driver).map_err(|e| cs.invalid(e.to_string()))?;
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
    /// they are missing (table mode: adds the columns an older table lacks).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) (the URL redacted) for a URL
    /// this backend cannot use; `Connection` when the server cannot be reached within the
    /// connect timeout; `Auth` for refused credentials or missing privileges;
    /// `UnexpectedReply` when creating the tables fails.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes the connections it opened; `CREATE TABLE IF
    /// NOT EXISTS` runs again on the next connect.
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
            Mode::Session => Inner::Session(session::new_mode(common.clone())),
            Mode::Table => {
                common.ensure_schema(table::DDL).await?;
                let t = table::TableMode::new(common.clone());
                t.migrate().await?;
                Inner::Table(t)
            }
        };
        Ok(MysqlBackend { common, inner })
    }

    /// The operations of the mode in use.
    fn ops(&self) -> &dyn distlock_sql::ModeOps {
        match &self.inner {
            Inner::Session(s) => s,
            Inner::Table(t) => t,
        }
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
    ///
    /// # Errors
    /// None: `None` when no grant matches.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads this client's state (waiting at most the op timeout for a
    /// request of the attempt that is running).
    pub async fn holder_connection(&self, name: &str, owner: &str) -> Option<u32> {
        match &self.inner {
            Inner::Session(s) => session::holder_connection(s, name, owner).await,
            Inner::Table(_) => None,
        }
    }
}

distlock_sql::sql_backend!(MysqlBackend,
    kind: KIND,
    endpoint: common.endpoint,
    operator: ops,
{
    fn capabilities(&self) -> distlock_core::backend::Capabilities {
        common::capabilities()
    }

    /// MySQL has no notifications: the watch never fires, and waiters (table mode) wake at
    /// the holder's lease end or their heartbeat. Session mode waits on the server instead.
    async fn watch(&self, _req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        Ok(Box::new(distlock_core::backend::NoWatch))
    }

});

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
