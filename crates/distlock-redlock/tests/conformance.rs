//! The shared conformance suite on a 3-node and on a 5-node Redlock of real redis-servers.

mod common;

use common::Cluster;
use distlock_core::{Client, ClientOptions};
use distlock_redlock::RedlockBackend;
use distlock_testkit::conformance::{Caps, Harness};
use distlock_testkit::ProxyControl;
use std::sync::Arc;
use std::time::Duration;

/// Redlock over `N` fresh redis-servers (a restart quarantine of 500 ms, so the harness
/// waits once for the servers to be a second old).
struct Redlock<const N: usize> {
    cluster: Cluster,
}

impl<const N: usize> Redlock<N> {
    fn start() -> Self {
        Redlock {
            cluster: Cluster::start(N),
        }
    }
}

#[async_trait::async_trait]
impl<const N: usize> Harness for Redlock<N> {
    async fn client(&self, opts: ClientOptions) -> Client {
        self.cluster.settle().await;
        self.cluster.client("quarantine=500ms", opts).await
    }

    fn caps(&self) -> Caps {
        Caps {
            lease_expiry: true,
            break_lock: true,
        }
    }

    /// A proxy in front of every node (the control faults all of them at once; one node's
    /// proxy is `proxies()[i]`).
    async fn proxied_client(&self, opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        self.cluster.settle().await;
        let addrs: Vec<_> = self.cluster.servers.iter().map(|s| s.addr()).collect();
        let proxy = ProxyControl::start(&addrs).expect("proxies");
        let url = format!("redlock://{}?quarantine=500ms", proxy.hosts());
        let backend = RedlockBackend::connect(&url, &opts)
            .await
            .expect("connect through the proxies");
        Some((Client::new(Arc::new(backend), opts).expect("client"), proxy))
    }

    /// Every node crashes without persistence, as far as the data goes.
    async fn lose_data(&self) -> bool {
        for s in &self.cluster.servers {
            assert_eq!(s.command(&["FLUSHALL"]).expect("FLUSHALL"), "OK");
        }
        true
    }

    async fn break_lock(&self, name: &str) {
        let all: Vec<usize> = (0..N).collect();
        self.cluster
            .wait_held_on(&all, name, Duration::from_secs(5))
            .await;
        assert_eq!(self.cluster.break_lock(name), N, "not held on every node");
    }
}

mod three_nodes {
    use super::*;
    distlock_testkit::conformance_suite!(Redlock::<3>::start());
    distlock_testkit::adversarial_suite!(Redlock::<3>::start());
}

mod five_nodes {
    use super::*;
    distlock_testkit::conformance_suite!(Redlock::<5>::start());
    distlock_testkit::adversarial_suite!(Redlock::<5>::start());
}
