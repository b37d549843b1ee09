//! `rediss://` against a real redis-server serving TLS with a throwaway CA.
#![cfg(feature = "tls")]

mod common;

use common::{acquired, released};

use distlock_core::{Client, Error};
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::fast_opts;
use distlock_testkit::RedisServer;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_over_tls() {
    let server = RedisServer::start_tls().expect("redis with TLS");
    let url = server.tls_url().expect("tls url");
    let opts = fast_opts();
    let backend = RedisBackend::connect(&url, &opts)
        .await
        .expect("connect over TLS");
    let client = Client::new(Arc::new(backend), opts.clone()).expect("client");
    let other = Client::new(
        Arc::new(RedisBackend::connect(&url, &opts).await.expect("connect")),
        opts.clone(),
    )
    .expect("client");
    let g = acquired(&client, "tls").await;
    // A waiter over TLS is handed the lock through the TLS subscriber connection.
    let lock = other.lock("tls").expect("lock");
    let waiter = tokio::spawn(async move { lock.acquire().await });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    released(g).await;
    let g2 = waiter.await.expect("join").expect("handed over");
    assert!(g2.fencing_token() > 1);
    released(g2).await;
}

#[tokio::test]
async fn untrusted_certificate_is_refused() {
    let server = RedisServer::start_tls().expect("redis with TLS");
    let url = server.tls_url().expect("tls url");
    let (base, _) = url.split_once('?').expect("query");
    // Without the test CA the server's certificate is not trusted.
    let err = RedisBackend::connect(base, &fast_opts())
        .await
        .err()
        .expect("must fail");
    assert!(err.is_connection(), "{err:?}");
    let err = RedisBackend::connect(&format!("{base}?ca_file=/no/such/ca.pem"), &fast_opts())
        .await
        .err()
        .expect("must fail");
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(
        err.to_string().contains("`ca_file=/no/such/ca.pem`"),
        "{err}"
    );
}
