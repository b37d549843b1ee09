//! The shared conformance suite on a real 3-member etcd cluster.

use distlock_core::{Client, ClientOptions};
use distlock_etcd::EtcdBackend;
use distlock_testkit::conformance::{Caps, Harness};
use distlock_testkit::{EtcdCluster, ProxyControl};
use etcd_client::DeleteOptions;
use std::sync::Arc;

struct Etcd {
    cluster: EtcdCluster,
}

impl Etcd {
    fn start() -> Self {
        Etcd {
            cluster: EtcdCluster::start().expect("start a 3-member etcd cluster"),
        }
    }
}

#[async_trait::async_trait]
impl Harness for Etcd {
    async fn client(&self, opts: ClientOptions) -> Client {
        let backend = EtcdBackend::connect(&self.cluster.url(), &opts)
            .await
            .expect("connect");
        Client::new(Arc::new(backend), opts).expect("client")
    }

    fn caps(&self) -> Caps {
        Caps {
            lease_expiry: true,
            break_lock: true,
        }
    }

    /// A proxy in front of every member.
    async fn proxied_client(&self, opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        // One member behind one proxy: the client balances requests over the members it is
        // given, so a fault on one of several proxies might see no traffic at all. The
        // cluster behind it is still the real one.
        let proxy = ProxyControl::start(&[self.cluster.client_addr(0)]).expect("proxy");
        let backend = EtcdBackend::connect(&format!("etcd://{}", proxy.hosts()), &opts)
            .await
            .expect("connect through the proxies");
        Some((Client::new(Arc::new(backend), opts).expect("client"), proxy))
    }

    async fn break_lock(&self, name: &str) {
        let opts = ClientOptions::default();
        let b = EtcdBackend::connect(&self.cluster.url(), &opts)
            .await
            .expect("connect");
        let mut kv = b.etcd_client().kv_client();
        let r = kv
            .delete(
                b.queue_prefix(name),
                Some(DeleteOptions::new().with_prefix()),
            )
            .await
            .expect("delete");
        assert!(r.deleted() >= 1, "nothing to delete");
    }
}

distlock_testkit::conformance_suite!(Etcd::start());
distlock_testkit::adversarial_suite!(Etcd::start());
