//! What both modes share: connections (a small pool of idle ones), the schema, lock keys.

use crate::error::{conn_dead, map, timeout, KIND, NOT_OWNER, NO_SUCH_THREAD};
use distlock_core::backend::Capabilities;
use distlock_core::{ClientOptions, Error, HolderInfo, LockInfo, LockKind, RenewOutcome, Result};
use distlock_sql::lease::{secs_ceil, with_grace};
use distlock_sql::IdlePool;
use futures_util::future::BoxFuture;
use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::DriverError::NoClientSslFlagFromServer;
use mysql_async::{Conn, Row, ServerError};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Idle connections kept for control statements and the next holder.
const POOL_MAX: usize = 8;

/// How many times `inspect` reads a key's rows again while its server lock has no holder row.
const GHOST_REREADS: u32 = 3;

/// The server clock in microseconds since the Unix epoch (UTC, so no time zone or daylight
/// saving change moves it), as SQL: the floor of every fencing token.
pub(crate) const CLOCK_US: &str =
    "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// The next fencing token after the counter `last` (an SQL expression), as SQL: above it,
/// and at least the server clock in microseconds. A counter set back (a restore, a crash that
/// lost the last commits, a failover to a replica that missed them) so never hands out a token
/// again, as long as the clock of the server that draws it is not behind the one that drew
/// the lost tokens by as much as the time between the two.
pub(crate) fn next_token(last: &str) -> String {
    format!("GREATEST({last} + 1, {CLOCK_US})")
}

/// A fencing token read back (`None` or 0: a reply of the wrong shape).
pub(crate) fn token(t: Option<u64>) -> Result<u64> {
    t.filter(|t| *t > 0)
        .ok_or_else(|| crate::error::shape("fencing token", format!("{t:?}")))
}

/// What a driver call returns.
pub(crate) type Driver<T> = std::result::Result<T, mysql_async::Error>;
/// The rows of each result set of a multi-statement query ([`query_sets`]).
pub(crate) type Sets = Vec<Vec<Row>>;

/// How one driver call ended.
pub(crate) enum Call<T> {
    Ok(T),
    Err(mysql_async::Error),
    /// No answer within this limit.
    Timeout(Duration),
}

/// How connections are opened: the driver's options, and for `ssl-mode=PREFERRED` the same
/// without TLS for a server that has none.
pub(crate) struct Connector {
    pub(crate) opts: mysql_async::Opts,
    pub(crate) plain_fallback: Option<mysql_async::Opts>,
    pub(crate) tls: crate::TlsOptions,
}

pub(crate) struct Common {
    pub(crate) connector: Connector,
    /// `PREFERRED` found the server without TLS: open unencrypted from now on.
    plain_only: AtomicBool,
    pub(crate) endpoint: String,
    pub(crate) namespace: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
    /// Connections that hold no lock, kept for later.
    pub(crate) idle: IdlePool<Conn>,
}

impl Common {
    pub(crate) fn new(connector: Connector, namespace: String, opts: &ClientOptions) -> Self {
        Common {
            endpoint: endpoint(&connector.opts),
            connector,
            plain_only: AtomicBool::new(false),
            namespace,
            connect_timeout: opts.get_connect_timeout(),
            op_timeout: opts.get_op_timeout(),
            idle: IdlePool::new(POOL_MAX),
        }
    }

    /// The TLS mode (for the application's own options: `REQUIRED` if they encrypt without
    /// checking, `VERIFY_IDENTITY` if they check).
    pub(crate) fn tls_mode(&self) -> crate::SslMode {
        if self.plain_only.load(Ordering::Relaxed) {
            return crate::SslMode::Prefer;
        }
        self.connector.tls.mode()
    }

    pub(crate) async fn open(&self) -> Result<Conn> {
        let plain = self.connector.plain_fallback.as_ref();
        let plain_only = self.plain_only.load(Ordering::Relaxed);
        let opts = plain.filter(|_| plain_only).unwrap_or(&self.connector.opts);
        let open = async {
            match (Conn::new(opts.clone()).await, plain) {
                (Err(mysql_async::Error::Driver(NoClientSslFlagFromServer)), Some(plain)) => {
                    tracing::info!(
                        endpoint = %self.endpoint,
                        "the server has no TLS: ssl-mode=PREFERRED goes on unencrypted"
                    );
                    self.plain_only.store(true, Ordering::Relaxed);
                    Conn::new(plain.clone()).await
                }
                (r, _) => r,
            }
        };
        let r = tokio::time::timeout(self.connect_timeout, open).await;
        let r = r.map_err(|_| timeout(&self.endpoint, "connecting", self.connect_timeout))?;
        r.map_err(|e| self.open_error(e))
    }

