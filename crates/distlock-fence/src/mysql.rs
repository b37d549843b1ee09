//! Fenced MySQL/MariaDB transactions over your own mysql_async connection.
//!
//! The fences live in one InnoDB table (default `dlock_write_fences`), one row per resource:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS dlock_write_fences (
//!     resource VARCHAR(255) NOT NULL PRIMARY KEY,
//!     token BIGINT UNSIGNED NULL,
//!     seq BIGINT UNSIGNED NULL
//! ) ENGINE=InnoDB;
//! ```
//!
//! [`MySqlFence::admit`], inside your transaction: the resource's row is created if missing
//! and locked (`INSERT … ON DUPLICATE KEY UPDATE`, which takes the row's exclusive lock — not
//! `INSERT IGNORE`, whose shared lock would deadlock two fenced writers), read, judged by
//! [the rule](crate#the-rule) ([`FenceRecord::admit`], the same
//! code as every store here) and raised. The lock is held until your transaction ends, so the
//! check, the fence and your writes commit together. [`MySqlFence::execute`] wraps one
//! statement so: `BEGIN`, three fence statements, yours, `COMMIT`.
//!
//! ```no_run
//! # async fn f(conn: &mut mysql_async::Conn, token: u64) -> distlock_fence::Result<()> {
//! use distlock_fence::mysql::MySqlFence;
//! use distlock_fence::{Outcome, Stamp};
//!
//! let fence = MySqlFence::new();
//! fence.create_table(conn).await?; // once, or in your migrations
//! let out = fence
//!     .execute(conn, "sku:42", Stamp::new(token).seq(1),
//!              "UPDATE stock SET `left` = `left` - 1 WHERE sku = ? AND `left` > 0", ("sku:42",))
//!     .await?;
//! if let Outcome::Applied(rows) = out {
//!     println!("{rows} row(s) updated");
//! }
//! # Ok(()) }
//! ```

use crate::{Decision, Error, FenceRecord, Outcome, Result, Stamp};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Transaction, TxOpts};

/// The longest resource name (the key column is `VARCHAR(255)`).
pub const MAX_RESOURCE_CHARS: usize = 255;

/// The fence table of a MySQL/MariaDB database, and fenced transactions on it.
#[derive(Debug, Clone)]
pub struct MySqlFence {
    table: String,
}

impl Default for MySqlFence {
    fn default() -> Self {
        MySqlFence::new()
    }
}

impl MySqlFence {
    /// The fences in the table `dlock_write_fences`.
    pub fn new() -> MySqlFence {
        MySqlFence {
            table: "dlock_write_fences".into(),
        }
    }

    /// The fences in the table `table` (`name` or `database.name`, each part of ASCII
    /// letters, digits and `_`, not starting with a digit, at most 63 bytes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another name.
    pub fn with_table(table: &str) -> Result<MySqlFence> {
        crate::sql_table_name(table)?;
        Ok(MySqlFence {
            table: table.into(),
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the fence table if it does not exist.
    ///
    /// # Errors
    /// [`Error::Store`] when the server refuses.
    pub async fn create_table(&self, conn: &mut Conn) -> Result<()> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (resource VARCHAR({MAX_RESOURCE_CHARS}) NOT NULL PRIMARY KEY, \
             token BIGINT UNSIGNED NULL, seq BIGINT UNSIGNED NULL) ENGINE=InnoDB",
            self.table
        );
        conn.query_drop(sql)
            .await
            .map_err(|e| my_err(&format!("creating {}", self.table), e))
    }

    /// The stamp recorded for `resource`, `None` before its first fenced write.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn recorded(
        &self,
        conn: &mut impl Queryable,
        resource: &str,
    ) -> Result<Option<Stamp>> {
        let sql = format!("SELECT token, seq FROM {} WHERE resource = ?", self.table);
        let row: Option<(Option<u64>, Option<u64>)> = conn
            .exec_first(sql, (resource,))
            .await
            .map_err(|e| my_err("reading a fence", e))?;
        Ok(stamp_of(row))
    }

    /// Checks `stamp` against the fence of `resource` and raises it, inside your transaction
    /// `tx`, by [the rule](crate#the-rule): write in `tx` only on [`Decision::Apply`], and
    /// commit. The fence row stays locked until `tx` ends.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a resource name over [`MAX_RESOURCE_CHARS`] characters;
    /// [`Error::Stale`] (roll back); [`Error::Store`].
    pub async fn admit(
        &self,
        tx: &mut Transaction<'_>,
        resource: &str,
        stamp: Stamp,
    ) -> Result<Decision> {
        if resource.chars().count() > MAX_RESOURCE_CHARS {
            return Err(Error::InvalidArgument(format!(
                "resource name of {} characters: the fence table holds at most {MAX_RESOURCE_CHARS}",
                resource.chars().count()
            )));
        }
        let t = &self.table;
        tx.exec_drop(
            format!(
                "INSERT INTO {t} (resource) VALUES (?) ON DUPLICATE KEY UPDATE resource = resource"
            ),
            (resource,),
        )
        .await
        .map_err(|e| my_err("locking a fence", e))?;
        let row: Option<(Option<u64>, Option<u64>)> = tx
            .exec_first(
                format!("SELECT token, seq FROM {t} WHERE resource = ? FOR UPDATE"),
                (resource,),
            )
            .await
            .map_err(|e| my_err("reading a fence", e))?;
        let mut fence = stamp_of(row);
        let decision = fence.admit(stamp)?;
        if let (Decision::Apply, Some(raised)) = (decision, fence) {
            tx.exec_drop(
                format!("UPDATE {t} SET token = ?, seq = ? WHERE resource = ?"),
                (raised.token, raised.seq, resource),
            )
            .await
            .map_err(|e| my_err("raising a fence", e))?;
        }
        Ok(decision)
    }

    /// One fenced statement: in a transaction of its own, `statement` (with `params`) runs
    /// only if `stamp` passes the fence of `resource`; the number of rows it changed.
    ///
    /// # Errors
    /// [`Error::Stale`] (nothing written); [`Error::InvalidArgument`]; [`Error::Store`] (rolled
    /// back, or the commit's outcome is unknown: retry with the same stamp).
    pub async fn execute(
        &self,
        conn: &mut Conn,
        resource: &str,
        stamp: Stamp,
        statement: &str,
        params: impl Into<Params> + Send,
    ) -> Result<Outcome<u64>> {
        let mut tx = conn
            .start_transaction(TxOpts::default())
            .await
            .map_err(|e| my_err("BEGIN", e))?;
        // Dropping `tx` without a commit rolls it back.
        if self.admit(&mut tx, resource, stamp).await? == Decision::Duplicate {
            tx.rollback().await.map_err(|e| my_err("ROLLBACK", e))?;
            return Ok(Outcome::Duplicate);
        }
        tx.exec_drop(statement, params)
            .await
            .map_err(|e| my_err("the fenced statement", e))?;
        let rows = tx.affected_rows();
        tx.commit().await.map_err(|e| my_err("COMMIT", e))?;
        Ok(Outcome::Applied(rows))
    }
}

fn stamp_of(row: Option<(Option<u64>, Option<u64>)>) -> Option<Stamp> {
    let (token, seq) = row?;
    Some(Stamp {
        token: token?,
        seq: seq.unwrap_or(0),
    })
}

fn my_err(what: &str, e: mysql_async::Error) -> Error {
    Error::store("mysql", format!("{what} failed: {e}"), e)
}
