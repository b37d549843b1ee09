//! Failures on a real 3-member etcd cluster: a crashed leader, a client cut off from the
//! cluster while it holds the lock, a waiter cut off while it waits.

use distlock_core::{Client, ClientOptions, Error, LockKind, LostReason, ReleaseOutcome};

mod common;
use common::{client_at as client, hold, hold_within, released};
use distlock_testkit::conformance::wait_for_waiters;
use distlock_testkit::{DelayProxy, EtcdCluster};
use std::time::{Duration, Instant};

fn opts(lease: Duration) -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(lease)
        .op_timeout(Duration::from_millis(700))
        .connect_timeout(Duration::from_secs(3))
}

/// `etcd://` through one proxy per member.
fn proxied(cluster: &EtcdCluster) -> (Vec<DelayProxy>, String) {
    let proxies: Vec<DelayProxy> = (0..cluster.len())
        .map(|i| DelayProxy::start(cluster.client_addr(i), Duration::ZERO).expect("proxy"))
        .collect();
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    (proxies, format!("etcd://{}", hosts.join(",")))
}

/// SIGKILL of the leader while a lock is held: the lock survives (it is replicated), nobody
/// else gets it, the holder is not lost and keeps renewing through the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_crash_keeps_the_lock() {
    let mut cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    // A lease well above an election (500 ms) plus reconnects on a loaded machine: the holder
    // must get a renewal through the new leader within it (renewals every 2 s).
    let lease = Duration::from_secs(6);
    let a = client(&url, opts(lease)).await;
    let b = client(&url, opts(lease)).await;
    let g = hold(&a, "orders").await;
    let token = g.fencing_token();

    let leader = cluster.leader().expect("leader");
    cluster.kill(leader);
    let killed_at = Instant::now();

    // For longer than two leases: nobody else gets the lock, the holder is never lost.
    let other = b.lock("orders").expect("lock");
    while killed_at.elapsed() < lease * 2 + Duration::from_secs(1) {
        match other.try_acquire().await {
            Ok(None) => {}
            Ok(Some(g2)) => panic!(
                "second holder after a leader crash: token {}",
                g2.fencing_token()
            ),
            // The election: requests fail for a moment.
            Err(e) => assert!(e.is_connection(), "{e}"),
        }
        assert!(
            !g.is_lost(),
            "holder lost after a leader crash: {:?}",
            g.lost_signal().reason()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let new = cluster
        .wait_leader(Duration::from_secs(10))
        .expect("new leader");
    assert_ne!(new, leader);
    // Still renewing through the new leader: the lease was refreshed within the last renewal
    // interval (a third of the lease) or so.
    let info = a.inspect("orders").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, g.owner());
    assert_eq!(info.fencing_token, token);
    let left = info.holders[0].lease_left.expect("lease left");
    assert!(
        left >= Duration::from_secs(1),
        "lease not renewed: {left:?} left"
    );
    released(g).await;
    let g2 = other
        .acquire_timeout(Duration::from_secs(15))
        .await
        .expect("free after release");
    assert!(g2.fencing_token() > token);
    // The crashed member comes back with its data.
    cluster.restart(leader).expect("restart");
    drop(g2);
}

/// A holder cut off from the cluster (as a SIGSTOPped process would be) stops renewing: its
/// lost signal fires no later than etcd frees the lock, the next holder gets a greater fencing
/// token, and once it can talk again it learns the lock is someone else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_holder_loses_the_lock_before_the_next_holder_gets_it() {
    let cluster = EtcdCluster::start().expect("cluster");
    let (proxies, via_proxies) = proxied(&cluster);
    let lease = Duration::from_secs(2);
    let a = client(&via_proxies, opts(lease)).await;
    // The next holder keeps the lock until the end of the test (while the cut-off client
    // reconnects): a lease a loaded machine cannot run out.
    let b = client(&cluster.url(), opts(Duration::from_secs(20))).await;
    let g = hold(&a, "stock").await;
    let lost = g.lost_signal();
    for p in &proxies {
        p.set_blackhole(true);
    }
    let cut_at = Instant::now();
    let g2 = hold_within(
        &b,
        "stock",
        Duration::from_secs(20),
        "the lock frees when the cut-off holder's lease ends",
    )
    .await;
    // Looked at the moment the grant returns (not by a task that a loaded machine may run
    // late): the old holder's signal must have fired already.
    let lost_when_granted = lost.reason();
    eprintln!("cut off at 0, next grant at {:?}", cut_at.elapsed());
    match lost_when_granted {
        Some(reason) => assert_eq!(reason, LostReason::LeaseExpired),
        None => panic!("the new holder got the lock before the old holder learned of its loss"),
    }
    assert!(g2.fencing_token() > g.fencing_token());
    // It can talk again: its release reports the lock as someone else's.
    for p in &proxies {
        p.set_blackhole(false);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let out = loop {
        match g_release_probe(&a).await {
            Ok(()) => break g.release().await.expect("release"),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("client never reconnected: {e}"),
        }
    };
    assert_eq!(out, ReleaseOutcome::TakenByOther);
    released(g2).await;
}

async fn g_release_probe(c: &Client) -> distlock_core::Result<()> {
    c.inspect("stock").await.map(|_| ())
}

/// A waiter cut off from the cluster stops waiting with an error once its own lease (its
/// place in the queue) must have expired, instead of waiting forever; its key is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_waiter_stops_with_an_error() {
    let cluster = EtcdCluster::start().expect("cluster");
    let (proxies, via_proxies) = proxied(&cluster);
    // The waiter's lease decides when it stops; the holder's only has to outlast the test on a
    // loaded machine.
    let lease = Duration::from_secs(2);
    let holder = client(&cluster.url(), opts(Duration::from_secs(20))).await;
    let waiter = client(&via_proxies, opts(lease)).await;
    let g = hold(&holder, "q").await;
    let lock = waiter.lock("q").expect("lock");
    let wait = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await });
    // Queued.
    wait_for_waiters(&holder, "q", LockKind::Mutex, 1).await;
    for p in &proxies {
        p.set_blackhole(true);
    }
    let cut_at = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the cut-off waiter kept waiting")
        .expect("join")
        .expect_err("a cut-off waiter got the lock");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert!(err.to_string().contains("queue"), "{err}");
    // About its own lease (2 s) after the cut, not at its 30 s deadline: 10 s is generous on a
    // loaded machine.
    assert!(
        cut_at.elapsed() < Duration::from_secs(10),
        "{:?}",
        cut_at.elapsed()
    );
    // etcd expires the waiter's lease, which removes its key; the holder is undisturbed.
    let t = Instant::now();
    loop {
        let info = holder.inspect("q").await.expect("inspect");
        assert_eq!(info.holders[0].owner, g.owner());
        if info.waiters == Some(0) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the waiter's key stayed: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!g.is_lost());
    released(g).await;
}
