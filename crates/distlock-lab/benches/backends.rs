//! `cargo bench -p distlock-lab --all-features --bench backends`: `dlock bench` on every backend
//! built in, each on real servers started here, in one run, with ratios to Redis measured in
//! the same run (the machine is shared and noisy: compare ratios, not absolute figures).
//!
//! `-- --quick` measures 1 s per scenario instead of 3 s.

use distlock_testkit::RedisServer;
use serde_json::Value;
use std::process::Command;

fn bench(url: &str, args: &[&str], secs: &str) -> Option<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-lab"))
        .env("DLOCK_BACKEND", url)
        .args(["bench", "--json", "--duration", secs])
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "{url} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn main() {
    let secs = if std::env::args().any(|a| a == "--quick") {
        "1s"
    } else {
        "3s"
    };
    let dir = distlock_testkit::TempDir::new().expect("temp dir");
    let redis = RedisServer::start().expect("redis-server");
    let nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    let redlock = format!(
        "redlock://{}?quarantine=100ms",
        nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    // Fresh nodes are in restart quarantine for its length.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Pushed to by the optional backends' features.
    #[allow(unused_mut)]
    let mut backends: Vec<(String, String)> = vec![
        ("redis".into(), redis.url()),
        ("redlock (3 nodes)".into(), redlock),
        ("file".into(), format!("file://{}", dir.path().display())),
    ];
    #[cfg(feature = "etcd")]
    let etcd = distlock_testkit::EtcdCluster::start().expect("etcd cluster");
    #[cfg(feature = "etcd")]
    backends.push(("etcd (3 members)".into(), etcd.url()));
    #[cfg(feature = "zookeeper")]
    let zk = distlock_testkit::ZkEnsemble::start().expect("zookeeper ensemble");
    #[cfg(feature = "zookeeper")]
    backends.push(("zookeeper (3 nodes)".into(), zk.url()));
    #[cfg(feature = "postgres")]
    let pg = distlock_testkit::PostgresServer::start().expect("postgres");
    #[cfg(feature = "postgres")]
    backends.push(("postgres".into(), pg.url()));
    #[cfg(feature = "mysql")]
    let my = distlock_testkit::MariaDbServer::start().expect("mariadb");
    #[cfg(feature = "mysql")]
    backends.push(("mysql (mariadb)".into(), my.url()));

    println!(
        "{:<22} {:>14} {:>10} {:>16} {:>12} {:>12} {:>10}",
        "backend",
        "uncont. p50 µs",
        "× redis",
        "contended ops/s",
        "wait p50 µs",
        "wait p99 µs",
        "× redis"
    );
    let mut base: Option<(f64, f64)> = None;
    for (label, url) in &backends {
        let u = bench(url, &["--scenario", "uncontended"], secs);
        let c = bench(url, &["--scenario", "contended", "--clients", "8"], secs);
        let num = |v: &Option<Value>, k: &str| v.as_ref().and_then(|v| v[k].as_f64());
        let (u50, ops) = (num(&u, "p50_us"), num(&c, "ops_per_s"));
        if base.is_none() {
            base = u50.zip(ops);
        }
        let ratio = |x: Option<f64>, b: Option<f64>| match (x, b) {
            (Some(x), Some(b)) if b > 0.0 => format!("{:.2}", x / b),
            _ => "-".into(),
        };
        let show = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.0}"));
        println!(
            "{:<22} {:>14} {:>10} {:>16} {:>12} {:>12} {:>10}",
            label,
            show(u50),
            ratio(u50, base.map(|b| b.0)),
            show(ops),
            show(num(&c, "p50_us")),
            show(num(&c, "p99_us")),
            ratio(ops, base.map(|b| b.1)),
        );
    }
}
