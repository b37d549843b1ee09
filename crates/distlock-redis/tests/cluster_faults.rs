//! `redis+cluster://` across a failover on a real 6-node Redis Cluster (3 masters, 1 replica
//! each, `cluster-node-timeout` 1 s): the service comes back for every name, a waiter blocked
//! across the failover still gets the lock, and exactly what the docs say a failover can lose
//! (a grant not yet replicated, without `?wait_replicas`) is lost, and what they say survives
//! (a grant acknowledged with `?wait_replicas=1`) survives.

mod common;

use common::{client_for, name_on};
use distlock_core::{ClientOptions, Error, LockKind};
use distlock_testkit::RedisCluster;
use std::time::{Duration, Instant};

/// Generous: a failover takes a few seconds, more on a loaded 2-core CI machine.
const FAILOVER: Duration = Duration::from_secs(60);

fn opts() -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(Duration::from_secs(3))
        .op_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(2))
}

fn start() -> RedisCluster {
    let t = Instant::now();
    let c = RedisCluster::start().expect("cluster");
    eprintln!("6-node cluster formed in {:?}", t.elapsed());
    c
}

/// A master killed while a lock on it is held and waited for: its replica takes over, the
/// waiter (subscribed at that very node) resubscribes elsewhere and gets the lock, and every
/// name is lockable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_waiter_still_gets_the_lock() {
    let mut cluster = start();
    // The subscriber connects to the first seed (node 0) first: kill that node, a master.
    let m = 0;
    assert!(cluster.masters().expect("masters").contains(&m));
    let name = name_on(&cluster, m, "held");
    let (holder, _) = client_for(&cluster.url(), opts()).await;
    let (other, _) = client_for(&cluster.url(), opts()).await;
    let guard = holder
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let token = guard.fencing_token();
    let lock = other.lock(&name).expect("lock");
    let waiter = tokio::spawn(async move { lock.acquire_timeout(FAILOVER).await });
    distlock_testkit::conformance::wait_for_waiters(&other, &name, LockKind::Mutex, 1).await;
    let r = cluster.replica_of(m).expect("replica");
    let t = Instant::now();
    cluster.kill(m);
    let promoted = cluster.wait_failover(m, FAILOVER).expect("failover");
    assert_eq!(promoted, r, "the replica took over");
    eprintln!("node {promoted} promoted after {:?}", t.elapsed());
    // The holder may have lost the lock while its master was gone (renewals failed for
    // longer than the lease) or kept it (the grant was replicated long before the kill).
    let outcome = guard.release().await;
    eprintln!("holder's release after the failover: {outcome:?}");
    let g = waiter
        .await
        .expect("join")
        .expect("the waiter gets the lock");
    assert!(g.fencing_token() > token);
    eprintln!("waiter granted {:?} after the kill", t.elapsed());
    g.release().await.expect("release");
    // Every name, on every master, is lockable again.
    for i in 0..30 {
        let n = format!("after-{i}");
        let g = holder
            .lock(&n)
            .expect("lock")
            .acquire_timeout(FAILOVER)
            .await
            .expect("acquire");
        g.release().await.expect("release");
    }
}

