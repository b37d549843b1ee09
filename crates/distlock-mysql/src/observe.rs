//! Observing elections (both modes), woken by the server without polling; docs/election-sql.md,
//! "MySQL / MariaDB", "Observing", has the whole argument. An observer registers its own
//! connection (not pooled) in `dlock_election_observers` and runs rounds of
//! `SELECT 'dlock-observe <key>', IF(woken = 0, SLEEP(<round>), 2) FROM <its row>`; every
//! change of the election made through dlock, once committed and off the caller's path, sets
//! `woken = 1` and `KILL QUERY`s the registered connections whose statement in the processlist
//! is that election's dlock-observe (ids are reused after a restart: nothing else is ever
//! interrupted). Whether anybody observes is read in the change's own last statement.
//!
//! Nothing is missed: the waker sets `woken` before it reads the processlist, so a round started
//! before that read is interrupted (a `KILL QUERY` that lands before the `SLEEP` begins makes
//! it return at once) and one started after does not sleep; the observer clears its `woken`
//! before it reports the wake (so the caller's next read sees every change that set it). A
//! leader whose connection dies sends nothing: observers see it at its lease end or the next
//! grant.

use crate::common::{close, col, election_key, sql_str, Call, Common};
use crate::error::{timeout, INTERRUPTED, KIND, NOT_OWNER};
use distlock_core::backend::{ReleaseWatch, Wake};
use distlock_core::{async_trait, Error, LockKind, Result, RetryPolicy};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

/// How long one server-side wait lasts (a round that ends without a wake starts the next one;
/// a round's reply later than this plus the slow limit ends the watch with an error).
const ROUND: Duration = Duration::from_secs(120);

/// Warned once per process: KILL refused, observers only wake at lease ends.
static KILL_REFUSED: AtomicBool = AtomicBool::new(false);
/// Warned once per process: observers of another user cannot be seen, nor woken.
static HIDDEN_WARNED: AtomicBool = AtomicBool::new(false);

/// The database user of this connection, as SQL.
const ME: &str = "COALESCE((SELECT USER FROM information_schema.PROCESSLIST \
                  WHERE ID = CONNECTION_ID()), '')";

/// For a grant of `kind` on key `lk` (an election's): the statement storing the candidate's
/// `value` under the token in SQL variable `token`, proclamation number 0, if that is not NULL
/// (nothing for a lock). `ns` and `name` are SQL.
pub(crate) fn election_row(
    (kind, value): (LockKind, Option<&str>),
    lk: &str,
    (ns, name): (&str, &str),
    token: &str,
) -> String {
    if kind != LockKind::Election {
        return String::new();
    }
    let value = sql_str(value.unwrap_or(""));
    format!(
        "INSERT INTO dlock_elections (lock_key, ns, name, token, value, seq) \
         SELECT '{lk}', {ns}, {name}, {token}, {value}, 0 FROM DUAL WHERE {token} IS NOT NULL \
         ON DUPLICATE KEY UPDATE token = {token}, value = {value}, seq = 0; "
    )
}

/// For a change of key `lk` of `kind`: the column to read back after it telling whether
/// anybody observes an election (`, EXISTS(…)`, 0 or 1; nothing for a lock).
pub(crate) fn observed_col(kind: LockKind, lk: &str) -> String {
    match kind {
        LockKind::Election => {
            format!(", EXISTS(SELECT 1 FROM dlock_election_observers WHERE lock_key = '{lk}')")
        }
        _ => String::new(),
    }
}

/// Wakes election key `lk`'s observers in the background if column `i` of `row` (the
/// [`observed_col`] read back; a lock's row has none) says there are any (see the module docs).
pub(crate) fn wake_if(common: &Arc<Common>, lk: &str, row: &Row, i: usize) {
    let observed = row.get_opt::<Option<i64>, usize>(i).and_then(|v| v.ok());
    if observed.flatten().unwrap_or(0) > 0 {
        wake(common, lk);
    }
}

