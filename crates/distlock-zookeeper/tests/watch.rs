//! `Backend::watch` (not used by this backend's own waiting, which watches predecessors, but
//! part of the trait): every release after `watch` returned wakes the subscriber.

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, ClientOptions, HoldKey, LockKind, LostSignal, Wake,
};
use distlock_testkit::conformance::unique_name;
use distlock_testkit::ZkEnsemble;
use distlock_zookeeper::ZkBackend;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_wakes_on_every_release() {
    let url = ZkEnsemble::shared().url();
    let opts = ClientOptions::default();
    let holder = ZkBackend::connect(&url, &opts).await.expect("connect");
    let watcher = ZkBackend::connect(&url, &opts).await.expect("connect");
    let key = HoldKey {
        name: unique_name("watch").as_str().into(),
        owner: "holder".into(),
        kind: LockKind::Mutex,
    };
    let waiter = HoldKey {
        owner: "waiter".into(),
        ..key.clone()
    };
    let waiting = AcquireRequest::new(waiter, Duration::from_secs(5), LostSignal::new());
    let mut w = watcher.watch(&waiting).await.expect("watch");
    for _ in 0..3 {
        let req = AcquireRequest::new(key.clone(), Duration::from_secs(5), LostSignal::new());
        let token = match holder.acquire(&req).await.expect("acquire") {
            AcquireReply::Granted { token } => token,
            other => panic!("not granted: {other:?}"),
        };
        holder.release(&req.grant(token)).await.expect("release");
        // The acquire and the release each changed the queue: at least one wake-up, promptly.
        let wake = tokio::time::timeout(Duration::from_secs(5), w.changed())
            .await
            .expect("no wake-up after a release")
            .expect("watch broke");
        assert_eq!(wake, Wake::Released);
    }
}
