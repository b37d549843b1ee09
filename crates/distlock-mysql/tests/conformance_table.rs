//! The shared conformance suite on a real MariaDB server, table mode (`?mode=table`).

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
            lease_expiry: true,
            break_lock: true,
        }
    }

    /// Frees the lock row behind the holder's back, as an operator would.
    async fn break_lock(&self, name: &str) {
        let key = distlock_mysql::lock_key("dlock", name);
        let n = self
            .server
            .sql(&format!(
                "UPDATE dlock.dlock_table_locks SET owner = NULL, count = 0, \
                 expires_at = '1970-01-02 00:00:00' WHERE lock_key = '{key}' AND owner IS NOT NULL; \
                 SELECT ROW_COUNT()"
            ))
            .expect("free the lock row");
        assert_eq!(n, "1", "nothing to break");
    }
}

distlock_testkit::conformance_suite!(My::table());
distlock_testkit::adversarial_suite!(My::table());
