//! The shared conformance suite over TLS: one etcd member serving only https with
//! `--client-cert-auth`, reached with `etcds://…?cacert=&cert=&key=` (and through a proxy,
//! which passes the TLS bytes through, for the cases that need one).

use distlock_core::ClientOptions;
use distlock_etcd::EtcdBackend;
use distlock_testkit::{conformance::ServerHarness, EtcdCluster};
use etcd_client::DeleteOptions;

fn etcd_tls() -> ServerHarness<EtcdCluster> {
    let cluster = EtcdCluster::start_tls(1, true).expect("start an etcd member with TLS");
    ServerHarness::new(cluster, EtcdCluster::url, |url, o| async move {
        EtcdBackend::connect(&url, &o).await
    })
    .proxy(|c| vec![c.client_addr(0)])
    .break_lock(|c, name| async move {
        let b = EtcdBackend::connect(&c.url(), &ClientOptions::default())
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

distlock_testkit::conformance_suite!(etcd_tls());
