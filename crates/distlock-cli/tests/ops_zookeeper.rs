//! The operator commands against a real ZooKeeper ensemble (needs `--features zookeeper`):
//! `list --json` shows a held lock and its queued waiter, `release --force --yes` removes the
//! holder (its lost signal fires, the waiter gets a higher token, the old holder's fenced write
//! is rejected), and `doctor` passes the test ensemble.
#![cfg(feature = "zookeeper")]

mod ops_common;
use distlock_testkit::{FencedRegister, ZkEnsemble};
use ops_common::*;
use std::time::{Duration, Instant};

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
    let old = client(&url, Duration::from_secs(1)).await;
    let next = client(&url, Duration::from_secs(5)).await;
    let guard = old
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let register = FencedRegister::new();
    assert!(register.write(guard.fencing_token(), "old", true));
    let waiter = {
        let lock = next.lock(&name).expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
    };
    // The waiter is listed once its node is in the queue.
    let t = Instant::now();
    let listed = loop {
        let out = dlock(&url, &["list", "--json", "--prefix", &name]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let locks: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).expect("one JSON array");
        if let Some(l) = locks
            .iter()
            .find(|l| l["name"] == name.as_str() && l["waiters"] == 1)
        {
            break l.clone();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{locks:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(listed["kind"], "mutex", "{listed}");
    assert_eq!(listed["holders"][0]["owner"], guard.owner(), "{listed}");
    assert_eq!(listed["fencing_token"], guard.fencing_token(), "{listed}");

    let out = dlock(&url, &["release", "--force", &name, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).contains(guard.owner()), "{out:?}");
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the old holder's lost signal fires");
    let g2 = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("in time")
        .expect("join")
        .expect("the waiter stayed queued and acquires");
    assert!(g2.fencing_token() > guard.fencing_token());
    assert!(register.write(g2.fencing_token(), "next", true));
    assert!(
        !register.write(guard.fencing_token(), "old", !guard.is_lost()),
        "the old holder's write must be rejected"
    );
    register.assert_no_rejected_belief();
    g2.release().await.expect("release");
}

#[test]
fn zookeeper_doctor_passes_the_test_ensemble() {
    let url = ZkEnsemble::shared().url();
    let out = dlock(&url, &["doctor"]);
    let report = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{report}");
    for check in ["session-timeout", "leader", "ensemble", "clock"] {
        let line = report
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&format!("{check}:")))
            .unwrap_or_else(|| panic!("no `{check}` line in {report}"));
        assert!(line.starts_with("OK"), "{check}: {report}");
    }
}
