//! Grant-addressed holds on MySQL/MariaDB, in both modes, against a real server: retried
//! requests whose first reply came late (through a `DelayProxy`), re-entrant guards, leases
//! that must never shorten, and mixed fixed and watchdog guards. Each case checks what the
//! server holds (`IS_USED_LOCK`, the lock row, the fencing counter), not only what the client
//! was told.

mod support;

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, ClientOptions, HoldKey, LockGuard, LockKind,
    LostSignal, ReleaseOutcome,
};
use distlock_mysql::{lock_key, MysqlBackend};
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name, EVENTUALLY};
use distlock_testkit::{DelayProxy, MariaDbServer};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Modes, My};

/// A reply this late makes the client give its request up (the operation timeout of
/// `fast_opts` is 500 ms) after the request executed on the server.
fn late() -> Duration {
    fast_opts().get_op_timeout() + Duration::from_millis(300)
}

/// Long enough that a grant leaked by a faulted request would outlast every bound below.
fn long_lease_opts() -> ClientOptions {
    fast_opts().watchdog_lease(Duration::from_secs(20))
}

/// A client (and its backend) whose traffic goes through a proxy the case controls.
struct Proxied {
    client: Client,
    backend: Arc<MysqlBackend>,
    proxy: DelayProxy,
}

async fn proxied(my: &My, opts: ClientOptions) -> Proxied {
    let proxy = DelayProxy::start(my.server.addr(), Duration::ZERO).expect("proxy");
    let url = my.url().replace(
        &format!("127.0.0.1:{}", my.server.port()),
        &format!("127.0.0.1:{}", proxy.port()),
    );
    let backend = Arc::new(
        MysqlBackend::connect(&url, &opts)
            .await
            .expect("connect through the proxy"),
    );
    let client = Client::new(backend.clone(), opts).expect("client");
    Proxied {
        client,
        backend,
        proxy,
    }
}

/// The connection id holding `GET_LOCK` of `name` on the server, if any (session mode).
fn server_holder(server: &MariaDbServer, name: &str) -> Option<String> {
    let id = server
        .sql(&format!(
            "SELECT IS_USED_LOCK('{}')",
            lock_key("dlock", name)
        ))
        .expect("IS_USED_LOCK");
    (id != "NULL").then_some(id)
}

/// The lock row of `name` (table mode): `owner attempt token`, or `NULL …` when free.
fn lock_row(server: &MariaDbServer, name: &str) -> String {
    server
        .sql(&format!(
            "SELECT CONCAT_WS(' ', IFNULL(owner, 'NULL'), IFNULL(attempt, 'NULL'), token) \
             FROM dlock.dlock_table_locks WHERE lock_key = '{}'",
            lock_key("dlock", name)
        ))
        .expect("lock row")
}

/// Connections the server has open from clients whose user is the test user.
fn server_connections(server: &MariaDbServer) -> usize {
    server
        .sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE USER = 'dlock' AND ID <> CONNECTION_ID()",
        )
        .expect("processlist")
        .parse()
        .expect("a count")
}