/// Without `?wait_replicas`, a grant acknowledged by a master whose replica had not received
/// it is lost by a failover: another client gets the same lock. (The replica is frozen and its
/// link cut by the master, so the write cannot reach it: the window async replication leaves,
/// made wide. Freezing alone is not enough: the kernel would buffer the stream for it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreplicated_grant_is_lost_by_a_failover() {
    let mut cluster = start();
    let m = cluster.masters().expect("masters")[1];
    let r = cluster.replica_of(m).expect("replica");
    let name = name_on(&cluster, m, "lost");
    let (a, _) = client_for(&cluster.url(), opts()).await;
    let (b, _) = client_for(&cluster.url(), opts()).await;
    // An earlier grant the replica confirmed: the fencing counter it will be promoted with.
    let url = format!("{}?wait_replicas=1&wait_timeout=500ms", cluster.url());
    let (w, _) = client_for(&url, opts()).await;
    let earlier = w
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    earlier.release().await.expect("release");
    cluster.pause(r);
    let cut = cluster.servers()[m].command(&["CLIENT", "KILL", "TYPE", "replica"]);
    assert_eq!(cut.expect("CLIENT KILL"), "1", "the replica's link");
    let guard = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("granted by the master");
    cluster.kill(m);
    cluster.resume(r);
    cluster.wait_failover(m, FAILOVER).expect("failover");
    // The promoted replica never saw the grant: B is granted the lock A believes it holds.
    let g = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(FAILOVER)
        .await
        .expect("granted again after the failover");
    eprintln!(
        "A holds token {} (lost: {}), B was granted token {}",
        guard.fencing_token(),
        guard.is_lost(),
        g.fencing_token()
    );
    // The promoted replica's fencing counter missed A's grant (it has the earlier one's),
    // yet B's token is above A's: a fenced store refuses A's late writes.
    assert!(
        g.fencing_token() > guard.fencing_token(),
        "the promoted replica granted token {} after the old master's {}",
        g.fencing_token(),
        guard.fencing_token()
    );
    // A's watchdog finds the grant gone and signals the loss.
    let t = Instant::now();
    while !guard.is_lost() {
        assert!(t.elapsed() < FAILOVER, "A never learnt it lost the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    g.release().await.expect("release");
    drop(guard);
}

/// With `?wait_replicas=1`: a grant the replica cannot confirm is refused (given back), a
/// renewal it cannot confirm does not extend the holder's lease (the lost signal fires at the
/// last confirmed lease end), and a confirmed grant survives the failover (another client
/// cannot take the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_grant_survives_with_wait_replicas() {
    let mut cluster = start();
    let m = cluster.masters().expect("masters")[2];
    let r = cluster.replica_of(m).expect("replica");
    let url = format!("{}?wait_replicas=1&wait_timeout=300ms", cluster.url());
    // A lease longer than the failover: what is tested is the grant surviving on the
    // replica, not the watchdog reaching the new master in time.
    let (a, _) = client_for(&url, opts().watchdog_lease(Duration::from_secs(20))).await;
    let (b, _) = client_for(&url, opts()).await;
    // A hold of B on the same master, renewed every second while the replica confirms.
    let renewed = name_on(&cluster, m, "renewed");
    let held = b
        .lock(&renewed)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !held.is_lost(),
        "lost while the replica confirmed the renewals"
    );
    // The replica frozen: the grant cannot be confirmed, so it is not reported.
    let unconfirmed = name_on(&cluster, m, "unconfirmed");
    cluster.pause(r);
    let t = Instant::now();
    let err = a
        .lock(&unconfirmed)
        .expect("lock")
        .try_acquire()
        .await
        .expect_err("no grant without the replica");
    assert!(err.to_string().contains("replicas confirmed"), "{err}");
    // Nor is a renewal: B's hold is lost when its last confirmed lease (3 s) runs out,
    // although the master alone extended it (a promoted replica would hold the older expiry).
    let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("the lost signal did not fire with the replica paused");
    let waited = t.elapsed();
    cluster.resume(r);
    assert_eq!(reason, distlock_core::LostReason::LeaseExpired);
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    // Confirmed, then the master dies at once.
    let name = name_on(&cluster, m, "kept");
    let guard = a
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    cluster.kill(m);
    cluster.wait_failover(m, FAILOVER).expect("failover");
    let t = Instant::now();
    // The lock is still held on the promoted replica: B cannot get it while A renews.
    let busy = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await;
    assert!(matches!(busy, Err(Error::Timeout { .. })), "{busy:?}");
    assert!(
        !guard.is_lost(),
        "the holder kept its lock across the failover"
    );
    eprintln!("held across the failover, checked for {:?}", t.elapsed());
    let info = b.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    guard.release().await.expect("release");
}
