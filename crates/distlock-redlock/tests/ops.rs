//! Operator commands (list, release --force, doctor) on a cluster of real redis-servers,
//! through the Client API: per-node agreement in `list`, a forced release that fences the old
//! holder and raises every node past the largest counter (also one a node had alone), a
//! forced release that needs a majority, and doctor findings per node. States are polled and
//! bounds are generous (a loaded 2-core machine).

mod common;

use common::{acquire_within, acquired, opts, wait_counting, Cluster};
use distlock_core::{Client, LockKind, Severity};
use distlock_testkit::FencedRegister;
use std::time::{Duration, Instant};

/// A settled 3-node cluster and a client whose backend counts every node.
async fn cluster_and_client(lease_ms: u64) -> (Cluster, Client) {
    let c = Cluster::start(3);
    c.settle().await;
    let (client, b) = c.client_and_backend("", opts(lease_ms)).await;
    wait_counting(&b, 3, Duration::from_secs(10)).await;
    (c, client)
}

/// A held lock is listed with its owner, lease and token; a released one with its counter
/// only; a hold one node lost shows the agreement (2 of 3) and still counts; a hold on a
/// single node is no holder; --prefix filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_merges_nodes_by_attempt_and_shows_agreement() {
    let (c, client) = cluster_and_client(5000).await;
    let held = acquired(&client, "ops-job").await;
    let done = acquired(&client, "ops-done").await;
    let done_token = done.fencing_token();
    done.release().await.expect("release");
    c.wait_held_on(&[0, 1, 2], "ops-job", Duration::from_secs(5))
        .await;

    let locks = client.list("ops-").await.expect("list");
    let job = locks
        .iter()
        .find(|l| l.info.name == "ops-job")
        .expect("held lock listed");
    assert_eq!(job.kind, LockKind::Mutex);
    assert_eq!(job.info.holders.len(), 1, "{job:?}");
    assert_eq!(job.info.holders[0].owner, held.owner(), "{job:?}");
    assert_eq!(job.info.fencing_token, held.fencing_token(), "{job:?}");
    assert!(
        job.info.holders[0]
            .lease_left
            .is_some_and(|l| l <= Duration::from_secs(5)),
        "{job:?}"
    );
    let gone = locks
        .iter()
        .find(|l| l.info.name == "ops-done")
        .expect("a released lock's counter is state");
    assert!(!gone.info.held(), "{gone:?}");
    assert!(gone.info.fencing_token >= done_token, "{gone:?}");

    // Node 2 loses the hold: a majority still has it, and the owner says 2 of 3.
    c.break_lock_on(2, "ops-job");
    let locks = client.list("ops-job").await.expect("list");
    assert!(locks.iter().all(|l| l.info.name == "ops-job"), "{locks:?}");
    let job = &locks[0];
    assert_eq!(
        job.info.holders[0].owner,
        format!("{} (on 2 of 3 nodes)", held.owner()),
        "{job:?}"
    );
    assert_eq!(job.info.fencing_token, held.fencing_token(), "{job:?}");

    // Only one node has it: no holder (the lock is free for a majority).
    c.break_lock_on(1, "ops-job");
    let locks = client.list("ops-job").await.expect("list");
    assert!(!locks[0].info.held(), "{locks:?}");
    drop(held);
}

/// `release --force` through the Client API: the old holder (another client, 1 s watchdog
/// lease) loses its lock at its next renewal, the next holder gets a higher token, and the old
/// holder's write with its token is rejected by a fenced register after the next one wrote.
/// One node's counter was far above the others (a node that alone saw a failed attempt's
/// increments); every node is raised past it, so whichever majority grants next, its token is
/// above it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_fences_the_old_holder_and_raises_every_node() {
    let (c, admin) = cluster_and_client(5000).await;
    let (old, ob) = c.client_and_backend("", opts(1000)).await;
    wait_counting(&ob, 3, Duration::from_secs(10)).await;
    let name = "ops-stuck";
    let guard = acquired(&old, name).await;
    let register = FencedRegister::new();
    assert!(register.write(guard.fencing_token(), "old", true));
    c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
        .await;
    let high = c.fence(0, name) + 1_000_000;
    c.servers[0]
        .command(&["SET", &format!("dlock:{{{name}}}:fence"), &high.to_string()])
        .expect("SET");

    let released_at = Instant::now();
    let r = admin
        .force_release(name, LockKind::Mutex)
        .await
        .expect("force release");
    assert_eq!(r.removed.len(), 1, "{r:?}");
    assert_eq!(r.removed[0].owner, guard.owner(), "{r:?}");
    assert!(r.fencing_token > high, "{r:?} vs {high}");
    for i in 0..3 {
        assert!(!c.has_lock(i, name), "node {i} kept the hold");
        assert!(
            c.fence(i, name) >= r.fencing_token,
            "node {i}'s counter {} is below the reported {}",
            c.fence(i, name),
            r.fencing_token
        );
    }

    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the old holder's lost signal fires");
    eprintln!(
        "lost signal {:?} after the forced release",
        released_at.elapsed()
    );
    let g2 = acquire_within(&admin, name, 10)
        .await
        .expect("the next holder acquires");
    assert!(g2.fencing_token() > r.fencing_token);
    assert!(register.write(g2.fencing_token(), "next", true));
    assert!(
        !register.write(guard.fencing_token(), "old", !guard.is_lost()),
        "the old holder's write must be rejected"
    );
    register.assert_no_rejected_belief();
    g2.release().await.expect("release");
    drop(guard);
}