    /// The error of a failed connect: a [`crate::TlsError`] for TLS failures, a hint about
    /// accounts that require TLS on refused credentials.
    fn open_error(&self, e: mysql_async::Error) -> Error {
        if let Some(t) = self.connector.tls.explain(&e) {
            return Error::connection(KIND, self.endpoint.clone(), t);
        }
        let mut e = map(&self.endpoint, e);
        if let Error::Auth { message, .. } = &mut e {
            #[cfg(feature = "tls")]
            let cert =
                (self.connector.opts.ssl_opts()).is_some_and(|s| s.client_identity().is_some());
            #[cfg(not(feature = "tls"))]
            let cert = false;
            if !cert && !message.contains("ssl-mode") {
                message.push_str(
                    "; an account that REQUIREs SSL needs ssl-mode=REQUIRED or stricter, one \
                     that REQUIREs X509 also ssl-cert=PATH&ssl-key=PATH",
                );
            }
        }
        e
    }

    /// An idle connection, or a new one.
    pub(crate) async fn take(&self) -> Result<Conn> {
        match self.idle.take() {
            Some(c) => Ok(c),
            None => self.open().await,
        }
    }

    /// How long work that must not be cut short by a caller's timeout (a request whose reply is
    /// late: its outcome decides who holds the lock) waits for the server before it gives up
    /// and closes the connection.
    pub(crate) fn slow_limit(&self) -> Duration {
        (self.op_timeout * 4).max(Duration::from_secs(2))
    }

    /// Runs one driver call with the long timeout of [`Common::slow_limit`].
    pub(crate) async fn slow_call<T>(&self, f: impl Future<Output = Driver<T>>) -> Call<T> {
        within(self.slow_limit(), f).await
    }

    /// Runs one driver call with the per-call timeout.
    pub(crate) async fn call<T>(&self, f: impl Future<Output = Driver<T>>) -> Call<T> {
        within(self.op_timeout, f).await
    }

    pub(crate) fn result<T>(&self, what: &str, c: Call<T>) -> Result<T> {
        match c {
            Call::Ok(v) => Ok(v),
            other => Err(self.error(what, other)),
        }
    }

    /// The error of a call that did not succeed.
    pub(crate) fn error<T>(&self, what: &str, c: Call<T>) -> Error {
        match c {
            Call::Ok(_) => crate::error::shape(what, "a success where a failure was expected"),
            Call::Err(e) => self.failed(e),
            Call::Timeout(limit) => timeout(&self.endpoint, what, limit),
        }
    }

    /// The error of a failed driver call; the idle connections are dropped too if the server
    /// went away (a restart, a failover takes them with it).
    pub(crate) fn failed(&self, e: mysql_async::Error) -> Error {
        if conn_dead(&e) {
            self.idle.clear();
        }
        map(&self.endpoint, e)
    }

    /// Whether a connection that made call `c` may be used again.
    pub(crate) fn reusable<T>(c: &Call<T>) -> bool {
        match c {
            Call::Ok(_) => true,
            Call::Err(e) => !conn_dead(e) && matches!(e, mysql_async::Error::Server(_)),
            Call::Timeout(_) => false,
        }
    }

