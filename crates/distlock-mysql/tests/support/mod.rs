//! One MariaDB server shared by the tests of a test binary (cases use distinct names), and the
//! two modes on it (the harness is the testkit's, shared with distlock-postgres).

#![allow(dead_code)]

use distlock_mysql::MysqlBackend;
use distlock_testkit::MariaDbServer;

distlock_testkit::sql_test_support! {
    My = MariaDbServer, MysqlBackend;
    /// Session mode (`GET_LOCK`, the default).
    session: "" => kill_holder,
    /// Table mode (`?mode=table`).
    table: "?mode=table" => free_lock_row,
}

/// Session mode: kills the holder's connection, as an operator (or a failover) would: the
/// server frees the lock, and the holder's next renewal finds its connection gone.
fn kill_holder(server: &MariaDbServer, name: &str) {
    let key = distlock_mysql::lock_key("dlock", name);
    let id = server
        .sql(&format!("SELECT IS_USED_LOCK('{key}')"))
        .expect("IS_USED_LOCK");
    assert_ne!(id, "NULL", "nobody holds {name}");
    server.sql(&format!("KILL {id}")).expect("KILL");
}

/// Table mode: frees the lock row behind the holder's back, as an operator would.
fn free_lock_row(server: &MariaDbServer, name: &str) {
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
