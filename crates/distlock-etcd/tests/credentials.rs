//! User and password outside the URL against a real etcd with authentication enabled (over
//! TLS, as a password should travel): the builder's `credentials` and `password_file`, and a
//! password that never shows in any error's `Display` or `Debug` (nor in the builder's).

use distlock_core::{Client, ClientOptions, Error};
use distlock_etcd::EtcdBackend;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{hold_within, released, secured, PASSWORD};

const WRONG: &str = "wrong-Ÿ-passw0rd";

/// No text of `e` (`Display`, `Debug`, every source's) shows a password or part of one.
fn assert_secret_free(what: &str, e: &Error) {
    for secret in [PASSWORD, WRONG, "hunter2", "passw0rd"] {
        distlock_testkit::tls_cases::assert_hides(what, e, secret);
    }
}

async fn connect_err(b: distlock_etcd::EtcdBuilder) -> Error {
    match b.ignore_env().connect().await {
        Ok(_) => panic!("connected"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_credentials_and_password_file() {
    let cluster = secured().await;
    let url = cluster.url();
    let backend = EtcdBackend::builder(&url)
        .credentials("root", PASSWORD)
        .ignore_env()
        .connect()
        .await
        .expect("builder credentials");
    let a = Client::new(Arc::new(backend), ClientOptions::default()).expect("client");
    let g = hold_within(&a, "secured", Duration::from_secs(15), "acquire").await;

    let dir = distlock_testkit::TempDir::new().expect("dir");
    let file = dir.path().join("password");
    std::fs::write(&file, format!("{PASSWORD}\n")).expect("write");
    let backend = EtcdBackend::builder(url.replace("etcds://", "etcds://root@"))
        .password_file(&file)
        .ignore_env()
        .connect()
        .await
        .expect("password file");
    let b = Client::new(Arc::new(backend), ClientOptions::default()).expect("client");
    assert!(b
        .lock("secured")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    released(g).await;

    // Without credentials the server refuses the requests.
    let anonymous = EtcdBackend::builder(&url).ignore_env().connect().await;
    let e = match anonymous {
        Err(e) => e,
        Ok(b) => {
            let c = Client::new(Arc::new(b), ClientOptions::default()).expect("client");
            c.lock("secured")
                .expect("lock")
                .try_acquire()
                .await
                .expect_err("no user")
        }
    };
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_shows_the_password() {
    let mut cluster = secured().await;
    let url = cluster.url();
    let with_user = url.replace("etcds://", "etcds://root@");
    let quick = ClientOptions::default().connect_timeout(Duration::from_millis(500));

    // A refused password, from the builder and from the URL.
    let e = connect_err(EtcdBackend::builder(&url).credentials("root", WRONG)).await;
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert_secret_free("wrong password (builder)", &e);
    let in_url = url.replace(
        "etcds://",
        &format!("etcds://root:{}@", "wrong-%C5%B8-passw0rd"),
    );
    let e = connect_err(EtcdBackend::builder(&in_url)).await;
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    assert_secret_free("wrong password (URL)", &e);
    let e = distlock::connect(&in_url)
        .await
        .map(|_| ())
        .expect_err("facade refuses");
    assert_secret_free("wrong password (facade)", &e);

    // A password without a user; a password file that is missing.
    let e = connect_err(EtcdBackend::builder(&url).password(PASSWORD)).await;
    assert!(e.is_invalid_argument(), "{e:?}");
    assert_secret_free("password without user", &e);
    let e = connect_err(EtcdBackend::builder(&with_user).password_file("/nonexistent/pw")).await;
    assert!(e.to_string().contains("/nonexistent/pw"), "{e}");

    // A bad URL with the password in it.
    let bad = format!("etcds://root:{PASSWORD}@127.0.0.1:x");
    let e = connect_err(EtcdBackend::builder(&bad)).await;
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
    assert_secret_free("bad URL", &e);

    // TLS refused (another CA), and nothing listening, with the right credentials.
    let other = distlock_testkit::TestCerts::generate().expect("other CA");
    let e = connect_err(
        EtcdBackend::builder(&url)
            .credentials("root", PASSWORD)
            .ca_file(other.ca()),
    )
    .await;
    assert!(e.is_connection(), "{e:?}");
    assert_secret_free("untrusted server", &e);
    let nothing = format!("etcd://127.0.0.1:{}", distlock_testkit::free_port());
    let e = connect_err(
        EtcdBackend::builder(&nothing)
            .credentials("root", PASSWORD)
            .options(quick.clone()),
    )
    .await;
    assert!(e.is_connection(), "{e:?}");
    assert_secret_free("nothing listens", &e);

    // A call on a connected backend whose cluster went away.
    let backend = EtcdBackend::builder(&url)
        .credentials("root", PASSWORD)
        .options(quick.clone())
        .ignore_env()
        .connect()
        .await
        .expect("connect");
    let c = Client::new(Arc::new(backend), quick).expect("client");
    cluster.kill(0);
    let e = c
        .lock("gone")
        .expect("lock")
        .try_acquire()
        .await
        .expect_err("cluster down");
    assert_secret_free("cluster down", &e);

    // The builder's Debug.
    let b = EtcdBackend::builder(format!("etcds://root:{PASSWORD}@h")).password(WRONG);
    let d = format!("{b:?}");
    assert!(!d.contains("hunter2") && !d.contains("passw0rd"), "{d}");
}