/// Proclaims `value` (number `seq`) for the grant of token `token` of election key `lk`, on a
/// pooled connection (never the leader's: a statement there would restart its
/// `wait_timeout`, which is the lease), in both modes: the value changes only if the grant
/// still leads and `seq` is new; `Renewed` while it leads, `NotHeld` otherwise; wakes the
/// election's observers if there are any. `holders` is the mode's table of grants (alias `h`)
/// and `leads` the condition that a row of it leads, with one `?` bound to `arg`.
pub(crate) async fn proclaim(
    common: &Arc<Common>,
    lk: String,
    (token, seq, value): (u64, u64, &str),
    (holders, leads, arg): (&str, &str, String),
) -> Result<distlock_core::RenewOutcome> {
    let update = format!(
        "UPDATE dlock_elections e JOIN {holders} h \
         ON h.lock_key = e.lock_key AND h.token = e.token \
         SET e.value = ?, e.seq = ? \
         WHERE e.lock_key = ? AND e.token = ? AND e.seq < ? AND {leads}"
    );
    let check = format!(
        "SELECT COUNT(*){} FROM {holders} h WHERE h.lock_key = ? AND h.token = ? AND {leads}",
        observed_col(LockKind::Election, &lk)
    );
    let (value, key) = (value.to_owned(), lk.clone());
    let leads: Option<(i64, i64)> = common
        .with_conn("proclaiming", move |c| {
            Box::pin(async move {
                let params = (value, seq, key.as_str(), token, seq, arg.as_str());
                c.exec_drop(update, params).await?;
                c.exec_first(check, (key.as_str(), token, arg.as_str()))
                    .await
            })
        })
        .await?;
    let Some((n, watched)) = leads else {
        return Err(crate::error::shape("proclaiming", "no row"));
    };
    if watched > 0 {
        wake(common, &lk);
    }
    Ok(crate::common::renewed(n > 0))
}

/// Wakes election key `lk`'s observers in the background, whoever they are.
pub(crate) fn wake(common: &Arc<Common>, lk: &str) {
    let (common, lk) = (common.clone(), lk.to_owned());
    tokio::spawn(async move {
        // A wake-up that fails (a lost connection, a deadlock with another waker) would be a
        // missed change for the observers: try again a few times.
        let retry = RetryPolicy::new(4, Duration::from_millis(50), Duration::from_secs(1));
        if let Err(e) = distlock_core::backoff::retry(retry, || wake_now(&common, &lk)).await {
            tracing::warn!(error = %e, "waking election observers failed; they see the change \
                           at the leader's lease end or the next change");
        }
    });
}

/// Flags election key `lk`'s observers, interrupts the SLEEP of each one running it, and
/// deletes the rows of this user's connections that are gone.
pub(crate) async fn wake_now(common: &Common, lk: &str) -> Result<()> {
    let sql = format!(
        "UPDATE dlock_election_observers SET woken = 1 WHERE lock_key = '{lk}'; \
         SELECT o.conn_id FROM dlock_election_observers o \
             JOIN information_schema.PROCESSLIST p ON p.ID = o.conn_id \
             WHERE o.lock_key = '{lk}' AND p.ID <> CONNECTION_ID() \
             AND p.INFO LIKE CONCAT('SELECT ''dlock-', 'observe {lk}''%'); \
         DELETE FROM dlock_election_observers WHERE lock_key = '{lk}' AND db_user = {ME} \
             AND conn_id NOT IN (SELECT ID FROM information_schema.PROCESSLIST); \
         SELECT COUNT(*) FROM dlock_election_observers WHERE lock_key = '{lk}' \
             AND db_user <> {ME} \
             AND conn_id NOT IN (SELECT ID FROM information_schema.PROCESSLIST)"
    );
    let sets = common.query("waking observers", sql).await?;
    let ids = sets.first().into_iter().flatten();
    let ids: Vec<u64> = ids
        .map(|r| col("observer connection", r, 0))
        .collect::<Result<_>>()?;
    let hidden: i64 = match sets.get(1).and_then(|rows| rows.first()) {
        Some(r) => col("observers of other users", r, 0)?,
        None => 0,
    };
    if hidden > 0 && !HIDDEN_WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            election_key = lk,
            "observers of another database user are not in this user's processlist: they are \
             only woken at lease ends; grant PROCESS and CONNECTION_ADMIN, or observe as the \
             same user"
        );
    }
    for id in ids {
        let refused = common.kill("waking an observer", "KILL QUERY", id).await?;
        if let Some(s) = refused.filter(|s| s.code == NOT_OWNER) {
            if !KILL_REFUSED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    conn_id = id,
                    error = %s.message,
                    "KILL QUERY refused: observers of other users are only woken at lease \
                     ends; run them as the same user or grant CONNECTION_ADMIN"
                );
            }
        }
    }
    Ok(())
}

