//! The shared conformance suite on a real three-node ZooKeeper ensemble.
//!
//! One ensemble per test binary (per test process under nextest); every case uses its own
//! lock names. Locks live as long as their ZooKeeper session, so the cases about fixed leases
//! ending on the server are skipped (`lease_expiry: false`): see `docs/zookeeper.md`.

use distlock_core::{Client, ClientOptions, LockKind};
use distlock_testkit::conformance::{Caps, Harness};
use distlock_testkit::{ProxyControl, ZkEnsemble};
use distlock_zookeeper::ZkBackend;
use std::sync::Arc;
use zookeeper_client as zk;

struct Zk {
    ensemble: &'static ZkEnsemble,
}

impl Zk {
    fn start() -> Self {
        let t = std::time::Instant::now();
        let ensemble = ZkEnsemble::shared();
        eprintln!("ensemble ready after {:?}", t.elapsed());
        Zk { ensemble }
    }
}

#[async_trait::async_trait]
impl Harness for Zk {
    async fn client(&self, opts: ClientOptions) -> Client {
        let backend = ZkBackend::connect(&self.ensemble.url(), &opts)
            .await
            .expect("connect");
        Client::new(Arc::new(backend), opts).expect("client")
    }

    fn caps(&self) -> Caps {
        Caps {
            // A lock lasts as long as its holder's session, not a lease.
            lease_expiry: false,
            break_lock: true,
        }
    }

    /// A proxy in front of every node.
    async fn proxied_client(&self, opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        // One member behind one proxy: the client balances requests over the members it is
        // given, so a fault on one of several proxies might see no traffic at all. The
        // cluster behind it is still the real one.
        let proxy = ProxyControl::start(&[self.ensemble.addr(0)]).expect("proxy");
        let backend = ZkBackend::connect(&format!("zk://{}", proxy.hosts()), &opts)
            .await
            .expect("connect through the proxies");
        Some((Client::new(Arc::new(backend), opts).expect("client"), proxy))
    }

    /// Deletes every lock node of the mutex `name`, as an operator with `zkCli.sh` might.
    async fn break_lock(&self, name: &str) {
        let zk = zk::Client::connect(&self.ensemble.connect_string())
            .await
            .expect("operator session");
        let dir = distlock_zookeeper::lock_dir("dlock", name, LockKind::Mutex).expect("dir");
        let children = zk.list_children(&dir).await.expect("list");
        let nodes: Vec<&String> = children.iter().filter(|c| c.starts_with("_c_")).collect();
        assert!(!nodes.is_empty(), "nothing to delete in {dir}");
        for c in nodes {
            zk.delete(&format!("{dir}/{c}"), None)
                .await
                .expect("delete");
        }
    }
}

distlock_testkit::conformance_suite!(Zk::start());
distlock_testkit::adversarial_suite!(Zk::start());
