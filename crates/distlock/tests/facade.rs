//! The facade: `connect(url)` for every built backend, and the blocking API.

use distlock::{ClientOptions, Error, ReleaseOutcome};
use distlock_testkit::{RedisServer, TempDir};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_by_url() {
    let server = RedisServer::start().expect("redis");
    let dir = TempDir::new().expect("tmp");
    for url in [server.url(), format!("file://{}", dir.path().display())] {
        let client = distlock::connect(&url).await.expect("connect");
        let g = client
            .lock("facade")
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        assert!(g.fencing_token() >= 1);
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

#[tokio::test]
async fn bad_urls() {
    let mut cases = vec![
        ("localhost:6379", "no scheme"),
        ("nope://x", "unknown scheme"),
        ("redis://h?x=1", "unknown parameter"),
        ("file://relative/dir", "file:///"),
    ];
    if cfg!(not(feature = "tls")) {
        cases.push(("rediss://h", "tls"));
    }
    for (url, want) in cases {
        let err = distlock::connect(url).await.expect_err(url);
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains(want), "{url}: {err}");
    }
    let err = distlock::connect_with(
        "redis://127.0.0.1:1",
        ClientOptions::default().watchdog_lease(Duration::from_millis(5)),
    )
    .await
    .expect_err("short lease");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[test]
fn blocking_api() {
    let server = RedisServer::start().expect("redis");
    let client = distlock::blocking::connect(&server.url()).expect("connect");
    let other = distlock::blocking::connect(&server.url()).expect("connect");
    let lock = client.lock("nightly").expect("lock");
    let g = lock.acquire().expect("acquire");
    assert!(!g.is_lost());
    assert!(other
        .lock("nightly")
        .expect("lock")
        .try_acquire()
        .expect("try")
        .is_none());
    let err = other
        .lock("nightly")
        .expect("lock")
        .acquire_timeout(Duration::from_millis(200))
        .expect_err("held");
    assert!(err.is_timeout());
    let info = other.inspect("nightly").expect("inspect");
    assert_eq!(info.holders[0].owner, lock.owner_id());
    assert_eq!(g.release().expect("release"), ReleaseOutcome::Released);
    let g = other
        .lock("nightly")
        .expect("lock")
        .try_acquire()
        .expect("try")
        .expect("free");
    drop(g); // released in the background
    let g = client
        .lock("nightly")
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .expect("acquire after drop");
    assert_eq!(g.release().expect("release"), ReleaseOutcome::Released);
}

#[tokio::test]
async fn blocking_api_refuses_async_context() {
    let err = distlock::blocking::connect("redis://127.0.0.1:1").expect_err("must refuse");
    assert!(matches!(err, Error::Runtime(_)), "{err:?}");
}

#[tokio::test]
async fn unknown_scheme_lists_the_built_ones() {
    let err = distlock::connect("nope://u:hunter2@h:1")
        .await
        .expect_err("unknown");
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(text.contains("unknown scheme `nope`"), "{text}");
    for scheme in distlock::registry().schemes() {
        assert!(text.contains(&format!("{scheme}://")), "{scheme}: {text}");
    }
    assert!(text.contains("nope://u:***@h:1"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn not_built_scheme_names_the_feature() {
    // Whatever this build has: every scheme of a missing feature says which one to enable.
    let registry = distlock::default_registry();
    for (scheme, feature) in registry.not_built() {
        let url = format!("{scheme}://u:hunter2@h/x");
        let text = distlock::connect(&url).await.expect_err(&url).to_string();
        assert!(
            text.contains(&format!("enable the `{feature}` cargo feature")),
            "{url}: {text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
    assert_eq!(
        registry.is_built("postgres"),
        cfg!(feature = "postgres"),
        "{registry:?}"
    );
    // And in a build without PostgreSQL (a registry standing for one):
    let mut without = distlock::default_registry();
    without
        .register_not_built("postgres", "postgres")
        .expect("scheme");
    let err = without
        .connect(
            "postgres://app:hunter2@db:5432/app",
            ClientOptions::default(),
        )
        .await
        .expect_err("not built");
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(
        text.contains("the postgres:// backend is not built into this program")
            && text.contains("enable the `postgres` cargo feature of distlock"),
        "{text}"
    );
    assert!(text.contains("postgres://app:***@db:5432/app"), "{text}");
    let text = without
        .connect("cassandra://h", ClientOptions::default())
        .await
        .expect_err("unknown")
        .to_string();
    assert!(text.contains("postgres:// (feature `postgres`)"), "{text}");
}

/// Every backend, built or not, with a bad URL or a closed port: no message and no `Debug`
/// shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_is_never_printed() {
    const PW: &str = "hunter2-s3cret";
    let urls = [
        format!("redis://u:{PW}@127.0.0.1:1"),
        format!("redis://u:{PW}@h:x"),
        format!("redis://u:{PW}@h?nope=1"),
        format!("rediss://u:{PW}@127.0.0.1:1"),
        format!("redlock://u:{PW}@127.0.0.1:1,127.0.0.1:2"),
        format!("redlock://u:{PW}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?nope=1"),
        format!("etcd://u:{PW}@h?x=1"),
        format!("etcds://u:{PW}@h"),
        format!("zk://u:{PW}@h"),
        format!("postgres://u:{PW}@h/db?nope=1"),
        format!("postgres://u@h/db?password={PW}&mode=x"),
        format!("postgresql://u:{PW}@127.0.0.1:1/db"),
        format!("mysql://u:{PW}@h/db?mode=x"),
        format!("mysql://u:{PW}@127.0.0.1:1/db"),
        format!("file://u:{PW}@host/x"),
        format!("nope://u:{PW}@h"),
        format!("u:{PW}@h:1"),
        format!("redis://u:{PW}@[::1"),
        "redis://u:hunter2/s3cret@h".to_owned(),
        "redis://u:hunter2?s3cret@h".to_owned(),
    ];
    let opts = ClientOptions::default()
        .connect_timeout(Duration::from_millis(300))
        .op_timeout(Duration::from_millis(300));
    for url in &urls {
        let err = match distlock::connect_with(url, opts.clone()).await {
            Ok(_) => panic!("{url} connected"),
            Err(e) => e,
        };
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(
                !text.contains(PW) && !text.contains("s3cret"),
                "{url}: {text}"
            );
        }
    }
}

#[cfg(feature = "file")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheme_of_ones_own() {
    let dir = TempDir::new().expect("tmp");
    let base = format!("file://{}", dir.path().display());
    // `applocks://` = the file backend in this test's directory, the path a subdirectory.
    let root = base.clone();
    distlock::register("AppLocks", move |url, opts| {
        let dir = format!("{root}{}", url.raw_path());
        async move {
            if let Some(k) = url.params().first().map(|(k, _)| k.clone()) {
                return Err(url.invalid(format!("unknown parameter `{k}`")));
            }
            distlock::file::FileBackend::from_url(&dir, &opts)
        }
    })
    .expect("register");
    assert!(distlock::registry().is_built("applocks"));
    assert!(distlock::register("no scheme", |_, _| async {
        Err::<distlock::file::FileBackend, _>(Error::invalid("never"))
    })
    .is_err());

    std::fs::create_dir_all(dir.path().join("jobs")).expect("mkdir");
    let mine = distlock::connect("applocks:///jobs")
        .await
        .expect("connect");
    let same = distlock::connect(&format!("{base}/jobs"))
        .await
        .expect("connect");
    assert_eq!(mine.backend_kind(), same.backend_kind());
    let g = mine
        .lock("nightly")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let info = same.inspect("nightly").await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.fencing_token, g.fencing_token());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let err = distlock::connect("applocks:///jobs?x=1")
        .await
        .expect_err("parameter");
    assert!(err.to_string().contains("unknown parameter `x`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_by_url() {
    let cluster = distlock_testkit::RedisCluster::start_with(3, 0).expect("cluster");
    let client = distlock::connect(&cluster.url()).await.expect("connect");
    for name in ["a", "b", "c", "d", "e", "f"] {
        let g = client
            .lock(name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let port = cluster.servers()[0].port();
    let err = distlock::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect_err("a cluster node behind redis://");
    assert!(err.to_string().contains("redis+cluster://"), "{err}");
}