/// Starts watching election `name` (see the module docs).
pub(crate) async fn observe(common: &Arc<Common>, name: &str) -> Result<Box<dyn ReleaseWatch>> {
    let lk = election_key(&common.namespace, name);
    let mut conn = common.take().await?;
    let cancel = CancellationToken::new();
    let (tx, rx) = mpsc::channel(1);
    let task = Watcher {
        common: common.clone(),
        register: register_sql(common, &lk, name),
        lk,
        tx,
        cancel: cancel.clone(),
    };
    if let Err(e) = task.reset(&mut conn, "registering the observer").await {
        close(conn);
        return Err(e);
    }
    tokio::spawn(task.run(conn));
    Ok(Box::new(ObserveWatch {
        rx,
        endpoint: common.endpoint.clone(),
        _stop: cancel.drop_guard(),
    }))
}

/// Registers (or clears the flag of) the connection's row.
fn register_sql(common: &Common, lk: &str, name: &str) -> String {
    let ns = sql_str(&common.namespace);
    let name = sql_str(name);
    format!(
        "INSERT INTO dlock_election_observers \
         (lock_key, conn_id, ns, name, db_user, woken, registered_at) \
         VALUES ('{lk}', CONNECTION_ID(), {ns}, {name}, {ME}, 0, UTC_TIMESTAMP(6)) \
         ON DUPLICATE KEY UPDATE woken = 0"
    )
}

/// The watch handed to the core: wakes come from the watcher task.
struct ObserveWatch {
    rx: mpsc::Receiver<Result<()>>,
    endpoint: String,
    /// Dropping the watch stops the watcher (which deregisters and closes its connection).
    _stop: DropGuard,
}

#[async_trait]
impl ReleaseWatch for ObserveWatch {
    async fn changed(&mut self) -> Result<Wake> {
        let ended = "the election observer's connection ended";
        let next = self.rx.recv().await;
        let next =
            next.unwrap_or_else(|| Err(Error::connection(KIND, self.endpoint.clone(), ended)));
        next.map(|()| Wake::Released)
    }
}

/// The task owning an observer's connection.
struct Watcher {
    common: Arc<Common>,
    lk: String,
    register: String,
    tx: mpsc::Sender<Result<()>>,
    cancel: CancellationToken,
}

