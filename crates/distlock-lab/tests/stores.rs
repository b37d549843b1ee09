//! `dlock seckill` and `dlock bench` on every backend with a store other than `file://` and
//! `redis://` (tests/seckill.rs, tests/bench.rs): the real program against real servers.
//! The tests of optional backends need the lab's cargo feature (CI: `--all-features`).

mod common;

use common::{bench_json, check_strategies, dlock, n, seckill_json, text};
use distlock_testkit::RedisServer;

/// `seckill --strategy all` (3 processes, 30 buyers, stock 10): the unlocked strategies
/// oversell, the others never do, and `lock` sells out.
fn seckill(backend: &str, scheme: &str) {
    check_strategies(&seckill_json(backend, &["--strategy", "all"]), scheme);
}

/// `bench --scenario contended --clients 4` for a second: no violation, no error.
fn bench(backend: &str, scheme: &str) {
    let v = bench_json(backend, &["--scenario", "contended", "--clients", "4"]);
    assert_eq!(v["backend"], scheme, "{v}");
    assert_eq!(v["scenario"], "contended", "{v}");
    assert!(n(&v, "ops") > 0, "{v}");
    assert_eq!(n(&v, "violations"), 0, "{v}");
    assert_eq!(n(&v, "errors"), 0, "{v}");
}

#[test]
fn redlock_store() {
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|r| format!("127.0.0.1:{}", r.port()))
        .collect();
    // Fresh servers are in Redlock's restart quarantine (default: a lease) for a while:
    // shorten it, and let it pass.
    let url = format!("redlock://{}?quarantine=500ms", hosts.join(","));
    std::thread::sleep(std::time::Duration::from_millis(700));
    seckill(&url, "redlock");
    bench(&url, "redlock");
    // The data lived on the first node only, and is gone; so are the locks' fencing
    // counters. (Lock keys themselves are the backend's business: a lease a failed attempt
    // left on a minority node expires with its TTL.)
    for (i, r) in nodes.iter().enumerate() {
        let left = r.command(&["KEYS", "*"]).expect("KEYS");
        for key in left.lines() {
            assert!(
                !key.starts_with("seckill:") && !key.starts_with("bench:"),
                "node {i} keeps store data `{key}`"
            );
            assert!(!key.ends_with(":fence"), "node {i} keeps `{key}`");
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_store() {
    let pg = distlock_testkit::PostgresServer::start().expect("postgres");
    seckill(&pg.url(), "postgres");
    bench(&pg.url(), "postgres");
    // The run's rows are gone; the tables stay.
    assert_eq!(
        pg.sql("SELECT count(*) FROM dlock_seckill_stock")
            .expect("sql")
            .trim(),
        "0"
    );
    assert_eq!(
        pg.sql("SELECT count(*) FROM dlock_seckill_orders")
            .expect("sql")
            .trim(),
        "0"
    );
    // Also in lease mode, with a namespace.
    let lease = format!("{}?mode=lease&namespace=shop", pg.url());
    seckill(&lease, "postgres");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_store() {
    let db = distlock_testkit::MariaDbServer::start().expect("mariadb");
    seckill(&db.url(), "mysql");
    bench(&db.url(), "mysql");
    assert_eq!(
        db.sql(&format!(
            "SELECT COUNT(*) FROM {}.dlock_seckill_stock",
            db.database()
        ))
        .expect("sql")
        .trim(),
        "0"
    );
    assert_eq!(
        db.sql(&format!(
            "SELECT COUNT(*) FROM {}.dlock_seckill_orders",
            db.database()
        ))
        .expect("sql")
        .trim(),
        "0"
    );
    let table = format!("{}?mode=table&namespace=shop", db.url());
    seckill(&table, "mysql");
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_store() {
    let cluster = distlock_testkit::EtcdCluster::start().expect("etcd");
    seckill(&cluster.url(), "etcd");
    bench(&cluster.url(), "etcd");
    // With a prefix of its own.
    seckill(&format!("{}/shop", cluster.url()), "etcd");
}

#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper_store() {
    let zk = distlock_testkit::ZkEnsemble::shared();
    seckill(&zk.url(), "zk");
    bench(&zk.url(), "zk");
    // Under a chroot that does not exist yet.
    seckill(&format!("{}/distlock-lab-stores", zk.url()), "zk");
}

#[test]
fn schemes_without_a_store_in_this_build() {
    let out = dlock("nope://x", &["seckill", "--json"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("nope://"),
        "{}",
        text(&out.stderr)
    );
    #[cfg(not(feature = "postgres"))]
    {
        let out = dlock("postgres://u@127.0.0.1:1/db", &["seckill", "--json"]);
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("--features postgres"),
            "{}",
            text(&out.stderr)
        );
    }
}
