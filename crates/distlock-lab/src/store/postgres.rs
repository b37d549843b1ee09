//! The `postgres://` store: two tables per store prefix, one row (stock) and N rows (orders)
//! per run, each operation one autocommit statement.
//!
//! ```sql
//! CREATE TABLE dlock_<prefix>_stock (run text PRIMARY KEY, stock bigint NOT NULL, version bigint NOT NULL);
//! CREATE TABLE dlock_<prefix>_orders (id bigserial PRIMARY KEY, run text NOT NULL, buyer bigint NOT NULL);
//! ```
//!
//! The compare-and-set is the classic optimistic lock:
//! `UPDATE … SET stock = $1, version = version + 1 WHERE run = $2 AND version = $3`.
//!
//! The `fenced` strategy fences the stock with distlock-fence's `PgFence` (resource
//! `dlock_<prefix>_stock:<run>` in `dlock_write_fences`), on a connection of its own.

use super::{timed, timed_fenced, Fenced, Store, StoreError, StoreResult, OP_TIMEOUT};
use distlock::async_trait;
use distlock_fence::postgres::PgFence;
use distlock_fence::Stamp;
use std::str::FromStr;
use tokio_postgres::{Client, NoTls};

/// Serializes the `CREATE TABLE IF NOT EXISTS` of concurrent processes (PostgreSQL can fail
/// them with a unique violation on its catalog otherwise). "dlockcli".
const SCHEMA_LOCK_KEY: i64 = 0x646c_6f63_6b63_6c69;

/// Stock and orders in two PostgreSQL tables.
pub struct PgStore {
    client: Client,
    endpoint: String,
    namespace: String,
    run: String,
    stock: String,
    orders: String,
    config: tokio_postgres::Config,
    fence: PgFence,
    /// The `fenced` strategy's connection (a transaction needs one of its own), opened on
    /// first use.
    fenced: tokio::sync::Mutex<Option<Client>>,
}

/// Connects with `config`; the connection task ends with the client.
async fn connect(config: &tokio_postgres::Config, endpoint: &str) -> StoreResult<Client> {
    let (client, connection) = timed(endpoint, "connecting", config.connect(NoTls)).await?;
    tokio::spawn(async move {
        // Ends with the client; errors surface on the client's next query.
        let _ = connection.await;
    });
    Ok(client)
}

/// What the store needs of a dlock PostgreSQL URL: the driver's config (dlock's own
/// parameters removed), `host:port` for messages, and the dlock namespace.
fn parse_url(url: &str) -> StoreResult<(tokio_postgres::Config, String, String)> {
    let (cs, namespace) = super::driver_url(url, &["mode", "listen"])?;
    let bad = |why: String| {
        let redacted = cs.redacted();
        StoreError(format!("invalid PostgreSQL URL `{redacted}`: {why}"))
    };
    // tokio-postgres reads only postgresql:// and postgres://, in lower case (as rebuilt).
    let mut config =
        tokio_postgres::Config::from_str(cs.expose_url()).map_err(|e| bad(e.to_string()))?;
    config.connect_timeout(OP_TIMEOUT);
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => return Err(bad("no host".into())),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    Ok((config, format!("PostgreSQL at {host}:{port}"), namespace))
}

