//! The operator commands against a real 3-member etcd cluster, as real `dlock` processes,
//! with the holder and a waiter in other clients (needs `--features etcd`).
#![cfg(feature = "etcd")]

mod ops_common;
use distlock_testkit::EtcdCluster;
use ops_common::*;
use std::time::Duration;

/// `list --json` shows the holder (owner, token) and the queued waiter; `release --force
/// --yes` removes the holder: its lost signal fires, the waiter gets the lock with a higher
/// token and the old holder's write is rejected by a fenced register; `doctor` passes the
/// healthy cluster (exit 0, one line per check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_list_force_release_and_doctor() {
    let cluster = EtcdCluster::start().expect("cluster");
    let url = cluster.url();
    let (_old, guard) = hold(&url, "ops-etcd", Duration::from_secs(2)).await;
    let next = client(&url, Duration::from_secs(5)).await;
    let waiter = spawn_waiter(&next, "ops-etcd");
    let l = listed_with_waiter(&url, "ops-etcd").await;
    assert_eq!(l["kind"], "mutex", "{l}");
    assert_eq!(l["holders"][0]["owner"], guard.owner(), "{l}");
    assert_eq!(l["fencing_token"], guard.fencing_token(), "{l}");

    let next = waited(waiter, Duration::from_secs(15));
    force_release_fences(&url, "ops-etcd", &guard, Duration::from_secs(10), next).await;

    let checks = [
        "members",
        "version",
        "leader",
        "raft-index",
        "lease",
        "clock",
    ];
    doctor_passes(&url, &checks);
    drop(guard);
}
