//! Elections on a real MariaDB server, in both modes where the case applies: the leader's
//! connection killed (session mode), a numbered proclamation retried through a proxy and a
//! late duplicate, a cancelled campaign, observers woken by the server (not by lease ends),
//! stale observer rows harmless.

mod support;

use distlock_core::{Backend, ClientOptions, LockKind, ReleaseOutcome};
use distlock_mysql::MysqlBackend;
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name};
use distlock_testkit::sql_faults::{
    election_cancelled_campaign, election_proclamations, BreakLock,
};
use distlock_testkit::{DelayProxy, MariaDbServer};
use std::time::{Duration, Instant};
use support::{Modes, My};

/// A long lease: nothing in these tests may be explained by a lease running out or a renewal.
fn long_opts() -> ClientOptions {
    fast_opts().watchdog_lease(Duration::from_secs(60))
}

/// The connection holding election `name`'s key (`NULL` if none).
fn leader_conn(server: &MariaDbServer, name: &str) -> String {
    let key = distlock_mysql::election_key("dlock", name);
    server
        .sql(&format!("SELECT IS_USED_LOCK('{key}')"))
        .expect("IS_USED_LOCK")
}

/// Connections waiting in `GET_LOCK` for election `name`'s key.
fn waiting(server: &MariaDbServer, name: &str) -> String {
    let key = distlock_mysql::election_key("dlock", name);
    server
        .sql(&format!(
            "SELECT count(*) FROM information_schema.processlist \
             WHERE info LIKE 'SELECT GET_LOCK(''{key}''%'"
        ))
        .expect("processlist")
}

async fn until_waiting(server: &MariaDbServer, name: &str, want: &str) {
    let what = format!("{want} connections waiting for the election");
    poll_until(&what, async || waiting(server, name), |v| v == want).await;
}

/// The stored value and proclamation number of election `name`.
fn stored(server: &MariaDbServer, name: &str) -> String {
    let key = distlock_mysql::election_key("dlock", name);
    server
        .sql(&format!(
            "SELECT CONCAT(value, '#', seq) FROM dlock.dlock_elections WHERE lock_key = '{key}'"
        ))
        .expect("sql")
}

/// Killing the leader's connection (`KILL`: an operator, a failover) frees the election's key:
/// the waiting candidate, queued on the server in `GET_LOCK`, leads next with a higher token;
/// the old leader's lost signal fires (at its next renewal, or its proclamation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_hands_over_with_a_higher_token() {
    let my = My::session();
    let name = unique_name("el-kill");
    let opts = fast_opts();
    let a = my.client_with(opts.clone()).await;
    let b = my.client_with(opts.clone()).await;
    let ea = a
        .election(&name)
        .expect("election")
        .with_owner("a")
        .expect("owner");
    let eb = b
        .election(&name)
        .expect("election")
        .with_owner("b")
        .expect("owner");
    let la = ea.campaign("a:1").await.expect("a leads");
    let t1 = la.fencing_token();
    let waiting_b = tokio::spawn(async move { eb.campaign("b:2").await });
    until_waiting(&my.server, &name, "1").await;
    let id = leader_conn(&my.server, &name);
    assert_ne!(id, "NULL");
    my.server.sql(&format!("KILL {id}")).expect("KILL");
    let lb = tokio::time::timeout(Duration::from_secs(10), waiting_b)
        .await
        .expect("b leads within 10 s")
        .expect("task")
        .expect("b leads");
    assert!(lb.fencing_token() > t1);
    let reason = tokio::time::timeout(Duration::from_secs(10), la.lost())
        .await
        .expect("the old leader's lost signal");
    eprintln!("old leader lost: {reason}");
    let leader = ea.leader().await.expect("leader").expect("someone leads");
    assert_eq!(
        (
            leader.owner.as_str(),
            leader.value.as_str(),
            leader.fencing_token
        ),
        ("b", "b:2", lb.fencing_token())
    );
    assert!(la.proclaim("stale").await.is_err());
    assert_eq!(stored(&my.server, &name), "b:2#0");
    lb.resign().await.expect("resign");
    assert_eq!(ea.leader().await.expect("leader"), None);
}

