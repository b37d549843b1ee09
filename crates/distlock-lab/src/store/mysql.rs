//! The `mysql://` store (MySQL, MariaDB): two InnoDB tables per store prefix, one row (stock)
//! and N rows (orders) per run; every operation one autocommit statement except `setup`
//! (a transaction).
//!
//! ```sql
//! CREATE TABLE dlock_<prefix>_stock (run VARCHAR(80) PRIMARY KEY, stock BIGINT, version BIGINT);
//! CREATE TABLE dlock_<prefix>_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, run VARCHAR(80), buyer BIGINT);
//! ```
//!
//! The compare-and-set is the classic optimistic lock:
//! `UPDATE … SET stock = ?, version = version + 1 WHERE run = ? AND version = ?`.
//!
//! The `fenced` strategy fences the stock with distlock-fence's `MySqlFence` (resource
//! `dlock_<prefix>_stock:<run>` in `dlock_write_fences`).

use super::{timed, timed_fenced, Fenced, Store, StoreError, StoreResult};
use distlock::async_trait;
use distlock_fence::mysql::MySqlFence;
use distlock_fence::Stamp;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, TxOpts};

/// Stock and orders in two MySQL tables.
pub struct MySqlStore {
    pool: Pool,
    endpoint: String,
    namespace: String,
    run: String,
    stock: String,
    orders: String,
    fence: MySqlFence,
}

/// The driver's options of a dlock MySQL URL (dlock's own parameters removed), `host:port`
/// for messages, and the dlock namespace.
fn parse_url(url: &str) -> StoreResult<(mysql_async::Opts, String, String)> {
    let (cs, namespace) = super::driver_url(url, &["mode"])?;
    let opts = mysql_async::Opts::from_url(cs.expose_url()).map_err(|e| {
        let redacted = cs.redacted();
        StoreError(format!("invalid MySQL URL `{redacted}`: {e}"))
    })?;
    let endpoint = format!("MySQL at {}:{}", opts.ip_or_hostname(), opts.tcp_port());
    Ok((opts, endpoint, namespace))
}

impl MySqlStore {
    /// Connects to the server of `url` and creates the store's tables if they are missing.
    pub async fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Self> {
        let (opts, endpoint, namespace) = parse_url(url)?;
        let store = MySqlStore {
            pool: Pool::new(opts),
            endpoint,
            namespace,
            run: run.to_owned(),
            stock: format!("dlock_{prefix}_stock"),
            orders: format!("dlock_{prefix}_orders"),
            fence: MySqlFence::new(),
        };
        let mut conn = store.conn().await?;
        timed(
            &store.endpoint,
            "creating the fence table",
            store.fence.create_table(&mut conn),
        )
        .await?;
        for ddl in [
            format!(
                "CREATE TABLE IF NOT EXISTS {} (
                    run VARCHAR(80) CHARACTER SET ascii NOT NULL PRIMARY KEY,
                    stock BIGINT NOT NULL,
                    version BIGINT NOT NULL
                ) ENGINE=InnoDB",
                store.stock
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (
                    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                    run VARCHAR(80) CHARACTER SET ascii NOT NULL,
                    buyer BIGINT NOT NULL,
                    KEY (run, id)
                ) ENGINE=InnoDB",
                store.orders
            ),
        ] {
            timed(
                &store.endpoint,
                "creating the store's tables",
                conn.query_drop(ddl),
            )
            .await?;
        }
        Ok(store)
    }

    async fn conn(&self) -> StoreResult<Conn> {
        timed(&self.endpoint, "connecting", self.pool.get_conn()).await
    }

    /// The fence's resource: this run's stock row.
    fn resource(&self) -> String {
        format!("{}:{}", self.stock, self.run)
    }

    fn missing(&self) -> StoreError {
        StoreError(format!(
            "{}: no row for run `{}` in {} (was the run cleaned up?)",
            self.endpoint, self.run, self.stock
        ))
    }

    /// Runs one statement; the number of rows it changed.
    async fn exec(
        &self,
        what: &str,
        sql: String,
        params: impl Into<mysql_async::Params> + Send,
    ) -> StoreResult<u64> {
        let mut conn = self.conn().await?;
        timed(&self.endpoint, what, async {
            conn.exec_drop(sql, params).await?;
            Ok::<_, mysql_async::Error>(conn.affected_rows())
        })
        .await
    }
}

fn to_u64(v: i64, what: &str) -> StoreResult<u64> {
    u64::try_from(v).map_err(|_| StoreError(format!("the store holds a negative {what} ({v})")))
}

