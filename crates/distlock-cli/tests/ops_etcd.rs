//! The operator commands against a real 3-member etcd cluster, as real `dlock` processes,
//! with the holder and a waiter in other clients (needs `--features etcd`).
#![cfg(feature = "etcd")]

mod ops_common;
use distlock_testkit::{EtcdCluster, FencedRegister};
use ops_common::*;
use std::time::{Duration, Instant};

/// `list --json` shows the holder (owner, token) and the queued waiter; `release --force
/// --yes` removes the holder: its lost signal fires, the waiter gets the lock with a higher
/// token and the old holder's write is rejected by a fenced register; `doctor` passes the
/// healthy cluster (exit 0, one line per check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_list_force_release_and_doctor() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let old = client(&url, Duration::from_secs(2)).await;
    let next = client(&url, Duration::from_secs(5)).await;
    let guard = old
        .lock("ops-etcd")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let register = FencedRegister::new();
    assert!(register.write(guard.fencing_token(), "old", true));
    let waiter = {
        let lock = next.lock("ops-etcd").expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    let t = Instant::now();
    let locks = loop {
        let locks = list_json(&url, "ops-");
        if locks.iter().any(|l| l["waiters"] == 1) {
            break locks;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no waiter: {locks:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let l = locks
        .iter()
        .find(|l| l["name"] == "ops-etcd" && l["kind"] == "mutex")
        .expect("listed");
    assert_eq!(l["holders"][0]["owner"], guard.owner(), "{l}");
    assert_eq!(l["fencing_token"], guard.fencing_token(), "{l}");

    let out = dlock(&url, &["release", "--force", "ops-etcd", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).contains(guard.owner()), "{out:?}");
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the old holder's lost signal fires");
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

    let out = dlock(&url, &["doctor"]);
    let report = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{report}");
    for check in [
        "members",
        "version",
        "leader",
        "raft-index",
        "lease",
        "clock",
    ] {
        let line = report
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&format!("{check}:")))
            .unwrap_or_else(|| panic!("no `{check}` line in {report}"));
        assert!(line.starts_with("OK"), "{check}: {report}");
    }
    drop(guard);
}
