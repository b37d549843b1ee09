//! `DLOCK_ETCD_USER`, `DLOCK_ETCD_PASSWORD` and `DLOCK_ETCD_PASSWORD_FILE` against a real etcd
//! with authentication enabled, through the facade (as the CLI connects). A binary of its own
//! with a single test: it sets the process's environment.

use distlock_etcd::{PASSWORD_ENV, PASSWORD_FILE_ENV, USER_ENV};
use std::time::Duration;

mod common;
use common::{hold_within, released, secured, PASSWORD};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_from_the_environment() {
    let cluster = secured().await;
    let url = cluster.url();
    std::env::set_var(USER_ENV, "root");
    std::env::set_var(PASSWORD_ENV, PASSWORD);
    let c = distlock::connect(&url)
        .await
        .expect("env user and password");
    released(hold_within(&c, "env", Duration::from_secs(15), "acquire").await).await;

    let dir = distlock_testkit::TempDir::new().expect("dir");
    let file = dir.path().join("pw");
    std::fs::write(&file, format!("{PASSWORD}\n")).expect("write");
    std::env::remove_var(PASSWORD_ENV);
    std::env::set_var(PASSWORD_FILE_ENV, &file);
    let c = distlock::connect(&url).await.expect("env password file");
    released(hold_within(&c, "env", Duration::from_secs(15), "acquire").await).await;

    // The URL's user and password win over the environment's.
    std::env::set_var(USER_ENV, "nobody");
    let e = distlock::connect(&url)
        .await
        .map(|_| ())
        .expect_err("env user nobody");
    assert!(matches!(e, distlock::Error::Auth { .. }), "{e:?}");
    let in_url = url.replace("etcds://", "etcds://root:hunter2-%C5%B8-s3cret@");
    distlock::connect(&in_url).await.expect("URL credentials");
}
