//! Elections in session mode on a real PostgreSQL server: the leader's session terminated, a
//! numbered proclamation retried through a proxy and a late duplicate, a cancelled campaign,
//! observers woken by NOTIFY (the election beside the lock of the same name is the shared
//! suite's `election_apart_from_lock`).

mod support;

use distlock_core::{ClientOptions, LostReason, ReleaseOutcome};
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name};
use distlock_testkit::sql_faults::{election_cancelled_campaign, election_proclamations};
use distlock_testkit::PostgresServer;
use std::time::{Duration, Instant};
use support::{Modes, Pg};

/// A long lease: nothing in these tests may be explained by a lease running out or a renewal
/// (the first comes after 20 s), only by the server's own signals.
fn long_opts() -> ClientOptions {
    fast_opts().watchdog_lease(Duration::from_secs(60))
}

/// `pg_locks` rows of election `name`'s key: `granted` true for the leader, false for waiting
/// candidates.
fn election_locks(server: &PostgresServer, name: &str, granted: bool) -> String {
    let key = distlock_postgres::election_key("dlock", name) as u64;
    server
        .sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = {granted} \
             AND classid = {} AND objid = {} AND objsubid = 1",
            key >> 32,
            key & 0xffff_ffff
        ))
        .expect("sql")
}

/// Waits until [`election_locks`] reads `want`.
async fn until_locks(server: &PostgresServer, name: &str, granted: bool, want: &str) {
    let what = format!("{want} pg_locks rows of the election (granted {granted})");
    poll_until(
        &what,
        async || election_locks(server, name, granted),
        |v| v == want,
    )
    .await;
}

/// The table of `pg`'s mode that keeps the elections.
fn table(pg: &Pg) -> &'static str {
    if pg.params.is_empty() {
        "dlock_elections"
    } else {
        "dlock_lease_elections"
    }
}

/// The stored value and proclamation number of election `name` (session mode's table).
fn stored(server: &PostgresServer, name: &str) -> String {
    stored_in(server, "dlock_elections", name)
}

/// The stored value and proclamation number of election `name` in `table`.
fn stored_in(server: &PostgresServer, table: &str, name: &str) -> String {
    server
        .sql(&format!(
            "SELECT value || '#' || seq FROM {table} WHERE name = '{name}'"
        ))
        .expect("sql")
}

/// Terminating the leader's backend (`pg_terminate_backend`: an operator, a failover, a
/// network cut) fires its lost signal at once with `SessionEnded`; the waiting candidate,
/// queued on the server, leads next with a higher token and its own value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_leader_hands_over_with_a_higher_token() {
    let pg = Pg::session();
    let name = unique_name("el-kill");
    let a = pg.client_with(long_opts()).await;
    let b = pg.client_with(long_opts()).await;
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
    let waiting = tokio::spawn(async move { eb.campaign("b:2").await });
    until_locks(&pg.server, &name, false, "1").await;
    let pid = pg
        .server
        .sql(&format!(
            "SELECT pid FROM dlock_elections WHERE name = '{name}'"
        ))
        .expect("pid");
    let t = Instant::now();
    assert_eq!(
        pg.server
            .sql(&format!("SELECT pg_terminate_backend({pid})"))
            .expect("terminate"),
        "t"
    );
    let reason = tokio::time::timeout(Duration::from_secs(10), la.lost())
        .await
        .expect("lost signal");
    assert!(matches!(reason, LostReason::SessionEnded(_)), "{reason:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let lb = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("b leads within 10 s")
        .expect("task")
        .expect("b leads");
    assert!(lb.fencing_token() > la.fencing_token());
    let leader = ea.leader().await.expect("leader").expect("someone leads");
    assert_eq!(
        (
            leader.owner.as_str(),
            leader.value.as_str(),
            leader.fencing_token
        ),
        ("b", "b:2", lb.fencing_token())
    );
    // The old leader's proclamation is refused and its resignation touches nothing.
    assert!(la.proclaim("stale").await.is_err());
    assert_eq!(stored(&pg.server, &name), "b:2#0");
    assert_ne!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
    assert_eq!(election_locks(&pg.server, &name, true), "1");
    lb.resign().await.expect("resign");
    assert_eq!(ea.leader().await.expect("leader"), None);
}

/// A proclamation retried after a late reply, and late or duplicated ones on the trait: the
/// effect of one, the lease untouched (testkit `sql_faults::election_proclamations`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_and_late_proclamations_have_the_effect_of_one() {
    for pg in [Pg::session(), Pg::lease()] {
        let tbl = table(&pg);
        let lease = |name: &str| {
            pg.server
                .sql(&format!(
                    "SELECT extract(epoch FROM expires_at) FROM {tbl} WHERE name = '{name}'"
                ))
                .expect("sql")
        };
        election_proclamations(&pg, |name| stored_in(&pg.server, tbl, name), lease).await;
    }
}

/// A campaign dropped while it waits on the server leaves nothing (testkit
/// `sql_faults::election_cancelled_campaign`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaign_leaves_nothing() {
    let pg = Pg::session();
    let rows_of_b = |name: &str| {
        pg.server
            .sql(&format!(
                "SELECT count(*) FROM dlock_elections WHERE name = '{name}' AND owner = 'b'"
            ))
            .expect("sql")
    };
    let waiting = |name: &str| election_locks(&pg.server, name, false);
    election_cancelled_campaign(&pg, waiting, rows_of_b).await;
}

/// The observer's next answer, within 10 s (far below the 60 s lease).
async fn next(obs: &mut distlock_core::Observer) -> Option<distlock_core::Leader> {
    tokio::time::timeout(Duration::from_secs(10), obs.next())
        .await
        .expect("woken within 10 s")
        .expect("observe")
}

/// Observers are woken by the server (LISTEN/NOTIFY on the election's channel): a new
/// leader, a proclaimed value, a resignation — each seen well before any lease end (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_are_woken_by_notify() {
    for pg in [Pg::session(), Pg::lease()] {
        observe_in(pg).await;
    }
}

async fn observe_in(pg: Pg) {
    let name = unique_name("el-observe");
    let a = pg.client_with(long_opts()).await;
    let o = pg.client_with(long_opts()).await;
    let mut obs = o.election(&name).expect("election").observe();
    assert_eq!(next(&mut obs).await, None);
    let e = a
        .election(&name)
        .expect("election")
        .with_owner("a")
        .expect("owner");
    let l = e.campaign("one").await.expect("leads");
    let seen = next(&mut obs).await.expect("a leader");
    assert_eq!(
        (seen.owner.as_str(), seen.value.as_str(), seen.fencing_token),
        ("a", "one", l.fencing_token())
    );
    l.proclaim("two").await.expect("proclaim");
    let seen = next(&mut obs).await.expect("a leader");
    assert_eq!(seen.value, "two");
    l.resign().await.expect("resign");
    assert_eq!(next(&mut obs).await, None);
}

/// The operator commands tell an election from the lock of the same name (both modes): `list`
/// shows both, each with its own holder, and `force_release(name, Election)` revokes the
/// leader only (its lost signal fires; the token drawn is above its own), leaving the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_tell_the_election_apart() {
    for pg in [Pg::session(), Pg::lease()] {
        distlock_testkit::sql_faults::election_operator_commands(&pg).await;
    }
}
