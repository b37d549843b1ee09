//! The operator commands (list, forced release, diagnosis) on a real ensemble, through the
//! Client API, with holders and waiters in other clients (other sessions).

use distlock_core::{Client, ClientOptions, LockKind, Severity};
use distlock_testkit::conformance::{unique_name, wait_for_waiters};
use distlock_testkit::{FencedRegister, ZkEnsemble};
use distlock_zookeeper::ZkBackend;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{hold, hold_within, read, shared_client};

fn opts() -> ClientOptions {
    // Generous call timeouts: the shared ensemble runs beside other suites on 2 cores.
    ClientOptions::default()
        .watchdog_lease(Duration::from_secs(1))
        .op_timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(10))
}

async fn client() -> Client {
    shared_client(opts()).await
}

/// `list` shows a held mutex with its owner, token and queued waiter, a rw lock's readers,
/// a released lock's last token, and honours the prefix (other tests' locks are not listed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_holders_waiters_and_tokens() {
    let p = unique_name("ops-list");
    let (a, b) = (client().await, client().await);
    let job = format!("{p}-job");
    let held = hold(&a, &job).await;
    let waiter = {
        let lock = b.lock(&job).expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    wait_for_waiters(&a, &job, LockKind::Mutex, 1).await;
    let rw = format!("{p}-rw");
    let r1 = read(&a, &rw).await;
    let r2 = read(&b, &rw).await;
    let done = format!("{p}-done");
    let d = hold(&a, &done).await;
    let done_token = d.fencing_token();
    d.release().await.expect("release");

    let locks = a.list(&p).await.expect("list");
    assert!(
        locks.iter().all(|l| l.info.name.starts_with(&p)),
        "{locks:?}"
    );
    let find = |name: &str, kind: LockKind| {
        locks
            .iter()
            .find(|l| l.info.name == name && l.kind == kind)
            .unwrap_or_else(|| panic!("{name} {kind:?} not in {locks:?}"))
    };
    let j = find(&job, LockKind::Mutex);
    assert_eq!(j.info.holders.len(), 1, "{j:?}");
    assert_eq!(j.info.holders[0].owner, held.owner(), "{j:?}");
    assert_eq!(j.info.fencing_token, held.fencing_token(), "{j:?}");
    assert_eq!(j.info.waiters, Some(1), "{j:?}");
    let r = find(&rw, LockKind::Write);
    assert_eq!(r.info.holders.len(), 2, "{r:?}");
    assert!(
        r.info
            .holders
            .iter()
            .all(|h| h.side == Some(LockKind::Read)),
        "{r:?}"
    );
    // The rw lock's parent directory is not reported as a mutex of its own.
    assert!(
        !locks
            .iter()
            .any(|l| l.info.name == rw && l.kind == LockKind::Mutex),
        "{locks:?}"
    );
    let g = find(&done, LockKind::Mutex);
    assert!(g.info.holders.is_empty(), "{g:?}");
    assert_eq!(g.info.fencing_token, done_token, "{g:?}");
    let only = a.list(&rw).await.expect("list");
    assert_eq!(only.len(), 1, "{only:?}");

    held.release().await.expect("release");
    let g = waiter.await.expect("join").expect("the waiter acquires");
    g.release().await.expect("release");
    r1.release().await.expect("release");
    r2.release().await.expect("release");
}

/// A holder in another session is removed: its lost signal fires, the queued waiter gets
/// the lock with a higher token than the old holder's, and the old holder's write with
/// its token is rejected by a fenced store after the next holder wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_fences_the_old_holder_and_keeps_waiters() {
    let name = unique_name("ops-force");
    let (old, next, op) = (client().await, client().await, client().await);
    let guard = hold(&old, &name).await;
    let register = FencedRegister::new();
    assert!(register.write(guard.fencing_token(), "old", true));
    let waiter = {
        let lock = next.lock(&name).expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    wait_for_waiters(&op, &name, LockKind::Mutex, 1).await;

    let released_at = Instant::now();
    let report = op
        .force_release(&name, LockKind::Mutex)
        .await
        .expect("force");
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert_eq!(report.removed[0].owner, guard.owner(), "{report:?}");
    assert!(report.fencing_token > guard.fencing_token(), "{report:?}");
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the old holder's lost signal fires");
    eprintln!(
        "lost signal {:?} after the forced release",
        released_at.elapsed()
    );

    let g2 = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("in time")
        .expect("join")
        .expect("the waiter stayed queued and acquires");
    // The waiter's token is its node's czxid: above the old holder's (it queued later), but
    // possibly below the release's zxid (its node was created before it).
    assert!(g2.fencing_token() > guard.fencing_token(), "{report:?}");
    assert!(register.write(g2.fencing_token(), "next", true));
    assert!(
        !register.write(guard.fencing_token(), "old", !guard.is_lost()),
        "the old holder's write must be rejected"
    );
    register.assert_no_rejected_belief();
    // A second forced release removes the new holder only.
    let again = op
        .force_release(&name, LockKind::Mutex)
        .await
        .expect("force");
    assert_eq!(again.removed.len(), 1, "{again:?}");
    assert_eq!(again.removed[0].owner, g2.owner(), "{again:?}");
    tokio::time::timeout(Duration::from_secs(10), g2.lost())
        .await
        .expect("lost");
    // A free lock: nothing removed, the counter still reported above every token.
    let free = op
        .force_release(&name, LockKind::Mutex)
        .await
        .expect("force");
    assert!(free.removed.is_empty(), "{free:?}");
    assert!(free.fencing_token > g2.fencing_token(), "{free:?}");
    let never = op
        .force_release(&unique_name("ops-never"), LockKind::Mutex)
        .await
        .expect("force");
    assert_eq!((never.removed.len(), never.fencing_token), (0, 0));
}

