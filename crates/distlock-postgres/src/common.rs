//! What both modes share: connecting, the control connection, the schema, lock keys.

use crate::error::{map, timeout, KIND};
use distlock_core::{Error, LockKind, RenewOutcome, Result};
use sha2::{Digest, Sha256};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::{Client, Connection, Row, Socket};

pub(crate) type PgConnection = Connection<Socket, crate::tls::Stream>;

/// Connection settings and the shared control connection.
pub(crate) struct Common {
    pub(crate) config: tokio_postgres::Config,
    /// The TLS connector (with what its errors say about the settings).
    pub(crate) tls: crate::tls::Tls,
    pub(crate) endpoint: String,
    pub(crate) namespace: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
    /// `server_version_num` of the server seen at connect time.
    pub(crate) server_version: i32,
    /// Locked while a broken one is replaced (one reconnect at a time).
    control: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// A replacement control connection is being opened ([`Common::replace_control`]).
    replacing: AtomicBool,
}

impl Common {
    /// Connects the control connection and reads the server version.
    pub(crate) async fn connect(
        config: tokio_postgres::Config,
        tls: crate::tls::Tls,
        endpoint: String,
        namespace: String,
        opts: &distlock_core::ClientOptions,
    ) -> Result<Arc<Common>> {
        let mut common = Common {
            config,
            tls,
            endpoint,
            namespace,
            connect_timeout: opts.get_connect_timeout(),
            op_timeout: opts.get_op_timeout(),
            server_version: 0,
            control: tokio::sync::Mutex::new(None),
            replacing: AtomicBool::new(false),
        };
        let client = common.client(None).await.map(Arc::new)?;
        // Part of connecting: a cold server may need longer than one call's timeout.
        let (limit, what) = (common.setup_timeout(), "reading the server version");
        let sql = "SELECT current_setting('server_version_num')::int4";
        let row = common
            .within(limit, what, client.query_one(sql, &[]))
            .await?;
        (common.server_version,) = cols(&row, "server_version_num")?;
        *common.control.get_mut() = Some(client);
        Ok(Arc::new(common))
    }

    /// Time allowed for the statements of connecting (version, schema check and creation).
    pub(crate) fn setup_timeout(&self) -> Duration {
        self.op_timeout.max(self.connect_timeout)
    }

    /// True if the server has `idle_session_timeout` and `client_connection_check_interval`
    /// (PostgreSQL 14 and later).
    pub(crate) fn has_session_timeouts(&self) -> bool {
        self.server_version >= 140_000
    }

    /// Opens a new connection with `config` (the backend's if `None`, or a variant of it) and
    /// the backend's TLS settings; the caller drives the connection future.
    pub(crate) async fn open(
        &self,
        config: Option<&tokio_postgres::Config>,
    ) -> Result<(Client, PgConnection)> {
        let config = config.unwrap_or(&self.config);
        tokio::time::timeout(self.connect_timeout, config.connect(self.tls.connector()))
            .await
            .map_err(|_| timeout(&self.endpoint, "connecting", self.connect_timeout))?
            .map_err(|e| self.connect_error(e))
    }

    /// A failed connection attempt: TLS failures and a missing password explained, the rest
    /// as every driver error.
    fn connect_error(&self, e: tokio_postgres::Error) -> Error {
        if let Some(t) = self.tls.explain(&e) {
            return Error::connection(KIND, self.endpoint.clone(), t);
        }
        let mut chain = std::iter::successors(Some(&e as &dyn std::error::Error), |s| s.source());
        if e.as_db_error().is_none() && chain.any(|s| s.to_string().contains("password missing")) {
            return Error::auth(
                KIND,
                self.endpoint.clone(),
                "the server asks for a password and none was given: put it in the URL, \
                          in PostgresBuilder::password, in PGPASSWORD or in a password file \
                          (passfile=, PGPASSFILE or ~/.pgpass)",
            );
        }
        map(&self.endpoint, e)
    }

