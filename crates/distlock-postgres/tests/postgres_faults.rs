//! Faults and PostgreSQL-specific behaviour, on real servers: killed sessions and processes,
//! restarts, credentials, unreachable servers, read-write locks, notifications.

mod support;

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, ClientOptions, Error, HoldKey, LockKind,
    LostReason, LostSignal, ReleaseOutcome,
};
use distlock_postgres::PostgresBackend;
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name, EVENTUALLY};
use distlock_testkit::sql_faults;
use distlock_testkit::PostgresServer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{shared_server, Modes, Pg};

fn client(backend: PostgresBackend, opts: ClientOptions) -> Client {
    Client::new(Arc::new(backend), opts).expect("client")
}

/// Connections waiting (not granted) on the server for lock `name`'s key, in the default
/// namespace. Only this lock's key counts: other tests may share the server.
fn server_waiters(server: &PostgresServer, name: &str) -> String {
    let key = distlock_postgres::lock_key("dlock", name) as u64;
    server
        .sql(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND classid = {} AND objid = {} AND objsubid = 1",
            key >> 32,
            key & 0xffff_ffff
        ))
        .expect("sql")
}

distlock_testkit::sql_fault_cases! {
    mode: Pg::session(),
    connect: support::connect,
    env: "DLOCK_PG_CHILD",
    waiters: server_waiters,
    refusal: "password authentication failed",
    invalid: [
        "postgres://u:secret@h/db?mode=nope",
        "postgres://u:secret@h/db?sslmode=verify-full",
        "postgres://u:secret@h/db?bogus=1",
        "postgres://h/db",
        "postgresx://u@h/db",
    ],
}

/// Terminating the holder's session (an operator's `pg_terminate_backend`, a failover, a
/// network cut) fires the lost signal at once with `SessionEnded`, and frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_session_fires_lost_at_once() {
    let pg = Pg::session();
    let name = unique_name("terminate");
    // A long lease: only the session's end can explain a prompt signal (the holder's next
    // renewal comes 20 s after the acquisition, its lease ends after 60 s).
    let opts = fast_opts().watchdog_lease(Duration::from_secs(60));
    let backend = pg.backend(&opts).await;
    let a = client(backend, opts.clone());
    let lock = a.lock(&name).expect("lock");
    let g = lock.acquire().await.expect("acquire");
    let pid = match a.backend().inspect(&name, LockKind::Mutex).await {
        Ok(info) => {
            assert_eq!(info.holders.len(), 1);
            pg.server
                .sql(&format!(
                    "SELECT pid FROM dlock_holders WHERE name = '{name}'"
                ))
                .expect("pid")
        }
        Err(e) => panic!("inspect: {e}"),
    };
    let t = Instant::now();
    assert_eq!(
        pg.server
            .sql(&format!("SELECT pg_terminate_backend({pid})"))
            .expect("terminate"),
        "t"
    );
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost signal");
    assert!(
        matches!(reason, LostReason::SessionEnded(ref why) if why.contains("terminating connection")),
        "{reason:?}"
    );
    // At once, from the connection's end: 5 s is generous on a loaded machine and still far
    // below the first renewal (20 s), the other way a holder could learn of the loss.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The backend frees its locks as it exits, a moment after closing the connection (the
    // wait is on the server: nothing else would free the lock).
    let b = pg.client_with(opts).await;
    let g2 = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("free after the session ended");
    assert!(g2.fencing_token() > g.fencing_token());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A server restart (crash) ends every session: holders' lost signals fire at once; the
