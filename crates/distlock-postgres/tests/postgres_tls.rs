//! TLS and credentials against real servers: each `sslmode` against a server with `ssl=on`
//! (which refuses unencrypted TCP) and one without, the right and a wrong CA, a wrong host
//! name, client certificates, the password from the builder or a password file, the
//! application's own `tokio_postgres::Config`, and no password in any error.
#![cfg(feature = "tls")]

mod support;

use distlock_core::{ClientOptions, Error};
use distlock_postgres::{PostgresBackend, PostgresBuilderExt, SslMode, TlsErrorKind, TlsOptions};
use distlock_testkit::tls_cases::{self, assert_encrypted, client_options, tls_error, works};
use distlock_testkit::{PostgresServer, TempDir, TestCerts};
use std::path::Path;
use std::time::Duration;
use support::tls_server;

/// `postgres://dlock[:password]@HOST:PORT/dlock?QUERY`.
fn url(server: &PostgresServer, password: Option<&str>, host: &str, query: &str) -> String {
    let pw = password.map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "postgres://{}{pw}@{host}:{}/{}?{query}",
        server.user(),
        server.port(),
        server.database()
    )
}

fn ca(server: &PostgresServer) -> String {
    server.tls_ca().expect("CA").display().to_string()
}

/// The error of connecting on `u`, which must fail.
async fn fails(u: &str) -> Error {
    tls_cases::fails(PostgresBackend::connect(u, &client_options()).await)
}