/// The election and the lock of the same name never conflict; each inspect reports its own.
/// A proclamation retried after a late reply, and late or duplicated ones on the trait: the
/// effect of one, the lease untouched (testkit `sql_faults::election_proclamations`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_and_late_proclamations_have_the_effect_of_one() {
    for my in [My::session(), My::table()] {
        // Where the grant's lease end is kept.
        let holders = if my.params.is_empty() {
            "dlock_holders"
        } else {
            "dlock_table_locks"
        };
        let lease = |name: &str| {
            let key = distlock_mysql::election_key("dlock", name);
            my.server
                .sql(&format!(
                    "SELECT expires_at FROM dlock.{holders} WHERE lock_key = '{key}'"
                ))
                .expect("sql")
        };
        election_proclamations(&my, |name| stored(&my.server, name), lease).await;
    }
}

/// A campaign dropped while it waits in `GET_LOCK` leaves nothing (testkit
/// `sql_faults::election_cancelled_campaign`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaign_leaves_nothing() {
    let my = My::session();
    let rows_of_b = |name: &str| {
        let key = distlock_mysql::election_key("dlock", name);
        my.server
            .sql(&format!(
                "SELECT count(*) FROM dlock.dlock_holders WHERE lock_key = '{key}' AND owner = 'b'"
            ))
            .expect("sql")
    };
    election_cancelled_campaign(&my, |name| waiting(&my.server, name), rows_of_b).await;
}

/// A connection holding an election's key without a holder row (a grant between its
/// `GET_LOCK` and its row, or a cancelled campaign's grant being given back) holds the
/// election all the same: `inspect` reports it, so an election shown free can be led. (The
/// conformance case `cancelled_campaign_leaves_nothing` met this now and then: its dropped
/// campaign's grant, given back in the background, hid from `inspect` and refused `c`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_without_a_row_is_reported() {
    use mysql_async::prelude::Queryable;
    let my = My::session();
    let name = unique_name("rowless");
    let key = distlock_mysql::election_key("dlock", &name);
    let mut raw = mysql_async::Conn::from_url(my.url())
        .await
        .expect("a connection of its own");
    let got: Option<i64> =
        (raw.exec_first("SELECT GET_LOCK(?, 0)", (&key,)).await).expect("GET_LOCK");
    assert_eq!(got, Some(1));
    let client = my.client_with(fast_opts()).await;
    let election = client.election(&name).expect("election");
    let info = (client.inspect_kind(&name, LockKind::Election).await).expect("inspect");
    assert_eq!(info.holders.len(), 1, "held, shown free: {info:?}");
    let led = election.try_campaign("c").await.expect("try");
    assert!(led.is_none(), "led while another connection held the key");
    raw.exec_drop("DO RELEASE_LOCK(?)", (&key,))
        .await
        .expect("RELEASE_LOCK");
    let info = (client.inspect_kind(&name, LockKind::Election).await).expect("inspect");
    assert!(info.holders.is_empty(), "free, shown held: {info:?}");
    let led = election.try_campaign("c").await.expect("try");
    let leader = led.expect("an election shown free refused a campaign");
    assert_eq!(
        leader.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
}

/// Rows of `dlock_election_observers` for election `name`.
fn observer_rows(server: &MariaDbServer, name: &str) -> String {
    let key = distlock_mysql::election_key("dlock", name);
    server
        .sql(&format!(
            "SELECT count(*) FROM dlock.dlock_election_observers WHERE lock_key = '{key}'"
        ))
        .expect("sql")
}

/// The observer's next answer, which must come well within the 60 s lease: only the server's
/// wake-up can explain it (the core's lease-end look would come a minute later).
async fn next_soon(o: &mut distlock_core::Observer) -> Option<distlock_core::Leader> {
    tokio::time::timeout(Duration::from_secs(15), o.next())
        .await
        .expect("the observer was not woken by the server")
        .expect("observe")
}

