//! `DLOCK_REDIS_SERVER` overrides the binary. Kept in its own test binary
//! (a single test) because it mutates the process environment.

use distlock_testkit::{Error, RedisServer, REDIS_SERVER_ENV};

#[test]
fn env_var_overrides_binary() {
    std::env::set_var(REDIS_SERVER_ENV, "/nonexistent/distlock-redis-server");
    let err = RedisServer::start().expect_err("must fail");
    std::env::remove_var(REDIS_SERVER_ENV);
    match err {
        Error::BinaryMissing { binary, package } => {
            assert_eq!(binary, "/nonexistent/distlock-redis-server");
            assert_eq!(package, "redis-server");
        }
        other => panic!("unexpected error: {other:?}"),
    }
    // Back to the default binary.
    let s = RedisServer::start().expect("start");
    assert_eq!(s.command(&["PING"]).expect("ping"), "PONG");
}
