//! `DLOCK_ZK_USER`, `DLOCK_ZK_PASSWORD` and `DLOCK_ZK_PASSWORD_FILE` against a real ZooKeeper
//! node with a digest-protected chroot, through the facade (as the CLI connects). A binary of
//! its own with a single test: it sets the process's environment.

use distlock_testkit::ZkEnsemble;
use distlock_zookeeper::{PASSWORD_ENV, PASSWORD_FILE_ENV, USER_ENV};
use std::time::Duration;

mod common;
use common::{hold_within, released};

const PASSWORD: &str = "hunter2-Ÿ-s3cret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_from_the_environment() {
    let e = ZkEnsemble::start_with(1).expect("start ZooKeeper");
    e.protect("/secure", "shop", PASSWORD)
        .await
        .expect("protect");
    // acl=creator: nodes made with acl=open would let any identity in (ZooKeeper checks a
    // node's own ACL, not its ancestors').
    let url = format!("zk://{}/secure?acl=creator", e.connect_string());
    std::env::set_var(USER_ENV, "shop");
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
    let err = distlock::connect(&url)
        .await
        .map(|_| ())
        .expect_err("env user nobody");
    assert!(matches!(err, distlock::Error::Auth { .. }), "{err:?}");
    let in_url = url.replace("zk://", "zk://shop:hunter2-%C5%B8-s3cret@");
    distlock::connect(&in_url).await.expect("URL credentials");
}
