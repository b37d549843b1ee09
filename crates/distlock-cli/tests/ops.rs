//! The operator commands `dlock list`, `dlock release --force` and `dlock doctor` as real
//! processes against real servers (Redis, the file backend), with holders in other clients.

mod ops_common;
use distlock_testkit::{FencedRegister, RedisOptions, RedisServer};
use ops_common::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `dlock release --force NAME` answering its question with `answer`.
fn release_answering(url: &str, name: &str, answer: &str) -> std::process::Output {
    let mut child = Command::new(DLOCK)
        .env("DLOCK_BACKEND", url)
        .args(["release", "--force", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{answer}\n").as_bytes())
        .expect("answer");
    child.wait_with_output().expect("wait")
}

fn find<'a>(
    locks: &'a [serde_json::Value],
    name: &str,
    kind: &str,
) -> Option<&'a serde_json::Value> {
    locks
        .iter()
        .find(|l| l["name"] == name && l["kind"] == kind)
}

async fn wait_until<F: FnMut() -> bool>(what: &str, timeout: Duration, mut f: F) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// `list --json` shows held locks (owner, lease), queued waiters, read-write and semaphore
/// holders, locks only a fencing counter is left of, and honours --prefix.
async fn list_shows_held_and_waited(url: &str, queues: bool) {
    let a = client(url, Duration::from_secs(5)).await;
    let b = client(url, Duration::from_secs(5)).await;
    let held = a
        .lock("ops-job")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let owner = held.owner().to_owned();
    let waiter = {
        let lock = b.lock("ops-job").expect("lock");
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await })
    };
    let read = a
        .rw_lock("ops-rw")
        .expect("rw")
        .read()
        .acquire()
        .await
        .expect("read");
    let done = a
        .lock("ops-done")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let done_token = done.fencing_token();
    done.release().await.expect("release");
    let url2 = url.to_owned();
    // The waiter is queued once the server counts it (where the backend has a queue).
    let mut last = Vec::new();
    wait_until("the waiter to be listed", Duration::from_secs(10), || {
        last = list_json(&url2, "ops-");
        !queues || find(&last, "ops-job", "mutex").is_some_and(|l| l["waiters"] == 1)
    })
    .await;
    let job = find(&last, "ops-job", "mutex").expect("held lock listed");
    assert_eq!(job["holders"][0]["owner"], owner.as_str(), "{job}");
    assert_eq!(job["holders"][0]["count"], 1, "{job}");
    assert_eq!(job["fencing_token"], held.fencing_token(), "{job}");
    if let Some(ms) = job["holders"][0]["lease_ms_left"].as_u64() {
        assert!(ms <= 5000, "{job}");
    }
    let rw = find(&last, "ops-rw", "write").expect("rw lock listed");
    assert_eq!(rw["holders"][0]["side"], "read", "{rw}");
    let gone = find(&last, "ops-done", "mutex").expect("a released lock's counter is state");
    assert_eq!(gone["holders"].as_array().map(Vec::len), Some(0), "{gone}");
    assert_eq!(gone["fencing_token"], done_token, "{gone}");
    // --prefix filters by name.
    let only = list_json(url, "ops-rw");
    assert!(only.iter().all(|l| l["name"] == "ops-rw"), "{only:?}");
    // The plain table names every lock.
    let out = dlock(url, &["list"]);
    let table = text(&out.stdout);
    assert!(
        table.contains("ops-job") && table.contains(&owner),
        "{table}"
    );
    held.release().await.expect("release");
    let g = waiter.await.expect("join").expect("waiter acquires");
    g.release().await.expect("release");
    read.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_list_shows_held_and_waited_for_locks() {
    let server = RedisServer::start().expect("redis");
    list_shows_held_and_waited(&server.url(), true).await;
    // A semaphore with its permit count.
    let c = client(&server.url(), Duration::from_secs(5)).await;
    let p = c
        .semaphore("ops-sem", 3)
        .expect("sem")
        .acquire(1)
        .await
        .expect("permit");
    let locks = list_json(&server.url(), "ops-sem");
    let sem = find(&locks, "ops-sem", "semaphore").expect("semaphore listed");
    assert_eq!(sem["permits"], 3, "{sem}");
    assert_eq!(sem["holders"][0]["count"], 1, "{sem}");
    p.release().await.expect("release");
}