/// fencing counter survives (PostgreSQL is durable), so tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_fires_lost_and_tokens_survive() {
    let mut server = PostgresServer::start().expect("start postgres");
    let name = unique_name("restart");
    // A long lease: only the session's end can fire the lost signal in time (the first renewal
    // comes after 20 s), and the lease-mode hold outlasts the restart on a loaded machine.
    let opts = fast_opts().watchdog_lease(Duration::from_secs(60));
    for params in ["", "?mode=lease"] {
        let url = format!("{}{params}", server.url());
        let (a, g, token) =
            sql_faults::hold_across_restart(&mut server, support::connect, &url, &opts, &name)
                .await;
        if params.is_empty() {
            let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
                .await
                .expect("lost signal after restart");
            assert!(matches!(reason, LostReason::SessionEnded(_)), "{reason:?}");
        }
        // A new client (reconnecting) gets the lock with a higher token; in lease mode the
        // lease row survived the restart, so it must wait for the old lease... which the
        // holder still renews: release it first.
        if params.is_empty() {
            drop(g);
        } else {
            assert!(!g.is_lost(), "lease mode survives a restart");
            assert_eq!(
                g.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        sql_faults::next_holder_after_restart(support::connect, &url, &opts, &name, token).await;
        drop(a);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_role_is_an_auth_error() {
    let pg = Pg::session();
    let e = PostgresBackend::connect(
        &format!("postgres://nobody:x@127.0.0.1:{}/dlock", pg.server.port()),
        &fast_opts(),
    )
    .await
    .err()
    .expect("refused");
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
}

/// Readers share, a writer excludes them, the writer may take the read side (downgrade), a
/// reader may not take the write side (an upgrade could deadlock), and a blocked writer is
/// woken by the last reader's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_locks() {
    let pg = Pg::session();
    let name = unique_name("rw");
    let opts = fast_opts();
    let a = pg.client_with(opts.clone()).await;
    let b = pg.client_with(opts.clone()).await;
    let ra = a.rw_lock(&name).expect("rw");
    let rb = b.rw_lock(&name).expect("rw");
    let g1 = ra.read().try_acquire().await.expect("try").expect("read");
    let g2 = rb
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("shared read");
    assert!(g2.fencing_token() > g1.fencing_token());
    let e = rb.write().try_acquire().await.expect_err("upgrade");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let info = a
        .inspect_kind(&name, LockKind::Read)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 2);
    assert!(info.holders.iter().all(|h| h.side == Some(LockKind::Read)));
    // A blocked writer is woken by the last reader's release (server-side wait).
    let c = pg.client_with(opts.clone()).await;
    let wc = c.rw_lock(&name).expect("rw").write();
    let w = tokio::spawn(async move {
        let g = wc.acquire_timeout(Duration::from_secs(20)).await;
        (g, Instant::now())
    });
    poll_until(
        "the writer never waited on the server",
        async || server_waiters(&pg.server, &name),
        |n| n == "1",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.is_finished(), "writer passed readers");
    assert_eq!(
        g1.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!w.is_finished(), "writer passed a reader");
    let released = Instant::now();
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (wg, at) = w.await.expect("task");
    let wg = wg.expect("writer");
    // Woken by the release itself (the wait is on the server); without it the writer would
    // only stop at its 20 s deadline. 5 s is generous on a loaded machine.
    let latency = at.saturating_duration_since(released);
    assert!(
        latency < Duration::from_secs(5),
        "writer woke {latency:?} after the release"
    );
    let info = a
        .inspect_kind(&name, LockKind::Write)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].side, Some(LockKind::Write));
    assert!(ra.read().try_acquire().await.expect("try").is_none());
    assert_eq!(
        wg.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // The writer takes the read side too (downgrade), then lets the write side go.
    let w = ra.write().acquire().await.expect("write");
    let r = ra
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("downgrade");
    assert!(rb.read().try_acquire().await.expect("try").is_none());
    assert_eq!(
        w.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let r2 = rb
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("read after downgrade");
    for g in [r, r2] {
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    // Kinds this backend does not do are refused clearly.
    let e = a
        .semaphore(&name, 2)
        .expect("semaphore")
        .try_acquire(1)
        .await
        .expect_err("unsupported");
    assert!(e.is_unsupported(), "{e:?}");
}

/// `inspect` shows holder, its one grant (re-entrant guards are counted in the client), lease
/// and the last token; a holder whose session died is not reported even though its row is
/// still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_live_holders_only() {
    let pg = Pg::session();
    let name = unique_name("inspect");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(20));
    let a = pg.client_with(opts.clone()).await;
    let lock = a.lock(&name).expect("lock");
    let g = lock.acquire().await.expect("acquire");
    let _g2 = lock.try_acquire().await.expect("try").expect("re-enter");
    let info = a.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, lock.owner());
    assert_eq!(info.holders[0].count, 1, "one grant on the server");
    let left = info.holders[0].lease_left.expect("lease");
    assert!(
        left > Duration::from_secs(15) && left <= Duration::from_secs(20),
        "{left:?}"
    );
    assert_eq!(info.fencing_token, g.fencing_token());
    // Kill the session without deleting the row.
    pg.server
        .sql(&format!(
            "SELECT pg_terminate_backend(pid) FROM dlock_holders WHERE name = '{name}'"
        ))
        .expect("terminate");
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost");
    // The backend frees its locks as it exits, a moment after closing the connection.
    let info = poll_until(
        "the dead holder is still reported",
        async || a.inspect(&name).await.expect("inspect"),
        |info| !info.held(),
    )
    .await;
    assert!(!info.held(), "{info:?}");
    assert_eq!(info.fencing_token, g.fencing_token());
}

