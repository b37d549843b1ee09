//! Helpers shared by the operator-command tests (`ops*.rs`): run the real `dlock` binary
//! against a backend URL, read its JSON, connect a holder client.
#![allow(dead_code)] // each test binary uses its own subset

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The `dlock` binary under test.
pub const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// Runs `dlock ARGS` with `DLOCK_BACKEND=url` and no terminal on stdin.
pub fn dlock(url: &str, args: &[&str]) -> Output {
    Command::new(DLOCK)
        .env("DLOCK_BACKEND", url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run dlock")
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `dlock list --json --prefix PREFIX`, which must succeed with one JSON array.
pub fn list_json(url: &str, prefix: &str) -> Vec<serde_json::Value> {
    let out = dlock(url, &["list", "--json", "--prefix", prefix]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("one JSON array")
}

/// A client of its own (as another process would have) with watchdog lease `lease`.
pub async fn client(url: &str, lease: Duration) -> distlock::Client {
    distlock::connect_with(
        url,
        distlock::ClientOptions::default().watchdog_lease(lease),
    )
    .await
    .expect("connect")
}
