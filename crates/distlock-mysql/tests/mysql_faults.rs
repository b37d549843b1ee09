//! Faults and MySQL/MariaDB-specific behaviour, on real servers: killed connections and
//! processes, restarts, credentials, unreachable servers, unsupported kinds.

mod support;

use distlock_core::{Client, LockKind, LostReason, ReleaseOutcome};
use distlock_mysql::lock_key;
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name};
use distlock_testkit::sql_faults;
use distlock_testkit::sql_faults::{late_request_of_an_ended_attempt, Ended};
use distlock_testkit::MariaDbServer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Modes, My};

/// Connections waiting in `GET_LOCK` for lock `name`, in the default namespace. Only this
/// lock counts: other tests may share the server.
fn server_waiters(server: &MariaDbServer, name: &str) -> String {
    let key = lock_key("dlock", name);
    server
        .sql(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE 'SELECT GET_LOCK%{key}%' AND STATE LIKE '%lock%'"
        ))
        .expect("sql")
}

distlock_testkit::sql_fault_cases! {
    mode: My::session(),
    connect: support::connect,
    env: "DLOCK_MY_CHILD",
    waiters: server_waiters,
    refusal: "Access denied",
    invalid: [
        "mysql://u:secret@h/db?mode=nope",
        "mysql://u:secret@h/db?bogus=1",
        "mysql://h/db",
        "mariadb://u@h/db",
    ],
}

/// Killing the holder's connection frees the lock at once, and the holder learns it at once:
/// its client sees the connection close (before, it learned at its next renewal, a third of
/// the lease later, while the next holder already held the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_frees_the_lock() {
    let my = My::session();
    let name = unique_name("kill");
    // A long lease: only the connection's end can explain a prompt signal (the first renewal
    // comes 20 s after the acquisition).
    let opts = fast_opts().watchdog_lease(Duration::from_secs(60));
    let bb = Arc::new(my.backend(&opts).await);
    let a = Client::new(bb.clone(), opts.clone()).expect("client");
    let lock = a.lock(&name).expect("lock");
    let g = lock.acquire().await.expect("acquire");
    let id = bb
        .holder_connection(&name, lock.owner())
        .await
        .expect("holder connection");
    assert_eq!(
        my.server
            .sql(&format!(
                "SELECT IS_USED_LOCK('{}')",
                lock_key("dlock", &name)
            ))
            .expect("sql"),
        id.to_string()
    );
    let killed = Instant::now();
    my.server.sql(&format!("KILL {id}")).expect("KILL");
    let b = my.client_with(opts).await;
    let g2 = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("free once the holder's connection is gone");
    assert!(g2.fencing_token() > g.fencing_token());
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost signal");
    // From the connection's close (`SessionEnded`), not a renewal (`NotHeld`): 5 s is generous
    // on a loaded machine and still far below the first renewal.
    assert!(
        matches!(reason, LostReason::SessionEnded(ref why) if why.contains(&format!("connection {id}"))),
        "{reason:?}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A server restart drops every connection: holders lose their locks (noticed at the next
/// renewal); fencing counters survive, so tokens keep increasing. In table mode the lock row
/// survives the restart and its holder keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_loses_session_locks_and_tokens_survive() {
    let mut server = MariaDbServer::start().expect("start mariadbd");
    let name = unique_name("restart");
    for params in ["", "?mode=table"] {
        // Table mode: a lease that outlasts a restart on a loaded machine.
        let opts = if params.is_empty() {
            fast_opts()
        } else {
            fast_opts().watchdog_lease(Duration::from_secs(20))
        };
        let url = format!("{}{params}", server.url());
        let (a, g, token) =
            sql_faults::hold_across_restart(&mut server, support::connect, &url, &opts, &name)
                .await;
        if params.is_empty() {
            let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
                .await
                .expect("lost signal after restart");
            assert!(
                matches!(
                    reason,
                    LostReason::SessionEnded(_) | LostReason::NotHeld | LostReason::LeaseExpired
                ),
                "{reason:?}"
            );
            drop(g);
        } else {
            // Renewals reconnect; the row survived.
            tokio::time::sleep(Duration::from_millis(800)).await;
            assert!(!g.is_lost(), "table mode survives a restart");
            assert_eq!(
                g.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        sql_faults::next_holder_after_restart(support::connect, &url, &opts, &name, token).await;
        drop(a);
    }
}

/// GET_LOCK has no shared mode: read-write locks are refused clearly, in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_locks_are_unsupported() {
    for my in [My::session(), My::table()] {
        let a = my.client_with(fast_opts()).await;
        let name = unique_name("rw");
        let e = a
            .rw_lock(&name)
            .expect("rw")
            .read()
            .try_acquire()
            .await
            .expect_err("unsupported");
        assert!(e.is_unsupported(), "{e:?}");
        assert!(e.to_string().contains("mysql"), "{e}");
    }
}

/// `inspect` shows holder, lease and the last token; a holder whose connection is
/// gone is not reported even though its row is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_live_holders_only() {
    let my = My::session();
    let name = unique_name("inspect");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(20));
    let bb = Arc::new(my.backend(&opts).await);
    let a = Client::new(bb.clone(), opts.clone()).expect("client");
    let lock = a.lock(&name).expect("lock");
    let g = lock.acquire().await.expect("acquire");
    let _g2 = lock.try_acquire().await.expect("try").expect("re-enter");
    let info = a.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, lock.owner());
    // Re-entry is counted in the client: the server sees one grant.
    assert_eq!(info.holders[0].count, 1);
    let left = info.holders[0].lease_left.expect("lease");
    assert!(
        left > Duration::from_secs(15) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    assert_eq!(info.fencing_token, g.fencing_token());
    let id = bb.holder_connection(&name, lock.owner()).await.expect("id");
    my.server.sql(&format!("KILL {id}")).expect("KILL");
    let info = poll_until(
        "the killed holder is still reported",
        async || a.inspect(&name).await.expect("inspect"),
        |info| !info.held(),
    )
    .await;
    assert!(!info.held(), "{info:?}");
    assert_eq!(info.fencing_token, g.fencing_token());
}

