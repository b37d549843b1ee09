//! One MariaDB server shared by the tests of a test binary (cases use distinct names), and the
//! two modes on it (the harness is the testkit's, shared with distlock-postgres).

#![allow(dead_code)]

use distlock_mysql::MysqlBackend;
use distlock_testkit::MariaDbServer;

distlock_testkit::sql_test_support! {
    My = MariaDbServer, MysqlBackend;
    /// Session mode (`GET_LOCK`, the default).
    session: "" => delete_holder_row,
    /// Table mode (`?mode=table`).
    table: "?mode=table" => free_lock_row,
}

/// Session mode: deletes the holder's row, as an operator revoking the lock would: the
/// holder's next renewal finds it gone, reports the lock lost (`NotHeld`) and gives
/// `GET_LOCK` up. (Killing the holder's connection instead, [`kill_holder`], fires its lost
/// signal at once, with `SessionEnded`: tested in mysql_faults.rs and mysql_tls.rs.)
pub fn delete_holder_row(server: &MariaDbServer, name: &str) {
    let key = distlock_mysql::lock_key("dlock", name);
    let n = server
        .sql(&format!(
            "DELETE FROM dlock.dlock_holders WHERE lock_key = '{key}'; SELECT ROW_COUNT()"
        ))
        .expect("delete the holder row");
    assert_eq!(n, "1", "nobody holds {name}");
}

/// Session mode: kills the holder's connection, as an operator (or a failover) would: the
/// server frees the lock, and the holder's client sees its connection close.
pub fn kill_holder(server: &MariaDbServer, name: &str) {
    let key = distlock_mysql::lock_key("dlock", name);
    let id = server
        .sql(&format!("SELECT IS_USED_LOCK('{key}')"))
        .expect("IS_USED_LOCK");
    assert_ne!(id, "NULL", "nobody holds {name}");
    server.sql(&format!("KILL {id}")).expect("KILL");
}

/// Table mode: frees the lock row behind the holder's back, as an operator would.
pub fn free_lock_row(server: &MariaDbServer, name: &str) {
    let key = distlock_mysql::lock_key("dlock", name);
    let n = server
        .sql(&format!(
            "UPDATE dlock.dlock_table_locks SET owner = NULL, count = 0, \
             expires_at = '1970-01-02 00:00:00' WHERE lock_key = '{key}' AND owner IS NOT NULL; \
             SELECT ROW_COUNT()"
        ))
        .expect("free the lock row");
    assert_eq!(n, "1", "nothing to break");
}

static TLS_SERVER: std::sync::Mutex<std::sync::Weak<MariaDbServer>> =
    std::sync::Mutex::new(std::sync::Weak::new());

/// One MariaDB server with TLS on (unencrypted TCP refused) shared by the tests of a test
/// binary, with a client certificate for its `REQUIRE X509` login in `tls/x509.pem` and
/// `tls/x509.key` of its dir (the CA that signed it is dropped).
pub fn tls_server() -> std::sync::Arc<MariaDbServer> {
    let mut slot = TLS_SERVER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.upgrade() {
        return s;
    }
    let certs = distlock_testkit::TestCerts::generate().expect("test certificates");
    let s = std::sync::Arc::new(MariaDbServer::start_tls(&certs).expect("start a TLS mariadb"));
    let (cert, key) = certs.client(s.x509_user()).expect("client certificate");
    let (c, k) = client_cert(&s);
    std::fs::copy(cert, c).expect("copy the client certificate");
    std::fs::copy(key, k).expect("copy the client key");
    *slot = std::sync::Arc::downgrade(&s);
    s
}

/// The client certificate and key of [`tls_server`]'s `REQUIRE X509` login.
pub fn client_cert(server: &MariaDbServer) -> (std::path::PathBuf, std::path::PathBuf) {
    let d = server.dir().join("tls");
    (d.join("x509.pem"), d.join("x509.key"))
}

/// Connects on `url` plus `&ssl-ca=` the shared TLS server's CA (for
/// [`SqlMode`](distlock_testkit::sql_faults::SqlMode)s whose parameters set an `ssl-mode`).
pub fn connect_tls(
    url: String,
    opts: distlock_core::ClientOptions,
) -> distlock_testkit::sql_faults::Connecting<MysqlBackend> {
    let ca = tls_server().tls_ca().expect("the TLS server's CA");
    let url = format!("{url}&ssl-ca={}", ca.display());
    Box::pin(async move { MysqlBackend::connect(&url, &opts).await })
}
