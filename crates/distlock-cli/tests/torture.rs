//! `dlock torture` as a real process: the self-test flags every broken lock, and short runs
//! with a fixed seed on the file backend and a real redis-server find no violation while
//! every nemesis asked for really fired.

use distlock_testkit::RedisServer;
use serde_json::Value;
use std::process::Command;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// Runs `dlock [args…] --json`: exit code and the parsed report.
fn torture(args: &[&str]) -> (i32, Value) {
    let out = Command::new(DLOCK)
        .args(args)
        .arg("--json")
        .output()
        .expect("run dlock");
    let code = out.status.code().expect("exit code");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}), exit {code}; stdout {} stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, json)
}

/// A passing run where each of `nemeses` fired at least once and the register was used.
fn assert_clean(code: i32, r: &Value, nemeses: &[&str]) {
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["ok"], true, "{r:#}");
    assert!(r["verdict"].as_str().unwrap().starts_with("PASS"), "{r:#}");
    assert!(r["stats"]["grants"].as_u64().unwrap() > 5, "{r:#}");
    assert!(r["stats"]["writes"].as_u64().unwrap() > 5, "{r:#}");
    for n in nemeses {
        assert!(
            r["nemeses"][n].as_u64().unwrap_or(0) > 0,
            "{n} never fired: {r:#}"
        );
    }
}

#[test]
fn self_test_flags_every_broken_lock() {
    let (code, r) = torture(&["torture", "--self-test", "--seed", "1"]);
    assert_eq!(code, 0, "{r:#}");
    let cases = r["cases"].as_array().unwrap();
    let expect = [
        ("correct", None),
        ("no-owner-check", Some("overlap")),
        ("no-renewal", Some("overlap")),
        ("token-reset", Some("duplicate-token")),
    ];
    assert_eq!(cases.len(), expect.len());
    for (lock, want) in expect {
        let c = cases.iter().find(|c| c["lock"] == lock).expect(lock);
        let counts = &c["report"]["violation_counts"];
        match want {
            None => assert_eq!(counts, &serde_json::json!({}), "{lock}: {c:#}"),
            Some(k) => assert!(counts[k].as_u64().unwrap_or(0) > 0, "{lock}: {c:#}"),
        }
        assert_eq!(c["passed"], true, "{lock}: {c:#}");
    }
}

#[test]
fn file_backend_passes_with_pause_and_kill() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let (code, r) = torture(&[
        "--backend",
        &url,
        "torture",
        "--clients",
        "4",
        "--duration",
        "15s",
        "--lease",
        "1s",
        "--nemesis",
        "pause,kill",
        "--seed",
        "11",
    ]);
    assert_clean(code, &r, &["pause", "kill"]);
}

#[test]
fn redis_passes_with_every_nemesis() {
    let redis = RedisServer::start().expect("redis");
    let (code, r) = torture(&[
        "--backend",
        &redis.url(),
        "torture",
        "--clients",
        "4",
        "--duration",
        "18s",
        "--lease",
        "1s",
        "--nemesis",
        "pause,kill,delay,drop,reset,duplicate",
        "--seed",
        "12",
    ]);
    assert_clean(
        code,
        &r,
        &["pause", "kill", "delay", "drop", "reset", "duplicate"],
    );
}

#[test]
fn every_kind_on_two_names_passes_on_redis() {
    let redis = RedisServer::start().expect("redis");
    // (kind, fewest and most holders at once the kind's rule allows and a run shows).
    for (kind, least, most) in [
        ("fair", 1, 1),
        ("read-write", 2, 5),
        ("semaphore=2", 2, 2),
        ("election", 1, 1),
    ] {
        let (code, r) = torture(&[
            "--backend",
            &redis.url(),
            "torture",
            "--kind",
            kind,
            "--names",
            "2",
            "--clients",
            "5",
            "--duration",
            "7s",
            "--lease",
            "1s",
            "--nemesis",
            "pause,kill",
            "--seed",
            "13",
        ]);
        assert_eq!(code, 0, "{kind}: {r:#}");
        assert!(r["stats"]["grants"].as_u64().unwrap() > 5, "{kind}: {r:#}");
        let held = r["stats"]["max_holders"].as_u64().unwrap();
        assert!((least..=most).contains(&held), "{kind}: {r:#}");
        // A semaphore's holders use no register; the others write.
        let writes = r["stats"]["writes"].as_u64().unwrap();
        assert_eq!(writes > 0, !kind.starts_with("semaphore"), "{kind}: {r:#}");
    }
}

#[test]
fn bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    for args in [
        vec!["torture", "--nemesis", "bogus"],
        // The proxy cannot stand in front of a directory.
        vec![
            "--backend",
            &url,
            "torture",
            "--nemesis",
            "drop",
            "--duration",
            "1s",
        ],
        vec!["torture", "--kind", "semaphore=0", "--duration", "1s"],
        vec!["torture", "--kind", "write", "--duration", "1s"],
        vec!["torture", "--names", "0", "--duration", "1s"],
    ] {
        let out = Command::new(DLOCK).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}