/// A cancelled or timed-out wait leaves no connection waiting in GET_LOCK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_waits_leave_no_server_waiters() {
    let mode = My::session();
    let (_a, g) = sql_faults::abandoned_waits_leave_no_server_waiters(&mode, server_waiters).await;
    g.release().await.expect("release");
}

/// The first request of an attempt is held in a proxy past the operation timeout; the client
/// closes that connection and goes on with another (table mode: `one_trip`), its retry is
/// answered "held" (a try, a wait that runs out) or granted and then released, and the
/// attempt ends. The held request reaches the server only after the holder released: it must
/// not grant the lock to the ended attempt (table mode did: nobody held it for a whole lease,
/// a third client got nothing). Session mode is run too: there a late `GET_LOCK` dies with the
/// connection the client closed.
async fn late(my: My, kind: LockKind, ended: Ended) {
    let at_once = !my.params.is_empty();
    late_request_of_an_ended_attempt(&my, "", kind, ended, at_once).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_try_of_an_ended_attempt_table() {
    late(My::table(), LockKind::Mutex, Ended::Try).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_try_of_a_released_attempt_table() {
    late(My::table(), LockKind::Mutex, Ended::Released).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_wait_of_an_ended_attempt_table() {
    late(My::table(), LockKind::Mutex, Ended::Wait).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_campaign_of_an_ended_attempt_table() {
    late(My::table(), LockKind::Election, Ended::Try).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_try_of_an_ended_attempt_session() {
    late(My::session(), LockKind::Mutex, Ended::Try).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_wait_of_an_ended_attempt_session() {
    late(My::session(), LockKind::Mutex, Ended::Wait).await;
}

/// The SQL that puts `name`'s fencing counter (its `dlock_fence` row, and table mode's lock
/// row) back where it is now. Run later, it is a rollback: a restore from a backup, a crash
/// with `innodb_flush_log_at_trx_commit` other than 1 that lost the last commits, a failover
/// to an asynchronous replica that missed them.
fn my_counters(server: &MariaDbServer, name: &str, kind: LockKind, table: bool) -> String {
    let lk = match kind {
        LockKind::Election => distlock_mysql::election_key("dlock", name),
        _ => lock_key("dlock", name),
    };
    let get = |table: &str| {
        server
            .sql(&format!(
                "SELECT COALESCE(MAX(token), 0) FROM dlock.{table} WHERE lock_key = '{lk}'"
            ))
            .expect("token")
    };
    let fence = get("dlock_fence");
    let mut sql = format!("UPDATE dlock.dlock_fence SET token = {fence} WHERE lock_key = '{lk}'");
    if table {
        let row = get("dlock_table_locks");
        sql.push_str(&format!(
            "; UPDATE dlock.dlock_table_locks SET token = {row} WHERE lock_key = '{lk}'"
        ));
    }
    sql
}

/// The fencing counter set back by hand to an older value (the deterministic stand-in for a
/// restore, a crash that lost the last commits, an asynchronous failover): the next token is
/// above every token handed out before, in both modes, for locks and elections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_after_the_counter_is_set_back() {
    for my in [My::session(), My::table()] {
        for kind in [LockKind::Mutex, LockKind::Election] {
            let table = !my.params.is_empty();
            sql_faults::tokens_rise_after_a_rollback(&my, kind, |s, n, k| {
                my_counters(s, n, k, table)
            })
            .await;
        }
    }
}

/// A forced release (table mode) whose transaction fails halfway — its counter update runs
/// out of the server's lock wait timeout behind another transaction's shared lock on the
/// counter's row — changes nothing and
/// leaves nothing behind. Its connection, inside the open transaction that holds the lock's
/// row, is closed (the server rolls the transaction back), never given back to the pool, where
/// it kept the row locked: the holder could then neither renew nor release. On a server of
/// its own, whose lock wait timeout is 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_forced_release_leaves_no_open_transaction() {
    use mysql_async::prelude::Queryable;
    let server = Arc::new(MariaDbServer::start().expect("start mariadbd"));
    server
        .sql("SET GLOBAL innodb_lock_wait_timeout = 1")
        .expect("lock wait timeout");
    let my = My::new(
        server.clone(),
        "?mode=table",
        support::connect,
        support::free_lock_row,
    );
    // Calls wait longer than the server's lock wait timeout: the server's error comes first.
    let opts = fast_opts()
        .watchdog_lease(Duration::from_secs(60))
        .op_timeout(Duration::from_secs(5));
    let holder = my.client_with(opts.clone()).await;
    let name = unique_name("force-fails");
    let key = lock_key("dlock", &name);
    let g = holder
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let mut other = mysql_async::Conn::from_url(server.url())
        .await
        .expect("connect");
    other.query_drop("START TRANSACTION").await.expect("begin");
    let token: Option<u64> = other
        .query_first(format!(
            "SELECT token FROM dlock_fence WHERE lock_key = '{key}' LOCK IN SHARE MODE"
        ))
        .await
        .expect("lock the counter's row");
    assert!(token.is_some(), "the lock has no counter");
    let operator = my.client_with(opts.clone()).await;
    let r = operator.force_release(&name, LockKind::Mutex).await;
    assert!(r.is_err(), "the forced release went through: {r:?}");
    other.query_drop("ROLLBACK").await.expect("rollback");
    drop(other);
    // Nothing of the forced release stayed: the holder renews and releases as before.
    g.extend(Duration::from_secs(60)).await.expect("renew");
    assert!(!g.is_lost());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let again = operator
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    again.release().await.expect("release");
}

/// Session mode: a forced release whose `KILL` the server refuses (the holder is a connection
/// of another user, which this user may not end) advances the fencing counter all the same,
/// then reports the refusal with what to grant; the other user's connection keeps the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_kill_still_advances_the_counter_and_says_what_to_grant() {
    use mysql_async::prelude::Queryable;
    let my = My::session();
    let name = unique_name("kill-refused");
    let key = lock_key("dlock", &name);
    let operator = my.client_with(fast_opts()).await;
    let g = operator
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let before = g.fencing_token();
    g.release().await.expect("release");
    // Another user (no CONNECTION ADMIN / SUPER) holds the lock's key on a plain connection.
    let user = format!("other_{}", std::process::id());
    my.server
        .sql(&format!(
            "CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY 'pw'; \
             GRANT SELECT ON dlock.* TO '{user}'@'%'"
        ))
        .expect("create the other user");
    let url = format!("mysql://{user}:pw@127.0.0.1:{}/dlock", my.server.port());
    let mut foreign = mysql_async::Conn::from_url(url).await.expect("connect");
    let got: Option<i64> = foreign
        .query_first(format!("SELECT GET_LOCK('{key}', 0)"))
        .await
        .expect("GET_LOCK");
    assert_eq!(got, Some(1));
    let e = operator
        .force_release(&name, LockKind::Mutex)
        .await
        .expect_err("KILL refused");
    let text = e.to_string();
    eprintln!("{text}");
    assert!(
        matches!(e, distlock_core::Error::Unsupported { .. }),
        "{e:?}"
    );
    assert!(text.contains("CONNECTION"), "{text}");
    let info = operator.inspect(&name).await.expect("inspect");
    assert!(
        info.fencing_token > before,
        "the counter did not advance: {} after {before}",
        info.fencing_token
    );
    // The other user's connection still holds the key.
    let still: Option<i64> = foreign
        .query_first(format!("SELECT IS_USED_LOCK('{key}') = CONNECTION_ID()"))
        .await
        .expect("IS_USED_LOCK");
    assert_eq!(still, Some(1));
    let again = operator
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(
        again.is_none(),
        "the other user's connection holds the lock"
    );
    foreign.disconnect().await.expect("disconnect");
}