impl PgStore {
    /// Connects to the server of `url` and creates the store's tables if they are missing.
    pub async fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Self> {
        let (config, endpoint, namespace) = parse_url(url)?;
        let client = connect(&config, &endpoint).await?;
        let stock = format!("dlock_{prefix}_stock");
        let orders = format!("dlock_{prefix}_orders");
        let ddl = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY});
             CREATE TABLE IF NOT EXISTS {stock} (
                 run text PRIMARY KEY,
                 stock bigint NOT NULL,
                 version bigint NOT NULL
             );
             CREATE TABLE IF NOT EXISTS {orders} (
                 id bigserial PRIMARY KEY,
                 run text NOT NULL,
                 buyer bigint NOT NULL
             );
             CREATE INDEX IF NOT EXISTS {orders}_run ON {orders} (run);
             COMMIT;"
        );
        timed(
            &endpoint,
            "creating the store's tables",
            client.batch_execute(&ddl),
        )
        .await?;
        let fence = PgFence::new();
        timed(
            &endpoint,
            "creating the fence table",
            fence.create_table(&client),
        )
        .await?;
        Ok(PgStore {
            client,
            endpoint,
            namespace,
            run: run.to_owned(),
            stock,
            orders,
            config,
            fence,
            fenced: tokio::sync::Mutex::new(None),
        })
    }

    /// The fence's resource: this run's stock row.
    fn resource(&self) -> String {
        format!("{}:{}", self.stock, self.run)
    }

    /// The `fenced` strategy's connection.
    async fn fenced_client(&self) -> StoreResult<tokio::sync::MutexGuard<'_, Option<Client>>> {
        let mut guard = self.fenced.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            *guard = Some(connect(&self.config, &self.endpoint).await?);
        }
        Ok(guard)
    }

    fn missing(&self) -> StoreError {
        StoreError(format!(
            "{}: no row for run `{}` in {} (was the run cleaned up?)",
            self.endpoint, self.run, self.stock
        ))
    }
}

fn to_i64(v: u64, what: &str) -> StoreResult<i64> {
    i64::try_from(v).map_err(|_| StoreError(format!("{what} {v} does not fit a bigint")))
}

fn to_u64(v: i64, what: &str) -> StoreResult<u64> {
    u64::try_from(v).map_err(|_| StoreError(format!("the store holds a negative {what} ({v})")))
}

