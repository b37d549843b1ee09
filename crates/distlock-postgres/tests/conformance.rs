//! The shared conformance suite on a real PostgreSQL server, session mode (advisory locks).

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
            // The lease is the holder session's `idle_session_timeout`: the server ends a
            // session that stops renewing, and with it the lock.
            lease_expiry: true,
            break_lock: true,
        }
    }

    /// Deletes the holder's row, as an operator revoking the lock would: the holder's next
    /// renewal finds it gone, reports the lock lost and gives the advisory lock up.
    /// (Killing the holder's session instead is tested in postgres_faults.rs: its lost
    /// signal fires at once, with `SessionEnded`.)
    async fn break_lock(&self, name: &str) {
        let n = self
            .server
            .sql(&format!(
                "WITH d AS (DELETE FROM dlock_holders WHERE name = '{}' RETURNING 1) SELECT count(*) FROM d",
                name.replace('\'', "''")
            ))
            .expect("delete holder row");
        assert_eq!(n, "1", "nothing to delete");
    }
}

distlock_testkit::conformance_suite!(Pg::session());
distlock_testkit::adversarial_suite!(Pg::session());