/// PostgreSQL can grant an advisory lock to a waiter whose `lock_timeout` has fired but is not
/// yet handled, and still fail the statement with the timeout: the error path keeps a lock
/// granted meanwhile (LockErrorCleanup), and a session-level advisory lock outlives the
/// aborted transaction. Such a wait must give that lock back. Here the waiter's backend is
/// frozen (SIGSTOP) across its deadline while the holder releases, then thawed: the lock must
/// come free at once. (It used to stay held, by a pooled session, for good: every later waiter
/// timed out with nobody reported holding it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_timed_out_as_it_was_granted_gives_the_lock_back() {
    let pg = Pg::session();
    let name = unique_name("timeoutgrant");
    let (a, b, c) = (
        pg.client_with(fast_opts()).await,
        pg.client_with(fast_opts()).await,
        pg.client_with(fast_opts()).await,
    );
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let wait = Duration::from_millis(1500);
    let started = Instant::now();
    let waiter = {
        let lock = b.lock(&name).expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(wait).await.map(drop) })
    };
    let key = distlock_postgres::lock_key("dlock", &name) as u64;
    let waiting = format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND classid = {} AND objid = {} AND objsubid = 1",
        key >> 32,
        key & 0xffff_ffff
    );
    let pid = poll_until(
        "the waiter never waited on the server",
        async || pg.server.sql(&waiting).expect("sql"),
        |pid| !pid.is_empty(),
    )
    .await;
    let pid: u32 = pid.parse().expect("a pid");
    assert!(
        pg.server.pause_member(pid),
        "{pid} is not a backend of the server"
    );
    // The server-side timer of the wait fires while its backend is frozen (the wait's own
    // deadline, well before the client's safety net after it).
    tokio::time::sleep_until((started + wait + Duration::from_millis(60)).into()).await;
    // The release hands the lock to the frozen waiter, which then handles its timeout.
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(pg.server.resume_member(pid));
    let r = waiter.await.expect("task");
    eprintln!("the waiter ended with {r:?} after {:?}", started.elapsed());
    let t = Instant::now();
    let g = poll_until(
        "the lock never came free after the timed-out wait",
        async || {
            c.lock(&name)
                .expect("lock")
                .try_acquire()
                .await
                .expect("try")
        },
        |g| g.is_some(),
    )
    .await;
    eprintln!("free again {:?} after the wait ended", t.elapsed());
    drop(g);
}

/// A cancelled or timed-out wait leaves no backend waiting on the server, and `inspect`
/// counts no waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_waits_leave_no_server_waiters() {
    let mode = Pg::session();
    let (a, g) = sql_faults::abandoned_waits_leave_no_server_waiters(&mode, server_waiters).await;
    let info = a.inspect(g.name()).await.expect("inspect");
    assert_eq!(info.waiters, Some(0));
    g.release().await.expect("release");
}