/// A fresh watch on election `name`, then `change`, then the watch must fire well within the
/// 60 s lease. The watch alone (no state read) fires only when the server wakes it.
async fn wakes<F: std::future::Future<Output = ()>>(
    backend: &MysqlBackend,
    name: &str,
    what: &str,
    change: F,
) {
    let mut w = Backend::observe(backend, name).await.expect("observe");
    change.await;
    tokio::time::timeout(Duration::from_secs(15), w.changed())
        .await
        .unwrap_or_else(|_| panic!("{what}: the observer was not woken by the server"))
        .expect("watch");
}

/// An observer is woken by the server, not by a lease end (the lease is 60 s): by a grant, a
/// proclamation, a resignation and (session mode) a candidate granted on the server while it
/// waited. The core's `Observer` then reports each change. Dropping it removes its
/// registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_is_woken_by_the_server() {
    for my in [My::session(), My::table()] {
        let name = unique_name("el-obs");
        let a = my.client_with(long_opts()).await;
        let b = my.client_with(long_opts()).await;
        let ob = my.backend(&long_opts()).await;
        let o_client = my.client_with(long_opts()).await;
        let mut o = o_client.election(&name).expect("election").observe();
        assert_eq!(
            next_soon(&mut o).await,
            None,
            "a fresh election has no leader"
        );
        assert_eq!(observer_rows(&my.server, &name), "1");
        let ea = a
            .election(&name)
            .expect("election")
            .with_owner("a")
            .expect("owner");
        let eb = b
            .election(&name)
            .expect("election")
            .with_owner("b")
            .expect("owner");
        let mut la = None;
        wakes(&ob, &name, "grant", async {
            la = Some(ea.campaign("a:1").await.expect("a leads"));
        })
        .await;
        let la = la.expect("a leads");
        let seen = next_soon(&mut o).await.expect("a leader");
        assert_eq!((seen.owner.as_str(), seen.value.as_str()), ("a", "a:1"));
        wakes(&ob, &name, "proclaim", async {
            la.proclaim("a:2").await.expect("proclaim");
        })
        .await;
        let seen = next_soon(&mut o).await.expect("a leader");
        assert_eq!((seen.owner.as_str(), seen.value.as_str()), ("a", "a:2"));
        wakes(&ob, &name, "resign", async {
            assert_eq!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
        })
        .await;
        assert_eq!(
            next_soon(&mut o).await,
            None,
            "the resignation was not seen"
        );
        if my.params.is_empty() {
            // Session mode: c leads, b waits in GET_LOCK on the server; c's connection is
            // killed (which sends no wake-up), so the wake comes from b's server-side grant.
            let c = my.client_with(long_opts()).await;
            let lc = c
                .election(&name)
                .expect("election")
                .with_owner("c")
                .expect("owner")
                .campaign("c:1")
                .await
                .expect("c leads");
            assert_eq!(next_soon(&mut o).await.expect("c").owner, "c");
            let waiting_b = tokio::spawn(async move { eb.campaign("b:1").await });
            until_waiting(&my.server, &name, "1").await;
            let id = leader_conn(&my.server, &name);
            wakes(&ob, &name, "grant on the server", async {
                my.server.sql(&format!("KILL {id}")).expect("KILL");
            })
            .await;
            let lb = waiting_b.await.expect("join").expect("b leads");
            let seen = next_soon(&mut o).await.expect("b");
            assert_eq!((seen.owner.as_str(), seen.value.as_str()), ("b", "b:1"));
            drop(lc);
            lb.resign().await.expect("resign");
        }
        drop(o);
        poll_until(
            "the observer's registration removed",
            async || observer_rows(&my.server, &name),
            |v| v == "0",
        )
        .await;
    }
}