#[async_trait]
impl Store for MySqlStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        let mut conn = self.conn().await?;
        let (s, o, run) = (&self.stock, &self.orders, &self.run);
        timed(&self.endpoint, "setup", async {
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            tx.exec_drop(format!("DELETE FROM {o} WHERE run = ?"), (run,))
                .await?;
            tx.exec_drop(
                format!(
                    "INSERT INTO {s} (run, stock, version) VALUES (?, ?, 0) \
                     ON DUPLICATE KEY UPDATE stock = VALUES(stock), version = 0"
                ),
                (run, stock),
            )
            .await?;
            tx.commit().await
        })
        .await
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        let mut conn = self.conn().await?;
        let row: Option<(i64, i64)> = timed(
            &self.endpoint,
            "reading the stock",
            conn.exec_first(
                format!("SELECT stock, version FROM {} WHERE run = ?", self.stock),
                (&self.run,),
            ),
        )
        .await?;
        let (stock, version) = row.ok_or_else(|| self.missing())?;
        Ok((stock, to_u64(version, "version")?))
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        let n = self
            .exec(
                "writing the stock",
                format!(
                    "UPDATE {} SET stock = ?, version = version + 1 WHERE run = ?",
                    self.stock
                ),
                (stock, &self.run),
            )
            .await?;
        if n == 0 {
            return Err(self.missing());
        }
        Ok(())
    }

    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool> {
        let Ok(expected) = i64::try_from(expected_version) else {
            return Ok(false);
        };
        let n = self
            .exec(
                "compare-and-set of the stock",
                format!(
                    "UPDATE {} SET stock = ?, version = version + 1 WHERE run = ? AND version = ?",
                    self.stock
                ),
                (new_stock, &self.run, expected),
            )
            .await?;
        Ok(n == 1)
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        let buyer = i64::try_from(buyer)
            .map_err(|_| StoreError(format!("buyer id {buyer} does not fit a BIGINT")))?;
        self.exec(
            "inserting an order",
            format!("INSERT INTO {} (run, buyer) VALUES (?, ?)", self.orders),
            (&self.run, buyer),
        )
        .await
        .map(drop)
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        let mut conn = self.conn().await?;
        let rows: Vec<i64> = timed(
            &self.endpoint,
            "reading the orders",
            conn.exec(
                format!(
                    "SELECT buyer FROM {} WHERE run = ? ORDER BY id",
                    self.orders
                ),
                (&self.run,),
            ),
        )
        .await?;
        rows.into_iter().map(|b| to_u64(b, "buyer id")).collect()
    }

    async fn fenced_read(&self, _lock: &str, token: u64) -> StoreResult<Fenced<i64>> {
        let mut conn = self.conn().await?;
        let resource = self.resource();
        let sql = format!("SELECT stock FROM {} WHERE run = ?", self.stock);
        let read = timed_fenced(&self.endpoint, "a fenced read of the stock", async {
            let store = |e| distlock_fence::Error::store("mysql", "reading the stock", e);
            let mut tx = conn
                .start_transaction(TxOpts::default())
                .await
                .map_err(store)?;
            self.fence
                .admit(&mut tx, &resource, Stamp::new(token))
                .await?;
            let stock: Option<i64> = tx.exec_first(sql, (&self.run,)).await.map_err(store)?;
            tx.commit().await.map_err(store)?;
            Ok(stock)
        })
        .await?;
        read.found(|| self.missing())
    }

    async fn fenced_write(&self, _lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>> {
        let mut conn = self.conn().await?;
        let sql = format!(
            "UPDATE {} SET stock = ?, version = version + 1 WHERE run = ?",
            self.stock
        );
        let resource = self.resource();
        let written = timed_fenced(
            &self.endpoint,
            "a fenced write of the stock",
            self.fence.execute(
                &mut conn,
                &resource,
                Stamp::new(token),
                &sql,
                (stock, &self.run),
            ),
        )
        .await?;
        Ok(written.map(drop))
    }

    async fn cleanup(&self) -> StoreResult<()> {
        for t in [&self.orders, &self.stock] {
            self.exec(
                "deleting the run's rows",
                format!("DELETE FROM {t} WHERE run = ?"),
                (&self.run,),
            )
            .await?;
        }
        self.exec(
            "deleting the run's fence",
            format!("DELETE FROM {} WHERE resource = ?", self.fence.table()),
            (self.resource(),),
        )
        .await
        .map(drop)
    }

    /// Deletes the lock's rows in distlock-mysql's tables (`dlock_fence`, `dlock_holders` in
    /// session mode, `dlock_table_locks` in table mode), for the tables that exist.
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        for table in ["dlock_fence", "dlock_holders", "dlock_table_locks"] {
            let mut conn = self.conn().await?;
            let n: Option<i64> = timed(
                &self.endpoint,
                "looking up dlock's tables",
                conn.exec_first(
                    "SELECT COUNT(*) FROM information_schema.tables \
                     WHERE table_schema = DATABASE() AND table_name = ?",
                    (table,),
                ),
            )
            .await?;
            drop(conn);
            if n.unwrap_or(0) > 0 {
                self.exec(
                    "deleting the lock's rows",
                    format!("DELETE FROM {table} WHERE ns = ? AND name = ?"),
                    (&self.namespace, name),
                )
                .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let (o, ep, ns) =
            parse_url("mysql://u:pw@127.0.0.1:7000/db?namespace=shop&mode=table").unwrap();
        assert_eq!(ep, "MySQL at 127.0.0.1:7000");
        assert_eq!(ns, "shop");
        assert_eq!(o.db_name(), Some("db"));
        let (_, _, ns) = parse_url("mysql://u@h/db").unwrap();
        assert_eq!(ns, "dlock");
    }
}
