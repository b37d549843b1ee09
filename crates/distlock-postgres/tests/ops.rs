//! Operator commands (list, force_release, diagnose) on a real PostgreSQL server, both modes,
//! through the Client API, with holders in other clients.

mod support;

use distlock_core::{Client, ClientOptions, Error, LockKind, Severity};
use distlock_testkit::FencedRegister;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Modes, Pg};

async fn client(pg: &Pg, lease: Duration) -> Client {
    pg.client_with(ClientOptions::default().watchdog_lease(lease))
        .await
}

async fn client_at(url: &str, lease: Duration) -> Client {
    let opts = ClientOptions::default().watchdog_lease(lease);
    let b = distlock_postgres::PostgresBackend::connect(url, &opts)
        .await
        .expect("connect");
    Client::new(Arc::new(b), opts).expect("client")
}

async fn wait_for(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let t = Instant::now();
    while !f().await {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Held, waited-for, read-side and released locks are listed (owner, lease, waiters, token),
/// and the prefix filters.
async fn list_shows_locks(pg: &Pg, p: &str, session: bool) {
    let a = client(pg, Duration::from_secs(5)).await;
    let b = client(pg, Duration::from_secs(5)).await;
    let job = format!("{p}job");
    let held = a
        .lock(&job)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let waiter = {
        let lock = b.lock(&job).expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await })
    };
    let done = format!("{p}done");
    let g = a
        .lock(&done)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let done_token = g.fencing_token();
    g.release().await.expect("release");
    let rw = format!("{p}rw");
    let read = if session {
        Some(
            a.rw_lock(&rw)
                .expect("rw")
                .read()
                .acquire()
                .await
                .expect("read"),
        )
    } else {
        None
    };
    let mut last = Vec::new();
    wait_for(
        "the waiter to be listed",
        Duration::from_secs(10),
        async || {
            last = a.list(p).await.expect("list");
            !session
                || last
                    .iter()
                    .any(|l| l.info.name == job && l.info.waiters == Some(1))
        },
    )
    .await;
    let j = last
        .iter()
        .find(|l| l.info.name == job)
        .expect("held lock listed");
    assert_eq!(j.kind, LockKind::Mutex);
    assert_eq!(j.info.holders.len(), 1, "{j:?}");
    assert_eq!(j.info.holders[0].owner, held.owner());
    assert_eq!(j.info.holders[0].count, 1);
    assert!(
        j.info.holders[0]
            .lease_left
            .is_some_and(|l| l <= Duration::from_secs(5)),
        "{j:?}"
    );
    assert_eq!(j.info.fencing_token, held.fencing_token());
    let d = last
        .iter()
        .find(|l| l.info.name == done)
        .expect("released lock listed");
    assert!(d.info.holders.is_empty(), "{d:?}");
    assert_eq!(d.info.fencing_token, done_token);
    if session {
        let r = last.iter().find(|l| l.info.name == rw).expect("rw listed");
        assert_eq!(r.kind, LockKind::Write);
        assert_eq!(r.info.holders[0].side, Some(LockKind::Read), "{r:?}");
    }
    let only = a.list(&done).await.expect("list");
    assert!(only.iter().all(|l| l.info.name == done), "{only:?}");
    assert!(a.list(&format!("{p}none")).await.expect("list").is_empty());
    // Names are compared as text, not LIKE patterns.
    assert!(a.list(&format!("{p}_ob")).await.expect("list").is_empty());
    held.release().await.expect("release");
    let g = waiter.await.expect("join").expect("waiter acquires");
    g.release().await.expect("release");
    if let Some(r) = read {
        r.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_list_shows_locks() {
    list_shows_locks(&Pg::session(), "sl-", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_list_shows_locks() {
    list_shows_locks(&Pg::lease(), "ll-", false).await;
}

/// A holder in another client (lease 1 s) is removed: its lost signal fires, the counter is
/// past its token, the next holder's token is higher, and the old holder's write with its
/// token is rejected after the next one wrote. A waiter stays queued and gets the lock.
async fn force_release_fences(pg: &Pg, name: &str) {
    let old = client(pg, Duration::from_secs(1)).await;
    let guard = old
        .lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let register = FencedRegister::new();
    assert!(register.write(guard.fencing_token(), "old", true));
    let next = client(pg, Duration::from_secs(5)).await;
    let waiter = {
        let lock = next.lock(name).expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await })
    };
    let op = client(pg, Duration::from_secs(5)).await;
    let t = Instant::now();
    let out = op
        .force_release(name, LockKind::Mutex)
        .await
        .expect("force");
    assert_eq!(out.removed.len(), 1, "{out:?}");
    assert_eq!(out.removed[0].owner, guard.owner());
    assert!(out.fencing_token > guard.fencing_token(), "{out:?}");
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the old holder's lost signal fires");
    eprintln!("lost signal {:?} after the forced release", t.elapsed());
    let g2 = waiter.await.expect("join").expect("the waiter acquires");
    assert!(g2.fencing_token() > out.fencing_token || g2.fencing_token() > guard.fencing_token());
    assert!(register.write(g2.fencing_token(), "next", true));
    assert!(
        !register.write(guard.fencing_token(), "old", !guard.is_lost()),
        "the old holder's write must be rejected"
    );
    register.assert_no_rejected_belief();
    // A second forced release of a free lock removes nothing and still advances the counter.
    g2.release().await.expect("release");
    let again = op
        .force_release(name, LockKind::Mutex)
        .await
        .expect("force");
    assert!(again.removed.is_empty(), "{again:?}");
    assert!(again.fencing_token > out.fencing_token);
    let info = op.inspect(name).await.expect("inspect");
    assert_eq!(info.fencing_token, again.fencing_token);
    // A name never used gets a counter too.
    let fresh = op
        .force_release(&format!("{name}-fresh"), LockKind::Mutex)
        .await
        .expect("force");
    assert!(fresh.removed.is_empty() && fresh.fencing_token > again.fencing_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_force_release_fences_the_old_holder() {
    force_release_fences(&Pg::session(), "sf-stuck").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_force_release_fences_the_old_holder() {
    force_release_fences(&Pg::lease(), "lf-stuck").await;
}

/// Session mode, read-write: both sides go (a writer that downgraded holds both on one
/// session, another reader on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_force_release_of_both_rw_sides() {
    let pg = Pg::session();
    let a = client(&pg, Duration::from_secs(5)).await;
    let b = client(&pg, Duration::from_secs(5)).await;
    // One RwLock: its write and read sides share an owner id (a downgrade).
    let rw = a.rw_lock("sf-rw").expect("rw");
    let w = rw.write().acquire().await.expect("write");
    let r = rw.read().acquire().await.expect("downgrade");
    let op = client(&pg, Duration::from_secs(5)).await;
    let listed = op.list("sf-rw").await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].info.holders.len(), 2, "{listed:?}");
    let out = op
        .force_release("sf-rw", LockKind::Write)
        .await
        .expect("force");
    assert_eq!(out.removed.len(), 2, "{out:?}");
    for lost in [w.lost(), r.lost()] {
        tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("lost signal fires");
    }
    let r2 = b
        .rw_lock("sf-rw")
        .expect("rw")
        .read()
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("read");
    assert!(r2.fencing_token() > w.fencing_token());
    let listed = op.list("sf-rw").await.expect("list");
    assert_eq!(listed[0].info.holders.len(), 1, "{listed:?}");
    r2.release().await.expect("release");
}

/// A session holding the name's advisory key without a holder row (a foreign program using
/// the same key) is listed with its pid and application_name, and terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_foreign_advisory_holder_is_listed_and_released() {
    let pg = Pg::session();
    let op = client(&pg, Duration::from_secs(5)).await;
    // A counter row makes the name known.
    op.force_release("sf-foreign", LockKind::Mutex)
        .await
        .expect("force");
    let url = format!("{}?application_name=foreign-job", pg.server.url());
    let config: tokio_postgres::Config = url.parse().expect("config");
    let (raw, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    let key = distlock_postgres::lock_key("dlock", "sf-foreign");
    raw.execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .expect("lock");
    let listed = op.list("sf-foreign").await.expect("list");
    let h = &listed[0].info.holders;
    assert_eq!(h.len(), 1, "{listed:?}");
    assert!(
        h[0].owner.contains("foreign-job") && h[0].owner.contains("no dlock_holders row"),
        "{h:?}"
    );
    let out = op
        .force_release("sf-foreign", LockKind::Mutex)
        .await
        .expect("force");
    assert_eq!(out.removed.len(), 1, "{out:?}");
    // The foreign session was terminated and the key is free.
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("session ends");
    assert!(
        ended.expect("join").is_err(),
        "terminated, not closed cleanly"
    );
    let g = op
        .lock("sf-foreign")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    assert!(g.fencing_token() > out.fencing_token);
    g.release().await.expect("release");
}

/// A superuser's plain session (a role dlock's may not terminate) holding lock `name`'s
/// advisory key through `func` (`pg_advisory_lock` or `pg_advisory_lock_shared`), and the
/// task driving its connection.
async fn superuser_holds(
    pg: &Pg,
    name: &str,
    func: &str,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let config: tokio_postgres::Config = pg.server.admin_url().parse().expect("config");
    let (raw, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    let key = distlock_postgres::lock_key("dlock", name);
    raw.execute(&format!("SELECT {func}($1)"), &[&key])
        .await
        .expect("lock");
    (raw, conn)
}

/// Terminating another role's (here a superuser's) backend is refused with what to grant,
/// and that backend keeps the lock. (The superuser holds the key with a plain connection: a
/// dlock client of another role would create or need dlock's tables as that role.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_force_release_without_privilege_says_what_to_grant() {
    let pg = Pg::session();
    let op = client(&pg, Duration::from_secs(5)).await;
    op.force_release("sf-priv", LockKind::Mutex)
        .await
        .expect("force a free lock");
    let (raw, conn) = superuser_holds(&pg, "sf-priv", "pg_advisory_lock").await;
    let e = op
        .force_release("sf-priv", LockKind::Mutex)
        .await
        .expect_err("refused");
    let text = e.to_string();
    eprintln!("{text}");
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert!(text.contains("pg_signal_backend"), "{text}");
    assert!(!conn.is_finished());
    let g = op
        .lock("sf-priv")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g.is_none(), "the superuser's session still holds the key");
    drop(raw);
}

/// A forced release that may end one holder but not another (a dlock reader, and a
/// superuser's plain session holding the read side beside it) ends the one it may, advances
/// the fencing counter, and only then reports the refusal: the dlock reader learns at once
/// that its lock is gone, the counter is above its token, and the superuser's session keeps
/// its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_refused_force_release_still_ends_and_fences_the_others() {
    let pg = Pg::session();
    let a = client(&pg, Duration::from_secs(5)).await;
    let r = a
        .rw_lock("sf-half")
        .expect("rw")
        .read()
        .acquire()
        .await
        .expect("read");
    let (raw, conn) = superuser_holds(&pg, "sf-half", "pg_advisory_lock_shared").await;
    let op = client(&pg, Duration::from_secs(5)).await;
    let e = op
        .force_release("sf-half", LockKind::Write)
        .await
        .expect_err("refused");
    let text = e.to_string();
    eprintln!("{text}");
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    assert!(text.contains("pg_signal_backend"), "{text}");
    tokio::time::timeout(Duration::from_secs(5), r.lost())
        .await
        .expect("the dlock reader's session was ended");
    let info = op
        .inspect_kind("sf-half", LockKind::Write)
        .await
        .expect("inspect");
    assert!(
        info.fencing_token > r.fencing_token(),
        "the counter did not advance: {} after {}",
        info.fencing_token,
        r.fencing_token()
    );
    assert!(!conn.is_finished());
    let w = op
        .rw_lock("sf-half")
        .expect("rw")
        .write()
        .try_acquire()
        .await
        .expect("try");
    assert!(w.is_none(), "the superuser's session still holds its share");
    drop(raw);
}