    /// Runs `f` on a pooled connection (control statements: no lock is left on it), e.g.
    /// `|c| c.exec_first(sql, params)`.
    pub(crate) async fn with_conn<T, F>(&self, what: &str, f: F) -> Result<T>
    where
        F: for<'c> FnOnce(&'c mut Conn) -> BoxFuture<'c, Driver<T>>,
    {
        let mut conn = self.take().await?;
        let c = self.call(f(&mut conn)).await;
        // A dead server (restart, failover) takes the other idle connections with it.
        self.dispose(conn, &c, true);
        self.result(what, c)
    }

    /// Runs one multi-statement query (see [`query_sets`]) on a pooled connection. A
    /// connection whose query did not succeed is closed: it may be inside an open transaction,
    /// or its reply still on the way; the server rolls back what it had not committed.
    pub(crate) async fn query(&self, what: &str, sql: String) -> Result<Sets> {
        let mut conn = self.take().await?;
        let c = self.call(query_sets(&mut conn, sql)).await;
        self.dispose(conn, &c, false);
        self.result(what, c)
    }

    /// Disposes of a connection after call `c` on it: kept if it succeeded, or (`refused_ok`)
    /// if the server merely refused the statement; closed otherwise (a failed statement may
    /// leave a transaction open with its row locks, or a session setting half-reset: closing
    /// the connection undoes both, and frees whatever lock it held), and the idle ones dropped
    /// too if the server went away.
    pub(crate) fn dispose<T>(&self, conn: Conn, c: &Call<T>, refused_ok: bool) {
        if matches!(c, Call::Ok(_)) || (refused_ok && Self::reusable(c)) {
            self.idle.put(conn);
        } else {
            if matches!(c, Call::Err(e) if conn_dead(e)) {
                self.idle.clear();
            }
            close(conn);
        }
    }

    /// Creates dlock's tables if they are missing.
    pub(crate) async fn ensure_schema(&self, ddl: &'static [&'static str]) -> Result<()> {
        // Part of connecting: a cold server may need longer than one call's timeout.
        let limit = self
            .op_timeout
            .max(self.connect_timeout)
            .max(Duration::from_secs(10));
        let mut conn = self.take().await?;
        for stmt in ddl {
            let c = within(limit, conn.query_drop(*stmt)).await;
            let mut r = self.result("creating dlock's tables", c);
            if let Err(Error::UnexpectedReply { message, .. }) = &mut r {
                *message = format!(
                    "creating dlock's tables failed: {message}; create them beforehand with the \
                     SQL in docs/mysql.md"
                );
            }
            r?;
        }
        self.idle.put(conn);
        Ok(())
    }

    /// `inspect` of key `lk` (`name`'s lock of `kind`), in both modes: the live rows of the
    /// mode's table of `holders` (alias `h`; `live` the condition that a row counts), each with
    /// the value stored with its token (an election's leader: the first, its token the one
    /// reported), and the fencing counter. If `used` and no row counts, the connection holding
    /// the key's `GET_LOCK` is reported too.
    pub(crate) async fn inspect(
        &self,
        (name, kind, lk): (&str, LockKind, String),
        (holders, live): (&str, &str),
        used: bool,
    ) -> Result<LockInfo> {
        let sql = format!(
            "SELECT h.owner, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), h.expires_at), \
             e.value, h.token FROM {holders} h LEFT JOIN dlock_elections e \
             ON e.lock_key = h.lock_key AND e.token = h.token WHERE h.lock_key = ? AND {live}"
        );
        type Holder = (String, Option<i64>, Option<String>, u64);
        let (mut rows, token, unnamed) = self
            .with_conn("inspecting", move |c| {
                Box::pin(async move {
                    // A server lock without a holder row: a grant between its `GET_LOCK` and
                    // its row, or one being given back (a cancelled waiter's that raced with
                    // the release). Held all the same, so it is reported; as both last
                    // milliseconds, the rows are read again a few times first, so that a
                    // watcher of an election rarely sees such a nameless leader.
                    let mut round = 0;
                    let (rows, by) = loop {
                        let rows: Vec<Holder> = c.exec(&sql, (lk.as_str(),)).await?;
                        let by: Option<Option<u64>> = match rows.is_empty() && used {
                            true => c.exec_first("SELECT IS_USED_LOCK(?)", (&lk,)).await?,
                            false => None,
                        };
                        let by = by.flatten();
                        if by.is_none() || round == GHOST_REREADS {
                            break (rows, by);
                        }
                        round += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    };
                    let token: Option<u64> = c
                        .exec_first("SELECT token FROM dlock_fence WHERE lock_key = ?", (&lk,))
                        .await?;
                    Ok((rows, token, by))
                })
            })
            .await?;
        let mut info = LockInfo::new(name).with_fencing_token(token.unwrap_or(0));
        let election = kind == LockKind::Election;
        if election {
            rows.truncate(1);
        }
        for (owner, us, value, token) in rows {
            if election {
                info.fencing_token = token;
            }
            let value = election.then(|| value.unwrap_or_default());
            info.holders.push(holder(owner, us).with_value(value));
        }
        if let Some(conn) = unnamed {
            let what = format!("(connection {conn}, being granted or given back)");
            info.holders.push(HolderInfo::new(what, 1));
        }
        Ok(info)
    }

    /// The connection holding key `lk`'s `GET_LOCK` now, if any.
    pub(crate) async fn used_by(&self, lk: &str) -> Result<Option<u64>> {
        let (sql, lk) = ("SELECT IS_USED_LOCK(?)", lk.to_owned());
        let id: Option<Option<u64>> = self
            .with_conn("finding the holder", |c| c.exec_first(sql, (lk,)))
            .await?;
        Ok(id.flatten())
    }

    /// Runs `kill` (`KILL` ends session `id`, `KILL QUERY` stops its statement). `Some` of
    /// the server's refusal when the session is gone already (`NO_SUCH_THREAD`) or another
    /// user's that this one may not end (`NOT_OWNER`).
    pub(crate) async fn kill(
        &self,
        what: &str,
        kill: &str,
        id: u64,
    ) -> Result<Option<ServerError>> {
        let sql = format!("{kill} {id}");
        self.with_conn(what, move |c| {
            Box::pin(async move {
                match c.query_drop(sql).await {
                    Ok(()) => Ok(None),
                    Err(mysql_async::Error::Server(s))
                        if s.code == NO_SUCH_THREAD || s.code == NOT_OWNER =>
                    {
                        Ok(Some(s))
                    }
                    Err(e) => Err(e),
                }
            })
        })
        .await
    }
}

