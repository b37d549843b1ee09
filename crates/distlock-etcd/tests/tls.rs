//! `etcds://` against real etcd members serving https with a throwaway CA (the testkit's
//! `EtcdCluster::start_tls`): the right CA works (URL and builder, through the facade too),
//! a wrong CA, a missing or foreign client certificate and a plain-http member each fail with
//! their own `TlsError`, and an application's own TLS client can be handed in.

use distlock_core::{ClientOptions, Error};
use distlock_etcd::{EtcdBackend, TlsErrorKind};
use distlock_testkit::{EtcdCluster, TestCerts};
use std::time::Duration;

mod common;
use common::{client_at, hold_within, released};

/// `url` without its query (the TLS parameters).
fn bare(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

fn quick() -> ClientOptions {
    ClientOptions::default().connect_timeout(Duration::from_secs(2))
}

/// The kind of the `TlsError` an `Error::Connection` carries (panics otherwise).
fn kind(e: &Error) -> TlsErrorKind {
    distlock_testkit::tls_cases::tls_error(e).kind()
}

async fn fails(url: &str) -> Error {
    match EtcdBackend::connect(url, &quick()).await {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_ca_and_client_certificate() {
    let cluster = EtcdCluster::start_tls(1, true).expect("tls cluster");
    assert!(cluster.url().starts_with("etcds://"), "{}", cluster.url());
    let a = client_at(&cluster.url(), ClientOptions::default()).await;
    let b = client_at(&cluster.url(), ClientOptions::default()).await;
    let g = hold_within(&a, "tls", Duration::from_secs(15), "acquire over TLS").await;
    assert!(b
        .lock("tls")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    let info = b.inspect("tls").await.expect("inspect");
    assert_eq!(info.holders[0].owner, g.owner());
    released(g).await;
    let findings = a.diagnose().await.expect("doctor");
    let tls = findings
        .iter()
        .find(|f| f.check == "tls")
        .expect("tls finding");
    assert_eq!(tls.severity, distlock_core::Severity::Ok, "{tls:?}");
    assert!(
        tls.message.contains("https") && tls.message.contains("a client certificate is shown"),
        "{tls:?}"
    );

    // The same files through the builder instead of the URL.
    let certs = cluster.certs().expect("certs");
    let (cert, key) = cluster.client_cert().expect("client cert");
    let backend = EtcdBackend::builder(bare(&cluster.url()))
        .ca_file(certs.ca())
        .client_cert(cert, key)
        .connect()
        .await
        .expect("builder over TLS");
    let c = distlock_core::Client::new(std::sync::Arc::new(backend), ClientOptions::default())
        .expect("client");
    released(hold_within(&c, "tls", Duration::from_secs(15), "builder acquire").await).await;

    // And through the facade, as the CLI connects.
    let f = distlock::connect(&cluster.url()).await.expect("facade");
    released(hold_within(&f, "tls", Duration::from_secs(15), "facade acquire").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_is_not_trusted() {
    let cluster = EtcdCluster::start_tls(1, false).expect("tls cluster");
    let other = TestCerts::generate().expect("other CA");
    let url = format!("{}?cacert={}", bare(&cluster.url()), other.ca().display());
    let e = fails(&url).await;
    assert!(kind(&e) == TlsErrorKind::Untrusted, "{e:?}");
    let text = e.to_string();
    assert!(text.contains("certificate is not trusted"), "{text}");
    assert!(text.contains("cacert=PATH"), "{text}");
    // No cacert: the system's CAs, which do not know the test CA either.
    let e = fails(bare(&cluster.url())).await;
    assert!(kind(&e) == TlsErrorKind::Untrusted, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_required_missing_or_foreign() {
    let cluster = EtcdCluster::start_tls(1, true).expect("tls cluster");
    let ca = cluster.certs().expect("certs").ca();
    let url = format!("{}?cacert={}", bare(&cluster.url()), ca.display());
    let e = fails(&url).await;
    assert!(kind(&e) == TlsErrorKind::ClientCertRejected, "{e:?}");
    assert!(
        e.to_string()
            .contains("server requires a client certificate"),
        "{e}"
    );
    // A client certificate signed by another CA is refused by the server.
    let other = TestCerts::generate().expect("other CA");
    let (cert, key) = other.client("stranger").expect("foreign client cert");
    let url = format!("{url}&cert={}&key={}", cert.display(), key.display());
    let e = fails(&url).await;
    assert!(kind(&e) == TlsErrorKind::ClientCertRejected, "{e:?}");
    assert!(
        e.to_string().contains("refused the client certificate"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_member_and_bad_files() {
    let plain = EtcdCluster::start_with_members(1).expect("plain cluster");
    let certs = TestCerts::generate().expect("certs");
    let url = format!(
        "{}?cacert={}",
        plain.url().replace("etcd://", "etcds://"),
        certs.ca().display()
    );
    let e = fails(&url).await;
    assert!(kind(&e) == TlsErrorKind::NotSupportedByServer, "{e:?}");
    assert!(e.to_string().contains("etcd:// instead of etcds://"), "{e}");
    // And the other way round: etcd:// to a member that only speaks TLS.
    let tls = EtcdCluster::start_tls(1, false).expect("tls cluster");
    let e = fails(&bare(&tls.url()).replace("etcds://", "etcd://")).await;
    assert!(e.is_connection(), "{e:?}");
    assert!(e.to_string().contains("connect with etcds://"), "{e}");
    // Files that cannot be read or are not PEM are named, before any connection.
    let e = fails("etcds://127.0.0.1:1?cacert=/nonexistent/ca.pem").await;
    assert!(e.is_invalid_argument(), "{e:?}");
    assert!(e.to_string().contains("cacert=/nonexistent/ca.pem"), "{e}");
    let e = fails(&format!(
        "etcds://127.0.0.1:1?cert={}&key={}",
        certs.ca().display(),
        certs.ca().display()
    ))
    .await;
    assert!(e.to_string().contains("PRIVATE KEY"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applications_tls_client() {
    let cluster = EtcdCluster::start_tls(1, true).expect("tls cluster");
    let certs = cluster.certs().expect("certs");
    let (cert, key) = cluster.client_cert().expect("client cert");
    let read = |p: &std::path::Path| std::fs::read(p).expect("read pem");
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(&certs.ca())))
        .identity(etcd_client::Identity::from_pem(read(cert), read(key)));
    let co = etcd_client::ConnectOptions::new()
        .with_require_leader(true)
        .with_tls(tls);
    let etcd = etcd_client::Client::connect(cluster.endpoints(), Some(co.clone()))
        .await
        .expect("application's client");
    let opts = ClientOptions::default().namespace("app/locks");
    let backend = EtcdBackend::from_client(etcd.clone(), &opts)
        .await
        .expect("from_client")
        .with_member_options(co);
    let mine = distlock_core::Client::new(std::sync::Arc::new(backend), opts).expect("client");
    let g = hold_within(&mine, "job", Duration::from_secs(15), "acquire").await;
    // The application's client still works alongside, and sees the lock's key.
    let mut kv = etcd.kv_client();
    let r = kv
        .get(
            "app/locks/job/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("app read");
    assert_eq!(r.kvs().len(), 1);
    // Another client (dlock's own connection) on the same prefix is excluded.
    let url = format!("{}/app/locks", bare(&cluster.url()));
    let url = format!("{url}?{}", cluster.url().split_once('?').expect("query").1);
    let other = client_at(&url, ClientOptions::default()).await;
    assert!(other
        .lock("job")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    // doctor reaches the member with the application's connect options.
    let findings = mine.diagnose().await.expect("diagnose");
    let members = findings
        .iter()
        .find(|f| f.check == "members")
        .expect("members finding");
    assert!(
        members.severity == distlock_core::Severity::Ok,
        "{findings:?}"
    );
    released(g).await;
}
