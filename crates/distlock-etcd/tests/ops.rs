//! The operator commands (`list`, `release --force`, `doctor`) on a real etcd cluster, through
//! the `Client` API, with holders and waiters in other clients: a forced release fences the
//! old holder (its lost signal fires, its write with the old token is rejected once the next
//! holder wrote), leaves waiters queued and never removes a holder that came after it; doctor
//! passes a healthy cluster and flags a dead member and a watchdog lease below etcd's minimum
//! lease TTL.

use distlock_core::{
    Client, ClientOptions, Error, Finding, LockKind, LostReason, Operator, Severity,
};
use distlock_etcd::EtcdBackend;

mod common;
use common::{client_at, etcdctl, etcdctl_lock, exits, file_appears, hold};
use distlock_testkit::conformance::{poll_until, wait_for_waiters};
use distlock_testkit::{EtcdCluster, FencedRegister, TempDir};
use std::time::{Duration, Instant};

fn opts(lease: Duration) -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(lease)
        .connect_timeout(Duration::from_secs(2))
}

async fn client(url: &str, lease: Duration) -> Client {
    client_at(url, opts(lease)).await
}

fn finding<'a>(findings: &'a [Finding], check: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no `{check}` finding in {findings:#?}"))
}

/// `list` shows a held lock (owner, token, lease left), its queued waiter, a released lock's
/// counter, a name with `/` (unescaped), a holder that `etcdctl lock` queued under the same
/// prefix (foreign, no owner), and honours the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_holders_waiters_counters_and_foreign_keys() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let a = client(&url, Duration::from_secs(5)).await;
    let b = client(&url, Duration::from_secs(5)).await;
    let held = hold(&a, "ops-job").await;
    let waiter = {
        let lock = b.lock("ops-job").expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    wait_for_waiters(&a, "ops-job", LockKind::Mutex, 1).await;
    let done = hold(&a, "ops-done").await;
    let done_token = done.fencing_token();
    done.release().await.expect("release");
    let slash = hold(&a, "ops-a/b").await;
    let other = hold(&a, "zz-other").await;

    let locks = a.list("ops-").await.expect("list");
    let names: Vec<&str> = locks.iter().map(|l| l.info.name.as_str()).collect();
    assert_eq!(names, ["ops-a/b", "ops-done", "ops-job"], "{locks:#?}");
    let job = &locks[2];
    assert_eq!(job.kind, LockKind::Mutex);
    assert_eq!(job.info.holders.len(), 1, "{job:?}");
    assert_eq!(job.info.holders[0].owner, held.owner(), "{job:?}");
    assert_eq!(job.info.holders[0].count, 1, "{job:?}");
    assert_eq!(job.info.fencing_token, held.fencing_token(), "{job:?}");
    assert_eq!(job.info.waiters, Some(1), "{job:?}");
    // etcd's lease is the watchdog lease rounded up to whole seconds.
    let left = job.info.holders[0].lease_left.expect("lease left");
    assert!(left <= Duration::from_secs(5), "{job:?}");
    let gone = &locks[1];
    assert!(gone.info.holders.is_empty(), "{gone:?}");
    assert_eq!(gone.info.fencing_token, done_token, "{gone:?}");
    assert_eq!(locks[0].info.fencing_token, slash.fencing_token());
    // The listing is what inspect says, lock by lock.
    for l in &locks {
        let i = a.inspect(&l.info.name).await.expect("inspect");
        assert_eq!(i.fencing_token, l.info.fencing_token, "{l:?}");
        assert_eq!(i.waiters, l.info.waiters, "{l:?}");
    }
    let only = a.list("ops-a").await.expect("list");
    assert_eq!(only.len(), 1, "{only:?}");
    assert_eq!(a.list("").await.expect("list").len(), 4);

    // `etcdctl lock dlock/NAME` queues under the same prefix: a foreign holder, listed.
    if let Some(bin) = etcdctl() {
        let dir = TempDir::new().expect("temp dir");
        let (heldf, go) = (dir.path().join("held"), dir.path().join("go"));
        let script = format!(
            "touch '{}'; while [ ! -e '{}' ]; do sleep 0.05; done",
            heldf.display(),
            go.display()
        );
        let mut ctl = etcdctl_lock(bin, &cluster, "ops-ctl", &script);
        file_appears(&heldf).await;
        let locks = a.list("ops-ctl").await.expect("list");
        assert_eq!(locks.len(), 1, "{locks:?}");
        let owner = &locks[0].info.holders[0].owner;
        assert!(owner.starts_with("(not dlock) "), "{locks:?}");
        assert!(locks[0].info.fencing_token > 0, "{locks:?}");
        // Let etcdctl's command end by itself (killing etcdctl would orphan it).
        std::fs::write(&go, b"").expect("touch go");
        exits(&mut ctl).await;
    }

    held.release().await.expect("release");
    let g = waiter.await.expect("join").expect("waiter acquires");
    g.release().await.expect("release");
    slash.release().await.expect("release");
    other.release().await.expect("release");
}

