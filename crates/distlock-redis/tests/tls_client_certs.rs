//! `rediss://` with client certificates (`?cert=PATH&key=PATH`) against a real redis-server
//! with `--tls-auth-clients yes` and a throwaway CA.
#![cfg(feature = "tls")]

use distlock_core::conn::TlsErrorKind;
use distlock_core::Error;
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{self, ServerHarness};
use distlock_testkit::tls_cases::{client_options, fails, tls_error, works};
use distlock_testkit::{RedisServer, TestCerts};

fn server() -> RedisServer {
    RedisServer::start_tls_client_certs().expect("redis with TLS and client certificates")
}

fn client_url(s: &RedisServer) -> String {
    s.tls_client_url().expect("client cert").expect("tls url")
}

fn harness() -> ServerHarness<RedisServer> {
    ServerHarness::new(server(), client_url, |url, o| async move {
        RedisBackend::connect(&url, &o).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_subset_with_client_certificate() {
    let h = harness();
    conformance::mutual_exclusion(&h).await;
    conformance::reentrancy(&h).await;
    conformance::fencing_tokens_increase(&h).await;
    conformance::waiter_woken_by_release(&h).await;
    conformance::watchdog_renews(&h).await;
    conformance::semaphore_permits(&h).await;
}

#[tokio::test]
async fn cacert_is_an_alias_of_ca_file() {
    let s = server();
    let url = client_url(&s).replace("?ca_file=", "?cacert=");
    works(RedisBackend::connect(&url, &client_options()).await).await;
}

#[tokio::test]
async fn without_a_client_certificate_it_is_required() {
    let s = server();
    let url = s.tls_url().expect("tls url");
    let e = fails(RedisBackend::connect(&url, &client_options()).await);
    let t = tls_error(&e);
    assert_eq!(t.kind(), TlsErrorKind::ClientCertRejected, "{e}");
    assert!(
        e.to_string().contains("requires a client certificate")
            && e.to_string().contains("cert=PATH&key=PATH"),
        "{e}"
    );
}

#[tokio::test]
async fn client_certificate_of_another_ca_is_refused() {
    let s = server();
    let other = TestCerts::generate().expect("other CA");
    let (cert, key) = other.client("stranger").expect("client cert");
    let url = format!(
        "{}&cert={}&key={}",
        s.tls_url().expect("tls url"),
        cert.display(),
        key.display()
    );
    let e = fails(RedisBackend::connect(&url, &client_options()).await);
    assert_eq!(
        tls_error(&e).kind(),
        TlsErrorKind::ClientCertRejected,
        "{e}"
    );
    assert!(
        e.to_string().contains("refused the client certificate"),
        "{e}"
    );
}

#[tokio::test]
async fn server_of_another_ca_is_untrusted() {
    let s = server();
    let other = TestCerts::generate().expect("other CA");
    let url = client_url(&s).replace(
        &s.tls_certs().expect("certs").ca().display().to_string(),
        &other.ca().display().to_string(),
    );
    let e = fails(RedisBackend::connect(&url, &client_options()).await);
    assert_eq!(tls_error(&e).kind(), TlsErrorKind::Untrusted, "{e}");
    assert!(e.to_string().contains("ca_file=PATH"), "{e}");
}

#[tokio::test]
async fn bad_tls_parameters_name_themselves() {
    let s = server();
    let base = s.tls_url().expect("tls url");
    for (url, says) in [
        (
            format!("{base}&cert=/no/such.pem&key=/no/such.key"),
            "cert=",
        ),
        (format!("{base}&cert=/no/such.pem"), "key=PATH"),
        (format!("{base}&key=/no/such.key"), "cert=PATH"),
        (format!("{base}&cacert=/x"), "once"),
        (
            format!("redis://127.0.0.1:{}?cert=/a&key=/b", s.port()),
            "rediss://",
        ),
    ] {
        let e = fails(RedisBackend::connect(&url, &client_options()).await);
        assert!(matches!(e, Error::InvalidUrl { .. }), "{url}: {e:?}");
        assert!(e.to_string().contains(says), "{url}: {e}");
    }
}
