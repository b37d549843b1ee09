//! Fenced PostgreSQL transactions over your own tokio-postgres connection.
//!
//! The fences live in one table (default `dlock_write_fences`), one row per resource:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS dlock_write_fences (
//!     resource text PRIMARY KEY,
//!     token numeric(20) NOT NULL,  -- u64: above bigint's range
//!     seq numeric(20) NOT NULL
//! );
//! ```
//!
//! [`PgFence::admit`] checks and raises the resource's fence with one upsert inside your
//! transaction; the upsert's row lock is held until the transaction ends, so a concurrent
//! fenced transaction on the same resource waits, and the check, the fence and your writes
//! commit together or not at all. [`PgFence::execute`] does it for one statement: the upsert
//! and your statement are sent together (pipelined) in a transaction that commits only when
//! the fence admitted the write — two round trips besides `BEGIN`.
//!
//! ```no_run
//! # async fn f(client: &mut tokio_postgres::Client, token: u64) -> distlock_fence::Result<()> {
//! use distlock_fence::postgres::PgFence;
//! use distlock_fence::{Error, Outcome, Stamp};
//!
//! let fence = PgFence::new();
//! fence.create_table(client).await?; // once, or in your migrations
//! match fence
//!     .execute(client, "sku:42", Stamp::new(token).seq(1),
//!              "UPDATE stock SET left = left - 1 WHERE sku = $1 AND left > 0", &[&"sku:42"])
//!     .await
//! {
//!     Ok(Outcome::Applied(rows)) => println!("{rows} row(s) updated"),
//!     Ok(Outcome::Duplicate) => println!("applied before (a retry)"),
//!     Err(Error::Stale { newer, .. }) => println!("lease ended: token {newer} wrote since"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```

use crate::{Decision, Error, Outcome, Result, Stamp};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, Transaction};

/// The fence table of a PostgreSQL database, and fenced transactions on it.
#[derive(Debug, Clone)]
pub struct PgFence {
    table: String,
}

impl Default for PgFence {
    fn default() -> Self {
        PgFence::new()
    }
}

impl PgFence {
    /// The fences in the table `dlock_write_fences`.
    pub fn new() -> PgFence {
        PgFence {
            table: "dlock_write_fences".into(),
        }
    }

    /// The fences in the table `table` (`name` or `schema.name`, each part a plain identifier:
    /// letters, digits, `_`, not starting with a digit, at most 63 bytes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another name.
    pub fn with_table(table: &str) -> Result<PgFence> {
        crate::sql_table_name(table)?;
        Ok(PgFence {
            table: table.into(),
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the fence table if it does not exist (concurrent callers are fine).
    ///
    /// # Errors
    /// [`Error::Store`] when PostgreSQL refuses (no right to create it, …).
    pub async fn create_table(&self, client: &impl GenericClient) -> Result<()> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (resource text PRIMARY KEY, \
             token numeric(20) NOT NULL, seq numeric(20) NOT NULL)",
            self.table
        );
        match client.batch_execute(&sql).await {
            Ok(()) => Ok(()),
            // Two sessions creating it at once: the loser sees the winner's catalog entry.
            Err(e)
                if e.code().is_some_and(|c| {
                    *c == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                        || *c == tokio_postgres::error::SqlState::DUPLICATE_TABLE
                }) =>
            {
                Ok(())
            }
            Err(e) => Err(pg_err(&format!("creating {}", self.table), e)),
        }
    }

    /// The stamp recorded for `resource`, `None` before its first fenced write.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn recorded(
        &self,
        client: &impl GenericClient,
        resource: &str,
    ) -> Result<Option<Stamp>> {
        let sql = format!(
            "SELECT token::text, seq::text FROM {} WHERE resource = $1",
            self.table
        );
        let row = client
            .query_opt(&sql, &[&resource])
            .await
            .map_err(|e| pg_err("reading a fence", e))?;
        row.map(|r| stamp_of(&r)).transpose()
    }