/// Connections of `server` with id `id`, and of those, the ones running `info` (a prefix).
fn session_of(server: &MariaDbServer, id: &str, info: &str) -> String {
    server
        .sql(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE ID = {id} AND COALESCE(INFO, '') LIKE '{info}%'"
        ))
        .expect("processlist")
}

/// Dropping an observer removes its registration even when its connection had a statement on
/// its way that registers it again (the reset of its flag after a wake-up, in flight when the
/// watch is dropped). The server runs what a connection sent before it reads that the
/// connection closed: a deregistration that deletes the row before the observer's session has
/// ended sees the row come back, naming a dead connection (until some later change's sweep).
/// Here the proxy delays that registration, and holds the deregistration's `KILL` of the
/// observer's connection until the registration has run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_observer_with_a_registration_in_flight_leaves_no_row() {
    for my in [My::session(), My::table()] {
        let name = unique_name("el-obsflight");
        let key = distlock_mysql::election_key("dlock", &name);
        let proxy = DelayProxy::start(my.server.addr(), Duration::ZERO).expect("proxy");
        // Nothing may time out while the proxy holds a request back.
        let opts = long_opts().op_timeout(Duration::from_secs(5));
        let ob = my.backend_via(&proxy.addr().to_string(), &opts).await;
        let w = Backend::observe(&ob, &name).await.expect("observe");
        let id = my
            .server
            .sql(&format!(
                "SELECT conn_id FROM dlock.dlock_election_observers WHERE lock_key = '{key}'"
            ))
            .expect("sql");
        poll_until(
            "the observer waiting in its round",
            async || session_of(&my.server, &id, "SELECT ''dlock-observe"),
            |n| n == "1",
        )
        .await;
        // A change made by a client of its own (not through the proxy) interrupts the round;
        // the observer then registers again, and that statement is delayed.
        let before = proxy.stats().requests.chunks_read;
        proxy.set_request_delay(Duration::from_secs(2));
        let a = my.client_with(long_opts()).await;
        let l = a
            .election(&name)
            .expect("election")
            .campaign("v")
            .await
            .expect("leads");
        let t = Instant::now();
        while proxy.stats().requests.chunks_read == before {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no registration sent"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        proxy.set_request_delay(Duration::ZERO);
        proxy.hold_next_request_with(format!("KILL {id}").as_bytes());
        drop(w);
        poll_until(
            "the deregistration's KILL held",
            async || proxy.held_connections(),
            |n| *n == 1,
        )
        .await;
        // The observer's end of stream follows the delayed registration: once its session is
        // gone, the registration has run.
        poll_until(
            "the observer's session ended",
            async || session_of(&my.server, &id, ""),
            |n| n == "0",
        )
        .await;
        proxy.release_held();
        poll_until(
            "the observer's registration removed",
            async || observer_rows(&my.server, &name),
            |v| v == "0",
        )
        .await;
        l.resign().await.expect("resign");
    }
}

/// A broken observer connection (killed by an operator) ends the watch with an error, and the
/// core's `Observer` subscribes again and goes on seeing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_observer_connection_ends_the_watch() {
    for my in [My::session(), My::table()] {
        let name = unique_name("el-obskill");
        let key = distlock_mysql::election_key("dlock", &name);
        let ob = my.backend(&long_opts()).await;
        let mut w = Backend::observe(&ob, &name).await.expect("observe");
        let id = my
            .server
            .sql(&format!(
                "SELECT conn_id FROM dlock.dlock_election_observers WHERE lock_key = '{key}'"
            ))
            .expect("sql");
        my.server.sql(&format!("KILL {id}")).expect("KILL");
        let r = tokio::time::timeout(Duration::from_secs(15), w.changed())
            .await
            .expect("the watch did not end");
        assert!(r.is_err(), "{r:?}");
        drop(w);
        // The core's observer after the same: it resubscribes and sees the next leader.
        let c = my.client_with(long_opts()).await;
        let mut o = c.election(&name).expect("election").observe();
        assert_eq!(next_soon(&mut o).await, None);
        let ids = my
            .server
            .sql(&format!(
                "SELECT conn_id FROM dlock.dlock_election_observers WHERE lock_key = '{key}'"
            ))
            .expect("sql");
        let live = ids.lines().last().expect("a registration").to_owned();
        my.server.sql(&format!("KILL {live}")).expect("KILL");
        let l = c
            .election(&name)
            .expect("election")
            .campaign("v")
            .await
            .expect("leads");
        let seen = next_soon(&mut o).await.expect("a leader");
        assert_eq!(seen.value, "v");
        l.resign().await.expect("resign");
    }
}

