//! The shared conformance suite on a real redis-server.

use distlock_redis::RedisBackend;
use distlock_testkit::{conformance::ServerHarness, RedisServer};

fn redis() -> ServerHarness<RedisServer> {
    let server = RedisServer::start().expect("start redis-server");
    ServerHarness::new(server, RedisServer::url, |url, o| async move {
        RedisBackend::connect(&url, &o).await
    })
    .proxy(|s| vec![s.addr()])
    // A crash without persistence, as far as the data goes.
    .lose_data(|s| async move { assert_eq!(s.command(&["FLUSHALL"]).expect("FLUSHALL"), "OK") })
    .break_lock(|s, name| async move {
        let reply = s.command(&["DEL", &format!("dlock:{{{name}}}")]);
        assert_eq!(reply.expect("DEL"), "1", "nothing to delete");
    })
}

distlock_testkit::conformance_suite!(redis());
distlock_testkit::adversarial_suite!(redis());
distlock_testkit::late_request_suite!(redis());
distlock_testkit::election_suite!(redis());
