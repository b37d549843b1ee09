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

/// `client(url, lease)` holding the mutex `name`.
pub async fn hold(
    url: &str,
    name: &str,
    lease: Duration,
) -> (distlock::Client, distlock::LockGuard) {
    let c = client(url, lease).await;
    let g = c
        .lock(name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("acquire");
    (c, g)
}

/// A waiter for the mutex `name` on `client`, queued in a task (up to 30 s).
pub fn spawn_waiter(
    client: &distlock::Client,
    name: &str,
) -> tokio::task::JoinHandle<distlock::Result<distlock::LockGuard>> {
    let lock = client.lock(name).expect("lock");
    tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await })
}

/// `list --json --prefix name` until the mutex `name` is listed with one waiter (within 20 s).
pub async fn listed_with_waiter(url: &str, name: &str) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        let locks = list_json(url, name);
        if let Some(l) = locks
            .iter()
            .find(|l| l["name"] == name && l["waiters"] == 1)
        {
            return l.clone();
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no waiter: {locks:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `release --force NAME --yes` of `old`'s lock: it names the old owner, the old holder's
/// lost signal fires within `lost_within`, the next holder (`next`) gets a higher token and
/// the old holder's write is rejected by a fenced register; `next`'s guard is released.
pub async fn force_release_fences(
    url: &str,
    name: &str,
    old: &distlock::LockGuard,
    lost_within: Duration,
    next: impl std::future::Future<Output = distlock::LockGuard>,
) {
    let register = distlock_testkit::FencedRegister::new();
    assert!(register.write(old.fencing_token(), "old", true));
    let t = std::time::Instant::now();
    let out = dlock(url, &["release", "--force", name, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).contains(old.owner()), "{out:?}");
    tokio::time::timeout(lost_within, old.lost())
        .await
        .expect("the old holder's lost signal fires");
    eprintln!("{url}: lost signal {:?} after the release", t.elapsed());
    let g2 = next.await;
    assert!(g2.fencing_token() > old.fencing_token());
    assert!(register.write(g2.fencing_token(), "next", true));
    assert!(
        !register.write(old.fencing_token(), "old", !old.is_lost()),
        "the old holder's write must be rejected"
    );
    register.assert_no_rejected_belief();
    g2.release().await.expect("release");
}

/// A waiter's guard, within `within`.
pub async fn waited(
    waiter: tokio::task::JoinHandle<distlock::Result<distlock::LockGuard>>,
    within: Duration,
) -> distlock::LockGuard {
    tokio::time::timeout(within, waiter)
        .await
        .expect("the waiter gets the lock in time")
        .expect("join")
        .expect("the waiter stayed queued and acquires")
}

/// `dlock doctor` exits 0 with an `OK` line for each of `checks`.
pub fn doctor_passes(url: &str, checks: &[&str]) {
    let out = dlock(url, &["doctor"]);
    let report = text(&out.stdout) + &text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{url}: {report}");
    for check in checks {
        let line = report
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&format!("{check}:")))
            .unwrap_or_else(|| panic!("no `{check}` line in {report}"));
        assert!(line.starts_with("OK"), "{check}: {report}");
    }
}