/// The server's `host:port` in `opts`.
pub(crate) fn endpoint(opts: &mysql_async::Opts) -> String {
    format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port())
}

/// Runs one driver call with the timeout `limit`.
async fn within<T>(limit: Duration, f: impl Future<Output = Driver<T>>) -> Call<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Call::Ok(v),
        Ok(Err(e)) => Call::Err(e),
        Err(_) => Call::Timeout(limit),
    }
}

/// Closes a connection now, whatever state its protocol is in (a call on it timed out, so a
/// reply may still be on its way and the connection must never be used again). The socket
/// closes before this returns: the server ends the session — rolling back its transaction and
/// freeing its `GET_LOCK` — as soon as it sees that, instead of whenever a polite disconnect
/// (which first waits for the pending reply) would get through.
pub(crate) fn close(conn: Conn) {
    use futures_util::FutureExt;
    // One poll marks the connection disconnected and queues `COM_QUIT` if the socket takes
    // it; dropping the future then drops the connection with its socket.
    let _ = conn.disconnect().now_or_never();
}

/// Runs a text query of several statements and returns the rows of each result set that has
/// columns (statements without a result set, like `SET` or `UPDATE`, give none).
///
/// A statement after the first that fails (a deadlock, a lock wait timeout, a `KILL QUERY`)
/// ends the query with its error, like a failing first statement: the server runs none of the
/// statements after it. The driver keeps such an error as the query's next "result" and
/// reports the query as exhausted (`is_empty`) before it, so it is read out explicitly here;
/// otherwise the caller would get the result sets before the failure as a success, and the
/// error would surface on whatever statement the connection runs next.
pub(crate) async fn query_sets(conn: &mut Conn, sql: String) -> Driver<Sets> {
    let mut r = conn.query_iter(sql).await?;
    let mut out = Vec::new();
    // Bounded: a query of ours has a handful of statements.
    for _ in 0..256 {
        if r.is_empty() {
            break;
        }
        let has_columns = !r.columns_ref().is_empty();
        let rows: Vec<Row> = r.collect().await?;
        if has_columns {
            out.push(rows);
        }
    }
    // The error of a failed later statement, if any (and anything left unread).
    r.drop_result().await?;
    Ok(out)
}

/// The first row of the last result set of `sets`.
pub(crate) fn last_row<'a>(what: &str, sets: &'a [Vec<Row>]) -> Result<&'a Row> {
    sets.last()
        .and_then(|rows| rows.first())
        .ok_or_else(|| crate::error::shape(what, "no row"))
}

/// Column `i` of `row` as a `T` (NULL is `None` when `T` is an `Option`).
pub(crate) fn col<T: FromValue>(what: &str, row: &Row, i: usize) -> Result<T> {
    match row.get_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(crate::error::shape(what, format!("column {i}: {e}"))),
        None => Err(crate::error::shape(what, format!("no column {i}"))),
    }
}

/// A string as an SQL expression that cannot break out of its quotes: a hex literal converted
/// to utf8mb4. Multi-statement text queries (one round trip, so that a late reply belongs to
/// one request that happened entirely or not at all) cannot take parameters.
pub(crate) fn sql_str(s: &str) -> String {
    match s.is_empty() {
        true => "CONVERT('' USING utf8mb4)".to_owned(),
        false => format!("CONVERT(X'{}' USING utf8mb4)", hex(s.as_bytes())),
    }
}

