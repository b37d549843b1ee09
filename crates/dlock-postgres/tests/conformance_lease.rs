//! The shared conformance suite on a real PostgreSQL server, lease mode (`?mode=lease`).

mod support;

use dlock_testkit::conformance::{Caps, Harness};
use support::Pg;

#[async_trait::async_trait]
impl Harness for Pg {
    async fn client(&self, opts: dlock_core::ClientOptions) -> dlock_core::Client {
        self.client_with(opts).await
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
                "WITH u AS (UPDATE dlock_leases SET owner = NULL, count = 0, expires_at = 'epoch' \
                 WHERE name = '{}' AND owner IS NOT NULL RETURNING 1) SELECT count(*) FROM u",
                name.replace('\'', "''")
            ))
            .expect("free the lease row");
        assert_eq!(n, "1", "nothing to break");
    }
}

dlock_testkit::conformance_suite!(Pg::lease());
