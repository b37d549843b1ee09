//! Credentials outside the URL (builder, password file) and the application's own client,
//! against real redis-servers; no error shows the password.

use distlock_core::{ClientOptions, Error};
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{self, ServerHarness};
use distlock_testkit::tls_cases::{assert_hides, client_options, fails, works};
use distlock_testkit::{RedisOptions, RedisServer};

const SECRET: &str = "s3cret-Pa55word";
const WRONG: &str = "wr0ng-Pa55word";

fn with_password() -> RedisServer {
    RedisServer::start_with(RedisOptions {
        password: Some(SECRET.into()),
        acl_user: Some(("locks".into(), SECRET.into())),
        ..Default::default()
    })
    .expect("redis with a password")
}

fn plain_url(s: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}", s.port())
}

fn password_file(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let p = dir.join("redis-password");
    std::fs::write(&p, format!("{text}\n")).expect("write password file");
    p
}

#[tokio::test]
async fn builder_password_user_and_file() {
    let s = with_password();
    let b = || {
        RedisBackend::builder(plain_url(&s))
            .ignore_env()
            .options(client_options())
    };
    works(b().password(SECRET).connect().await).await;
    works(b().user("locks").password(SECRET).connect().await).await;
    let dir = distlock_testkit::TempDir::new().expect("tempdir");
    works(
        b().password_file(password_file(dir.path(), SECRET))
            .connect()
            .await,
    )
    .await;
    // The builder's password wins over the URL's.
    let url = format!("redis://:{WRONG}@127.0.0.1:{}", s.port());
    works(
        RedisBackend::builder(url)
            .ignore_env()
            .options(client_options())
            .password(SECRET)
            .connect()
            .await,
    )
    .await;
}

#[tokio::test]
async fn no_error_shows_the_password() {
    let s = with_password();
    let dir = distlock_testkit::TempDir::new().expect("tempdir");
    let file = password_file(dir.path(), WRONG);
    let b = |url: String| {
        RedisBackend::builder(url)
            .ignore_env()
            .options(client_options())
    };
    let cases = [
        (
            "wrong password in the URL",
            b(format!("redis://:{WRONG}@127.0.0.1:{}", s.port())),
        ),
        (
            "wrong password from the builder",
            b(plain_url(&s)).password(WRONG),
        ),
        (
            "wrong user password from the builder",
            b(plain_url(&s)).user("locks").password(WRONG),
        ),
        (
            "wrong password from a file",
            b(plain_url(&s)).password_file(&file),
        ),
    ];
    for (what, builder) in cases {
        let shown = format!("{builder:?}");
        assert!(!shown.contains(WRONG), "{what}: builder Debug {shown}");
        let e = fails(builder.connect().await);
        assert!(matches!(e, Error::Auth { .. }), "{what}: {e:?}");
        assert_hides(what, &e, WRONG);
    }
    // No password at all: refused, and the message says so.
    let e = fails(b(plain_url(&s)).connect().await);
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    // A server that is not there, with the password from the builder and from the URL.
    let port = distlock_testkit::free_port();
    for builder in [
        b(format!("redis://127.0.0.1:{port}")).password(SECRET),
        b(format!("redis://:{SECRET}@127.0.0.1:{port}")),
        b(format!("redis://:{SECRET}@127.0.0.1:{port}?bogus=1")),
        b(format!("redis://127.0.0.1:{port}")).user("nobody"),
    ] {
        let e = fails(builder.connect().await);
        assert_hides("server down", &e, SECRET);
    }
}

#[tokio::test]
async fn user_without_password_is_refused_before_connecting() {
    let e = fails(
        RedisBackend::builder("redis://locks@127.0.0.1:1")
            .ignore_env()
            .connect()
            .await,
    );
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("DLOCK_REDIS_PASSWORD"), "{e}");
}

async fn app_backend(url: String, o: ClientOptions) -> distlock_core::Result<RedisBackend> {
    let client = redis::Client::open(url.as_str()).expect("app client");
    let manager = client
        .get_connection_manager()
        .await
        .expect("app connection manager");
    RedisBackend::from_connection_manager(manager, client, &o).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_connection_manager() {
    let server = RedisServer::start_with(RedisOptions {
        password: Some(SECRET.into()),
        ..Default::default()
    })
    .expect("redis");
    let h = ServerHarness::new(server, RedisServer::url, app_backend);
    conformance::mutual_exclusion(&h).await;
    conformance::reentrancy(&h).await;
    conformance::fencing_tokens_increase(&h).await;
    conformance::waiter_woken_by_release(&h).await;
    conformance::watchdog_renews(&h).await;
}

#[tokio::test]
async fn the_applications_client_with_namespace_and_replicas() {
    let master = RedisServer::start().expect("master");
    let _replica = RedisServer::start_replica_of(&master).expect("replica");
    let opts = client_options().namespace("app");
    let b = app_backend(master.url(), opts.clone())
        .await
        .expect("backend")
        .with_wait_replicas(1, std::time::Duration::from_millis(500), &opts)
        .expect("wait replicas");
    works(Ok(b)).await;
    let keys = master.command(&["KEYS", "app:*"]).expect("KEYS");
    assert!(keys.contains("app:{"), "{keys}");
    let bad = ClientOptions::default().namespace("a{b");
    let e = fails(app_backend(master.url(), bad).await);
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}
