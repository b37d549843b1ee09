//! `dlock seckill` and `dlock bench` are the lab's subcommands (crate distlock-lab, tested
//! there through `dlock-lab`): here, that the `dlock` binary runs them, hidden worker included,
//! with the same flags and output, and lists them in its help.

use distlock_testkit::TempDir;
use std::process::{Command, Output};

fn dlock(dir: &TempDir, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .arg("--backend")
        .arg(format!("file://{}", dir.path().display()))
        .args(args)
        .env_remove("DLOCK_BACKEND")
        .output()
        .expect("run dlock")
}

fn json(out: &Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("`{l}`: {e}")))
        .collect()
}

#[test]
fn seckill_runs_its_workers_through_dlock() {
    let dir = TempDir::with_prefix("distlock-cli-seckill").expect("temp dir");
    let rows = json(&dlock(
        &dir,
        &[
            "seckill",
            "--json",
            "--strategy",
            "none,lock",
            "--stock",
            "5",
        ],
    ));
    assert_eq!(rows.len(), 2, "{rows:?}");
    let lock = rows
        .iter()
        .find(|r| r["strategy"] == "lock")
        .expect("lock row");
    assert_eq!(
        (lock["sold"].as_u64(), lock["oversold"].as_u64()),
        (Some(5), Some(0))
    );
    assert_eq!(lock["processes"], 3, "{lock}");
}

#[test]
fn bench_runs_through_dlock() {
    let dir = TempDir::with_prefix("distlock-cli-bench").expect("temp dir");
    let args = [
        "bench",
        "--scenario",
        "contended",
        "--clients",
        "2",
        "--duration",
        "300ms",
    ];
    let rows = json(&dlock(&dir, &[&args[..], &["--json"]].concat()));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["scenario"], "contended", "{rows:?}");
    assert_eq!(rows[0]["violations"], 0, "{rows:?}");
    assert!(rows[0]["ops"].as_u64().is_some_and(|n| n > 0), "{rows:?}");
}

#[test]
fn help_lists_the_lab_but_not_its_worker() {
    let dir = TempDir::with_prefix("distlock-cli-help").expect("temp dir");
    let out = dlock(&dir, &["--help"]);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for sub in [
        "run",
        "list",
        "release",
        "doctor",
        "seckill",
        "bench",
        "completions",
    ] {
        assert!(help.contains(&format!("  {sub} ")), "no `{sub}` in\n{help}");
    }
    assert!(
        !help.contains("__seckill-worker") && !help.contains("__guard"),
        "{help}"
    );
    let out = dlock(&dir, &["seckill", "--processes", "0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