/// `bytes` as lowercase hex digits.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attempt id, quoted for SQL. The core makes them of hex digits; anything else (an id
/// made by hand) is refused rather than inlined.
pub(crate) fn sql_attempt(id: &distlock_core::AttemptId) -> Result<String> {
    let s = id.as_str();
    if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Error::invalid(format!(
            "attempt id `{s}` is not 1 to 64 ASCII letters and digits"
        )));
    }
    Ok(format!("'{s}'"))
}

/// The lock's key: `dlock:` and 32 lowercase hex digits, the first 128 bits of
/// SHA-256(namespace ‖ 0x00 ‖ name). It is the `GET_LOCK` name (at most 64 characters, and
/// case-insensitive on the server, which lowercase hex makes harmless) and the primary key of
/// dlock's tables. Stable across versions and platforms.
pub fn lock_key(namespace: &str, name: &str) -> String {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0u8]);
    h.update(name.as_bytes());
    format!("dlock:{}", hex(&h.finalize()[..16]))
}

/// Both modes do mutexes and elections (a lock of the election's own key, its value in
/// `dlock_elections`), no other kind (`GET_LOCK` has no shared mode; the lock rows follow it).
pub(crate) fn capabilities() -> Capabilities {
    Capabilities::kinds(&[LockKind::Mutex, LockKind::Election])
        .note("MySQL/MariaDB do mutexes and elections only")
}

/// The `GET_LOCK` key of election `name`: [`lock_key`] of the name followed by a NUL and
/// `election`. Lock names cannot contain NUL (nor any control character), so an election's
/// key is never the key of a lock: the election never conflicts with the lock of the same
/// name, and has its own fencing counter and holder row.
pub fn election_key(namespace: &str, name: &str) -> String {
    lock_key(namespace, &format!("{name}\u{0}election"))
}

/// The `GET_LOCK` key of `name`'s lock of `kind`.
pub(crate) fn key_of(namespace: &str, name: &str, kind: LockKind) -> String {
    match kind {
        LockKind::Election => election_key(namespace, name),
        _ => lock_key(namespace, name),
    }
}

/// A holder of one grant (re-entry is counted in the holder's client) whose lease has
/// `left_us` microseconds left (`None`: unknown; a past end: zero).
pub(crate) fn holder(owner: String, left_us: Option<i64>) -> HolderInfo {
    HolderInfo::new(owner, 1)
        .with_lease_left(left_us.map(|us| Duration::from_micros(us.max(0) as u64)))
}

/// `Renewed` if `held`, `NotHeld` otherwise.
pub(crate) fn renewed(held: bool) -> RenewOutcome {
    match held {
        true => RenewOutcome::Renewed,
        false => RenewOutcome::NotHeld,
    }
}

/// `wait_timeout` (whole seconds, rounded up, 1 s to 365 days) for a lease of `d`, plus its
/// grace ([`distlock_sql::lease::grace`]).
pub(crate) fn wait_timeout_secs(d: Duration) -> u64 {
    secs_ceil(with_grace(d)).clamp(1, 31_536_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        // Pinned: changing the mapping would let two versions of dlock hold one lock at once.
        let k = lock_key("dlock", "orders:42");
        assert_eq!(k, "dlock:b4b70b00793efb76a3ae735d3d36bc89");
        assert_eq!(k.len(), 38);
        assert!(k.starts_with("dlock:"));
        assert!(k[6..]
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(lock_key("dlock", "a"), lock_key("dlock", "A"));
        assert_ne!(lock_key("a", "b"), lock_key("ab", ""));
        assert_eq!(wait_timeout_secs(Duration::from_millis(300)), 1);
        assert_eq!(wait_timeout_secs(Duration::from_millis(1000)), 2);
        assert_eq!(wait_timeout_secs(Duration::from_millis(2000)), 3);
        assert_eq!(wait_timeout_secs(Duration::from_secs(30)), 35);
    }

    #[test]
    fn inlined_values_cannot_break_out() {
        assert_eq!(sql_str("a'b"), "CONVERT(X'612762' USING utf8mb4)");
        assert_eq!(sql_str(""), "CONVERT('' USING utf8mb4)");
        assert_eq!(sql_str("π"), "CONVERT(X'cf80' USING utf8mb4)");
        let id = distlock_core::AttemptId::new();
        assert_eq!(sql_attempt(&id).expect("hex id"), format!("'{id}'"));
        for bad in ["", "a'b", "a b", &"a".repeat(65)] {
            assert!(
                sql_attempt(&distlock_core::AttemptId::from_server(bad)).is_err(),
                "{bad}"
            );
        }
    }
}
