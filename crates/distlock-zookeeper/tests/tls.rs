//! `zks://` against real ZooKeeper nodes serving TLS on a `secureClientPort` with a throwaway
//! CA: the right CA works, another CA is `Untrusted`, a missing or foreign client certificate
//! is `ClientCertRejected` when the server requires one, the plain port is
//! `NotSupportedByServer`, and unusable files are `InvalidArgument` naming the parameter.

use distlock_core::{ClientOptions, Error};
use distlock_testkit::tls_cases::{assert_encrypted, client_options, fails, tls_error, works};
use distlock_testkit::{TestCerts, ZkEnsemble};
use distlock_zookeeper::{TlsErrorKind, ZkBackend};

async fn connect(url: &str) -> distlock_core::Result<ZkBackend> {
    ZkBackend::connect(url, &client_options()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_certificate_is_checked() {
    let zk = ZkEnsemble::start_tls(1, false).expect("start a ZooKeeper node with TLS");
    let url = zk.tls_url().expect("TLS url");
    works(connect(&url).await).await;
    assert_encrypted(connect(&url).await, "no client certificate").await;

    // Another CA: the server's certificate is not trusted.
    let other = TestCerts::generate().expect("another CA");
    let port = zk.secure_port(0).expect("TLS port");
    let wrong = format!("zks://127.0.0.1:{port}?cacert={}", other.ca().display());
    let e = fails(connect(&wrong).await);
    let tls = tls_error(&e);
    assert_eq!(tls.kind(), TlsErrorKind::Untrusted, "{e}");
    assert!(e.to_string().contains("`?cacert=PATH`"), "{e}");

    // By a name its certificate does not list.
    let ca = zk.certs().expect("certs").ca();
    let e = fails(connect(&format!("zks://127.0.0.2:{port}?cacert={}", ca.display())).await);
    // 127.0.0.2 reaches the node only if it listens there; it listens on 127.0.0.1 alone,
    // so this is a plain connection failure, not a TLS one.
    assert!(matches!(e, Error::Connection { .. }), "{e}");

    // The plain client port does not speak TLS.
    let plain_port = zk.addr(0).port();
    let e = fails(
        connect(&format!(
            "zks://127.0.0.1:{plain_port}?cacert={}",
            ca.display()
        ))
        .await,
    );
    let tls = tls_error(&e);
    assert_eq!(tls.kind(), TlsErrorKind::NotSupportedByServer, "{e}");
    assert!(e.to_string().contains("secureClientPort"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_required() {
    let zk = ZkEnsemble::start_tls(1, true).expect("start a ZooKeeper node with TLS");
    works(connect(&zk.tls_url().expect("TLS url")).await).await;
    assert_encrypted(
        connect(&zk.tls_url().expect("TLS url")).await,
        "a client certificate is shown",
    )
    .await;

    let port = zk.secure_port(0).expect("TLS port");
    let certs = zk.certs().expect("certs");
    let base = format!("zks://127.0.0.1:{port}?cacert={}", certs.ca().display());

    // No client certificate.
    let e = fails(connect(&base).await);
    let tls = tls_error(&e);
    assert_eq!(tls.kind(), TlsErrorKind::ClientCertRejected, "{e}");
    assert!(e.to_string().contains("`?cert=PATH&key=PATH`"), "{e}");

    // A client certificate of another CA.
    let other = TestCerts::generate().expect("another CA");
    let (cert, key) = other.client("stranger").expect("client cert");
    let url = format!("{base}&cert={}&key={}", cert.display(), key.display());
    let e = fails(connect(&url).await);
    let tls = tls_error(&e);
    assert_eq!(tls.kind(), TlsErrorKind::ClientCertRejected, "{e}");
    assert!(
        e.to_string().contains("refused the client certificate"),
        "{e}"
    );

    // Another certificate the servers' CA signed is fine.
    let (cert, key) = certs.client("another-client").expect("client cert");
    works(
        connect(&format!(
            "{base}&cert={}&key={}",
            cert.display(),
            key.display()
        ))
        .await,
    )
    .await;
}

#[tokio::test]
async fn unusable_files_name_the_parameter() {
    let certs = TestCerts::generate().expect("certs");
    let dir = certs.dir();
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "hello").expect("write");
    let (cert, key) = certs.client("c").expect("client");
    let ca = certs.ca();
    for (url, want) in [
        (
            format!(
                "zks://127.0.0.1:1?cacert={}",
                dir.join("missing.pem").display()
            ),
            "cannot read `cacert=",
        ),
        (
            format!("zks://127.0.0.1:1?cacert={}", not_pem.display()),
            "`cacert=",
        ),
        (
            format!(
                "zks://127.0.0.1:1?cacert={}&cert={}&key={}",
                ca.display(),
                not_pem.display(),
                key.display()
            ),
            "`cert=",
        ),
        (
            format!(
                "zks://127.0.0.1:1?cacert={}&cert={}&key={}",
                ca.display(),
                cert.display(),
                not_pem.display()
            ),
            "`key=",
        ),
    ] {
        let e = fails(ZkBackend::connect(&url, &ClientOptions::default()).await);
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains(want),
            "{url}: {e}"
        );
    }
}