/// A holder in another client is removed by a forced release while a waiter is queued: the
/// old holder's lost signal fires at its next renewal (`NotHeld`), the waiter (still queued)
/// gets the lock with a higher token, and the old holder's write with its token is rejected
/// by a fenced register after the next holder wrote. A later acquire gets a token above the
/// counter the forced release reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_fences_the_old_holder_and_keeps_the_waiters() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    // A 2 s watchdog lease: renewals every ~0.7 s, so the loss is seen quickly, with room for
    // a loaded machine.
    let old = client(&url, Duration::from_secs(2)).await;
    let next = client(&url, Duration::from_secs(5)).await;
    let admin = client(&url, Duration::from_secs(5)).await;
    let guard = hold(&old, "ops-stuck").await;
    let register = FencedRegister::new();
    assert!(register.write(guard.fencing_token(), "old", true));
    let waiter = {
        let lock = next.lock("ops-stuck").expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    wait_for_waiters(&admin, "ops-stuck", LockKind::Mutex, 1).await;

    let released_at = Instant::now();
    let r = admin
        .force_release("ops-stuck", LockKind::Mutex)
        .await
        .expect("forced release");
    assert_eq!(r.removed.len(), 1, "{r:?}");
    assert_eq!(r.removed[0].owner, guard.owner(), "{r:?}");
    assert!(r.fencing_token > guard.fencing_token(), "{r:?}");

    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the old holder's lost signal fires");
    assert_eq!(reason, LostReason::NotHeld);
    eprintln!(
        "lost signal {:?} after the forced release",
        released_at.elapsed()
    );
    // The waiter stayed queued and is woken by the deletion, as by a release.
    let g2 = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter gets the lock")
        .expect("join")
        .expect("acquire");
    assert!(g2.fencing_token() > guard.fencing_token());
    assert!(register.write(g2.fencing_token(), "next", true));
    assert!(
        !register.write(guard.fencing_token(), "old", !guard.is_lost()),
        "the old holder's write must be rejected"
    );
    register.assert_no_rejected_belief();
    g2.release().await.expect("release");
    let g3 = hold(&admin, "ops-stuck").await;
    assert!(
        g3.fencing_token() > r.fencing_token,
        "{} > {}",
        g3.fencing_token(),
        r.fencing_token
    );
    g3.release().await.expect("release");
    drop(guard);
}

/// A forced release of a free lock removes nothing and still advances the counter (inspect
/// reports it; the next grant is above it). A forced release never removes a holder that
/// came after the one it read: it is guarded by the holder's create revision (driven here
/// by releasing the read holder and granting to another attempt before a second forced
/// release, which removes only the new one). Read-write locks are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_free_lock_and_of_unsupported_kinds() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let a = client(&url, Duration::from_secs(5)).await;
    let g = hold(&a, "ops-free").await;
    let first = g.fencing_token();
    g.release().await.expect("release");
    let r = a
        .force_release("ops-free", LockKind::Mutex)
        .await
        .expect("forced release");
    assert!(r.removed.is_empty(), "{r:?}");
    assert!(r.fencing_token > first, "{r:?}");
    let info = a.inspect("ops-free").await.expect("inspect");
    assert_eq!(info.fencing_token, r.fencing_token);
    let g = hold(&a, "ops-free").await;
    assert!(g.fencing_token() > r.fencing_token);
    // `fair` is the same lock on etcd.
    let r2 = a
        .force_release("ops-free", LockKind::Fair)
        .await
        .expect("forced release");
    assert_eq!(r2.removed.len(), 1, "{r2:?}");
    assert_eq!(r2.removed[0].owner, g.owner());
    assert!(matches!(
        a.force_release("ops-free", LockKind::Write).await,
        Err(Error::Unsupported { .. })
    ));
    drop(g);
}

