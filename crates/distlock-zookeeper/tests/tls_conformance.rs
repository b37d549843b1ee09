//! A subset of the shared conformance suite over TLS: one ZooKeeper node serving `zks://` on
//! its `secureClientPort` with `ssl.clientAuth=need`, reached with
//! `zks://…?cacert=&cert=&key=` (and through a proxy, which passes the TLS bytes through, for
//! the cases that need one).

use distlock_core::LockKind;
use distlock_testkit::{conformance::ServerHarness, ZkEnsemble};
use distlock_zookeeper::ZkBackend;
use std::net::{Ipv4Addr, SocketAddr};
use zookeeper_client as zk;

fn zk_tls() -> ServerHarness<ZkEnsemble> {
    let ensemble = ZkEnsemble::start_tls(1, true).expect("start a ZooKeeper node with TLS");
    let url = |e: &ZkEnsemble| e.tls_url().expect("a TLS ensemble");
    ServerHarness::new(ensemble, url, |url, o| async move {
        ZkBackend::connect(&url, &o).await
    })
    .no_lease_expiry()
    .proxy(|e| {
        let port = e.secure_port(0).expect("a TLS port");
        vec![SocketAddr::from((Ipv4Addr::LOCALHOST, port))]
    })
    // An operator deleting the lock nodes, over the node's plain client port.
    .break_lock(|e, name| async move {
        let zk = zk::Client::connect(&e.connect_string())
            .await
            .expect("operator session");
        let dir = distlock_zookeeper::lock_dir("dlock", &name, LockKind::Mutex).expect("dir");
        let children = zk.list_children(&dir).await.expect("list");
        for c in children.iter().filter(|c| c.starts_with("_c_")) {
            zk.delete(&format!("{dir}/{c}"), None)
                .await
                .expect("delete");
        }
    })
}

distlock_testkit::conformance_suite!(@cases zk_tls();
    mutual_exclusion, waiter_woken_by_release, fencing_tokens_increase, drop_releases,
    watchdog_renews, lost_when_broken, cancelled_acquire_leaves_nothing,
    rw_readers_share_writer_excludes, invalid_input);