/// Lease mode: a waiter is woken by NOTIFY, before its heartbeat could have woken it; with
/// `listen=off` it still gets the lock (at its heartbeat, long before the holder's lease ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_wakes_waiters_by_notify() {
    let server = shared_server();
    // The holder's lease: a waiter that saw no release would wait until it ends.
    let lease = Duration::from_secs(20);
    // Without a notification a lease-mode waiter tries again every `beat` (1 s: the longest
    // heartbeat there is, it cannot be made slower).
    let beat = distlock_core::wait::heartbeat(lease);
    for listen in [true, false] {
        let params = if listen {
            "?mode=lease"
        } else {
            "?mode=lease&listen=off"
        };
        let url = format!("{}{params}", server.url());
        let name = unique_name("notify");
        let opts = fast_opts().watchdog_lease(lease);
        let a = client(
            PostgresBackend::connect(&url, &opts)
                .await
                .expect("connect"),
            opts.clone(),
        );
        let bb = Arc::new(
            PostgresBackend::connect(&url, &opts)
                .await
                .expect("connect"),
        );
        let b = Client::new(bb.clone(), opts.clone()).expect("client");
        let g = a
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        let lb = b.lock(&name).expect("lock");
        let spawned = Instant::now();
        let waiter = tokio::spawn(async move {
            let g = lb.acquire_timeout(Duration::from_secs(30)).await;
            (g, Instant::now())
        });
        if listen {
            // Wait until the waiter listens. It subscribes after its first attempt, tries once
            // more, then sleeps until a notification or its heartbeat. The subscription came
            // after `not_before` (the start of the last look that did not see it), so the
            // heartbeat cannot end before `not_before + beat`: a grant before that instant was
            // not the heartbeat's doing, however loaded the machine.
            let mut not_before = spawned;
            loop {
                let asked = Instant::now();
                if bb.listening_channels().await == 1 {
                    break;
                }
                not_before = asked;
                assert!(
                    spawned.elapsed() < EVENTUALLY,
                    "the waiter never subscribed to notifications"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let earliest_heartbeat = not_before + beat;
            // Let its attempt after subscribing pass, so that it sleeps when the lock is
            // released (kept short: what is left of the heartbeat is the margin below).
            tokio::time::sleep(Duration::from_millis(100)).await;
            let released = Instant::now();
            g.release().await.expect("release");
            let (g2, at) = waiter.await.expect("task");
            let g2 = g2.expect("acquired");
            assert!(
                at < earliest_heartbeat,
                "{params}: woke {:?} after the release, not before its heartbeat could have \
                 ({:?} after the release)",
                at.saturating_duration_since(released),
                earliest_heartbeat.saturating_duration_since(released)
            );
            g2.release().await.expect("release");
        } else {
            // Let the waiter start waiting (nothing to observe without notifications; if it
            // is late it just gets a free lock).
            tokio::time::sleep(Duration::from_millis(500)).await;
            let released = Instant::now();
            g.release().await.expect("release");
            let (g2, at) = waiter.await.expect("task");
            let g2 = g2.expect("acquired");
            // At its next heartbeat (within 1 s), not when the holder's 20 s lease would have
            // ended: 5 s is generous on a loaded machine and far below the lease.
            let latency = at.saturating_duration_since(released);
            assert!(
                latency < Duration::from_secs(5),
                "{params}: woke {latency:?} after the release"
            );
            g2.release().await.expect("release");
        }
    }
}

/// Many short holds reuse a few connections instead of opening one per grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_reused() {
    let pg = Pg::session();
    let name = unique_name("reuse");
    // Its own application_name: the server is shared with the binary's other tests, whose
    // connections come and go meanwhile (they counted when this test ran beside them).
    let url = pg.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let backend =
        PostgresBackend::connect(&format!("{url}{sep}application_name={name}"), &fast_opts())
            .await
            .expect("connect");
    let backend = Arc::new(backend);
    let c = Client::new(backend.clone(), fast_opts()).expect("client");
    let count = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}'");
    let before: i64 = pg.server.sql(&count).expect("sql").parse().expect("count");
    for _ in 0..30 {
        let g = c
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        g.release().await.expect("release");
    }
    let after: i64 = pg.server.sql(&count).expect("sql").parse().expect("count");
    assert!(after - before <= 2, "{before} -> {after} connections");
    assert!(backend.idle_sessions() >= 1);
    // Waits that time out on the server give their session back too.
    let holder = pg.client_with(fast_opts()).await;
    let g = holder
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    for _ in 0..3 {
        let e = c
            .lock(&name)
            .expect("lock")
            .acquire_timeout(Duration::from_millis(100))
            .await
            .expect_err("held");
        assert!(e.is_timeout(), "{e:?}");
    }
    assert!(
        backend.idle_sessions() >= 1,
        "timed-out waits closed their sessions"
    );
    g.release().await.expect("release");
}

