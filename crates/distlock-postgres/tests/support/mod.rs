//! One PostgreSQL server shared by the tests of a test binary (cases use distinct names), and
//! the two modes on it (the harness is the testkit's, shared with distlock-mysql).

#![allow(dead_code)]

use distlock_postgres::PostgresBackend;
use distlock_testkit::{PostgresServer, TestCerts};
use std::sync::{Arc, Mutex, Weak};

distlock_testkit::sql_test_support! {
    Pg = PostgresServer, PostgresBackend;
    /// Session mode (advisory locks, the default).
    session: "" => delete_holder_row,
    /// Lease mode (`?mode=lease`).
    lease: "?mode=lease" => free_lease_row,
}

fn quoted(name: &str) -> String {
    name.replace('\'', "''")
}

/// Session mode: deletes the holder's row, as an operator revoking the lock would: the
/// holder's next renewal finds it gone, reports the lock lost and gives the advisory lock up.
/// (Killing the holder's session instead is tested in postgres_faults.rs: its lost signal
/// fires at once, with `SessionEnded`.)
pub fn delete_holder_row(server: &PostgresServer, name: &str) {
    let n = server
        .sql(&format!(
            "WITH d AS (DELETE FROM dlock_holders WHERE name = '{}' RETURNING 1) SELECT count(*) FROM d",
            quoted(name)
        ))
        .expect("delete holder row");
    assert_eq!(n, "1", "nothing to delete");
}

/// Lease mode: frees the lock's row behind the holder's back, as an operator would.
pub fn free_lease_row(server: &PostgresServer, name: &str) {
    let n = server
        .sql(&format!(
            "WITH u AS (UPDATE dlock_leases SET owner = NULL, attempt = NULL, expires_at = 'epoch' \
             WHERE name = '{}' AND owner IS NOT NULL RETURNING 1) SELECT count(*) FROM u",
            quoted(name)
        ))
        .expect("free the lease row");
    assert_eq!(n, "1", "nothing to break");
}

static TLS_SERVER: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());

/// A PostgreSQL server with `ssl=on` (TCP over TLS only) shared by the tests of a test binary,
/// its certificate signed by a throwaway CA ([`PostgresServer::tls_ca`]).
pub fn tls_server() -> Arc<PostgresServer> {
    let mut slot = TLS_SERVER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.upgrade() {
        return s;
    }
    let certs = TestCerts::generate().expect("test certificates");
    let s = Arc::new(PostgresServer::start_tls(&certs).expect("start a TLS postgres"));
    *slot = Arc::downgrade(&s);
    s
}

/// Connects on `url` plus `&sslrootcert=` the shared TLS server's CA (for
/// [`SqlMode`](distlock_testkit::sql_faults::SqlMode)s whose parameters set an `sslmode`).
pub fn connect_tls(
    url: String,
    opts: distlock_core::ClientOptions,
) -> distlock_testkit::sql_faults::Connecting<PostgresBackend> {
    let ca = tls_server().tls_ca().expect("the TLS server's CA");
    let url = format!("{url}&sslrootcert={}", ca.display());
    Box::pin(async move { PostgresBackend::connect(&url, &opts).await })
}