/// With one node down the forced release is done on the other two (a majority) and the old
/// holder loses its lock; with two down it fails, names the nodes it could not reach, and
/// leaves the reached node's hold removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_needs_a_majority_and_names_unreached_nodes() {
    let (mut c, admin) = cluster_and_client(5000).await;
    let (old, ob) = c.client_and_backend("", opts(1000)).await;
    wait_counting(&ob, 3, Duration::from_secs(10)).await;
    let guard = acquired(&old, "ops-a").await;
    c.wait_held_on(&[0, 1, 2], "ops-a", Duration::from_secs(5))
        .await;
    c.servers[2].pause();
    let r = admin
        .force_release("ops-a", LockKind::Mutex)
        .await
        .expect("a majority suffices");
    assert_eq!(
        r.removed[0].owner,
        format!("{} (on 2 of 3 nodes)", guard.owner()),
        "{r:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the old holder's lost signal fires");

    c.servers[1].pause();
    let port1 = c.servers[1].port();
    let port2 = c.servers[2].port();
    let err = admin
        .force_release("ops-a", LockKind::Mutex)
        .await
        .expect_err("one node of three is no majority");
    let msg = err.to_string();
    assert!(err.is_connection(), "{msg}");
    assert!(
        msg.contains("1 of 3")
            && msg.contains(&port1.to_string())
            && msg.contains(&port2.to_string()),
        "{msg}"
    );
    c.servers[1].resume();
    c.servers[2].resume();
    // Not a lock kind Redlock has.
    let err = admin
        .force_release("ops-a", LockKind::Write)
        .await
        .expect_err("rw is unsupported");
    assert!(err.to_string().contains("write"), "{err}");
}

/// doctor on a healthy cluster: node count, each node's Redis checks and quarantine, and the
/// clock spread are reported, none unsafe; then one node with an evicting policy is unsafe
/// (named by its endpoint), a flushed node initialised again shows its quarantine, and a node
/// that does not answer is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_each_node() {
    let (mut c, client) = cluster_and_client(2000).await;
    let eps: Vec<String> = c
        .servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let fs = client.diagnose().await.expect("diagnose");
    let find = |fs: &[distlock_core::Finding], check: &str| {
        fs.iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no `{check}` finding in {fs:#?}"))
            .clone()
    };
    assert_eq!(find(&fs, "nodes").severity, Severity::Ok);
    assert_eq!(find(&fs, "clock spread").severity, Severity::Ok, "{fs:#?}");
    for ep in &eps {
        assert_eq!(
            find(&fs, &format!("{ep} maxmemory-policy")).severity,
            Severity::Ok
        );
        assert_eq!(
            find(&fs, &format!("{ep} quarantine")).severity,
            Severity::Ok
        );
        // The testkit's servers run without persistence.
        assert_eq!(
            find(&fs, &format!("{ep} persistence")).severity,
            Severity::Warning
        );
    }
    assert!(fs.iter().all(|f| f.severity != Severity::Unsafe), "{fs:#?}");

    c.servers[1]
        .command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .expect("CONFIG SET");
    let fs = client.diagnose().await.expect("diagnose");
    let f = find(&fs, &format!("{} maxmemory-policy", eps[1]));
    assert_eq!(f.severity, Severity::Unsafe, "{f:?}");
    assert!(f.message.contains("noeviction"), "{f:?}");

    // Node 0 loses its data; the client initialises it again with a quarantine stored on the node.
    let (seeder, sb) = c
        .client_and_backend("check_interval=100ms&quarantine=20s", opts(2000))
        .await;
    c.servers[0].command(&["FLUSHALL"]).expect("FLUSHALL");
    let t = Instant::now();
    loop {
        let fs = seeder.diagnose().await.expect("diagnose");
        let f = find(&fs, &format!("{} quarantine", eps[0]));
        if f.severity == Severity::Warning && f.message.contains("restart quarantine") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "node 0's quarantine never reported: {f:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(sb);

    c.servers[2].pause();
    let fs = client.diagnose().await.expect("diagnose");
    let f = find(&fs, &format!("{} reachable", eps[2]));
    assert_eq!(f.severity, Severity::Warning, "{f:?}");
    c.servers[2].resume();
}