    /// Opens a new connection with `config` (the backend's if `None`) whose connection
    /// future runs in a task of its own until the client is dropped.
    pub(crate) async fn client(&self, config: Option<&tokio_postgres::Config>) -> Result<Client> {
        let (client, conn) = self.open(config).await?;
        let endpoint = self.endpoint.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%endpoint, error = %e, "postgres connection ended");
            }
        });
        Ok(client)
    }

    /// The shared control connection (for inspect, lease-mode statements, checks), reconnected
    /// when it broke.
    pub(crate) async fn control(&self) -> Result<Arc<Client>> {
        let mut slot = self.control.lock().await;
        match slot.as_ref().filter(|c| !c.is_closed()) {
            Some(c) => Ok(c.clone()),
            None => Ok(slot.insert(self.client(None).await.map(Arc::new)?).clone()),
        }
    }

    /// Runs one driver call with the per-call timeout, mapping its error.
    pub(crate) async fn run<T>(
        &self,
        what: &str,
        f: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        self.within(self.op_timeout, what, f).await
    }

    /// Runs one driver call with the time limit `limit`, mapping its error.
    pub(crate) async fn within<T>(
        &self,
        limit: Duration,
        what: &str,
        f: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        tokio::time::timeout(limit, f)
            .await
            .map_err(|_| timeout(&self.endpoint, what, limit))?
            .map_err(|e| map(&self.endpoint, e))
    }

    /// Runs `sql` with `params` on the control connection, with the per-call timeout. A call
    /// that gets no answer in time starts opening a replacement control connection in the
    /// background (see [`Common::replace_control`]).
    pub(crate) async fn query(
        self: &Arc<Self>,
        what: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>> {
        let client = self.control().await?;
        match tokio::time::timeout(self.op_timeout, client.query_typed(sql, params)).await {
            Ok(r) => r.map_err(|e| map(&self.endpoint, e)),
            Err(_) => {
                self.replace_control(&client);
                Err(timeout(&self.endpoint, what, self.op_timeout))
            }
        }
    }

    /// A call on control connection `client` got no answer in time: open a new connection in
    /// the background and, once it is up, make it the control connection (if `client` still
    /// is). A connection whose bytes are being lost (a partition, a peer gone without TCP
    /// noticing) would otherwise time out every later call, each queued behind the unanswered
    /// one, long after the network healed. The old connection is not closed: calls already
    /// on it run to their end (a slow server still executes a give-up queued there), and it
    /// closes when the last of them lets go of it. One replacement at a time; if it cannot
    /// connect (the server is as slow as the old connection), the old one stays.
    fn replace_control(self: &Arc<Self>, client: &Arc<Client>) {
        if self.replacing.swap(true, SeqCst) {
            return;
        }
        let (common, old) = (self.clone(), Arc::downgrade(client));
        tokio::spawn(async move {
            if let Ok(new) = common.client(None).await.map(Arc::new) {
                let mut slot = common.control.lock().await;
                let (c, old) = (slot.as_ref(), old.upgrade());
                if c.zip(old).is_some_and(|(c, old)| Arc::ptr_eq(c, &old)) {
                    tracing::debug!(endpoint = %common.endpoint, "postgres control connection replaced after a timeout");
                    *slot = Some(new);
                }
            }
            common.replacing.store(false, SeqCst);
        });
    }

    /// Creates dlock's tables if they are missing, and brings tables of an older version up to
    /// date (`columns`: the columns this version needs, which an older table lacks). Concurrent
    /// clients serialize on a transaction-level advisory lock, so the DDL cannot race.
    pub(crate) async fn ensure_schema(
        &self,
        tables: &[&str],
        columns: &[(&str, &str)],
        ddl: &str,
    ) -> Result<()> {
        let client = self.control().await?;
        let (col_tables, col_names): (Vec<&str>, Vec<&str>) = columns.iter().copied().unzip();
        let what = "checking dlock's tables";
        let row = self
            .within(
                self.setup_timeout(),
                what,
                client.query_one(
                    "SELECT (SELECT bool_and(to_regclass(t) IS NOT NULL) FROM unnest($1::text[]) AS t) \
                        AND (SELECT coalesce(bool_and(EXISTS ( \
                                 SELECT 1 FROM pg_attribute a \
                                 WHERE a.attrelid = to_regclass(x.t) AND a.attname = x.c \
                                   AND NOT a.attisdropped)), true) \
                             FROM unnest($2::text[], $3::text[]) AS x(t, c))",
                    &[&tables, &col_tables, &col_names],
                ),
            )
            .await?;
        if let (Some(true),) = cols::<(Option<bool>,)>(&row, what)? {
            return Ok(());
        }
        let script =
            format!("BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY}); {ddl} COMMIT;");
        let limit = self.setup_timeout().max(Duration::from_secs(10));
        let what = "creating dlock's tables";
        match self
            .within(limit, what, client.batch_execute(&script))
            .await
        {
            Err(Error::UnexpectedReply { message, .. }) => Err(Error::unexpected(
                KIND,
                format!(
                    "creating dlock's tables failed: {message}; create them beforehand \
                     with the SQL in docs/postgres.md"
                ),
            )),
            other => other,
        }
    }
}