fn check<'a>(f: &'a [distlock_core::Finding], name: &str) -> &'a distlock_core::Finding {
    f.iter()
        .find(|x| x.check == name)
        .unwrap_or_else(|| panic!("no {name} finding in {f:?}"))
}

/// A plain server, directly: every check passes (a TCP proxy in front is not a pooler).
async fn doctor_passes(pg: &Pg) {
    let c = client(pg, Duration::from_secs(5)).await;
    let f = c.diagnose().await.expect("diagnose");
    eprintln!("{f:#?}");
    for name in [
        "version",
        "tls",
        "pooler",
        "session-timeout",
        "replication",
        "clock",
    ] {
        assert_eq!(check(&f, name).severity, Severity::Ok, "{f:?}");
    }
    let proxy = distlock_testkit::ProxyControl::start(&[pg.server.addr()]).expect("proxy");
    let url = pg
        .url()
        .replace(&format!("127.0.0.1:{}", pg.server.port()), &proxy.hosts());
    let c = client_at(&url, Duration::from_secs(5)).await;
    let f = c.diagnose().await.expect("diagnose");
    assert_eq!(check(&f, "pooler").severity, Severity::Ok, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_doctor_passes_a_direct_server() {
    doctor_passes(&Pg::session()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_doctor_passes_a_direct_server() {
    doctor_passes(&Pg::lease()).await;
}