/// Tables of the version with re-entry counts (a `count` column, no `attempt`, holders keyed
/// by owner and kind) are migrated by the first new client, in both modes, and work after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_tables_are_migrated() {
    let server = shared_server();
    let schema = format!("old_{}", std::process::id());
    let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
             SET search_path = {schema};
             CREATE SEQUENCE dlock_fence_seq;
             CREATE TABLE dlock_fence (ns text NOT NULL, name text NOT NULL,
                 token bigint NOT NULL, PRIMARY KEY (ns, name));
             CREATE TABLE dlock_holders (ns text NOT NULL, name text NOT NULL,
                 owner text NOT NULL, kind text NOT NULL, token bigint NOT NULL,
                 count integer NOT NULL, pid integer NOT NULL,
                 acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL,
                 PRIMARY KEY (ns, name, owner, kind));
             INSERT INTO dlock_holders VALUES ('dlock', 'stale', 'o', 'mutex', 1, 2, 0, now(), now());
             CREATE TABLE dlock_leases (ns text NOT NULL, name text NOT NULL, owner text,
                 count integer NOT NULL, token bigint NOT NULL, acquired_at timestamptz,
                 expires_at timestamptz NOT NULL, PRIMARY KEY (ns, name));
             INSERT INTO dlock_leases VALUES ('dlock', 'old', NULL, 0, 7, NULL, 'epoch');"
        ))
        .await
        .expect("old tables");
    for params in ["", "&mode=lease"] {
        let url = format!(
            "{}?options=-c%20search_path%3D{schema}{params}",
            server.url()
        );
        let c = client_at(&url).await;
        for name in ["old", "new"] {
            let g = c
                .lock(name)
                .expect("lock")
                .try_acquire()
                .await
                .expect("try")
                .expect("free");
            assert_eq!(
                g.release().await.expect("release"),
                ReleaseOutcome::Released,
                "{params}"
            );
        }
        // Connecting again finds the tables up to date.
        let _ = client_at(&url).await;
    }
    let cols = client
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND column_name IN ('count', 'attempt') ORDER BY 1, 2",
            &[&schema],
        )
        .await
        .expect("columns");
    let cols: Vec<(String, String)> = cols.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        cols,
        vec![
            // The election tables of this version (added, not migrated).
            ("dlock_elections".into(), "attempt".into()),
            ("dlock_holders".into(), "attempt".into()),
            ("dlock_lease_elections".into(), "attempt".into()),
            ("dlock_leases".into(), "attempt".into())
        ]
    );
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop");
}

async fn client_at(url: &str) -> Client {
    let opts = fast_opts();
    client(
        PostgresBackend::connect(url, &opts).await.expect("connect"),
        opts,
    )
}