/// A holder in another client, watchdog lease 1 s, is removed by `release --force`: its lost
/// signal fires within about a lease, the next holder gets a higher token, and the old
/// holder's write with its token is rejected by a fenced register after the next one wrote.
async fn force_release_fences_the_old_holder(url: &str) {
    let old = client(url, Duration::from_secs(1)).await;
    let guard = old
        .lock("ops-stuck")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let register = FencedRegister::new();
    assert!(register.write(guard.fencing_token(), "old", true));

    // Without --yes it asks; anything but "y" keeps the holder.
    let out = release_answering(url, "ops-stuck", "n");
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stderr).contains("[y/N]"), "{out:?}");
    // Without --force it refuses.
    let out = dlock(url, &["release", "ops-stuck", "--yes"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(!guard.is_lost());

    // "y" on stdin releases.
    let released_at = Instant::now();
    let out = release_answering(url, "ops-stuck", "y");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = text(&out.stdout);
    assert!(stdout.contains(guard.owner()), "{stdout}");

    // The old holder learns it at its next renewal (a third of the 1 s lease, plus a loaded
    // machine's margin).
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the old holder's lost signal fires");
    eprintln!(
        "lost signal {:?} after the forced release",
        released_at.elapsed()
    );

    let next = client(url, Duration::from_secs(5)).await;
    let g2 = next
        .lock("ops-stuck")
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("the next holder acquires");
    assert!(g2.fencing_token() > guard.fencing_token());
    assert!(register.write(g2.fencing_token(), "next", true));
    assert!(
        !register.write(guard.fencing_token(), "old", !guard.is_lost()),
        "the old holder's write must be rejected"
    );
    register.assert_no_rejected_belief();
    g2.release().await.expect("release");
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_force_release_fences_the_old_holder() {
    let server = RedisServer::start().expect("redis");
    force_release_fences_the_old_holder(&server.url()).await;
    // The counter was advanced past the clock seed + 1 by the script, atomically with the
    // deletion: a lost counter would not bring tokens back either.
    let fence: u64 = server
        .command(&["GET", "dlock:{ops-stuck}:fence"])
        .expect("get")
        .parse()
        .expect("number");
    assert!(
        fence > 1_000_000_000_000_000,
        "seeded from the clock: {fence}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_force_release_of_rw_and_semaphore_holders() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let c = client(&url, Duration::from_secs(1)).await;
    let r = c
        .rw_lock("ops-rw2")
        .expect("rw")
        .read()
        .acquire()
        .await
        .expect("read");
    let s = c
        .semaphore("ops-sem2", 2)
        .expect("sem")
        .acquire(1)
        .await
        .expect("permit");
    let out = dlock(
        &url,
        &["release", "--force", "ops-rw2", "--kind", "write", "--yes"],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = dlock(
        &url,
        &[
            "release",
            "--force",
            "ops-sem2",
            "--kind",
            "semaphore=2",
            "-y",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for lost in [r.lost(), s.lost()] {
        tokio::time::timeout(Duration::from_secs(5), lost)
            .await
            .expect("lost signal fires");
    }
}

fn doctor(url: &str) -> (Option<i32>, String) {
    let out = dlock(url, &["doctor"]);
    (out.status.code(), text(&out.stdout) + &text(&out.stderr))
}

fn line<'a>(report: &'a str, check: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{check}:")))
        .unwrap_or_else(|| panic!("no `{check}` line in {report}"))
}

fn redis_with(args: &[&str]) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        extra_args: args.iter().map(|s| s.to_string()).collect(),
        ..RedisOptions::default()
    })
    .expect("redis")
}

#[test]
fn redis_doctor_passes_a_safe_server() {
    let server = redis_with(&["--appendonly", "yes"]);
    let (code, report) = doctor(&server.url());
    assert_eq!(code, Some(0), "{report}");
    for check in [
        "version",
        "cluster",
        "maxmemory-policy",
        "persistence",
        "replication",
        "clock",
    ] {
        assert!(line(&report, check).starts_with("OK"), "{check}: {report}");
    }
}

#[test]
fn redis_doctor_flags_eviction_and_missing_persistence() {
    let server = redis_with(&["--maxmemory-policy", "allkeys-lru"]);
    let (code, report) = doctor(&server.url());
    assert_eq!(code, Some(1), "{report}");
    assert!(
        line(&report, "maxmemory-policy").starts_with("UNSAFE"),
        "{report}"
    );
    assert!(
        line(&report, "maxmemory-policy").contains("noeviction"),
        "{report}"
    );
    // The testkit's default: --save "" --appendonly no.
    assert!(line(&report, "persistence").starts_with("WARN"), "{report}");
    let server = redis_with(&["--maxmemory-policy", "volatile-ttl"]);
    let (code, report) = doctor(&server.url());
    assert_eq!(code, Some(1), "{report}");
    assert!(
        line(&report, "maxmemory-policy").starts_with("UNSAFE"),
        "{report}"
    );
}

#[test]
fn redis_url_at_a_cluster_node_is_refused_naming_redis_cluster() {
    let server = redis_with(&["--cluster-enabled", "yes", "--appendonly", "yes"]);
    let (code, report) = doctor(&server.url());
    assert_ne!(code, Some(0), "{report}");
    assert!(report.contains("redis+cluster://"), "{report}");
}

/// `list`, `release --force` and `doctor` through `--backend redis+cluster://…`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_operator_commands() {
    let cluster = distlock_testkit::RedisCluster::start_with(3, 0).expect("cluster");
    let url = cluster.url();
    list_shows_held_and_waited(&url, true).await;
    force_release_fences_the_old_holder(&url).await;
    let (code, report) = doctor(&url);
    assert_eq!(code, Some(0), "{report}");
    let masters = report.matches("a master of the cluster, reached by redis+cluster://");
    assert_eq!(masters.count(), 3, "{report}");
}

#[test]
fn redis_doctor_flags_replicas_without_wait_replicas() {
    let primary = redis_with(&["--appendonly", "yes"]);
    let _replica = redis_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let t = Instant::now();
    let report = loop {
        let (code, report) = doctor(&primary.url());
        if line(&report, "replication").starts_with("WARN") {
            assert_eq!(code, Some(0), "{report}");
            break report;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "replica never connected: {report}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        line(&report, "replication").contains("wait_replicas=1"),
        "{report}"
    );
    let (code, report) = doctor(&format!("{}?wait_replicas=1", primary.url()));
    assert_eq!(code, Some(0), "{report}");
    assert!(line(&report, "replication").starts_with("OK"), "{report}");
}

fn file_url(dir: &distlock_testkit::TempDir) -> String {
    format!("file://{}", dir.path().display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_list_shows_held_locks() {
    let dir = distlock_testkit::TempDir::with_prefix("dlock-ops").expect("tempdir");
    // The file backend has no server queue: waiters are not counted.
    list_shows_held_and_waited(&file_url(&dir), false).await;
}

/// On file:// a held lock is the holder process's flock: a forced release is refused with
/// the holder's pid and what to do; a free lock's counter is advanced under the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_force_release_names_the_holder_and_fences_a_free_lock() {
    let dir = distlock_testkit::TempDir::with_prefix("dlock-ops").expect("tempdir");
    let url = file_url(&dir);
    let c = client(&url, Duration::from_secs(5)).await;
    let g = c
        .lock("ops-f")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let out = dlock(&url, &["release", "--force", "ops-f", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
    assert!(err.contains("kill"), "{err}");
    assert!(!g.is_lost());
    let first = g.fencing_token();
    g.release().await.expect("release");
    let out = dlock(&url, &["release", "--force", "ops-f", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let advanced: u64 = text(&out.stdout)
        .split_whitespace()
        .last()
        .and_then(|t| t.parse().ok())
        .expect("the new token is printed last");
    assert!(advanced > first, "{advanced} > {first}");
    let g = c
        .lock("ops-f")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    assert!(g.fencing_token() > advanced);
    g.release().await.expect("release");
}

#[test]
fn file_doctor_passes_a_local_writable_directory() {
    let dir = distlock_testkit::TempDir::with_prefix("dlock-ops").expect("tempdir");
    let (code, report) = doctor(&file_url(&dir));
    assert_eq!(code, Some(0), "{report}");
    assert!(line(&report, "file-system").starts_with("OK"), "{report}");
    assert!(line(&report, "writable").starts_with("OK"), "{report}");
}

/// MySQL/MariaDB (needs `--features mysql`): both modes list held locks, a forced release
/// fences the old holder (session mode: its connection is killed; table mode: its row is
/// cleared), and doctor passes a plain server.
#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use distlock_testkit::MariaDbServer;

    fn urls(db: &MariaDbServer) -> [String; 2] {
        let url = db.url();
        let sep = if url.contains('?') { '&' } else { '?' };
        [url.clone(), format!("{url}{sep}mode=table")]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_list_shows_held_locks() {
        let db = MariaDbServer::start().expect("mariadb");
        for url in urls(&db) {
            let a = client(&url, Duration::from_secs(5)).await;
            let g = a
                .lock("my-held")
                .expect("lock")
                .acquire()
                .await
                .expect("acquire");
            let locks = list_json(&url, "my-");
            let l = find(&locks, "my-held", "mutex").expect("listed");
            assert_eq!(l["holders"][0]["owner"], g.owner(), "{url}: {l}");
            assert_eq!(l["fencing_token"], g.fencing_token(), "{url}: {l}");
            g.release().await.expect("release");
            let locks = list_json(&url, "my-");
            let l = find(&locks, "my-held", "mutex").expect("counter is state");
            assert_eq!(l["holders"].as_array().map(Vec::len), Some(0), "{url}: {l}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_force_release_fences_the_old_holder() {
        let db = MariaDbServer::start().expect("mariadb");
        for url in urls(&db) {
            force_release_fences_the_old_holder(&url).await;
        }
    }

    #[test]
    fn mysql_doctor_passes_a_plain_server() {
        let db = MariaDbServer::start().expect("mariadb");
        for url in urls(&db) {
            let (code, report) = doctor(&url);
            assert_eq!(code, Some(0), "{url}: {report}");
            for check in [
                "version",
                "wait_timeout",
                "connection-close",
                "galera",
                "clock",
            ] {
                assert!(line(&report, check).starts_with("OK"), "{check}: {report}");
            }
        }
    }
}
