//! Test support for dlock: starts **real** servers for tests (never mocks).
//!
//! Every server runs on a free loopback port (`127.0.0.1` only), in its own
//! temporary directory, and is killed (and its directory removed) when the
//! handle is dropped. Child processes are additionally spawned with
//! `PR_SET_PDEATHSIG = SIGKILL` (on Linux), so they die together with the
//! test binary even if it aborts without unwinding.
//!
//! The API is synchronous and std-only: every call is short and blocking
//! (a few hundred milliseconds at most in the normal case), so it can be
//! used from plain `#[test]` functions and from async tests alike.
//!
//! Main entry points:
//! - [`RedisServer`]: a real `redis-server` (Debian package `redis-server`).
//! - [`RedisCluster`]: a real Redis Cluster (3 masters, 3 replicas by default).
//! - [`DelayProxy`]: a TCP proxy that delays, blackholes or resets traffic
//!   (each direction on its own), for "slow link", "late reply" and "lost
//!   reply" fault tests; [`ProxyControl`] drives several at once.
//! - [`FencedRegister`] and [`OverlapRecorder`]: the invariant checkers of the
//!   contended conformance cases (a store that rejects stale fencing tokens;
//!   a recorder of critical sections that finds two believed holders inside
//!   at once).
//! - [`ServerProcess`]: the lifecycle every starter shares (spawn in a temp dir on a free
//!   loopback port, readiness probe, kill, pause, resume, restart on the same port and
//!   directory, log capture, kill on drop), for starting other servers the same way.
//! - [`free_port`] and [`TempDir`]: small building blocks.
//! - [`memory`]: an in-memory reference backend, the conformance suite's executable
//!   specification and the template a new backend copies.
//!
//! ```
//! use std::time::Duration;
//! use distlock_testkit::{DelayProxy, RedisServer};
//!
//! let mut redis = RedisServer::start()?;
//! assert_eq!(redis.command(&["SET", "k", "v"])?, "OK");
//! assert_eq!(redis.command(&["GET", "k"])?, "v");
//!
//! // A node behind a slow link:
//! let slow = DelayProxy::start(redis.addr(), Duration::from_millis(20))?;
//! let _url = format!("redis://{}", slow.addr());
//!
//! // A crash without persistence: same port, empty data.
//! redis.restart()?;
//! assert_eq!(redis.command(&["GET", "k"])?, "(nil)");
//! # Ok::<(), distlock_testkit::Error>(())
//! ```
//!
//! The `redis-server` binary can be overridden with the
//! `DLOCK_REDIS_SERVER` environment variable ([`REDIS_SERVER_ENV`]) or
//! per call with [`RedisServer::start_with_binary`].

#![deny(missing_docs)]

pub mod conformance;
mod error;
mod etcd;
mod fenced;
pub mod grant;
pub mod http;
mod mariadb;
pub mod memory;
mod postgres;
mod process;
pub mod prom;
mod redis;
mod redis_cluster;
mod resp;
mod sentinel;
mod spawn;
pub mod sql_faults;
mod template;
mod tls;
pub mod tls_cases;
mod zookeeper;

pub use error::{Error, Result};
pub use etcd::{EtcdCluster, EtcdStatus, ETCD_BINARY_ENV};
pub use fenced::{FencedRegister, FencedWrite, Interval, OverlapRecorder, Visit};
pub use mariadb::{MariaDbServer, MARIADB_SERVER_ENV};
pub use postgres::{PostgresServer, POSTGRES_BIN_DIR_ENV};
pub use process::{Ready, ReadyCheck, ServerProcess, ServerSpec};
// The proxy lives in crate distlock-proxy so that `dlock torture` can ship it; re-exported here
// for the tests that always took it from the testkit.
pub use distlock_proxy::{DelayProxy, DirectionStats, ProxyControl, ProxyStats};
pub use redis::{RedisOptions, RedisServer, REDIS_SERVER_ENV};
pub use redis_cluster::{ClusterNode, ClusterRole, RedisCluster, CLUSTER_NODE_TIMEOUT_MS};
pub use resp::Reply;
pub use sentinel::{SentinelOptions, SentinelSetup, SENTINEL_MASTER};
/// A self-deleting temporary directory: [`tempfile::TempDir`] (`TempDir::new()`,
/// `TempDir::with_prefix(p)`, `.path()`), removed recursively on drop.
pub use tempfile::TempDir;
pub use tls::TestCerts;
pub use zookeeper::{
    ZkEnsemble, ZOOKEEPER_CLASSPATH_ENV, ZOOKEEPER_JAR, ZOOKEEPER_JAVA_ENV, ZOOKEEPER_TICK_MS,
};

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

/// Returns a currently free TCP port on `127.0.0.1`.
///
/// The port is found by binding `127.0.0.1:0`, reading the port the kernel
/// assigned and closing the socket again. Another process may grab the port
/// before it is used; the server starters in this crate retry on such races.
///
/// # Panics
///
/// Panics (with a descriptive message) if no loopback socket can be bound at
/// all, which means the test environment is unusable. Use [`try_free_port`]
/// to get an error instead.
pub fn free_port() -> u16 {
    match try_free_port() {
        Ok(port) => port,
        Err(e) => panic!("distlock-testkit: cannot bind a TCP socket on 127.0.0.1: {e}"),
    }
}

/// Fallible variant of [`free_port`].
pub fn try_free_port() -> Result<u16> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    Ok(listener.local_addr()?.port())
}

/// Set by `scripts/test` (the CI command): a test that needs an optional tool (etcdctl, the
/// Curator jars, a JDK) fails instead of skipping when the tool is missing.
pub const STRICT_ENV: &str = "DLOCK_TEST_STRICT";

/// Reports that a test cannot run here: prints `SKIPPED: …` on a developer's machine, and
/// panics with the same message when [`STRICT_ENV`] is set (CI installs every tool, so a
/// missing one there is a broken setup, not a reason to pass without checking anything).
pub fn skip_or_fail(test: &str, why: &str) {
    if std::env::var_os(STRICT_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("{test} cannot run: {why} ({STRICT_ENV} is set, so this fails instead of skipping)");
    }
    eprintln!("SKIPPED {test}: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_is_bindable() {
        let port = free_port();
        assert_ne!(port, 0);
        let l = TcpListener::bind(("127.0.0.1", port)).expect("port should be free");
        drop(l);
    }
}
