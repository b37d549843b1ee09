//! `DLOCK_REDIS_PASSWORD`, `DLOCK_REDIS_PASSWORD_FILE` and `DLOCK_REDIS_USER`. One test
//! function: the environment belongs to the process.

use distlock_redis::{RedisBackend, PASSWORD_ENV, PASSWORD_FILE_ENV, USER_ENV};
use distlock_testkit::tls_cases::{assert_hides, client_options, fails, works};
use distlock_testkit::{RedisOptions, RedisServer};

const SECRET: &str = "env-s3cret";

#[tokio::test]
async fn password_from_the_environment() {
    let s = RedisServer::start_with(RedisOptions {
        password: Some(SECRET.into()),
        acl_user: Some(("locks".into(), SECRET.into())),
        ..Default::default()
    })
    .expect("redis with a password");
    let url = format!("redis://127.0.0.1:{}", s.port());
    std::env::set_var(PASSWORD_ENV, SECRET);
    works(RedisBackend::connect(&url, &client_options()).await).await;
    std::env::set_var(USER_ENV, "locks");
    works(RedisBackend::connect(&url, &client_options()).await).await;
    std::env::remove_var(USER_ENV);
    // ignore_env: no password, refused.
    let e = fails(
        RedisBackend::builder(url.as_str())
            .ignore_env()
            .options(client_options())
            .connect()
            .await,
    );
    assert!(matches!(e, distlock_core::Error::Auth { .. }), "{e:?}");
    // The file named by DLOCK_REDIS_PASSWORD_FILE, when DLOCK_REDIS_PASSWORD is unset.
    std::env::remove_var(PASSWORD_ENV);
    let dir = distlock_testkit::TempDir::new().expect("tempdir");
    let file = dir.path().join("pw");
    std::fs::write(&file, format!("{SECRET}\n")).expect("write");
    std::env::set_var(PASSWORD_FILE_ENV, &file);
    works(RedisBackend::connect(&url, &client_options()).await).await;
    std::env::set_var(PASSWORD_FILE_ENV, dir.path().join("missing"));
    let e = fails(RedisBackend::connect(&url, &client_options()).await);
    assert!(e.to_string().contains(PASSWORD_FILE_ENV), "{e}");
    // A wrong password from the environment is not shown either.
    std::env::remove_var(PASSWORD_FILE_ENV);
    std::env::set_var(PASSWORD_ENV, "env-wr0ng");
    let e = fails(RedisBackend::connect(&url, &client_options()).await);
    assert_hides("wrong password from the environment", &e, "env-wr0ng");
}