    /// Checks `stamp` against the fence of `resource` and raises it, inside your transaction
    /// `tx`, by [the rule](crate#the-rule): write in `tx` only on [`Decision::Apply`], and
    /// commit. The fence row stays locked until `tx` ends.
    ///
    /// # Errors
    /// [`Error::Stale`] (roll back: nothing of yours must commit); [`Error::Store`].
    pub async fn admit(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        stamp: Stamp,
    ) -> Result<Decision> {
        let applied = tx
            .query_opt(
                &self.upsert(),
                &[&resource, &stamp.token.to_string(), &stamp.seq.to_string()],
            )
            .await
            .map_err(|e| pg_err("checking a fence", e))?;
        self.decision(tx, resource, stamp, applied.is_some()).await
    }

    /// One fenced statement: in a transaction of its own, `statement` (with `params`) runs
    /// only if `stamp` passes the fence of `resource`; the number of rows it changed.
    ///
    /// # Errors
    /// [`Error::Stale`] (nothing written); [`Error::Store`] (the transaction rolled back, or
    /// its commit's outcome is unknown: retry with the same stamp).
    pub async fn execute(
        &self,
        client: &mut Client,
        resource: &str,
        stamp: Stamp,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Outcome<u64>> {
        let tx = client.transaction().await.map_err(|e| pg_err("BEGIN", e))?;
        let upsert = self.upsert();
        let (token, seq) = (stamp.token.to_string(), stamp.seq.to_string());
        // Pipelined: both are sent before the first answer; the statement is rolled back
        // unless the fence admitted it.
        let (fenced, written) = futures_join(
            tx.query_opt(&upsert, &[&resource, &token, &seq]),
            tx.execute(statement, params),
        )
        .await;
        let fenced = fenced.map_err(|e| pg_err("checking a fence", e))?;
        let decision = self
            .decision(&tx, resource, stamp, fenced.is_some())
            .await?;
        if decision == Decision::Duplicate {
            return Ok(Outcome::Duplicate);
        }
        let rows = written.map_err(|e| pg_err("the fenced statement", e))?;
        tx.commit().await.map_err(|e| pg_err("COMMIT", e))?;
        Ok(Outcome::Applied(rows))
    }

    /// The upsert that raises the fence when the rule admits the write, and returns a row
    /// then. Mirrors `crate::decide`.
    fn upsert(&self) -> String {
        let t = &self.table;
        format!(
            "INSERT INTO {t} AS f (resource, token, seq) VALUES ($1, $2::text::numeric, $3::text::numeric) \
             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, \
               seq = CASE WHEN f.token = EXCLUDED.token THEN GREATEST(f.seq, EXCLUDED.seq) ELSE EXCLUDED.seq END \
             WHERE f.token < EXCLUDED.token \
                OR (f.token = EXCLUDED.token AND (EXCLUDED.seq = 0 OR EXCLUDED.seq > f.seq)) \
             RETURNING 1"
        )
    }

    /// Apply when the upsert returned its row; otherwise the row (locked by the upsert) says
    /// whether the stamp was stale or a duplicate.
    async fn decision(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        stamp: Stamp,
        applied: bool,
    ) -> Result<Decision> {
        if applied {
            return Ok(Decision::Apply);
        }
        match self.recorded(tx, resource).await? {
            Some(rec) if rec.token > stamp.token => Err(Error::Stale {
                token: stamp.token,
                newer: rec.token,
            }),
            Some(_) => Ok(Decision::Duplicate),
            None => Err(Error::Store {
                store: "postgres".into(),
                message: format!("the fence of `{resource}` vanished under its row lock"),
                source: None,
            }),
        }
    }
}

/// Polls both futures together (so the driver pipelines their queries).
async fn futures_join<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    futures_util::future::join(a, b).await
}

fn stamp_of(row: &tokio_postgres::Row) -> Result<Stamp> {
    let bad = |what: &str| Error::Store {
        store: "postgres".into(),
        message: format!("a fence row holds {what}, not a token and a sequence number"),
        source: None,
    };
    let token: String = row.try_get(0).map_err(|e| pg_err("reading a fence", e))?;
    let seq: String = row.try_get(1).map_err(|e| pg_err("reading a fence", e))?;
    Ok(Stamp {
        token: token.parse().map_err(|_| bad(&token))?,
        seq: seq.parse().map_err(|_| bad(&seq))?,
    })
}

fn pg_err(what: &str, e: tokio_postgres::Error) -> Error {
    Error::store("postgres", format!("{what} failed: {e}"), e)
}
