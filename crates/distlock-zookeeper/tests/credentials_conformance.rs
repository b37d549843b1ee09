//! A subset of the shared conformance suite with digest credentials: one ZooKeeper node whose
//! chroot only the digest user `shop` may enter, reached with
//! `zk://shop:PASSWORD@…/secure?acl=creator` (and through a proxy for the cases that need one).

use distlock_core::LockKind;
use distlock_testkit::{conformance::ServerHarness, ZkEnsemble};
use distlock_zookeeper::ZkBackend;

const PASSWORD: &str = "hunter2-s3cret";

fn zk_digest() -> ServerHarness<ZkEnsemble> {
    let ensemble = ZkEnsemble::start_with(1).expect("start a ZooKeeper node");
    let url = |e: &ZkEnsemble| {
        format!(
            "zk://shop:{PASSWORD}@{}/secure?acl=creator",
            e.connect_string()
        )
    };
    ServerHarness::new(ensemble, url, |url, o| async move {
        // Opening an authenticated session right after `protect` took over 2 s once on a
        // loaded CI machine: the connect gets longer than the cases' fast options give.
        let o = o.connect_timeout(std::time::Duration::from_secs(10));
        ZkBackend::builder(url)
            .options(o)
            .ignore_env()
            .connect()
            .await
    })
    .no_lease_expiry()
    .before_client(|e| async move {
        e.protect("/secure", "shop", PASSWORD)
            .await
            .expect("protect");
    })
    .proxy(|e| vec![e.addr(0)])
    // An operator deleting the lock nodes: it must authenticate as the owner.
    .break_lock(|e, name| async move {
        let zk = e
            .client(0, Some(("shop", PASSWORD)))
            .await
            .expect("operator");
        let dir = format!(
            "/secure{}",
            distlock_zookeeper::lock_dir("dlock", &name, LockKind::Mutex).expect("dir")
        );
        let children = zk.list_children(&dir).await.expect("list");
        for c in children.iter().filter(|c| c.starts_with("_c_")) {
            zk.delete(&format!("{dir}/{c}"), None)
                .await
                .expect("delete");
        }
    })
}

distlock_testkit::conformance_suite!(@cases zk_digest();
    mutual_exclusion, waiter_woken_by_release, fencing_tokens_increase, drop_releases,
    watchdog_renews, lost_when_broken, cancelled_acquire_leaves_nothing,
    rw_readers_share_writer_excludes, invalid_input);
