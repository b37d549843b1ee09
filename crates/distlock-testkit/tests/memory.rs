//! The whole conformance suite against the in-memory reference backend
//! ([`distlock_testkit::memory`]): what a new backend's conformance test looks like.
//! No network, so no proxied client: the proxy cases skip, saying so.

use distlock_testkit::conformance::ServerHarness;
use distlock_testkit::memory::MemoryServer;
use std::time::Duration;

/// A fresh server per case. A connect pauses as a connect to a server on the same host does:
/// `rw_readers_share_writer_excludes` needs its readers to ask before its writers (see
/// `distlock-file/tests/conformance.rs`).
fn memory() -> ServerHarness<MemoryServer> {
    let server = MemoryServer::new();
    let s = server.clone();
    ServerHarness::new(
        server,
        |_| "memory".to_owned(),
        move |_url, opts| {
            let connected = s.connect(&opts);
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                connected
            }
        },
    )
    .break_lock(|s, name| async move { s.break_lock(&name) })
    .lose_data(|s| async move { s.lose_data() })
}

distlock_testkit::conformance_suite!(memory());
distlock_testkit::adversarial_suite!(memory());
distlock_testkit::election_suite!(memory());
