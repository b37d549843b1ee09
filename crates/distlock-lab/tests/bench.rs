//! `dlock bench` end to end on a real file directory and a real redis-server.

mod common;

use common::{bench_json, dlock, file_backend, left_in, n, text};
use distlock_testkit::RedisServer;
use serde_json::Value;

const KEYS: [&str; 14] = [
    "peer",
    "scenario",
    "backend",
    "clients",
    "nodes",
    "duration_s",
    "ops",
    "ops_per_s",
    "p50_us",
    "p99_us",
    "violations",
    "errors",
    "client_ops_min",
    "client_ops_max",
];

fn check(v: &Value, scenario: &str, backend: &str, clients: u64) {
    for k in KEYS {
        assert!(v.get(k).is_some(), "no `{k}` in {v}");
    }
    assert_eq!(v["peer"], "dlock");
    assert_eq!(v["scenario"], scenario);
    assert_eq!(v["backend"], backend);
    assert_eq!(n(v, "clients"), clients);
    assert_eq!(n(v, "nodes"), 1);
    assert!(n(v, "ops") > 0, "{v}");
    assert_eq!(n(v, "violations"), 0, "{v}");
    assert_eq!(n(v, "errors"), 0, "{v}");
    assert!(v["duration_s"].as_f64().is_some_and(|d| d >= 1.0), "{v}");
    assert!(v["ops_per_s"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    assert!(n(v, "p50_us") <= n(v, "p99_us"), "{v}");
    assert!(n(v, "client_ops_min") <= n(v, "client_ops_max"), "{v}");
    assert!(n(v, "client_ops_max") <= n(v, "ops"), "{v}");
    if clients > 1 {
        assert!(n(v, "client_ops_min") > 0, "every client got the lock: {v}");
    }
}

#[test]
fn file_scenarios() {
    let (dir, url) = file_backend("distlock-lab-bench");
    let v = bench_json(&url, &["--scenario", "uncontended", "--keys", "4"]);
    check(&v, "uncontended", "file", 1);
    assert!(v["ping_p50_us"].is_null());
    let v = bench_json(&url, &["--scenario", "contended", "--clients", "8"]);
    check(&v, "contended", "file", 8);
    let left = left_in(&dir);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn redis_scenarios() {
    let redis = RedisServer::start().expect("redis-server");
    let v = bench_json(&redis.url(), &["--scenario", "uncontended"]);
    check(&v, "uncontended", "redis", 1);
    assert!(n(&v, "ping_p50_us") > 0, "{v}");
    let v = bench_json(&redis.url(), &["--scenario", "contended", "--clients", "8"]);
    check(&v, "contended", "redis", 8);
    assert_eq!(redis.command(&["DBSIZE"]).expect("DBSIZE"), "0");
}

#[test]
fn readable_summary_with_ping_ratio() {
    let redis = RedisServer::start().expect("redis-server");
    let out = dlock(
        &redis.url(),
        &[
            "bench",
            "--scenario",
            "contended",
            "--clients",
            "2",
            "--duration",
            "300ms",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    for want in [
        "contended",
        "ops",
        "latency",
        "× PING",
        "violations   0",
        "errors       0",
    ] {
        assert!(s.contains(want), "no `{want}` in\n{s}");
    }
}

#[test]
fn readheavy_on_redis_next_to_a_mutex() {
    let redis = RedisServer::start().expect("redis-server");
    let v = bench_json(&redis.url(), &["--scenario", "readheavy", "--clients", "8"]);
    check(&v, "readheavy", "redis", 8);
    let base = &v["baseline"];
    assert_eq!(base["lock"], "mutex");
    assert!(n(base, "ops") > 0, "{v}");
    assert_eq!(n(base, "violations"), 0, "{v}");
    assert_eq!(n(base, "errors"), 0, "{v}");
}

#[test]
fn readheavy_on_file_next_to_a_mutex() {
    let (_dir, url) = file_backend("distlock-lab-bench-rh");
    let v = bench_json(&url, &["--scenario", "readheavy", "--clients", "4"]);
    check(&v, "readheavy", "file", 4);
    assert_eq!(v["baseline"]["lock"], "mutex");
    assert_eq!(n(&v["baseline"], "violations"), 0, "{v}");
}

#[test]
fn bad_input() {
    let out = dlock("file://", &["bench", "--scenario", "sideways"]);
    assert_eq!(out.status.code(), Some(2));
    let out = dlock(
        "file://",
        &["bench", "--scenario", "uncontended", "--duration", "0s"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("above zero"),
        "{}",
        text(&out.stderr)
    );
    let out = dlock(
        "file://",
        &["bench", "--scenario", "contended", "--clients", "0"],
    );
    assert_eq!(out.status.code(), Some(2));
    let out = dlock(
        "postgres://db.invalid/x",
        &["bench", "--scenario", "contended"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(!text(&out.stderr).is_empty());
}
