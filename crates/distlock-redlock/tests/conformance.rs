//! The shared conformance suite on a 3-node and on a 5-node Redlock of real redis-servers,
//! with a restart quarantine of 500 ms (so every client waits once for the servers to be a
//! second old).

mod common;

use common::Cluster;
use distlock_redlock::RedlockBackend;
use distlock_testkit::conformance::ServerHarness;
use std::time::Duration;

fn redlock(n: usize) -> ServerHarness<Cluster> {
    let url = |c: &Cluster| c.url("quarantine=500ms");
    ServerHarness::new(Cluster::start(n), url, |url, o| async move {
        RedlockBackend::connect(&url, &o).await
    })
    .before_client(|c| async move { c.settle().await })
    // A proxy in front of every node: the control faults all of them at once.
    .proxy(|c| c.servers.iter().map(|s| s.addr()).collect())
    // Every node crashes without persistence, as far as the data goes.
    .lose_data(|c| async move {
        for s in &c.servers {
            assert_eq!(s.command(&["FLUSHALL"]).expect("FLUSHALL"), "OK");
        }
    })
    .break_lock(move |c, name| async move {
        let all: Vec<usize> = (0..n).collect();
        c.wait_held_on(&all, &name, Duration::from_secs(5)).await;
        assert_eq!(c.break_lock(&name), n, "not held on every node");
    })
}

mod three_nodes {
    distlock_testkit::conformance_suite!(super::redlock(3));
    distlock_testkit::adversarial_suite!(super::redlock(3));
    distlock_testkit::late_request_suite!(super::redlock(3));
    distlock_testkit::election_suite!(crate::redlock(3));
}

mod five_nodes {
    distlock_testkit::conformance_suite!(super::redlock(5));
    distlock_testkit::adversarial_suite!(super::redlock(5));
    distlock_testkit::election_suite!(crate::redlock(5));
}
