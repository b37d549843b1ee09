//! The shared conformance suite on a real 3-member etcd cluster.

use distlock_core::ClientOptions;
use distlock_etcd::EtcdBackend;
use distlock_testkit::{conformance::ServerHarness, EtcdCluster};
use etcd_client::DeleteOptions;

fn etcd() -> ServerHarness<EtcdCluster> {
    let cluster = EtcdCluster::start().expect("start a 3-member etcd cluster");
    ServerHarness::new(cluster, EtcdCluster::url, |url, o| async move {
        EtcdBackend::connect(&url, &o).await
    })
    // One member behind the proxy: the client balances requests over the members it is
    // given, so a fault on one of several proxies might see no traffic at all.
    .proxy(|c| vec![c.client_addr(0)])
    .break_lock(|c, name| async move {
        let opts = ClientOptions::default();
        let b = EtcdBackend::connect(&c.url(), &opts)
            .await
            .expect("connect");
        let all = Some(DeleteOptions::new().with_prefix());
        let r = b
            .etcd_client()
            .kv_client()
            .delete(b.queue_prefix(&name), all)
            .await;
        assert!(r.expect("delete").deleted() >= 1, "nothing to delete");
    })
}

distlock_testkit::conformance_suite!(etcd());
distlock_testkit::adversarial_suite!(etcd());