/// Lease mode: an acquire that waits for the lease row's lock (another client's statement on
/// the same row) draws its token after it gets the row, so a grant made meanwhile cannot
/// leave it with a lower token. (Drawing it before the wait, as `VALUES` does, let tokens go
/// backwards; the conformance suite's fenced register caught it under contention.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_token_is_drawn_after_the_row_lock() {
    let pg = Pg::lease();
    let name = unique_name("row-lock-token");
    let backend = Arc::new(pg.backend(&fast_opts()).await);
    let key = HoldKey {
        name: name.as_str().into(),
        owner: "o".into(),
        kind: LockKind::Mutex,
    };
    let first = AcquireRequest::new(key.clone(), Duration::from_secs(30), LostSignal::new());
    let AcquireReply::Granted { token: t1 } = backend.acquire(&first).await.expect("acquire")
    else {
        panic!("not granted");
    };
    assert_eq!(
        backend.release(&first.grant(t1)).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Another session holds the row's lock, as a concurrent grant would.
    let (x, conn) = tokio_postgres::connect(&pg.server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    x.batch_execute("BEGIN").await.expect("begin");
    x.query(
        "SELECT token FROM dlock_leases WHERE ns = 'dlock' AND name = $1 FOR UPDATE",
        &[&name],
    )
    .await
    .expect("lock the row");
    let req = AcquireRequest::new(key.clone(), Duration::from_secs(30), LostSignal::new());
    let waiting = {
        let (backend, req) = (backend.clone(), req.clone());
        tokio::spawn(async move { backend.acquire(&req).await })
    };
    poll_until(
        "the acquire never waited for the row lock",
        async || {
            pg.server
                .sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND query LIKE '%dlock_leases%'",
                )
                .expect("sql")
        },
        |n| n != "0",
    )
    .await;
    // Meanwhile a grant and its release happen on the row, with a newer token.
    let t2: i64 = x
        .query_one(
            "UPDATE dlock_leases SET token = nextval('dlock_fence_seq') \
             WHERE ns = 'dlock' AND name = $1 RETURNING token",
            &[&name],
        )
        .await
        .expect("update")
        .get(0);
    x.batch_execute("COMMIT").await.expect("commit");
    let reply = tokio::time::timeout(EVENTUALLY, waiting)
        .await
        .expect("acquire")
        .expect("task")
        .expect("acquire");
    let AcquireReply::Granted { token } = reply else {
        panic!("not granted: {reply:?}");
    };
    assert!(
        token > u64::try_from(t2).expect("token"),
        "token {token} after {t2}: went backwards"
    );
    assert_eq!(
        backend.release(&req.grant(token)).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The SQL that puts `name`'s fencing counters back where they are now: the sequence
/// `dlock_fence_seq` (shared by every name) and the row that keeps the name's last token (of
/// the table `kind` and the mode's `lease` use). Run later, it is a rollback: a restore from a
/// base backup, or an asynchronous standby promoted after it missed the last WAL.
fn pg_counters(server: &PostgresServer, name: &str, kind: LockKind, lease: bool) -> String {
    let table = match (lease, kind) {
        (true, LockKind::Election) => "dlock_lease_elections",
        (true, _) => "dlock_leases",
        (false, LockKind::Election) => "dlock_elections",
        (false, _) => "dlock_fence",
    };
    let row = format!("ns = 'dlock' AND name = '{}'", name.replace('\'', "''"));
    let seq = server
        .sql("SELECT last_value FROM dlock_fence_seq")
        .expect("sequence");
    let token = server
        .sql(&format!("SELECT token FROM {table} WHERE {row}"))
        .expect("token");
    format!(
        "SELECT setval('dlock_fence_seq', {seq}); UPDATE {table} SET token = {token} WHERE {row}"
    )
}

/// The fencing counters set back by hand to an older value (the deterministic stand-in for a
/// restore from a backup or a failover to an asynchronous standby): the next token is above
/// every token handed out before, in both modes and for every kind (session mode: mutex,
/// fair, both sides of a read-write lock, election; lease mode: mutex, election). On a server of its own: the sequence is shared by every name, and setting it
/// back would hand other tests' names old tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_after_the_counters_are_set_back() {
    let server = Arc::new(PostgresServer::start().expect("start postgres"));
    let session = sql_faults::SqlMode::new(
        server.clone(),
        "",
        support::connect,
        support::delete_holder_row,
    );
    for kind in [
        LockKind::Mutex,
        LockKind::Fair,
        LockKind::Read,
        LockKind::Write,
        LockKind::Election,
    ] {
        sql_faults::tokens_rise_after_a_rollback(&session, kind, |s, n, k| {
            pg_counters(s, n, k, false)
        })
        .await;
    }
    let lease = sql_faults::SqlMode::new(
        server.clone(),
        "?mode=lease",
        support::connect,
        support::free_lease_row,
    );
    for kind in [LockKind::Mutex, LockKind::Election] {
        sql_faults::tokens_rise_after_a_rollback(&lease, kind, |s, n, k| {
            pg_counters(s, n, k, true)
        })
        .await;
    }
}
