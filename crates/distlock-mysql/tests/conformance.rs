//! The shared conformance suite on a real MariaDB server, session mode (`GET_LOCK`).

mod support;

use distlock_testkit::conformance::{Caps, Harness};
use distlock_testkit::ProxyControl;
use support::My;

#[async_trait::async_trait]
impl Harness for My {
    async fn client(&self, opts: distlock_core::ClientOptions) -> distlock_core::Client {
        self.client_with(opts).await
    }

    /// A proxy in front of the server: the URL with the proxy's port.
    async fn proxied_client(
        &self,
        opts: distlock_core::ClientOptions,
    ) -> Option<(distlock_core::Client, ProxyControl)> {
        let proxy = ProxyControl::start(&[self.server.addr()]).expect("proxy");
        let url = self
            .url()
            .replace(&format!("127.0.0.1:{}", self.server.port()), &proxy.hosts());
        let backend = distlock_mysql::MysqlBackend::connect(&url, &opts)
            .await
            .expect("connect through the proxy");
        let client =
            distlock_core::Client::new(std::sync::Arc::new(backend), opts).expect("client");
        Some((client, proxy))
    }

    fn caps(&self) -> Caps {
        Caps {
            // The lease is the holder connection's `wait_timeout` (whole seconds, rounded
            // up): the server disconnects a holder that stops renewing, freeing the lock.
            lease_expiry: true,
            break_lock: true,
        }
    }

    /// Kills the holder's connection, as an operator (or a failover) would: the server frees
    /// the lock, and the holder's next renewal finds its connection gone.
    async fn break_lock(&self, name: &str) {
        let key = distlock_mysql::lock_key("dlock", name);
        let id = self
            .server
            .sql(&format!("SELECT IS_USED_LOCK('{key}')"))
            .expect("IS_USED_LOCK");
        assert_ne!(id, "NULL", "nobody holds {name}");
        self.server.sql(&format!("KILL {id}")).expect("KILL");
    }
}

distlock_testkit::conformance_suite!(My::session());
distlock_testkit::adversarial_suite!(My::session());