impl Watcher {
    async fn run(self, mut conn: Conn) {
        let id = conn.id();
        let end = self.cancel.run_until_cancelled(self.rounds(&mut conn));
        let end = end.await.and_then(Result::err);
        // The statement in flight (if any) is abandoned: the connection is never reused.
        close(conn);
        // Best effort, retried a few times (every step is idempotent): a statement that timed
        // out on a loaded server leaves the row to the stale-observer sweep.
        let retry = RetryPolicy::new(3, Duration::from_millis(100), Duration::from_secs(1));
        let r = distlock_core::backoff::retry(retry, || self.deregister(id)).await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "deregistering an election observer failed");
        }
        if let Some(e) = end {
            let _ = self.tx.send(Err(e)).await;
        }
    }

    /// Rounds of waiting until the watch is dropped (`Ok`) or fails.
    async fn rounds(&self, conn: &mut Conn) -> Result<()> {
        loop {
            if !self.round(conn).await? {
                continue;
            }
            // Clear the flag (or register again) before reporting: see the module docs.
            self.reset(conn, "observing").await?;
            match self.tx.try_send(Ok(())) {
                // Full: a wake is already pending, which covers this one.
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
            }
        }
    }

    /// Forgets the observer of connection `id` (closed by the caller): ends its session on
    /// the server (which stops its SLEEP), waits until the session is gone (bounded by the
    /// slow limit: it ends at its next check for the kill, moments later), and only then
    /// deletes its row. A statement the connection sent before it was closed — a registration
    /// after a wake-up, in flight when the watch was dropped — still runs until the session
    /// ends: deleted earlier, the row would come back, naming a dead connection.
    async fn deregister(&self, id: u32) -> Result<()> {
        let what = "ending the observer's session";
        // Gone already; or the id is another user's session now (ids start over when the
        // server restarts), so this one is gone too.
        if self.common.kill(what, "KILL", id.into()).await?.is_none() {
            let (limit, started) = (self.common.slow_limit(), tokio::time::Instant::now());
            let sql = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?";
            let alive = || self.common.with_conn(what, |c| c.exec_first(sql, (id,)));
            while alive().await?.unwrap_or(0i64) > 0 {
                if started.elapsed() >= limit {
                    return Err(timeout(&self.common.endpoint, what, limit));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let lk = &self.lk;
        let sql = format!(
            "DELETE FROM dlock_election_observers WHERE lock_key = '{lk}' AND conn_id = {id}"
        );
        let what = "deregistering the observer";
        self.common.with_conn(what, |c| c.query_drop(sql)).await
    }

    /// One server-side wait: `false` if it slept the whole round (nothing happened), `true`
    /// if it was interrupted or flagged, or its row is gone (deleted by someone: registered
    /// again by the reset that follows).
    async fn round(&self, conn: &mut Conn) -> Result<bool> {
        let lk = &self.lk;
        let sql = format!(
            "SELECT 'dlock-observe {lk}', IF(woken = 0, SLEEP({}), 2) \
             FROM dlock_election_observers WHERE lock_key = '{lk}' AND conn_id = CONNECTION_ID()",
            ROUND.as_secs()
        );
        let limit = ROUND + self.common.slow_limit();
        match tokio::time::timeout(limit, conn.query_first::<Row, _>(sql)).await {
            Err(_) => Err(timeout(&self.common.endpoint, "observing", limit)),
            Ok(Ok(None)) => Ok(true),
            Ok(Ok(Some(row))) => match col::<Option<i64>>("observing", &row, 1)? {
                Some(v) => Ok(v != 0),
                None => Err(crate::error::shape("observing", "NULL")),
            },
            Ok(Err(mysql_async::Error::Server(s))) if s.code == INTERRUPTED => Ok(true),
            Ok(Err(e)) => Err(self.common.failed(e)),
        }
    }

    /// Registers the connection, or clears its flag (registering it again if its row is
    /// gone). A `KILL QUERY` meant for the round may land here: the statement is then run
    /// again.
    async fn reset(&self, conn: &mut Conn, what: &str) -> Result<()> {
        for _ in 0..8 {
            let c = self
                .common
                .call(conn.query_drop(self.register.clone()))
                .await;
            match c {
                Call::Ok(()) => return Ok(()),
                Call::Err(mysql_async::Error::Server(s)) if s.code == INTERRUPTED => continue,
                other => return Err(self.common.error(what, other)),
            }
        }
        Err(crate::error::shape(
            "observing",
            "the observer's statements keep being interrupted",
        ))
    }
}