async fn try_lock(c: &Client, name: &str) -> Option<LockGuard> {
    c.lock(name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try_acquire")
}

/// Polls until `other` takes `name` (it must come free within `EVENTUALLY`).
async fn comes_free(other: &Client, name: &str) -> LockGuard {
    let t = Instant::now();
    loop {
        if let Some(g) = try_lock(other, name).await {
            return g;
        }
        assert!(
            t.elapsed() < EVENTUALLY,
            "`{name}` still held after {:?}: {:?}",
            t.elapsed(),
            other.inspect(name).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// For `period`, `other` must not get `name` while `g` holds it, and `g` must not be lost.
async fn assert_excluded(other: &Client, name: &str, g: &LockGuard, period: Duration) {
    let t = Instant::now();
    while t.elapsed() < period {
        if let Some(intruder) = try_lock(other, name).await {
            panic!(
                "another owner got `{name}` (token {}) {:?} into the check while our guard \
                 (token {}, lost: {:?}) held it",
                intruder.fencing_token(),
                t.elapsed(),
                g.fencing_token(),
                g.lost_signal().reason()
            );
        }
        assert!(
            !g.is_lost(),
            "our guard of `{name}` was lost after {:?}: {:?}",
            t.elapsed(),
            g.lost_signal().reason()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two re-entrant guards; the last one's release executes on the server but its reply comes
/// late, so the core retries it — after another client took the lock. The retry must release
/// nothing (it names the first grant), and the other client keeps the lock.
async fn late_release_reply_with_reentrant_guards(my: My) {
    let p = proxied(&my, long_lease_opts()).await;
    let b = my.client_with(fast_opts()).await;
    let c = my.client_with(fast_opts()).await;
    let name = unique_name("late-release");
    let lock = p.client.lock(&name).expect("lock");
    let g1 = lock.acquire().await.expect("acquire");
    let g2 = lock.try_acquire().await.expect("try").expect("re-entry");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    // The first of two guards is counted down in the client: nothing reaches the server.
    assert_eq!(
        g1.release().await.expect("release"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert_excluded(&b, &name, &g2, Duration::from_millis(300)).await;
    let before = p.proxy.stats();
    p.proxy.set_reply_delay(late());
    let sent = Instant::now();
    let release = tokio::spawn(g2.release());
    // The release executed: the lock is free on the server long before its reply arrives.
    let gb = comes_free(&b, &name).await;
    // The server may commit before it writes the reply: heal only once the proxy has read
    // (and delayed) the reply's first chunk, which every later chunk waits behind.
    poll_until(
        "the release's reply was never read",
        async || p.proxy.stats(),
        |s| s.replies.chunks_read > before.replies.chunks_read,
    )
    .await;
    // The reply to it stays late (it was read while the delay was on); the retry is not.
    p.proxy.heal();
    let r = release.await.expect("join");
    assert!(
        sent.elapsed() >= fast_opts().get_op_timeout(),
        "the release's reply was not late: {r:?} after {:?}",
        sent.elapsed()
    );
    // The first request did release it; its retry found that grant gone.
    assert_eq!(
        r.expect("release"),
        ReleaseOutcome::Released,
        "the late release"
    );
    assert_excluded(&c, &name, &gb, Duration::from_millis(500)).await;
    let info = c.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].owner, gb.owner(), "{info:?}");
    assert_eq!(info.fencing_token, gb.fencing_token());
    assert_eq!(
        gb.release().await.expect("release"),
        ReleaseOutcome::Released,
        "the retried release freed the next holder's grant"
    );
    drop(comes_free(&c, &name).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_release_reply_with_reentrant_guards_session() {
    late_release_reply_with_reentrant_guards(My::session()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_release_reply_with_reentrant_guards_table() {
    late_release_reply_with_reentrant_guards(My::table()).await;
}

/// A `try_acquire` whose first reply comes late is retried by the core with the same attempt:
/// one grant (the name's counter is at its token: no second token was drawn), held by one
/// connection, and free the moment it is released (no connection left holding it).
async fn retried_try_acquire_is_one_grant(my: My) {
    let table = my.params.contains("table");
    let p = proxied(&my, long_lease_opts()).await;
    let b = my.client_with(fast_opts()).await;
    let name = unique_name("retried-try");
    let before = p.proxy.stats();
    p.proxy.set_reply_delay(late());
    let acquire = tokio::spawn({
        let lock = p.client.lock(&name).expect("lock");
        async move { lock.try_acquire().await }
    });
    // Once the first reply has been read (and delayed), the rest gets through at once.
    poll_until(
        "no reply was read",
        async || p.proxy.stats(),
        |s| s.replies.chunks_read > before.replies.chunks_read,
    )
    .await;
    p.proxy.heal();
    let g = acquire
        .await
        .expect("join")
        .expect("try_acquire")
        .expect("the retried try_acquire got the lock it was granted");
    let info = b.inspect(&name).await.expect("inspect");
    assert_eq!(
        info.fencing_token,
        g.fencing_token(),
        "the fencing counter moved twice: {info:?}"
    );
    assert_eq!(info.holders.len(), 1, "{info:?}");
    if table {
        let row = lock_row(&my.server, &name);
        let token = format!(" {}", g.fencing_token());
        assert!(row.starts_with(g.owner()) && row.ends_with(&token), "{row}");
    } else {
        let held_by = p
            .backend
            .holder_connection(&name, g.owner())
            .await
            .expect("a connection holds the grant");
        assert_eq!(
            server_holder(&my.server, &name),
            Some(held_by.to_string()),
            "the server's holder is not the grant's connection"
        );
    }
    assert!(try_lock(&b, &name).await.is_none(), "held by one grant");
    let g_token = g.fencing_token();
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // Free at once: no second grant, no connection of the first try left holding it.
    if !table {
        assert_eq!(server_holder(&my.server, &name), None);
    }
    let gb = try_lock(&b, &name).await.expect("free after the release");
    assert!(gb.fencing_token() > g_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_try_acquire_is_one_grant_session() {
    retried_try_acquire_is_one_grant(My::session()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_try_acquire_is_one_grant_table() {
    retried_try_acquire_is_one_grant(My::table()).await;
}

/// The backend trait directly, session mode: an acquire whose `GET_LOCK` reply comes late
/// times out for its caller, but its connection is kept with the attempt. Retried, the
/// attempt gets that same grant (same token, same connection); given up instead, the grant
/// is released as soon as the late reply is in, not when its 30 s lease ends. Either way no
/// connection is left holding the lock and none is opened for a second grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_get_lock_reply_keeps_one_connection_per_attempt() {
    let my = My::session();
    let p = proxied(&my, fast_opts()).await;
    for retry in [true, false] {
        let name = unique_name("late-get-lock");
        let req = AcquireRequest::new(
            HoldKey {
                name: name.as_str().into(),
                owner: "late-get-lock".into(),
                kind: LockKind::Mutex,
            },
            Duration::from_secs(30),
            LostSignal::new(),
        );
        // A warm connection in the pool, so the timed-out request is GET_LOCK itself.
        p.backend
            .inspect(&name, LockKind::Mutex)
            .await
            .expect("warm");
        let before = p.proxy.stats();
        p.proxy.set_reply_delay(late());
        let first = p.backend.acquire(&req).await;
        assert!(
            matches!(&first, Err(e) if e.is_connection()),
            "the late reply was not late: {first:?}"
        );
        p.proxy.heal();
        // The request executed: our connection holds the lock, its reply still on its way.
        let holder = server_holder(&my.server, &name).expect("GET_LOCK executed");
        assert!(p.proxy.stats().connections <= before.connections + 1);
        if retry {
            let token = match p.backend.acquire(&req).await.expect("retry") {
                AcquireReply::Granted { token } => token,
                other => panic!("the retried attempt was not granted: {other:?}"),
            };
            let counter = p
                .backend
                .inspect(&name, LockKind::Mutex)
                .await
                .expect("inspect")
                .fencing_token;
            assert_eq!(token, counter, "a second grant was made");
            assert_eq!(server_holder(&my.server, &name), Some(holder.clone()));
            assert_eq!(
                p.backend
                    .holder_connection(&name, "late-get-lock")
                    .await
                    .map(|id| id.to_string()),
                Some(holder),
                "the grant is not on the connection that took the lock"
            );
            assert_eq!(
                p.backend.release(&req.grant(token)).await.expect("release"),
                ReleaseOutcome::Released
            );
            assert_eq!(server_holder(&my.server, &name), None, "left held");
        } else {
            p.backend.give_up(&req).await.expect("give up");
            poll_until(
                "a given-up attempt's late grant was left holding the lock",
                async || server_holder(&my.server, &name),
                Option::is_none,
            )
            .await;
            assert!(
                p.backend
                    .holder_connection(&name, "late-get-lock")
                    .await
                    .is_none(),
                "the given-up attempt still has a connection"
            );
        }
    }
    // Every connection this backend opened is pooled or closed: none holds a lock, and the
    // server has no more than the pool's few for it.
    assert!(server_connections(&my.server) < 32);
}

/// `extend` with a lease shorter than the watchdog's never shortens the lease on the server:
/// with a 20 s watchdog lease (renewed every ~7 s), an `extend(100 ms)` that shortened it
/// would let another owner in after a second (session mode: the connection's `wait_timeout`)
/// or 100 ms (table mode: the row's lease end).
async fn short_extend_on_watchdog_guard(my: My) {
    let a = my.client_with(long_lease_opts()).await;
    let b = my.client_with(fast_opts()).await;
    let name = unique_name("short-extend");
    let g = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    assert!(g.is_watchdog());
    g.extend(Duration::from_millis(100)).await.expect("extend");
    let info = b.inspect(&name).await.expect("inspect");
    let left = info.holders[0].lease_left.expect("lease left");
    assert!(left > Duration::from_secs(15), "shortened to {left:?}");
    // Past both a shortened `wait_timeout` (1 s, plus the server's check) and a shortened row.
    assert_excluded(&b, &name, &g, Duration::from_secs(3)).await;
    // A fixed-lease guard too: a shorter extend leaves its longer lease alone.
    let name = unique_name("short-extend-fixed");
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_secs(5))
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    g.extend(Duration::from_millis(100)).await.expect("extend");
    assert_excluded(&b, &name, &g, Duration::from_secs(2)).await;
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_extend_on_watchdog_guard_session() {
    short_extend_on_watchdog_guard(My::session()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_extend_on_watchdog_guard_table() {
    short_extend_on_watchdog_guard(My::table()).await;
}

/// A fixed-lease guard and a watchdog guard of one owner share one grant; dropping either
/// first leaves the other's promise intact: the watchdog one keeps the lock past the fixed
/// lease, the fixed one keeps it (unrenewed) until the lease it was promised runs out. The
/// server sees one grant throughout (one token; session mode: one connection).
async fn fixed_and_watchdog_guards_dropped_in_both_orders(my: My) {
    let table = my.params.contains("table");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(2));
    let bb = Arc::new(my.backend(&opts).await);
    let a = Client::new(bb.clone(), opts).expect("client");
    let b = my.client_with(fast_opts()).await;
    let fixed_lease = Duration::from_secs(2);
    for watchdog_first in [true, false] {
        let name = unique_name("mixed");
        let lock = a.lock(&name).expect("lock");
        let fixed = lock.clone().lease(fixed_lease).expect("lease");
        let (gw, gf) = if watchdog_first {
            let gw = lock.acquire().await.expect("watchdog");
            (
                gw,
                fixed.try_acquire().await.expect("try").expect("re-entry"),
            )
        } else {
            let gf = fixed.acquire().await.expect("fixed");
            (
                lock.try_acquire().await.expect("try").expect("re-entry"),
                gf,
            )
        };
        assert_eq!(gw.fencing_token(), gf.fencing_token());
        // One grant for both guards: the name's counter is at its token.
        let token = gf.fencing_token();
        let info = b.inspect(&name).await.expect("inspect");
        assert_eq!(info.fencing_token, token, "one grant for both guards");
        let conn = if table {
            None
        } else {
            bb.holder_connection(&name, lock.owner()).await
        };
        assert!(table || conn.is_some());
        if watchdog_first {
            // Dropped first: the fixed guard keeps the lock until its own lease ends.
            let dropped = Instant::now();
            drop(gw);
            assert_excluded(&b, &name, &gf, fixed_lease / 2).await;
            // Then it frees itself (nobody renews it), and not before the guard knows.
            let t = Instant::now();
            let taken = loop {
                if let Some(g) = try_lock(&b, &name).await {
                    break g;
                }
                assert!(
                    t.elapsed() < EVENTUALLY,
                    "never freed at the fixed lease end"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert!(
                gf.is_lost(),
                "another owner got in while the fixed guard held it"
            );
            assert!(dropped.elapsed() >= fixed_lease / 2);
            assert!(taken.fencing_token() > token, "one grant for both guards");
            drop(gf);
            assert_eq!(
                taken.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        } else {
            drop(gf);
            // The watchdog guard renews past the fixed lease, on the same grant.
            assert_excluded(&b, &name, &gw, fixed_lease + Duration::from_secs(1)).await;
            if !table {
                assert_eq!(bb.holder_connection(&name, lock.owner()).await, conn);
            }
            assert_eq!(
                gw.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        let g = comes_free(&b, &name).await;
        let info = b.inspect(&name).await.expect("inspect");
        assert_eq!(info.fencing_token, g.fencing_token());
        assert!(g.fencing_token() > token, "{info:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_and_watchdog_guards_dropped_in_both_orders_session() {
    fixed_and_watchdog_guards_dropped_in_both_orders(My::session()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_and_watchdog_guards_dropped_in_both_orders_table() {
    fixed_and_watchdog_guards_dropped_in_both_orders(My::table()).await;
}

/// Two attempts of one owner id (two clients, as two processes with one configured id) are
/// two holders: the server never gives the second one the lock while the first holds it, and
/// releasing or giving up one never touches the other's grant.
async fn one_owner_two_attempts(my: My) {
    let opts = fast_opts();
    let backend = my.backend(&opts).await;
    let key = HoldKey {
        name: unique_name("one-owner").as_str().into(),
        owner: "shared-owner".into(),
        kind: LockKind::Mutex,
    };
    let first = AcquireRequest::new(key.clone(), Duration::from_secs(10), LostSignal::new());
    let second = AcquireRequest::new(key.clone(), Duration::from_secs(10), LostSignal::new());
    let token = match backend.acquire(&first).await.expect("acquire") {
        AcquireReply::Granted { token } => token,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        backend.acquire(&second).await.expect("acquire"),
        AcquireReply::Held { .. }
    ));
    backend.give_up(&second).await.expect("give up");
    // Another attempt's address, with the holder's owner id and token.
    let stranger = distlock_core::GrantRef {
        attempt: distlock_core::AttemptId::new(),
        ..first.grant(token)
    };
    assert_eq!(
        backend.release(&stranger).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert!(backend
        .inspect(&key.name, LockKind::Mutex)
        .await
        .expect("inspect")
        .held());
    assert_eq!(
        backend.release(&first.grant(token)).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        backend.release(&first.grant(token)).await.expect("release"),
        ReleaseOutcome::Expired,
        "a repeated release is reported, not repeated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_two_attempts_session() {
    one_owner_two_attempts(My::session()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_two_attempts_table() {
    one_owner_two_attempts(My::table()).await;
}

/// A `dlock_table_locks` made by an older version (no `attempt`, no `last_released`) gets the
/// columns added by the first table-mode client, and a lock row it left (held by an owner of
/// the old version, with no attempt) is another holder's, not ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_from_an_older_version_is_upgraded() {
    let my = My::table();
    let db = format!("dlock_old_{}", std::process::id());
    my.server
        .sql(&format!(
            "CREATE DATABASE {db}; GRANT ALL PRIVILEGES ON {db}.* TO 'dlock'@'%'; \
             CREATE TABLE {db}.dlock_table_locks ( \
                 lock_key CHAR(38) CHARACTER SET ascii NOT NULL PRIMARY KEY, \
                 ns VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                 name TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                 owner VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, \
                 count INT UNSIGNED NOT NULL, token BIGINT UNSIGNED NOT NULL, \
                 acquired_at DATETIME(6) NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB; \
             INSERT INTO {db}.dlock_table_locks VALUES ('{}', 'dlock', 'old-held', 'old-owner', \
                 2, 7, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
            lock_key("dlock", "old-held")
        ))
        .expect("an old-version table");
    let url = format!(
        "mysql://dlock:{}@127.0.0.1:{}/{db}?mode=table",
        my.server.password(),
        my.server.port()
    );
    let opts = fast_opts();
    let c = Client::new(
        Arc::new(MysqlBackend::connect(&url, &opts).await.expect("connect")),
        opts.clone(),
    )
    .expect("client");
    let cols = my
        .server
        .sql(&format!(
            "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{db}' \
             AND TABLE_NAME = 'dlock_table_locks' AND COLUMN_NAME IN ('attempt', 'last_released')"
        ))
        .expect("columns");
    assert_eq!(cols, "2");
    // A second client finds the columns there (no error from a repeated upgrade).
    let d = Client::new(
        Arc::new(MysqlBackend::connect(&url, &opts).await.expect("connect")),
        opts,
    )
    .expect("client");
    assert!(
        try_lock(&c, "old-held").await.is_none(),
        "the old holder's lock was taken"
    );
    let g = try_lock(&c, "new").await.expect("free");
    assert!(try_lock(&d, "new").await.is_none());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    my.server
        .sql(&format!("DROP DATABASE {db}"))
        .expect("drop the database");
}
