//! `dlock torture` on every backend, on the servers the testkit starts: a short run (12 s,
//! lease 1 s, fixed seed) with the pause and kill nemeses, and delay where the proxy can stand
//! in front of the server (a single-host URL): no violation, and every nemesis fired. (File and
//! Redis: tests/torture.rs; longer runs are by hand, see docs/torture.md.)

use serde_json::Value;
use std::process::Command;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// Runs `dlock --backend URL torture …` with the short settings and `nemeses`; checks it.
fn passes(url: &str, nemeses: &str, seed: &str) -> Value {
    let out = Command::new(DLOCK)
        .args(["--backend", url, "torture", "--clients", "4", "--duration"])
        .args(["12s", "--lease", "1s", "--nemesis", nemeses, "--seed", seed])
        .arg("--json")
        .output()
        .expect("run dlock");
    let code = out.status.code();
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}), exit {code:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    eprintln!("{url}: {} ({:?})", r["verdict"], r["stats"]);
    assert_eq!(code, Some(0), "{r:#}");
    assert!(r["stats"]["grants"].as_u64().unwrap() > 5, "{r:#}");
    assert!(r["stats"]["writes"].as_u64().unwrap() > 5, "{r:#}");
    for n in nemeses.split(',') {
        assert!(
            r["nemeses"][n].as_u64().unwrap_or(0) > 0,
            "{n} never fired: {r:#}"
        );
    }
    r
}

#[test]
fn redlock() {
    let servers: Vec<_> = (0..3)
        .map(|_| distlock_testkit::RedisServer::start().expect("redis"))
        .collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    // Several hosts: no proxy, so no network nemesis.
    passes(
        &format!("redlock://{}", hosts.join(",")),
        "pause,kill",
        "21",
    );
}

#[cfg(feature = "etcd")]
#[test]
fn etcd() {
    let etcd = distlock_testkit::EtcdCluster::start_with_members(1).expect("etcd");
    passes(&etcd.url(), "pause,kill,delay", "22");
}

#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper() {
    let zk = distlock_testkit::ZkEnsemble::start_with(1).expect("zookeeper");
    // A killed holder's lock lives as long as its session: with the default session timeout
    // (10 s) the checker rightly reports the lock held by nobody for 10 s with a 1 s lease
    // ('FAIL: held-by-nobody 1', waited 11.2 s). A session as long as the lease keeps the
    // lease's promise.
    let url = zk.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    passes(
        &format!("{url}{sep}session_timeout=1s"),
        "pause,kill,delay",
        "23",
    );
}

#[cfg(feature = "postgres")]
#[test]
fn postgres() {
    let pg = distlock_testkit::PostgresServer::start().expect("postgres");
    passes(&pg.url(), "pause,kill,delay", "24");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql() {
    let db = distlock_testkit::MariaDbServer::start().expect("mariadb");
    passes(&db.url(), "pause,kill,delay", "25");
}
