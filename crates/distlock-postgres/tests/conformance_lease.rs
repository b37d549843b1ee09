//! The shared conformance suite on a real PostgreSQL server, lease mode (`?mode=lease`).

mod support;

use distlock_testkit::conformance::{Caps, Harness};
use distlock_testkit::ProxyControl;
use support::Pg;

#[async_trait::async_trait]
impl Harness for Pg {
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
        let backend = distlock_postgres::PostgresBackend::connect(&url, &opts)
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

    /// Frees the lock's row behind the holder's back, as an operator would.
    async fn break_lock(&self, name: &str) {
        let n = self
            .server
            .sql(&format!(
                "WITH u AS (UPDATE dlock_leases SET owner = NULL, attempt = NULL, expires_at = 'epoch' \
                 WHERE name = '{}' AND owner IS NOT NULL RETURNING 1) SELECT count(*) FROM u",
                name.replace('\'', "''")
            ))
            .expect("free the lease row");
        assert_eq!(n, "1", "nothing to break");
    }
}

distlock_testkit::conformance_suite!(Pg::lease());
distlock_testkit::adversarial_suite!(Pg::lease());