#[async_trait]
impl Store for PgStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        let sql = format!(
            "WITH d AS (DELETE FROM {o} WHERE run = $1)
             INSERT INTO {s} (run, stock, version) VALUES ($1, $2, 0)
             ON CONFLICT (run) DO UPDATE SET stock = EXCLUDED.stock, version = 0",
            o = self.orders,
            s = self.stock
        );
        timed(
            &self.endpoint,
            "setup",
            self.client.execute(&sql, &[&self.run, &stock]),
        )
        .await
        .map(drop)
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        let sql = format!("SELECT stock, version FROM {} WHERE run = $1", self.stock);
        let row = timed(
            &self.endpoint,
            "reading the stock",
            self.client.query_opt(&sql, &[&self.run]),
        )
        .await?
        .ok_or_else(|| self.missing())?;
        let stock: i64 = row
            .try_get(0)
            .map_err(|e| StoreError(format!("{}: stock: {e}", self.endpoint)))?;
        let version: i64 = row
            .try_get(1)
            .map_err(|e| StoreError(format!("{}: version: {e}", self.endpoint)))?;
        Ok((stock, to_u64(version, "version")?))
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        let sql = format!(
            "UPDATE {} SET stock = $1, version = version + 1 WHERE run = $2",
            self.stock
        );
        let n = timed(
            &self.endpoint,
            "writing the stock",
            self.client.execute(&sql, &[&stock, &self.run]),
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
        let sql = format!(
            "UPDATE {} SET stock = $1, version = version + 1 WHERE run = $2 AND version = $3",
            self.stock
        );
        let n = timed(
            &self.endpoint,
            "compare-and-set of the stock",
            self.client
                .execute(&sql, &[&new_stock, &self.run, &expected]),
        )
        .await?;
        Ok(n == 1)
    }

    async fn fenced_read(&self, _lock: &str, token: u64) -> StoreResult<Fenced<i64>> {
        let mut guard = self.fenced_client().await?;
        let client = guard.as_mut().ok_or_else(|| self.missing())?;
        let (resource, sql) = (
            self.resource(),
            format!("SELECT stock FROM {} WHERE run = $1", self.stock),
        );
        let read = timed_fenced(&self.endpoint, "a fenced read of the stock", async {
            let store = |e| distlock_fence::Error::store("postgres", "reading the stock", e);
            let tx = client.transaction().await.map_err(store)?;
            self.fence.admit(&tx, &resource, Stamp::new(token)).await?;
            let row = tx.query_opt(&sql, &[&self.run]).await.map_err(store)?;
            tx.commit().await.map_err(store)?;
            Ok(row.and_then(|r| r.try_get::<_, i64>(0).ok()))
        })
        .await?;
        read.found(|| self.missing())
    }

    async fn fenced_write(&self, _lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>> {
        let mut guard = self.fenced_client().await?;
        let client = guard.as_mut().ok_or_else(|| self.missing())?;
        let sql = format!(
            "UPDATE {} SET stock = $1, version = version + 1 WHERE run = $2",
            self.stock
        );
        let resource = self.resource();
        let written = timed_fenced(
            &self.endpoint,
            "a fenced write of the stock",
            self.fence.execute(
                client,
                &resource,
                Stamp::new(token),
                &sql,
                &[&stock, &self.run],
            ),
        )
        .await?;
        Ok(written.map(drop))
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        let buyer = to_i64(buyer, "buyer id")?;
        let sql = format!("INSERT INTO {} (run, buyer) VALUES ($1, $2)", self.orders);
        timed(
            &self.endpoint,
            "inserting an order",
            self.client.execute(&sql, &[&self.run, &buyer]),
        )
        .await
        .map(drop)
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        let sql = format!(
            "SELECT buyer FROM {} WHERE run = $1 ORDER BY id",
            self.orders
        );
        let rows = timed(
            &self.endpoint,
            "reading the orders",
            self.client.query(&sql, &[&self.run]),
        )
        .await?;
        rows.iter()
            .map(|r| {
                let b: i64 = r
                    .try_get(0)
                    .map_err(|e| StoreError(format!("{}: buyer: {e}", self.endpoint)))?;
                to_u64(b, "buyer id")
            })
            .collect()
    }

    async fn cleanup(&self) -> StoreResult<()> {
        let sql = format!(
            "WITH d AS (DELETE FROM {o} WHERE run = $1) DELETE FROM {s} WHERE run = $1",
            o = self.orders,
            s = self.stock
        );
        timed(
            &self.endpoint,
            "deleting the run's rows",
            self.client.execute(&sql, &[&self.run]),
        )
        .await?;
        let sql = format!("DELETE FROM {} WHERE resource = $1", self.fence.table());
        timed(
            &self.endpoint,
            "deleting the run's fence",
            self.client.execute(&sql, &[&self.resource()]),
        )
        .await
        .map(drop)
    }

    /// Deletes the lock's rows in distlock-postgres's tables (`dlock_fence`, `dlock_holders`
    /// in session mode, `dlock_leases` in lease mode), for the tables that exist. Fencing
    /// tokens come from a sequence, so they keep increasing afterwards.
    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        for table in ["dlock_fence", "dlock_holders", "dlock_leases"] {
            let exists = timed(
                &self.endpoint,
                "looking up dlock's tables",
                self.client
                    .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table]),
            )
            .await?;
            let exists: bool = exists
                .try_get(0)
                .map_err(|e| StoreError(format!("{}: to_regclass: {e}", self.endpoint)))?;
            if exists {
                let sql = format!("DELETE FROM {table} WHERE ns = $1 AND name = $2");
                timed(
                    &self.endpoint,
                    "deleting the lock's rows",
                    self.client.execute(&sql, &[&self.namespace, &name]),
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
        let (c, ep, ns) =
            parse_url("postgres://u:pw@127.0.0.1:7000/db?namespace=shop&mode=lease&listen=off")
                .unwrap();
        assert_eq!(ep, "PostgreSQL at 127.0.0.1:7000");
        assert_eq!(ns, "shop");
        assert_eq!(c.get_dbname(), Some("db"));
        let (_, _, ns) = parse_url("postgresql://u@h/db?application_name=x").unwrap();
        assert_eq!(ns, "dlock");
        assert!(parse_url("postgres://u@h/db?bogus_param=1").is_err());
    }
}
