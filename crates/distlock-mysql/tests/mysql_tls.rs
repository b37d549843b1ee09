//! TLS and credentials against real servers: each `ssl-mode` against a server with TLS on
//! (which refuses unencrypted TCP) and one without, the right and a wrong CA, a wrong host
//! name, client certificates (`REQUIRE X509`), the password from the builder or a password
//! file, the application's own `mysql_async::Opts`, and no password in any error.
#![cfg(feature = "tls")]

mod support;

use distlock_core::{ClientOptions, Error};
use distlock_mysql::{MysqlBackend, MysqlBuilderExt, SslMode, TlsErrorKind, TlsOptions};
use distlock_testkit::tls_cases::{
    assert_encrypted, assert_hides, client_options, fails, tls_error, tls_finding, works,
};
use distlock_testkit::{MariaDbServer, TempDir, TestCerts};
use std::time::Duration;
use support::{client_cert, shared_server, tls_server};

/// `mysql://USER[:password]@127.0.0.1:PORT/dlock?QUERY`.
fn url(server: &MariaDbServer, user: &str, password: Option<&str>, query: &str) -> String {
    let pw = password.map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "mysql://{user}{pw}@127.0.0.1:{}/{}?{query}",
        server.port(),
        server.database()
    )
}

fn ca(server: &MariaDbServer) -> String {
    server.tls_ca().expect("CA").display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_preferred_encrypt_against_a_tls_server() {
    let server = tls_server();
    let pw = Some(server.password());
    // The server refuses unencrypted TCP, so each of these is encrypted.
    for query in [
        "ssl-mode=REQUIRED",
        "ssl-mode=preferred",
        "",
        "ssl_mode=Required",
    ] {
        works(
            MysqlBackend::connect(&url(&server, server.user(), pw, query), &client_options()).await,
        )
        .await;
    }
    // The REQUIRE SSL account too.
    works(
        MysqlBackend::connect(
            &url(&server, server.ssl_user(), pw, "ssl-mode=REQUIRED"),
            &client_options(),
        )
        .await,
    )
    .await;
    let e = fails(
        MysqlBackend::connect(
            &url(&server, server.user(), pw, "ssl-mode=DISABLED"),
            &client_options(),
        )
        .await,
    );
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("ssl-mode=REQUIRED"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_against_a_server_without_tls_says_so() {
    let plain = shared_server();
    let pw = Some(plain.password());
    let e = fails(
        MysqlBackend::connect(
            &url(&plain, plain.user(), pw, "ssl-mode=REQUIRED"),
            &client_options(),
        )
        .await,
    );
    assert_eq!(tls_error(&e).kind(), TlsErrorKind::NotSupportedByServer);
    assert!(e.to_string().contains("does not support TLS"), "{e}");
    // PREFERRED (the default) and DISABLED go on unencrypted.
    for query in ["ssl-mode=PREFERRED", "ssl-mode=DISABLED", ""] {
        works(
            MysqlBackend::connect(&url(&plain, plain.user(), pw, query), &client_options()).await,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_modes_check_the_chain_and_the_name() {
    let server = tls_server();
    let pw = Some(server.password());
    let ca = ca(&server);
    for mode in ["VERIFY_CA", "VERIFY_IDENTITY"] {
        let q = format!("ssl-mode={mode}&ssl-ca={ca}");
        works(MysqlBackend::connect(&url(&server, server.user(), pw, &q), &client_options()).await)
            .await;
    }
    // ssl-ca alone means VERIFY_CA, as for the mysql client.
    let q = format!("ssl-ca={ca}");
    works(MysqlBackend::connect(&url(&server, server.user(), pw, &q), &client_options()).await)
        .await;
    // A CA that did not sign the server's certificate.
    let other = TestCerts::generate().expect("another CA");
    for mode in ["VERIFY_CA", "VERIFY_IDENTITY"] {
        let q = format!("ssl-mode={mode}&ssl-ca={}", other.ca().display());
        let e = fails(
            MysqlBackend::connect(&url(&server, server.user(), pw, &q), &client_options()).await,
        );
        assert_eq!(tls_error(&e).kind(), TlsErrorKind::Untrusted, "{e}");
        assert!(e.to_string().contains("ssl-ca="), "{e}");
    }
    // The certificate is for 127.0.0.1 and localhost, not db.example.com. VERIFY_CA checks
    // the name too with this driver (docs/mysql.md, "TLS"): pinned, so an upgrade that lifts
    // the limit is noticed and the docs are updated.
    let named = |mode: SslMode, name: &str| {
        MysqlBackend::builder(&url(&server, server.user(), pw, ""))
            .tls(TlsOptions::new(mode).ca(&ca).server_name(name))
    };
    for (mode, says) in [
        (SslMode::VerifyFull, "db.example.com"),
        (SslMode::VerifyCa, "VERIFY_CA checks the name too"),
    ] {
        let e = fails(
            named(mode, "db.example.com")
                .options(client_options())
                .connect()
                .await,
        );
        assert_eq!(
            tls_error(&e).kind(),
            TlsErrorKind::WrongHost,
            "{mode:?}: {e}"
        );
        assert!(e.to_string().contains(says), "{mode:?}: {e}");
        works(
            named(mode, "localhost")
                .options(client_options())
                .connect()
                .await,
        )
        .await;
    }
    // VERIFY_CA without a CA is refused before connecting.
    let e = fails(
        MysqlBackend::connect(
            &url(&server, server.user(), pw, "ssl-mode=VERIFY_CA"),
            &client_options(),
        )
        .await,
    );
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_for_require_x509() {
    let server = tls_server();
    let pw = Some(server.password());
    let ca = ca(&server);
    let (cert, key) = client_cert(&server);
    let q = format!(
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&ssl-cert={}&ssl-key={}",
        cert.display(),
        key.display()
    );
    works(
        MysqlBackend::connect(&url(&server, server.x509_user(), pw, &q), &client_options()).await,
    )
    .await;
    // The same in code.
    works(
        MysqlBackend::builder(&url(&server, server.x509_user(), pw, ""))
            .tls(TlsOptions::new(SslMode::Require).client_cert(&cert, &key))
            .options(client_options())
            .connect()
            .await,
    )
    .await;
    // Without a certificate the account is refused, and the message says what it needs.
    let q = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    let e = fails(
        MysqlBackend::connect(&url(&server, server.x509_user(), pw, &q), &client_options()).await,
    );
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("ssl-cert="), "{e}");
    // A certificate of another CA is refused by the server.
    let other = TestCerts::generate().expect("another CA");
    let (c2, k2) = other.client(server.x509_user()).expect("client cert");
    let e = fails(
        MysqlBackend::builder(&url(&server, server.x509_user(), pw, ""))
            .tls(TlsOptions::new(SslMode::Require).client_cert(&c2, &k2))
            .options(client_options())
            .connect()
            .await,
    );
    match &e {
        Error::Connection { .. } => {
            assert_eq!(
                tls_error(&e).kind(),
                TlsErrorKind::ClientCertRejected,
                "{e}"
            )
        }
        Error::Auth { .. } => {}
        other => panic!("{other} / {other:?}"),
    }
    // A key file that does not exist is named.
    let e = fails(
        MysqlBackend::builder(&url(&server, server.x509_user(), pw, ""))
            .tls(TlsOptions::new(SslMode::Require).client_cert(&cert, "/nonexistent/k.pem"))
            .options(client_options())
            .connect()
            .await,
    );
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("/nonexistent/k.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_own_opts() {
    let server = tls_server();
    let ca = server.tls_ca().expect("CA");
    let ssl = mysql_async::SslOpts::default()
        .with_root_certs(vec![ca.clone().into()])
        .with_disable_built_in_roots(true);
    let opts_of = |ssl: Option<mysql_async::SslOpts>| -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(server.port())
            .user(Some(server.user()))
            .pass(Some(server.password()))
            .db_name(Some(server.database()))
            .prefer_socket(false)
            .ssl_opts(ssl)
            .into()
    };
    // Its own SslOpts, as they are.
    works(
        MysqlBackend::with_opts(opts_of(Some(ssl)))
            .options(client_options())
            .connect()
            .await,
    )
    .await;
    // No TLS in them, TLS from the builder, table mode.
    let b = MysqlBackend::with_opts(opts_of(None))
        .tls(TlsOptions::new(SslMode::VerifyFull).ca(&ca))
        .mode(distlock_mysql::Mode::Table)
        .namespace("byo")
        .options(client_options())
        .connect()
        .await
        .expect("connect");
    assert_eq!(b.mode(), distlock_mysql::Mode::Table);
    assert_eq!(b.namespace(), "byo");
    works(Ok(b)).await;
    // No TLS at all: the server refuses it.
    let e = fails(
        MysqlBackend::with_opts(opts_of(None))
            .options(client_options())
            .connect()
            .await,
    );
    assert!(matches!(e, Error::Auth { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_from_the_builder_and_a_file() {
    let server = tls_server();
    let q = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca(&server));
    let bare = url(&server, server.user(), None, &q);
    works(
        MysqlBackend::builder(&bare)
            .password(server.password())
            .options(client_options())
            .connect()
            .await,
    )
    .await;
    // The builder's password wins over the URL's.
    works(
        MysqlBackend::builder(&url(&server, server.user(), Some("wrong"), &q))
            .password(server.password())
            .options(client_options())
            .connect()
            .await,
    )
    .await;
    let dir = TempDir::with_prefix("dlock-mysql-pw-").expect("temp dir");
    let file = dir.path().join("password");
    std::fs::write(&file, format!("{}\n", server.password())).expect("write");
    works(
        MysqlBackend::builder(&bare)
            .password_file(&file)
            .options(client_options())
            .connect()
            .await,
    )
    .await;
    let with_file = format!("{bare}&password-file={}", file.display());
    works(MysqlBackend::connect(&with_file, &client_options()).await).await;
    // A password file that is not there is an error naming it.
    let e = fails(
        MysqlBackend::builder(&bare)
            .password_file(dir.path().join("missing"))
            .options(client_options())
            .connect()
            .await,
    );
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");
}

/// `MYSQL_PWD` (its own test: nextest runs each in its own process, so the variable is seen
/// by this test only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_from_mysql_pwd() {
    let server = tls_server();
    let q = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca(&server));
    std::env::set_var(distlock_mysql::PASSWORD_ENV, server.password());
    works(MysqlBackend::connect(&url(&server, server.user(), None, &q), &client_options()).await)
        .await;
    // The URL's password wins over it.
    let e = fails(
        MysqlBackend::connect(
            &url(&server, server.user(), Some("wrong"), &q),
            &client_options(),
        )
        .await,
    );
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    std::env::remove_var(distlock_mysql::PASSWORD_ENV);
}

/// Every error path with a secret password given through the URL, the builder, a password
/// file or the application's options: a wrong password, a server that is down, an untrusted
/// certificate, a wrong host name, a bad URL, a missing client key. No Display or Debug of
/// the error (or of the builder) shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_shows_the_password() {
    const SECRET: &str = "Zq9-very-secret-pw";
    let server = tls_server();
    let ca = ca(&server);
    let other = TestCerts::generate().expect("another CA");
    let down = distlock_testkit::try_free_port().expect("a free port");
    let fast = ClientOptions::default().connect_timeout(Duration::from_secs(3));
    let good = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    let untrusted = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", other.ca().display());
    let dir = TempDir::with_prefix("dlock-mysql-secret-").expect("temp dir");
    let file = dir.path().join("password");
    std::fs::write(&file, format!("{SECRET}\n")).expect("write");
    let down_url = |query: &str, pw: Option<&str>| {
        let pw = pw.map(|p| format!(":{p}")).unwrap_or_default();
        format!("mysql://dlock{pw}@127.0.0.1:{down}/dlock?{query}")
    };
    let user = server.user();
    let app_opts = |port: u16| -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(port)
            .user(Some(user))
            .pass(Some(SECRET))
            .db_name(Some("dlock"))
            .prefer_socket(false)
            .into()
    };
    let cases: Vec<(&str, distlock_mysql::MysqlBuilder)> = vec![
        (
            "wrong password in the URL",
            MysqlBackend::builder(&url(&server, user, Some(SECRET), &good)),
        ),
        (
            "wrong password from the builder",
            MysqlBackend::builder(&url(&server, user, None, &good)).password(SECRET),
        ),
        (
            "wrong password from a file",
            MysqlBackend::builder(&url(&server, user, None, &good)).password_file(&file),
        ),
        (
            "wrong password in the application's options",
            MysqlBackend::with_opts(app_opts(server.port()))
                .tls(TlsOptions::new(SslMode::VerifyFull).ca(&ca)),
        ),
        (
            "unencrypted, refused by the server",
            MysqlBackend::builder(&url(&server, user, Some(SECRET), "ssl-mode=DISABLED")),
        ),
        (
            "server down, password in the URL",
            MysqlBackend::builder(&down_url("ssl-mode=REQUIRED", Some(SECRET))),
        ),
        (
            "server down, password from the builder",
            MysqlBackend::builder(&down_url("", None)).password(SECRET),
        ),
        (
            "server down, the application's options",
            MysqlBackend::with_opts(app_opts(down)),
        ),
        (
            "untrusted certificate, password in the URL",
            MysqlBackend::builder(&url(&server, user, Some(SECRET), &untrusted)),
        ),
        (
            "untrusted certificate, password from the builder",
            MysqlBackend::builder(&url(&server, user, None, &untrusted)).password(SECRET),
        ),
        (
            "wrong host name",
            MysqlBackend::builder(&url(&server, user, Some(SECRET), "")).tls(
                TlsOptions::new(SslMode::VerifyFull)
                    .ca(&ca)
                    .server_name("db.example.com"),
            ),
        ),
        (
            "bad URL",
            MysqlBackend::builder(&url(&server, user, Some(SECRET), "ssl-mode=nope")),
        ),
        (
            "driver's own TLS parameter",
            MysqlBackend::builder(&url(&server, user, Some(SECRET), "require_ssl=true")),
        ),
        (
            "missing client key",
            MysqlBackend::builder(&url(
                &server,
                user,
                Some(SECRET),
                &format!("{good}&ssl-cert=/nonexistent/c.pem&ssl-key=/nonexistent/k.pem"),
            )),
        ),
    ];
    for (what, builder) in cases {
        let shown = format!("{builder:?}");
        assert!(!shown.contains(SECRET), "{what}: builder Debug: {shown}");
        let e = fails(builder.options(fast.clone()).connect().await);
        assert_hides(what, &e, SECRET);
    }
}

/// `dlock doctor`'s `tls` check says whether the session is encrypted and what was checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_tls() {
    let server = tls_server();
    let pw = Some(server.password());
    let ca = ca(&server);
    for (query, says) in [
        (
            format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
            "ssl-mode=VERIFY_IDENTITY: certificate chain and host name checked",
        ),
        (
            "ssl-mode=REQUIRED".to_owned(),
            "ssl-mode=REQUIRED: certificate not checked",
        ),
    ] {
        assert_encrypted(
            MysqlBackend::connect(&url(&server, server.user(), pw, &query), &client_options())
                .await,
            says,
        )
        .await;
    }
    // A server without TLS, on this machine: not encrypted, and that is fine here.
    let plain = shared_server();
    let tls = tls_finding(
        MysqlBackend::connect(
            &url(&plain, plain.user(), Some(plain.password()), ""),
            &client_options(),
        )
        .await,
    )
    .await;
    assert_eq!(tls.severity, distlock_core::Severity::Ok, "{tls:?}");
    assert!(
        tls.message
            .starts_with("not encrypted (ssl-mode=PREFERRED), to this machine"),
        "{tls:?}"
    );
}

/// Over TLS too, a holder whose connection the server kills is told at once, not at its next
/// renewal (20 s here): its client watches the socket under the TLS stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_over_tls_fires_lost_at_once() {
    let server = tls_server();
    let query = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca(&server));
    let opts = client_options().watchdog_lease(Duration::from_secs(60));
    let b = MysqlBackend::connect(
        &url(&server, server.user(), Some(server.password()), &query),
        &opts,
    )
    .await
    .expect("connect");
    let c = distlock_core::Client::new(std::sync::Arc::new(b), opts).expect("client");
    let name = format!("tls-kill-{}", std::process::id());
    let g = c
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let killed = std::time::Instant::now();
    support::kill_holder(&server, &name);
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("the holder was not told within 10 s that the server killed its connection");
    assert!(
        matches!(reason, distlock_core::LostReason::SessionEnded(_)),
        "{reason:?}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
}