/// For a rw lock, every reader holding is removed (both sessions), the queued writer stays
/// queued and then holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_removes_every_reader() {
    let name = unique_name("ops-force-rw");
    let (a, b, op) = (client().await, client().await, client().await);
    let r1 = read(&a, &name).await;
    let r2 = read(&b, &name).await;
    let writer = {
        let rw = op.rw_lock(&name).expect("rw");
        tokio::spawn(async move { rw.write().acquire_timeout(Duration::from_secs(30)).await })
    };
    wait_for_waiters(&a, &name, LockKind::Write, 1).await;
    let report = a.force_release(&name, LockKind::Read).await.expect("force");
    let mut owners: Vec<&str> = report.removed.iter().map(|h| h.owner.as_str()).collect();
    owners.sort_unstable();
    let mut want = vec![r1.owner(), r2.owner()];
    want.sort_unstable();
    assert_eq!(owners, want, "{report:?}");
    assert!(report
        .removed
        .iter()
        .all(|h| h.side == Some(LockKind::Read)));
    for lost in [r1.lost(), r2.lost()] {
        tokio::time::timeout(Duration::from_secs(10), lost)
            .await
            .expect("lost signal fires");
    }
    let w = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("in time")
        .expect("join")
        .expect("the writer acquires");
    assert!(
        w.fencing_token() > r1.fencing_token().max(r2.fencing_token()),
        "{report:?}"
    );
    w.release().await.expect("release");
}

/// The test ensemble (3 voting members, a leader, a session timeout above the lease) passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_the_test_ensemble() {
    let c = client().await;
    let findings = c.diagnose().await.expect("diagnose");
    for check in [
        "session-timeout",
        "leader",
        "ensemble",
        "tls",
        "auth",
        "clock",
    ] {
        let f = findings
            .iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no {check} in {findings:?}"));
        eprintln!("{check}: {:?} {}", f.severity, f.message);
        assert_ne!(f.severity, Severity::Unsafe, "{f:?}");
    }
    let tls = findings
        .iter()
        .find(|f| f.check == "tls")
        .expect("tls finding");
    assert_eq!(tls.severity, Severity::Ok, "{tls:?}");
    assert!(tls.message.contains("loopback only"), "{tls:?}");
    let ens = findings
        .iter()
        .find(|f| f.check == "ensemble")
        .expect("ensemble");
    assert!(ens.message.contains("voting members"), "{ens:?}");
}

/// A session timeout the server shortened (maxSessionTimeout) below what was asked for is a
/// warning; a lease above it is refused at connect (the unsafe case never gets a client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_warns_about_a_shortened_session() {
    let url = ZkEnsemble::shared().url();
    // The test ensemble caps sessions at 60 s.
    let long = format!("{url}?session_timeout=120s");
    let o = opts();
    let backend = ZkBackend::connect(&long, &o).await.expect("connect");
    let c = Client::new(Arc::new(backend), o).expect("client");
    let findings = c.diagnose().await.expect("diagnose");
    let f = findings
        .iter()
        .find(|f| f.check == "session-timeout")
        .expect("session-timeout");
    assert_eq!(f.severity, Severity::Warning, "{f:?}");
    let too_long = opts().watchdog_lease(Duration::from_secs(90));
    let err = ZkBackend::connect(&format!("{url}?session_timeout=120s"), &too_long)
        .await
        .err()
        .expect("a session shorter than the lease is refused");
    assert!(err.to_string().contains("watchdog lease"), "{err}");
}

/// A Curator `InterProcessMutex` node (`_c_<uuid>-lock-NNNN` holding the client's address)
/// in the lock's directory is listed as the holder with that address as its owner, and a
/// forced release removes it like one of ours (the next dlock holder then acquires).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_nodes_are_listed_and_force_released() {
    let name = unique_name("ops-curator");
    let c = client().await;
    // dlock creates the directory (and records a fence) on first use.
    let g = hold(&c, &name).await;
    let first = g.fencing_token();
    g.release().await.expect("release");
    let dir = distlock_zookeeper::lock_dir("dlock", &name, LockKind::Mutex).expect("dir");
    // Curator's own session: its node is ephemeral and named as Curator names it.
    let curator = zookeeper_client::Client::connect(&ZkEnsemble::shared().connect_string())
        .await
        .expect("raw connect");
    let opts = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    curator
        .create(
            &format!("{dir}/_c_2b0a6a4e-8f3c-4f7e-9d4a-1c2b3d4e5f60-lock-"),
            b"127.0.0.1",
            &opts,
        )
        .await
        .expect("create Curator's node");
    let locks = c.list(&name).await.expect("list");
    let l = locks
        .iter()
        .find(|l| l.info.name == name && l.kind == LockKind::Mutex)
        .unwrap_or_else(|| panic!("{locks:?}"));
    assert_eq!(l.info.holders.len(), 1, "{l:?}");
    assert_eq!(l.info.holders[0].owner, "127.0.0.1", "{l:?}");
    assert!(l.info.fencing_token > first, "the node's czxid: {l:?}");
    let try_held = c
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(try_held.is_none(), "Curator's node holds the lock");
    let report = c
        .force_release(&name, LockKind::Mutex)
        .await
        .expect("force");
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert_eq!(report.removed[0].owner, "127.0.0.1", "{report:?}");
    let g = hold_within(
        &c,
        &name,
        Duration::from_secs(10),
        "acquires after the forced release",
    )
    .await;
    assert!(g.fencing_token() > report.fencing_token, "{report:?}");
    g.release().await.expect("release");
}
