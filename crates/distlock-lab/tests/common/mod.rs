//! Helpers of the lab's end-to-end tests: run `dlock-lab` (the lab subcommands of `dlock`, the
//! same code) and read its JSON lines.
#![allow(dead_code)] // Each test file uses its own part.

use distlock_testkit::TempDir;
use serde_json::Value;
use std::process::{Command, Output};

/// `dlock-lab --backend BACKEND ARGS…`, with `DLOCK_BACKEND` unset.
pub fn dlock(backend: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock-lab"))
        .arg("--backend")
        .arg(backend)
        .args(args)
        .env_remove("DLOCK_BACKEND")
        .output()
        .expect("run dlock-lab")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The stdout of a run that must have succeeded (else the panic shows both streams).
pub fn success(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs a command that must succeed and returns its stdout's JSON lines.
pub fn json_lines(backend: &str, args: &[&str]) -> Vec<Value> {
    success(&dlock(backend, args))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("`{l}`: {e}")))
        .collect()
}

/// A fresh directory and the `file://` URL of it.
pub fn file_backend(prefix: &str) -> (TempDir, String) {
    let dir = TempDir::with_prefix(prefix).expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    (dir, url)
}

/// The names left in the file backend's namespace directory.
pub fn left_in(dir: &TempDir) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir.path().join("dlock"))
        .expect("namespace dir")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect()
}

pub fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not a count in {v}"))
}

pub fn row<'a>(rows: &'a [Value], strategy: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["strategy"] == strategy)
        .unwrap_or_else(|| panic!("no row for {strategy} in {rows:?}"))
}

/// `seckill --json --stock 10 --buyers 30 --processes 3 --work-ms 30 EXTRA…`: big margins.
pub fn seckill_json(backend: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "seckill",
        "--json",
        "--stock",
        "10",
        "--buyers",
        "30",
        "--processes",
        "3",
        "--work-ms",
        "30",
    ];
    args.extend_from_slice(extra);
    json_lines(backend, &args)
}

/// What every strategy of a `seckill_json(…, ["--strategy", "all"])` run guarantees, whatever
/// the timing: the unlocked ones oversell across processes, the others never do, and `lock`
/// sells out.
pub fn check_strategies(rows: &[Value], backend: &str) {
    assert_eq!(rows.len(), 6, "{rows:?}");
    for r in rows {
        assert_eq!(r["backend"], backend, "{r}");
        assert_eq!(n(r, "sold") + n(r, "failed"), 30, "{r}");
    }
    for s in ["none", "local"] {
        let r = row(rows, s);
        assert!(
            n(r, "oversold") > 0,
            "{s} should oversell across processes: {r}"
        );
        assert_eq!(n(r, "oversold"), n(r, "sold").saturating_sub(10), "{r}");
    }
    for s in ["optimistic", "trylock", "lock", "fenced"] {
        let r = row(rows, s);
        assert_eq!(n(r, "oversold"), 0, "{s} must never oversell: {r}");
        assert!(n(r, "sold") <= 10, "{r}");
    }
    for s in ["lock", "fenced"] {
        let r = row(rows, s);
        assert_eq!(n(r, "sold"), 10, "{s} sells out: {r}");
        assert_eq!(n(r, "failed"), 20, "{r}");
        // Nobody stalled past a lease: nothing late, nothing rejected, nothing lost.
        for key in ["late_writes", "fenced_rejections", "lost_updates"] {
            assert_eq!(n(r, key), 0, "{s}: {key}: {r}");
        }
    }
}

/// `bench --duration 1s --json ARGS…`: the one JSON object it prints.
pub fn bench_json(backend: &str, args: &[&str]) -> Value {
    let mut all = vec!["bench", "--duration", "1s", "--json"];
    all.extend_from_slice(args);
    let stdout = success(&dlock(backend, &all));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: `{stdout}`"))
}