/// dlock's sessions on the server, and how many of them use TLS (`count|encrypted`).
fn dlock_sessions(server: &PostgresServer) -> String {
    server
        .sql(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'dlock'",
        )
        .expect("sql")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_and_prefer_encrypt_against_a_tls_server() {
    let server = tls_server();
    let pw = Some(server.password());
    for query in ["sslmode=require", "sslmode=prefer", ""] {
        let b = PostgresBackend::connect(&url(&server, pw, "127.0.0.1", query), &client_options())
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        let sessions = dlock_sessions(&server);
        let (n, tls) = sessions.split_once('|').expect("two columns");
        assert!(
            n != "0" && n == tls,
            "{query}: {sessions} (count|encrypted)"
        );
        works(Ok(b)).await;
    }
    // The server refuses unencrypted TCP: disable fails, and says where.
    let e = fails(&url(&server, pw, "127.0.0.1", "sslmode=disable")).await;
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("no encryption") && text.contains("sslmode=require"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_says_so() {
    let plain = PostgresServer::start().expect("start postgres");
    let pw = Some(plain.password());
    let e = fails(&url(&plain, pw, "127.0.0.1", "sslmode=require")).await;
    assert_eq!(tls_error(&e).kind(), TlsErrorKind::NotSupportedByServer);
    let text = e.to_string();
    assert!(
        text.contains("does not support TLS") && text.contains("ssl = on"),
        "{text}"
    );
    // prefer (the default) and disable go on unencrypted.
    for query in ["sslmode=prefer", "sslmode=disable"] {
        works(
            PostgresBackend::connect(&url(&plain, pw, "127.0.0.1", query), &client_options()).await,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_modes_check_the_chain_and_the_name() {
    let server = tls_server();
    let pw = Some(server.password());
    let ca = ca(&server);
    for (host, mode) in [
        ("127.0.0.1", "verify-full"),
        ("localhost", "verify-full"),
        ("127.0.0.1", "verify-ca"),
        ("127.0.0.1", "require"),
    ] {
        let u = url(
            &server,
            pw,
            host,
            &format!("sslmode={mode}&sslrootcert={ca}"),
        );
        works(PostgresBackend::connect(&u, &client_options()).await).await;
    }
    // A CA that did not sign the server's certificate: refused by verify-full, verify-ca and
    // (libpq's rule: a root certificate makes require check the chain) require.
    let other = TestCerts::generate().expect("another CA");
    let wrong = other.ca().display().to_string();
    for mode in ["verify-full", "verify-ca", "require", "prefer"] {
        let e = fails(&url(
            &server,
            pw,
            "127.0.0.1",
            &format!("sslmode={mode}&sslrootcert={wrong}"),
        ))
        .await;
        assert_eq!(tls_error(&e).kind(), TlsErrorKind::Untrusted, "{mode}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("not trusted by sslrootcert={wrong}")),
            "{mode}: {text}"
        );
    }
    // The right CA, a name the certificate does not list (the TCP connection still goes to
    // 127.0.0.1 through hostaddr): verify-full refuses, verify-ca does not check names.
    let q = |mode: &str| format!("sslmode={mode}&sslrootcert={ca}&hostaddr=127.0.0.1");
    let e = fails(&url(&server, pw, "db.wrong.example", &q("verify-full"))).await;
    assert_eq!(tls_error(&e).kind(), TlsErrorKind::WrongHost, "{e}");
    assert!(e.to_string().contains("`db.wrong.example`"), "{e}");
    let u = url(&server, pw, "db.wrong.example", &q("verify-ca"));
    works(PostgresBackend::connect(&u, &client_options()).await).await;
    // The system's roots do not know the throwaway CA (or the machine has none to offer).
    let e = fails(&url(
        &server,
        pw,
        "127.0.0.1",
        "sslmode=verify-full&sslrootcert=system",
    ))
    .await;
    match &e {
        Error::InvalidArgument(m) => assert!(m.contains("sslrootcert=system"), "{m}"),
        _ => assert_eq!(tls_error(&e).kind(), TlsErrorKind::Untrusted, "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_log_in_without_a_password() {
    let certs = TestCerts::generate().expect("certs");
    let server = PostgresServer::start_tls_client_certs(&certs).expect("start postgres");
    let (cert, key) = certs.client(server.user()).expect("client cert");
    let ca = certs.ca().display().to_string();
    let with = |cert: &Path, key: &Path| {
        url(
            &server,
            None,
            "127.0.0.1",
            &format!(
                "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
                cert.display(),
                key.display()
            ),
        )
    };
    works(PostgresBackend::connect(&with(&cert, &key), &client_options()).await).await;
    // The same in code.
    let tls = TlsOptions::new(SslMode::VerifyFull)
        .root_cert(certs.ca())
        .client_cert(&cert, &key);
    let b = PostgresBackend::builder(&url(&server, None, "127.0.0.1", ""))
        .tls(tls)
        .options(client_options())
        .connect()
        .await;
    works(b).await;
    // No client certificate: the server's cert method refuses the login.
    let e = fails(&url(
        &server,
        None,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await;
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
    // A client certificate of another CA: the server refuses it in the handshake.
    let other = TestCerts::generate().expect("another CA");
    let (cert2, key2) = other.client(server.user()).expect("client cert");
    let e = fails(&with(&cert2, &key2)).await;
    assert_eq!(
        tls_error(&e).kind(),
        TlsErrorKind::ClientCertRejected,
        "{e}"
    );
    assert!(e.to_string().contains(&cert2.display().to_string()), "{e}");
    // A key that does not go with the certificate, an unreadable one.
    let e = fails(&with(&cert, &key2)).await;
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("does not go with"), "{e}");
    let e = fails(&with(&cert, Path::new("/nonexistent/key.pem"))).await;
    assert!(e.to_string().contains("sslkey=/nonexistent/key.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_own_config() {
    let server = tls_server();
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(server.port())
        .user(server.user())
        .dbname(server.database())
        .password(server.password())
        .application_name("dlock");
    let tls = TlsOptions::new(SslMode::VerifyFull).root_cert(server.tls_ca().expect("CA"));
    works(
        PostgresBackend::with_config(config.clone(), tls)
            .options(client_options())
            .connect()
            .await,
    )
    .await;
    // Its password left out and given to the builder; lease mode.
    let mut no_pw = tokio_postgres::Config::new();
    no_pw
        .host("127.0.0.1")
        .port(server.port())
        .user(server.user())
        .dbname(server.database());
    let tls = TlsOptions::new(SslMode::Require);
    let b = PostgresBackend::with_config(no_pw.clone(), tls.clone())
        .password(server.password())
        .mode(distlock_postgres::Mode::Lease)
        .options(client_options())
        .connect()
        .await;
    assert_eq!(
        b.as_ref().map(|b| b.mode()).ok(),
        Some(distlock_postgres::Mode::Lease)
    );
    works(b).await;
    // No password anywhere: the message says where one can go.
    let e = PostgresBackend::with_config(no_pw, tls)
        .passfile("/nonexistent/pgpass")
        .options(client_options())
        .connect()
        .await
        .err()
        .expect("no password");
    assert!(
        e.to_string().contains("password file /nonexistent/pgpass"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_from_a_password_file() {
    use std::os::unix::fs::PermissionsExt;
    let server = tls_server();
    let dir = TempDir::with_prefix("dlock-pgpass-").expect("temp dir");
    let file = dir.path().join("pgpass");
    std::fs::write(
        &file,
        format!(
            "# dlock\nother:1:*:*:nope\n127.0.0.1:{}:{}:{}:{}\n",
            server.port(),
            server.database(),
            server.user(),
            server.password()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let u = url(
        &server,
        None,
        "127.0.0.1",
        &format!("sslmode=require&passfile={}", file.display()),
    );
    works(PostgresBackend::connect(&u, &client_options()).await).await;
    let u = url(&server, None, "127.0.0.1", "sslmode=require");
    works(
        PostgresBackend::builder(&u)
            .passfile(&file)
            .options(client_options())
            .connect()
            .await,
    )
    .await;
    // A file others may read is refused, as libpq ignores it.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let e = PostgresBackend::builder(&u)
        .passfile(&file)
        .options(client_options())
        .connect()
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("chmod 600"), "{e}");
    // No line for this host: the server's password request goes unanswered.
    std::fs::write(&file, "other:1:*:*:nope\n").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let e = PostgresBackend::builder(&u)
        .passfile(&file)
        .options(client_options())
        .connect()
        .await
        .err()
        .expect("no password");
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("PGPASSWORD"), "{e}");
}

/// Every error path with a secret password given through the URL, the builder and a
/// password file: a wrong password, a server that is down, an untrusted certificate, a bad
/// URL, a missing client key. No Display or Debug of the error (or of the builder) shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_shows_the_password() {
    const SECRET: &str = "Zq9-very-secret-pw";
    let server = tls_server();
    let ca = ca(&server);
    let other = TestCerts::generate().expect("another CA");
    let down = distlock_testkit::try_free_port().expect("a free port");
    let fast = ClientOptions::default().connect_timeout(Duration::from_secs(3));
    let good = format!("sslmode=verify-full&sslrootcert={ca}");
    let untrusted = format!("sslmode=verify-full&sslrootcert={}", other.ca().display());
    let dir = TempDir::with_prefix("dlock-pgpass-").expect("temp dir");
    let passfile = dir.path().join("pgpass");
    std::fs::write(&passfile, format!("*:*:*:*:{SECRET}\n")).expect("write");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let down_url = |query: &str, pw: Option<&str>| {
        let pw = pw.map(|p| format!(":{p}")).unwrap_or_default();
        format!("postgres://dlock{pw}@127.0.0.1:{down}/dlock?{query}")
    };
    let mut cases: Vec<(&str, distlock_postgres::PostgresBuilder)> = vec![
        (
            "wrong password in the URL",
            PostgresBackend::builder(&url(&server, Some(SECRET), "127.0.0.1", &good)),
        ),
        (
            "wrong password from the builder",
            PostgresBackend::builder(&url(&server, None, "127.0.0.1", &good)).password(SECRET),
        ),
        (
            "wrong password from a file",
            PostgresBackend::builder(&url(&server, None, "127.0.0.1", &good)).passfile(&passfile),
        ),
        (
            "server down, password in the URL",
            PostgresBackend::builder(&down_url("sslmode=require", Some(SECRET))),
        ),
        (
            "server down, password from the builder",
            PostgresBackend::builder(&down_url("sslmode=require", None)).password(SECRET),
        ),
        (
            "untrusted certificate, password in the URL",
            PostgresBackend::builder(&url(&server, Some(SECRET), "127.0.0.1", &untrusted)),
        ),
        (
            "untrusted certificate, password from the builder",
            PostgresBackend::builder(&url(&server, None, "127.0.0.1", &untrusted)).password(SECRET),
        ),
        (
            "bad URL",
            PostgresBackend::builder(&url(&server, Some(SECRET), "127.0.0.1", "sslmode=nope")),
        ),
        (
            "missing client key",
            PostgresBackend::builder(&url(
                &server,
                Some(SECRET),
                "127.0.0.1",
                &format!("{good}&sslcert=/nonexistent/c.pem&sslkey=/nonexistent/k.pem"),
            )),
        ),
    ];
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(down)
        .user("dlock")
        .dbname("dlock")
        .password(SECRET);
    cases.push((
        "server down, password in the application's config",
        PostgresBackend::with_config(config, TlsOptions::new(SslMode::Require)),
    ));
    for (what, builder) in cases.drain(..) {
        let shown = format!("{builder:?}");
        assert!(!shown.contains(SECRET), "{what}: builder Debug {shown}");
        let e = tls_cases::fails(builder.options(fast.clone()).connect().await);
        tls_cases::assert_hides(what, &e, SECRET);
        eprintln!("{what}: {e}");
    }
}

/// SCRAM with `channel_binding=require`: the driver insists on SCRAM-SHA-256-PLUS with the
/// `tls-server-end-point` binding this crate computes, and the server checks it against its own
/// certificate, so a login that works shows the binding is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_channel_binding() {
    let certs = TestCerts::generate().expect("certs");
    let server = PostgresServer::start_tls(&certs).expect("start postgres");
    server
        .sql(&format!(
            "SET password_encryption = 'scram-sha-256'; ALTER ROLE {} PASSWORD '{}'",
            server.user(),
            server.password()
        ))
        .expect("a SCRAM password");
    let pw = Some(server.password());
    let ca = ca(&server);
    for query in [
        "sslmode=require&channel_binding=require".to_owned(),
        format!("sslmode=verify-full&sslrootcert={ca}&channel_binding=require"),
    ] {
        let u = url(&server, pw, "127.0.0.1", &query);
        works(PostgresBackend::connect(&u, &client_options()).await).await;
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
            format!("sslmode=verify-full&sslrootcert={ca}"),
            "sslmode=verify-full: certificate chain and host name checked",
        ),
        (
            "sslmode=require".to_owned(),
            "sslmode=require: certificate not checked",
        ),
    ] {
        assert_encrypted(
            PostgresBackend::connect(&url(&server, pw, "127.0.0.1", &query), &client_options())
                .await,
            says,
        )
        .await;
    }
}