/// A registration row naming a connection that is not an observer of that election (a stale
/// row after a server restart reused its id, or one made by hand) never interrupts that
/// connection's statement, even one that looks like another election's observer; a row whose
/// connection is gone is deleted by the next wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_observer_rows_never_kill_unrelated_queries() {
    use mysql_async::prelude::Queryable;
    for my in [My::session(), My::table()] {
        let name = unique_name("el-stale");
        let key = distlock_mysql::election_key("dlock", &name);
        let other = distlock_mysql::election_key("dlock", &format!("{name}-other"));
        // Connecting creates the tables.
        let a = my.client_with(long_opts()).await;
        let mut conn = mysql_async::Conn::from_url(my.server.url())
            .await
            .expect("connect");
        let id = conn.id();
        let user: String = conn
            .query_first("SELECT SUBSTRING_INDEX(USER(), '@', 1)")
            .await
            .expect("user")
            .expect("a row");
        my.server
            .sql(&format!(
                "INSERT INTO dlock.dlock_election_observers VALUES \
                 ('{key}', {id}, 'dlock', 'x', '{user}', 0, UTC_TIMESTAMP(6)), \
                 ('{key}', 4000000000, 'dlock', 'x', '{user}', 0, UTC_TIMESTAMP(6))"
            ))
            .expect("fake rows");
        let secs = 4;
        let unrelated = tokio::spawn(async move {
            let t = Instant::now();
            let r: Option<(String, i64)> = conn
                .query_first(format!("SELECT 'dlock-observe {other}', SLEEP({secs})"))
                .await
                .expect("the unrelated query was interrupted");
            (r.expect("a row").1, t.elapsed())
        });
        let e = a.election(&name).expect("election");
        // Changes of the election while the unrelated query runs: grant, proclaim, resign.
        let l = e.campaign("v1").await.expect("leads");
        l.proclaim("v2").await.expect("proclaim");
        l.resign().await.expect("resign");
        let l = e.campaign("v3").await.expect("leads");
        poll_until(
            "the gone connection's row deleted",
            async || observer_rows(&my.server, &name),
            |v| v == "1",
        )
        .await;
        l.resign().await.expect("resign");
        let (slept, took) = unrelated.await.expect("join");
        assert_eq!(slept, 0, "the unrelated SLEEP was interrupted");
        // SLEEP's own timer may end a few ms before the client's clock says `secs` have passed
        // (seen: 3.995 s); an interrupted one would return 1 (checked above) and end far sooner.
        assert!(
            took >= Duration::from_secs(secs) - Duration::from_millis(200),
            "{took:?}"
        );
        my.server
            .sql(&format!(
                "DELETE FROM dlock.dlock_election_observers WHERE lock_key = '{key}'"
            ))
            .expect("cleanup");
    }
}

/// The operator commands tell an election from the lock of the same name: `list` shows both,
/// each with its own holder, and `force_release(name, Election)` revokes the leader only (its
/// lost signal fires; the counter moves past its token), leaving the lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_tell_the_election_apart() {
    for my in [My::session(), My::table()] {
        distlock_testkit::sql_faults::election_operator_commands(&my).await;
    }
}

/// Connections of `server` running a statement that starts with `start` and names `key`.
/// (Not `INNODB_TRX`: the server refreshes that table only when it was not read for 0.1 s, so
/// a poll faster than that reads the same stale rows for ever.)
fn running(server: &MariaDbServer, start: &str, key: &str) -> String {
    server
        .sql(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE '{start}%{key}%'"
        ))
        .expect("processlist")
}