/// A lease's time left from milliseconds as the server computes them (`NULL` or not finite:
/// none; a past end: zero).
pub(crate) fn lease_left(ms: Option<f64>) -> Option<Duration> {
    ms.filter(|m| m.is_finite())
        .map(|m| Duration::from_secs_f64(m.max(0.0) / 1000.0))
}

/// The side of a read-write lock a holder row of kind `kind` holds (`None`: another kind).
pub(crate) fn side(kind: &str) -> Option<LockKind> {
    match kind {
        "read" => Some(LockKind::Read),
        "write" => Some(LockKind::Write),
        _ => None,
    }
}

/// The first column of the first row, or an error naming `what`.
pub(crate) fn first<'a, T: FromSql<'a>>(what: &str, rows: &'a [Row]) -> Result<T> {
    one(rows, what).map(|(t,)| t)
}

/// The leading columns of the first row, typed as the tuple `T`, or an error naming `what`.
pub(crate) fn one<'a, T: Cols<'a>>(rows: &'a [Row], what: &str) -> Result<T> {
    let row = rows.first();
    cols(
        row.ok_or_else(|| crate::error::shape(what, "no row"))?,
        what,
    )
}

/// The leading columns of a row as a tuple ([`cols`]).
pub(crate) trait Cols<'a>: Sized {
    fn from_row(r: &'a Row, what: &str) -> Result<Self>;
}

macro_rules! cols {
    ($($t:ident $i:tt),+) => {
        impl<'a, $($t: FromSql<'a>),+> Cols<'a> for ($($t,)+) {
            fn from_row(r: &'a Row, what: &str) -> Result<Self> {
                Ok(($(r.try_get::<_, $t>($i).map_err(|e| crate::error::shape(what, e))?,)+))
            }
        }
    };
}
cols!(A 0);
cols!(A 0, B 1);
cols!(A 0, B 1, C 2);
cols!(A 0, B 1, C 2, D 3);
cols!(A 0, B 1, C 2, D 3, E 4);
cols!(A 0, B 1, C 2, D 3, E 4, F 5);
cols!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);

/// The leading columns of `r`, typed as the tuple `T`, or an error naming `what`.
pub(crate) fn cols<'a, T: Cols<'a>>(r: &'a Row, what: &str) -> Result<T> {
    T::from_row(r, what)
}

/// A statement parameter and the type it is sent as. Statements go through `query_typed`,
/// which needs no prepare round trip, so each value carries its PostgreSQL type: the one its
/// Rust type maps to ([`Typed`]), written with [`params!`].
pub(crate) type Param<'a> = (&'a (dyn ToSql + Sync), Type);

/// The PostgreSQL type a Rust value is sent as (tokio-postgres's own mapping, so a value is
/// never sent as a type its `ToSql` refuses).
pub(crate) trait Typed: ToSql + Sync {
    const TYPE: Type;
}

macro_rules! typed {
    ($($t:ty => $pg:ident),*) => { $(impl Typed for $t { const TYPE: Type = Type::$pg; })* };
}
typed!(&str => TEXT, String => TEXT, bool => BOOL, i32 => INT4, i64 => INT8, u32 => OID,
    f64 => FLOAT8, Vec<&str> => TEXT_ARRAY, Vec<String> => TEXT_ARRAY, Vec<i32> => INT4_ARRAY,
    Vec<i64> => INT8_ARRAY, Vec<f64> => FLOAT8_ARRAY);
impl<T: Typed> Typed for Option<T> {
    const TYPE: Type = T::TYPE;
}

/// `p` with its type.
pub(crate) fn param<T: Typed>(p: &T) -> Param<'_> {
    (p, T::TYPE)
}

/// The parameters `[a, b, …]` of a statement, each with its type ([`param`]).
macro_rules! params {
    ($($p:expr),* $(,)?) => { [$($crate::common::param(&$p)),*] };
}
pub(crate) use params;

