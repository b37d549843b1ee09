//! The shared conformance suite on a real MariaDB server, session mode (`GET_LOCK`).

mod support;

use dlock_testkit::conformance::{Caps, Harness};
use support::My;

#[async_trait::async_trait]
impl Harness for My {
    async fn client(&self, opts: dlock_core::ClientOptions) -> dlock_core::Client {
        self.client_with(opts).await
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
        let key = dlock_mysql::lock_key("dlock", name);
        let id = self
            .server
            .sql(&format!("SELECT IS_USED_LOCK('{key}')"))
            .expect("IS_USED_LOCK");
        assert_ne!(id, "NULL", "nobody holds {name}");
        self.server.sql(&format!("KILL {id}")).expect("KILL");
    }
}

dlock_testkit::conformance_suite!(My::session());