/// Driving the backend directly: two forced releases racing for one holder remove it once;
/// the second finds the lock free (or the next holder, which it then removes — never a key
/// it did not read as first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_forced_releases_remove_one_holder_each() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let o = opts(Duration::from_secs(5));
    let b1 = EtcdBackend::connect(&url, &o).await.expect("connect");
    let b2 = EtcdBackend::connect(&url, &o).await.expect("connect");
    let a = client(&url, Duration::from_secs(5)).await;
    let g = hold(&a, "ops-race").await;
    let (r1, r2) = tokio::join!(
        b1.force_release("ops-race", LockKind::Mutex),
        b2.force_release("ops-race", LockKind::Mutex)
    );
    let (r1, r2) = (r1.expect("first"), r2.expect("second"));
    let removed = r1.removed.len() + r2.removed.len();
    assert_eq!(removed, 1, "{r1:?} {r2:?}");
    assert_ne!(r1.fencing_token, r2.fencing_token);
    let info = a.inspect("ops-race").await.expect("inspect");
    assert!(!info.held());
    drop(g);
}

/// doctor on a healthy cluster: every check passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_a_healthy_cluster() {
    let cluster = EtcdCluster::start().expect("cluster");
    let a = client(&cluster.url(), Duration::from_secs(10)).await;
    let findings = poll_until(
        "every check to pass",
        async || a.diagnose().await.expect("diagnose"),
        |f| f.iter().all(|f| f.severity == Severity::Ok),
    )
    .await;
    for check in [
        "members",
        "version",
        "leader",
        "raft-index",
        "lease",
        "tls",
        "clock",
    ] {
        finding(&findings, check);
    }
    assert!(finding(&findings, "tls").message.contains("loopback only"));
    assert!(finding(&findings, "members").message.contains("all 3"));
    assert!(finding(&findings, "clock").message.contains("not checked"));
}

/// doctor flags a dead member (a warning while the quorum holds) and names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_flags_a_dead_member() {
    let mut cluster = EtcdCluster::start().expect("cluster");
    let a = client(&cluster.url(), Duration::from_secs(10)).await;
    let before = a.diagnose().await.expect("diagnose");
    cluster.kill(2);
    cluster
        .wait_leader(Duration::from_secs(20))
        .expect("a leader");
    let findings = poll_until(
        "the dead member to be reported",
        async || a.diagnose().await.expect("diagnose"),
        |f| {
            f.iter()
                .any(|f| f.check == "members" && f.severity == Severity::Warning)
                && f.iter()
                    .any(|f| f.check == "leader" && f.severity == Severity::Ok)
        },
    )
    .await;
    eprintln!("{findings:#?}");
    let m = finding(&findings, "members");
    assert!(m.message.contains("1 of 3"), "{m:?}");
    assert!(
        findings.iter().all(|f| f.severity != Severity::Unsafe),
        "{before:#?} then {findings:#?}"
    );
}

/// doctor flags a watchdog lease below etcd's minimum lease TTL (1.5 × election timeout:
/// 5 s with a 3 s election timeout), and a watchdog lease too short to ride out an election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_flags_a_lease_below_the_minimum_ttl() {
    let cluster =
        EtcdCluster::start_with("etcd", 1, &["--election-timeout", "3000"]).expect("cluster");
    let short = client(&cluster.url(), Duration::from_secs(2)).await;
    let f = short.diagnose().await.expect("diagnose");
    let l = finding(&f, "lease");
    assert_eq!(l.severity, Severity::Warning, "{l:?}");
    assert!(l.message.contains("5s"), "{l:?}");
    let fine = client(&cluster.url(), Duration::from_secs(30)).await;
    let f = fine.diagnose().await.expect("diagnose");
    assert_eq!(finding(&f, "lease").severity, Severity::Ok, "{f:#?}");
    let edge = client(&cluster.url(), Duration::from_secs(5)).await;
    let f = edge.diagnose().await.expect("diagnose");
    let l = finding(&f, "lease");
    assert_eq!(l.severity, Severity::Warning, "{l:?}");
    assert!(l.message.contains("election"), "{l:?}");
}
