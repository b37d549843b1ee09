//! The shared conformance suite on a real redis-server.

use distlock_core::{Client, ClientOptions};
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{Caps, Harness};
use distlock_testkit::{ProxyControl, RedisServer};
use std::sync::Arc;

struct Redis {
    server: RedisServer,
}

impl Redis {
    fn start() -> Self {
        Redis {
            server: RedisServer::start().expect("start redis-server"),
        }
    }
}

#[async_trait::async_trait]
impl Harness for Redis {
    async fn client(&self, opts: ClientOptions) -> Client {
        let backend = RedisBackend::connect(&self.server.url(), &opts)
            .await
            .expect("connect");
        Client::new(Arc::new(backend), opts).expect("client")
    }

    fn caps(&self) -> Caps {
        Caps {
            lease_expiry: true,
            break_lock: true,
        }
    }

    async fn proxied_client(&self, opts: ClientOptions) -> Option<(Client, ProxyControl)> {
        let proxy = ProxyControl::start(&[self.server.addr()]).expect("proxy");
        let backend = RedisBackend::connect(&format!("redis://{}", proxy.hosts()), &opts)
            .await
            .expect("connect through the proxy");
        Some((Client::new(Arc::new(backend), opts).expect("client"), proxy))
    }

    /// A crash without persistence, as far as the data goes.
    async fn lose_data(&self) -> bool {
        assert_eq!(self.server.command(&["FLUSHALL"]).expect("FLUSHALL"), "OK");
        true
    }

    async fn break_lock(&self, name: &str) {
        let reply = self
            .server
            .command(&["DEL", &format!("dlock:{{{name}}}")])
            .expect("DEL");
        assert_eq!(reply, "1", "nothing to delete");
    }
}

distlock_testkit::conformance_suite!(Redis::start());
distlock_testkit::adversarial_suite!(Redis::start());