/// A grant whose transaction the server rolls back as a deadlock's victim — the error comes
/// from a statement in the middle of the grant's multi-statement query — is retried and
/// granted, never answered as a reply without a token. (The driver hands a later statement's
/// error over as the end of the results: it was read as "fencing token: no row", and the
/// error stayed on the connection for its next statement.) The deadlock is a real one: a
/// transaction holds the election's row, the grant waits for it holding the counter's row,
/// then that transaction asks for the counter's row; being the heavier of the two, it is not
/// the one the server rolls back. On a server of its own: while the grant waits, its
/// transaction holds gap locks of `dlock_holders` that stall other cases' grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_rolled_back_by_a_deadlock_is_retried() {
    use mysql_async::prelude::Queryable;
    let server = std::sync::Arc::new(MariaDbServer::start().expect("start mariadbd"));
    let modes: [(&str, BreakLock<MariaDbServer>); 2] = [
        ("", support::delete_holder_row),
        ("?mode=table", support::free_lock_row),
    ];
    for (params, break_lock) in modes {
        let my = My::new(server.clone(), params, support::connect, break_lock);
        let name = unique_name("el-deadlock");
        let key = distlock_mysql::election_key("dlock", &name);
        // Nothing here may be explained by a call running out of time.
        let opts = long_opts().op_timeout(Duration::from_secs(5));
        let c = my.client_with(opts).await;
        let e = c
            .election(&name)
            .expect("election")
            .with_owner("a")
            .expect("owner");
        // The election's rows exist (the counter's and the value's).
        let first = e.campaign("v0").await.expect("a leads");
        let t0 = first.fencing_token();
        first.resign().await.expect("resign");

        let mut other = mysql_async::Conn::from_url(my.server.url())
            .await
            .expect("connect");
        other
            .query_drop(
                "CREATE TABLE IF NOT EXISTS deadlock_ballast (n INT PRIMARY KEY) ENGINE=InnoDB",
            )
            .await
            .expect("ballast table");
        other.query_drop("START TRANSACTION").await.expect("begin");
        let rows: Vec<String> = (0..200).map(|n| format!("({n})")).collect();
        other
            .query_drop(format!(
                "INSERT INTO deadlock_ballast VALUES {}",
                rows.join(",")
            ))
            .await
            .expect("ballast");
        let held: Option<u64> = other
            .query_first(format!(
                "SELECT seq FROM dlock_elections WHERE lock_key = '{key}' FOR UPDATE"
            ))
            .await
            .expect("lock the election's row");
        assert!(held.is_some(), "the election has no row");
        let campaign = tokio::spawn(async move { e.campaign("v1").await });
        // The grant holds the counter's row; once it runs the statement that needs the
        // election's row, it waits (or is about to).
        poll_until(
            "the grant waiting for the election's row",
            async || running(&my.server, "INSERT INTO dlock_elections", &key),
            |n| n == "1",
        )
        .await;
        let r: Result<Option<u64>, _> = other
            .query_first(format!(
                "SELECT token FROM dlock_fence WHERE lock_key = '{key}' FOR UPDATE"
            ))
            .await;
        assert!(
            r.is_ok(),
            "the server rolled back the other transaction, not the grant's: {r:?}"
        );
        other.query_drop("ROLLBACK").await.expect("rollback");
        drop(other);
        let l = campaign
            .await
            .expect("join")
            .expect("the grant rolled back by the deadlock is retried");
        assert!(l.fencing_token() > t0);
        let leader = c
            .election(&name)
            .expect("election")
            .leader()
            .await
            .expect("leader")
            .expect("someone leads");
        assert_eq!(
            (
                leader.owner.as_str(),
                leader.value.as_str(),
                leader.fencing_token
            ),
            ("a", "v1", l.fencing_token())
        );
        assert_eq!(stored(&my.server, &name), "v1#0");
        assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    }
}
