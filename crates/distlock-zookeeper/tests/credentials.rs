//! Digest credentials against a real ZooKeeper node with a digest superuser and a chroot only
//! one digest user may enter: missing and wrong credentials refused with typed errors, the
//! right ones lock, `acl=creator` keeps another identity off dlock's nodes (it cannot delete
//! or change the holder's node), the application's connector (`from_connector`), and a
//! password that never shows in any error's `Display` or `Debug`.

use distlock_core::{Client, ClientOptions, Error, LockKind};
use distlock_testkit::ZkEnsemble;
use distlock_zookeeper::{zookeeper_client as zk, NodeAcl, ZkBackend};
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{hold_within, released};

const USER: &str = "shop";
const PASSWORD: &str = "hunter2-Ÿ-s3cret";
const WRONG: &str = "wrong-Ÿ-passw0rd";
const SUPER: &str = "super-Ÿ-passw0rd";

/// A one-node ensemble with a superuser, and `/secure` that only `shop` may enter.
async fn secured() -> ZkEnsemble {
    let e = ZkEnsemble::start_with_superuser(1, SUPER).expect("start ZooKeeper");
    e.protect("/secure", USER, PASSWORD).await.expect("protect");
    e
}

fn url(e: &ZkEnsemble, path: &str) -> String {
    format!("zk://{}{path}", e.connect_string())
}

/// No text of `e` (`Display`, `Debug`, every source's) shows a password or part of one.
fn assert_secret_free(what: &str, e: &Error) {
    for secret in [PASSWORD, WRONG, SUPER, "hunter2", "passw0rd"] {
        distlock_testkit::tls_cases::assert_hides(what, e, secret);
    }
}

async fn connect_err(b: distlock_zookeeper::ZkBuilder) -> Error {
    match b.ignore_env().connect().await {
        Ok(_) => panic!("connected"),
        Err(e) => e,
    }
}

