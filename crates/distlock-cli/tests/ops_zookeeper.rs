//! The operator commands against a real ZooKeeper ensemble (needs `--features zookeeper`):
//! `list --json` shows a held lock and its queued waiter, `release --force --yes` removes the
//! holder (its lost signal fires, the waiter gets a higher token, the old holder's fenced write
//! is rejected), and `doctor` passes the test ensemble.
#![cfg(feature = "zookeeper")]

mod ops_common;
use distlock_testkit::ZkEnsemble;
use ops_common::*;
use std::time::Duration;

fn unique(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("ops-zk-{case}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_list_and_force_release() {
    let url = ZkEnsemble::shared().url();
    let name = unique("stuck");
    let (_old, guard) = hold(&url, &name, Duration::from_secs(1)).await;
    let next = client(&url, Duration::from_secs(5)).await;
    // The waiter is listed once its node is in the queue.
    let waiter = spawn_waiter(&next, &name);
    let listed = listed_with_waiter(&url, &name).await;
    assert_eq!(listed["kind"], "mutex", "{listed}");
    assert_eq!(listed["holders"][0]["owner"], guard.owner(), "{listed}");
    assert_eq!(listed["fencing_token"], guard.fencing_token(), "{listed}");

    let next = waited(waiter, Duration::from_secs(30));
    force_release_fences(&url, &name, &guard, Duration::from_secs(10), next).await;
}

#[test]
fn zookeeper_doctor_passes_the_test_ensemble() {
    let url = ZkEnsemble::shared().url();
    doctor_passes(&url, &["session-timeout", "leader", "ensemble", "clock"]);
}
