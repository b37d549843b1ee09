//! `dlock seckill` and `dlock bench` on every backend with a store other than `file://` and
//! `redis://` (tests/seckill.rs, tests/bench.rs): the real binary against real servers.
//! The tests of optional backends need the CLI's cargo feature (CI: `--all-features`).

use distlock_testkit::RedisServer;
use serde_json::Value;
use std::process::{Command, Output};

fn dlock(backend: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .arg("--backend")
        .arg(backend)
        .args(args)
        .env_remove("DLOCK_BACKEND")
        .output()
        .expect("run dlock")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn success(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not a count in {v}"))
}

/// `seckill --strategy all` (3 processes, 30 buyers, stock 10): the unlocked strategies
/// oversell, the others never do, and `lock` sells out.
fn seckill(backend: &str, scheme: &str) {
    let out = dlock(
        backend,
        &[
            "seckill",
            "--json",
            "--strategy",
            "all",
            "--stock",
            "10",
            "--buyers",
            "30",
            "--processes",
            "3",
            "--work-ms",
            "30",
        ],
    );
    let rows: Vec<Value> = success(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("`{l}`: {e}")))
        .collect();
    assert_eq!(rows.len(), 5, "{rows:?}");
    let row = |s: &str| {
        rows.iter()
            .find(|r| r["strategy"] == s)
            .unwrap_or_else(|| panic!("no row for {s} in {rows:?}"))
    };
    for r in &rows {
        assert_eq!(r["backend"], scheme, "{r}");
        assert_eq!(n(r, "sold") + n(r, "failed"), 30, "{r}");
    }
    for s in ["none", "local"] {
        let r = row(s);
        assert!(n(r, "oversold") > 0, "{s} should oversell: {r}");
        assert_eq!(n(r, "oversold"), n(r, "sold").saturating_sub(10), "{r}");
    }
    for s in ["optimistic", "trylock", "lock"] {
        let r = row(s);
        assert_eq!(n(r, "oversold"), 0, "{s} must never oversell: {r}");
        assert!(n(r, "sold") <= 10, "{r}");
    }
    let lock = row("lock");
    assert_eq!(n(lock, "sold"), 10, "lock sells out: {lock}");
    assert_eq!(n(lock, "failed"), 20, "{lock}");
}

/// `bench --scenario contended --clients 4` for a second: no violation, no error.
fn bench(backend: &str, scheme: &str) {
    let out = dlock(
        backend,
        &[
            "bench",
            "--scenario",
            "contended",
            "--clients",
            "4",
            "--duration",
            "1s",
            "--json",
        ],
    );
    let stdout = success(&out);
    let v: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: `{stdout}`"));
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
    seckill(&format!("{}/distlock-cli-stores", zk.url()), "zk");
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