async fn client(b: distlock_zookeeper::ZkBuilder) -> Client {
    let backend = b.ignore_env().connect().await.expect("connect");
    Client::new(Arc::new(backend), ClientOptions::default()).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_without_or_with_wrong_credentials() {
    let e = secured().await;
    let u = url(&e, "/secure");

    let err = connect_err(ZkBackend::builder(&u)).await;
    println!("no credentials: {err}");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(err.to_string().contains("DLOCK_ZK_USER"), "{err}");
    assert_secret_free("no credentials", &err);

    let err = connect_err(ZkBackend::builder(&u).credentials(USER, WRONG)).await;
    println!("wrong password: {err}");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(err.to_string().contains("check the password"), "{err}");
    assert_secret_free("wrong password (builder)", &err);
    let in_url = u.replace("zk://", "zk://shop:wrong-%C5%B8-passw0rd@");
    let err = connect_err(ZkBackend::builder(&in_url)).await;
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert_secret_free("wrong password (URL)", &err);
    let err = distlock::connect(&in_url)
        .await
        .map(|_| ())
        .expect_err("facade refuses");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert_secret_free("wrong password (facade)", &err);

    // The right ones, from the builder, the URL and a file.
    let a = client(ZkBackend::builder(&u).credentials(USER, PASSWORD)).await;
    let g = hold_within(&a, "secured", Duration::from_secs(15), "acquire").await;
    let dir = distlock_testkit::TempDir::new().expect("dir");
    let file = dir.path().join("password");
    std::fs::write(&file, format!("{PASSWORD}\n")).expect("write");
    let b = client(ZkBackend::builder(u.replace("zk://", "zk://shop@")).password_file(&file)).await;
    assert!(b
        .lock("secured")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    released(g).await;
    let in_url = u.replace("zk://", "zk://shop:hunter2-%C5%B8-s3cret@");
    let c = client(ZkBackend::builder(&in_url)).await;
    released(hold_within(&c, "secured", Duration::from_secs(15), "URL credentials").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_acl_keeps_other_identities_off() {
    let e = secured().await;
    // A chroot everybody may enter: only the nodes' own ACL protects them.
    let u = url(&e, "/open?acl=creator");
    let holder = client(ZkBackend::builder(&u).credentials(USER, PASSWORD)).await;
    let g = hold_within(&holder, "mine", Duration::from_secs(15), "acquire").await;
    let token = g.fencing_token();

    let dir = format!(
        "/open{}",
        distlock_zookeeper::lock_dir("dlock", "mine", LockKind::Mutex).expect("dir")
    );
    let su = e
        .client(0, Some(("super", SUPER)))
        .await
        .expect("superuser");
    let nodes = su.list_children(&dir).await.expect("list as superuser");
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let node = format!("{dir}/{}", nodes[0]);
    let (acl, _) = su.get_acl(&node).await.expect("acl");
    println!("ACL of {node}: {acl:?}");
    assert!(acl.iter().all(|a| a.scheme() == "digest"), "{acl:?}");

    // Another identity, and none: no delete, no change, no read, no queueing.
    for auth in [Some(("mallory", WRONG)), Some((USER, WRONG)), None] {
        let other = e.client(0, auth).await.expect("other session");
        let del = other.delete(&node, None).await;
        println!("{auth:?} deletes {node}: {del:?}");
        assert_eq!(del, Err(zk::Error::NoAuth), "{auth:?}");
        let set = other.set_data(&node, b"stolen", None).await.map(|_| ());
        assert_eq!(set, Err(zk::Error::NoAuth), "{auth:?}");
        let list = other.list_children(&dir).await.map(|_| ());
        assert_eq!(list, Err(zk::Error::NoAuth), "{auth:?}");
    }
    // Through dlock, another identity is refused (at connect: it cannot read the namespace
    // node dlock made), not given the lock.
    let err = connect_err(ZkBackend::builder(&u).credentials("mallory", WRONG)).await;
    println!("another identity through dlock: {err}");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert_secret_free("another identity", &err);

    // `doctor` says who owns the nodes.
    let findings = holder.diagnose().await.expect("diagnose");
    let auth = findings
        .iter()
        .find(|f| f.check == "auth")
        .expect("auth finding");
    assert!(auth.message.contains("acl=creator"), "{auth:?}");

    // Still held, by the same token; the same identity in another session queues.
    assert!(!g.is_lost());
    let same = client(ZkBackend::builder(&u).credentials(USER, PASSWORD)).await;
    assert!(same
        .lock("mine")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert_eq!(g.fencing_token(), token);
    released(g).await;
    released(hold_within(&same, "mine", Duration::from_secs(15), "after release").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_applications_connector() {
    let e = secured().await;
    let opts = ClientOptions::default().namespace("locks");
    let cluster = format!("{}/secure", e.connect_string());
    let connector =
        zk::Client::connector().with_auth("digest", format!("{USER}:{PASSWORD}").as_bytes());
    let backend = ZkBackend::from_connector(connector, &cluster, NodeAcl::Creator, &opts)
        .await
        .expect("from_connector");
    assert_eq!(backend.base_path(), "/secure/locks");
    let a = Client::new(Arc::new(backend), opts.clone()).expect("client");
    let g = hold_within(&a, "byo", Duration::from_secs(15), "acquire").await;
    let su = e
        .client(0, Some(("super", SUPER)))
        .await
        .expect("superuser");
    let dir = format!(
        "/secure{}",
        distlock_zookeeper::lock_dir("locks", "byo", LockKind::Mutex).expect("dir")
    );
    assert_eq!(
        su.list_children(&dir).await.expect("list").len(),
        1,
        "{dir}"
    );
    released(g).await;

    // A connector without the credentials: refused at connect, naming what is missing.
    let err =
        match ZkBackend::from_connector(zk::Client::connector(), &cluster, NodeAcl::Open, &opts)
            .await
        {
            Ok(_) => panic!("connected without credentials"),
            Err(e) => e,
        };
    println!("connector without credentials: {err}");
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(err.to_string().contains("connector"), "{err}");

    // A scheme the server refuses: it answers AuthFailed and closes the session.
    let started = std::time::Instant::now();
    let refused = zk::Client::connector().with_auth("no-such-scheme", b"x");
    let err = match ZkBackend::from_connector(refused, &cluster, NodeAcl::Open, &opts).await {
        Ok(_) => panic!("connected with a refused scheme"),
        Err(e) => e,
    };
    println!("refused scheme after {:?}: {err}", started.elapsed());
    assert!(matches!(err, Error::Auth { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_shows_the_password() {
    let mut e = secured().await;
    let u = url(&e, "/secure");
    let quick = ClientOptions::default()
        .connect_timeout(Duration::from_millis(800))
        .op_timeout(Duration::from_millis(800));

    // Half the credentials, a missing file, acl=creator without them, a bad URL.
    let err = connect_err(ZkBackend::builder(&u).password(PASSWORD)).await;
    assert!(err.is_invalid_argument(), "{err:?}");
    assert_secret_free("password without user", &err);
    let err = connect_err(
        ZkBackend::builder(u.replace("zk://", "zk://shop@")).password_file("/nonexistent/pw"),
    )
    .await;
    assert!(err.to_string().contains("/nonexistent/pw"), "{err}");
    let err = connect_err(ZkBackend::builder(format!("{u}?acl=creator"))).await;
    assert!(err.is_invalid_argument(), "{err:?}");
    let bad = format!("zk://shop:{PASSWORD}@127.0.0.1:x/secure");
    let err = connect_err(ZkBackend::builder(&bad)).await;
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert_secret_free("bad URL", &err);
    let bad = format!("zk://shop:{PASSWORD}@127.0.0.1/secure?acl=all");
    assert_secret_free("bad acl", &connect_err(ZkBackend::builder(&bad)).await);
    let b = ZkBackend::builder(format!("zk://shop:{PASSWORD}@h")).password(WRONG);
    let d = format!("{b:?}");
    assert!(!d.contains("hunter2") && !d.contains("passw0rd"), "{d}");

    // Nothing listening, with the right credentials.
    let nothing = format!("zk://127.0.0.1:{}/secure", distlock_testkit::free_port());
    let err = connect_err(
        ZkBackend::builder(&nothing)
            .credentials(USER, PASSWORD)
            .options(quick.clone()),
    )
    .await;
    assert!(err.is_connection(), "{err:?}");
    assert_secret_free("nothing listens", &err);

    // A call on a connected backend whose ensemble went away.
    let backend = ZkBackend::builder(&u)
        .credentials(USER, PASSWORD)
        .options(quick.clone())
        .ignore_env()
        .connect()
        .await
        .expect("connect");
    let c = Client::new(Arc::new(backend), quick).expect("client");
    let g = hold_within(&c, "gone", Duration::from_secs(15), "acquire").await;
    e.kill(0);
    let err = c
        .lock("gone2")
        .expect("lock")
        .try_acquire()
        .await
        .expect_err("ensemble down");
    assert_secret_free("ensemble down", &err);
    let lost = tokio::time::timeout(Duration::from_secs(20), g.lost())
        .await
        .expect("lost signal");
    let text = format!("{lost:?} {lost}");
    assert!(
        !text.contains("hunter2") && !text.contains("passw0rd"),
        "{text}"
    );
}

/// ZooKeeper keeps a session's identity on its connection: after the driver reconnects (same
/// session) and after a new session (the old one expired while cut off), dlock's calls must
/// authenticate again, or the holder could not delete its own node in a creator-owned
/// directory. Both are proved through a proxy that resets, then blackholes, the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_and_new_sessions_authenticate_again() {
    let e = secured().await;
    let proxy = distlock_testkit::DelayProxy::start(e.addr(0), Duration::ZERO).expect("proxy");
    let session = Duration::from_secs(6);
    let cut = format!(
        "zk://127.0.0.1:{}/secure?acl=creator&session_timeout=6s",
        proxy.port()
    );
    let opts = ClientOptions::default().watchdog_lease(session);
    let backend = ZkBackend::builder(&cut)
        .credentials(USER, PASSWORD)
        .options(opts.clone())
        .ignore_env()
        .connect()
        .await
        .expect("connect");
    let first_session = backend.session_id();
    let holder = Client::new(Arc::new(backend.clone()), opts).expect("client");

    // The connection reset under a hold: the driver reconnects within the session.
    let g = hold_within(&holder, "reauth", Duration::from_secs(15), "acquire").await;
    proxy.reset_all();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !g.is_lost(),
        "a reset connection within the session lost the hold"
    );
    released(g).await;
    let stats = proxy.stats();
    assert!(stats.resets >= 1 && stats.connections >= 2, "{stats:?}");
    assert_eq!(
        backend.session_id(),
        first_session,
        "a new session after a reset"
    );
    let g = hold_within(
        &holder,
        "reauth",
        Duration::from_secs(15),
        "after the reset",
    )
    .await;

    // Cut off past the session timeout: the hold is lost and the session expires; the next
    // call opens a new session, which must authenticate to queue in the creator-owned dir.
    proxy.set_blackhole(true);
    let reason = tokio::time::timeout(Duration::from_secs(20), g.lost())
        .await
        .expect("lost signal");
    println!("cut off: {reason:?}");
    tokio::time::sleep(session + Duration::from_secs(1)).await;
    proxy.set_blackhole(false);
    let g2 = hold_within(&holder, "reauth", Duration::from_secs(20), "new session").await;
    assert_ne!(backend.session_id(), first_session, "still the old session");
    assert!(g2.fencing_token() > g.fencing_token());
    released(g2).await;
}