/// A fencing token the server returned.
pub(crate) fn token_u64(t: i64) -> Result<u64> {
    u64::try_from(t).map_err(|_| crate::error::shape("fencing token", t))
}

/// A fencing token as the server stores it.
pub(crate) fn token_i64(t: u64) -> Result<i64> {
    i64::try_from(t).map_err(|_| Error::invalid(format!("fencing token {t} out of range")))
}

impl Common {
    /// Proclaims `value` (number `seq`) for election grant `grant` with a mode's statement
    /// `sql` ($1 ns, $2 name, $3 attempt, $4 token, $5 seq, $6 value, $7 the election's
    /// channel, then `extra`), on the control connection: a statement on the leader's
    /// session would restart its idle timer, which is the lease. `Renewed` while the grant
    /// leads (the first column), `NotHeld` otherwise.
    pub(crate) async fn proclaim(
        self: &Arc<Self>,
        sql: &str,
        grant: &distlock_core::GrantRef,
        (seq, value): (u64, &str),
        extra: &[Param<'_>],
    ) -> Result<RenewOutcome> {
        let (ns, name) = (self.namespace.as_str(), &*grant.key.name);
        let attempt = grant.attempt.as_str();
        let token = token_i64(grant.token)?;
        let seq = i64::try_from(seq)
            .map_err(|_| Error::invalid(format!("proclamation number {seq} out of range")))?;
        let chan = channel(election_key(ns, name));
        let mut params = params![ns, name, attempt, token, seq, value, chan].to_vec();
        params.extend_from_slice(extra);
        let rows = self.query("proclaiming", sql, &params).await?;
        Ok(match first("proclaiming", &rows)? {
            true => RenewOutcome::Renewed,
            false => RenewOutcome::NotHeld,
        })
    }
}

/// Advisory key taken (in a transaction) while creating the schema.
const SCHEMA_LOCK_KEY: i64 = 0x646c_6f63_6b5f_7363; // "dlock_sc"

/// The 64-bit advisory lock key of a lock: the first 8 bytes (big-endian, as a signed
/// integer) of SHA-256(namespace ‖ 0x00 ‖ name). Stable across versions and platforms.
pub fn lock_key(namespace: &str, name: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0u8]);
    h.update(name.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

/// The advisory key of election `name`: [`lock_key`] of the name followed by a NUL and
/// `election`. Lock names cannot contain NUL (nor any control character), so an election's
/// key is never the key of a lock, and the election never conflicts with the lock of the
/// same name. Its LISTEN/NOTIFY channel is [`channel`] of this key.
pub fn election_key(namespace: &str, name: &str) -> i64 {
    lock_key(namespace, &format!("{name}\u{0}election"))
}

/// The advisory key of `name`'s lock of `kind` (elections have their own).
pub(crate) fn key_of(namespace: &str, name: &str, kind: LockKind) -> i64 {
    match kind {
        LockKind::Election => election_key(namespace, name),
        _ => lock_key(namespace, name),
    }
}

/// How `pg_locks` shows a bigint advisory key: (classid, objid) = (high, low) 32 bits.
pub(crate) fn key_oids(key: i64) -> (u32, u32) {
    let k = key as u64;
    ((k >> 32) as u32, k as u32)
}

/// The LISTEN/NOTIFY channel of a lock key (an identifier of 22 characters).
pub fn channel(key: i64) -> String {
    format!("dlock_{:016x}", key as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable() {
        // Pinned: changing the mapping would let two versions of dlock hold one lock at once.
        assert_eq!(lock_key("dlock", "orders:42"), -5_424_855_129_482_396_810);
        assert_ne!(lock_key("dlock", "a"), lock_key("dlock", "b"));
        assert_ne!(lock_key("a", "b"), lock_key("ab", ""));
        let k = lock_key("dlock", "x");
        let (hi, lo) = key_oids(k);
        assert_eq!(((hi as u64) << 32 | lo as u64) as i64, k);
        assert_eq!(channel(k).len(), 22);
        assert_eq!(channel(-1), "dlock_ffffffffffffffff");
        // Pinned as the lock keys are; never the key of the lock of the same name.
        assert_ne!(election_key("dlock", "x"), lock_key("dlock", "x"));
        assert_eq!(
            key_of("dlock", "x", LockKind::Mutex),
            lock_key("dlock", "x")
        );
        assert_eq!(
            key_of("dlock", "x", LockKind::Election),
            election_key("dlock", "x")
        );
    }
}
