//! Through the `dlock` facade (as the CLI uses it): `distlock::connect("etcd://…")`, URL errors,
//! an unreachable cluster, and authentication.

use distlock::{ClientOptions, Error};
use distlock_testkit::EtcdCluster;
use std::time::{Duration, Instant};

mod common;
use common::{hold_within, released};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_acquire_inspect_release() {
    let cluster = EtcdCluster::start().expect("cluster");
    let client = distlock::connect(&format!("{}/facade", cluster.url()))
        .await
        .expect("connect");
    assert_eq!(client.backend_kind(), "etcd");
    assert!(client.endpoint().contains("127.0.0.1"));
    let g = hold_within(&client, "report", Duration::from_secs(15), "acquire").await;
    let info = client.inspect("report").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, g.owner());
    assert_eq!(info.fencing_token, g.fencing_token());
    assert!(info.holders[0].lease_left.expect("lease") > Duration::from_secs(20));
    assert_eq!(info.waiters, Some(0));
    // One member is enough to reach the cluster; the prefix separates applications.
    let one = distlock::connect(&format!("{}/facade", cluster.member_url(2)))
        .await
        .expect("connect to one member");
    assert!(one.inspect("report").await.expect("inspect").held());
    let other_app = distlock::connect(&format!("{}/other", cluster.member_url(1)))
        .await
        .expect("connect");
    assert!(!other_app.inspect("report").await.expect("inspect").held());
    released(g).await;
    // Unsupported kinds are typed errors.
    let err = client
        .rw_lock("report")
        .expect("rw")
        .read()
        .try_acquire()
        .await
        .expect_err("rw");
    assert!(err.is_unsupported(), "{err}");
}

#[tokio::test]
async fn bad_urls_and_unreachable_clusters() {
    for (url, says) in [
        ("etcd://", "empty host"),
        ("etcd://h:99999", "port"),
        ("etcd://h:1?x=1", "unknown parameter `x`"),
        ("etcd://h:1?cacert=/ca.pem", "etcds://"),
    ] {
        let err = distlock::connect(url).await.expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let err = distlock::connect("etcd://u:secret@h:x")
        .await
        .expect_err("bad port");
    assert!(!err.to_string().contains("secret"), "{err}");
    // Nothing listens there: a connection error, quickly.
    let port = distlock_testkit::free_port();
    let t = Instant::now();
    let opts = ClientOptions::default().connect_timeout(Duration::from_millis(500));
    let err = distlock::connect_with(&format!("etcd://127.0.0.1:{port}"), opts)
        .await
        .expect_err("nothing listens");
    assert!(err.is_connection(), "{err:?}");
    assert!(err.to_string().contains(&port.to_string()), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password() {
    let cluster = EtcdCluster::start_with_members(1).expect("cluster");
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("admin");
    admin.user_add("root", "s3cret", None).await.expect("user");
    admin.role_add("root").await.expect("role");
    admin.user_grant_role("root", "root").await.expect("grant");
    admin.auth_enable().await.expect("auth enable");
    let url = cluster.url().replace("etcd://", "etcd://root:s3cret@");
    let client = distlock::connect(&url)
        .await
        .expect("connect with credentials");
    let g = client
        .lock("secured")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    released(g).await;
    let wrong = cluster.url().replace("etcd://", "etcd://root:wrong@");
    let err = distlock::connect(&wrong).await.expect_err("wrong password");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(!err.to_string().contains("wrong"), "{err}");
    let anonymous = distlock::connect(&cluster.url()).await;
    match anonymous {
        Err(e) => assert!(matches!(e, Error::Auth { .. }), "{e:?}"),
        Ok(c) => {
            let e = c
                .lock("secured")
                .expect("lock")
                .try_acquire()
                .await
                .expect_err("no user");
            assert!(matches!(e, Error::Auth { .. }), "{e:?}");
        }
    }
}
