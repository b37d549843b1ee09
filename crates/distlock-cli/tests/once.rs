//! `dlock once`: five processes fired together at each of five intervals run the job exactly
//! five times, on every backend; skips say why (75 running elsewhere, 79 already ran); hosts
//! whose clocks are off do not run the job twice where the lock service has a clock. Real
//! processes against `file://`, redis-server, a Redlock trio, etcd, ZooKeeper, PostgreSQL and
//! MariaDB (the last four with their cargo features).

use distlock_testkit::RedisServer;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The binary under test: this build, or `DLOCK_TEST_BIN` (to see an older build fail).
fn bin() -> String {
    std::env::var("DLOCK_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_dlock").to_owned())
}

fn dlock(url: &str) -> Command {
    let mut c = Command::new(bin());
    c.env("DLOCK_BACKEND", url);
    c
}

/// Sleeps until `offset` past the next multiple of `every` in Unix time.
fn sleep_to_boundary(every: Duration, offset: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    let every_ns = every.as_nanos();
    let next = (now.as_nanos() / every_ns + 1) * every_ns;
    let target = Duration::from_nanos(next as u64) + offset;
    std::thread::sleep(target - now);
}

fn fire(url: &str, every: &str, log: &Path) -> Child {
    dlock(url)
        .args(["once", "--every", every, "job", "-c"])
        .arg(format!("echo ran >> '{}'; sleep 0.3", log.display()))
        .stderr(Stdio::piped())
        .spawn()
        .expect("once")
}

fn five_waves_five_runs(url: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("runs");
    let every = Duration::from_secs(2);
    let mut fired = Vec::new();
    for _ in 0..5 {
        sleep_to_boundary(every, Duration::from_millis(150));
        fired.extend((0..5).map(|_| fire(url, "2s", &log)));
    }
    let mut codes = Vec::new();
    for child in fired {
        let out = child.wait_with_output().expect("wait");
        let code = out.status.code();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        match code {
            Some(0) => assert!(!err.contains("skipped"), "{err}"),
            Some(75) => assert!(err.contains("skipped: it is running elsewhere"), "{err}"),
            Some(79) => assert!(err.contains("skipped: it ran in this interval"), "{err}"),
            other => panic!("exit {other:?}: {err}"),
        }
        codes.push(code);
    }
    let runs = std::fs::read_to_string(&log).expect("log").lines().count();
    assert_eq!(runs, 5, "exit codes {codes:?}");
    assert_eq!(
        codes.iter().filter(|c| **c == Some(0)).count(),
        5,
        "{codes:?}"
    );
}

#[test]
fn five_hosts_five_intervals_five_runs_on_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    five_waves_five_runs(&format!("file://{}", dir.path().display()));
}

#[test]
fn five_hosts_five_intervals_five_runs_on_redis() {
    let server = RedisServer::start().expect("redis");
    five_waves_five_runs(&server.url());
}

#[test]
fn five_hosts_five_intervals_five_runs_on_redlock() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis"))
        .collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    // No quarantine: the nodes have just started with no data, as the test knows.
    five_waves_five_runs(&format!("redlock://{}?quarantine=0s", hosts.join(",")));
}

#[cfg(feature = "etcd")]
#[test]
fn five_hosts_five_intervals_five_runs_on_etcd() {
    let cluster = distlock_testkit::EtcdCluster::start_with_members(1).expect("etcd");
    five_waves_five_runs(&cluster.url());
}

#[cfg(feature = "zookeeper")]
#[test]
fn five_hosts_five_intervals_five_runs_on_zookeeper() {
    let ensemble = distlock_testkit::ZkEnsemble::shared();
    // The shared ensemble outlives this test: a chroot of its own.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    five_waves_five_runs(&format!("{}/once-{nanos}", ensemble.url()));
}

#[cfg(feature = "postgres")]
#[test]
fn five_hosts_five_intervals_five_runs_on_postgres() {
    let pg = distlock_testkit::PostgresServer::start().expect("postgres");
    five_waves_five_runs(&pg.url());
}

#[cfg(feature = "mysql")]
#[test]
fn five_hosts_five_intervals_five_runs_on_mysql() {
    let db = distlock_testkit::MariaDbServer::start().expect("mariadb");
    five_waves_five_runs(&db.url());
}

/// On a backend whose locks end with the holder's connection (PostgreSQL and MySQL in their
/// default session mode), a finished run stays, holding the interval's lock, until its hold
/// is over: a firing after the run ended (same interval) skips with 79 instead of running
/// the job again; the first run then exits 0.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn a_finished_run_holds_the_interval_until_its_end(url: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("runs");
    let once = |tag: &str| {
        dlock(url)
            .args(["once", "--every", "1h", "--at-most", "4s", "report", "-c"])
            .arg(format!("echo {tag} >> '{}'", log.display()))
            .stderr(Stdio::piped())
            .spawn()
            .expect("once")
    };
    let first = once("first");
    let t = std::time::Instant::now();
    while std::fs::read_to_string(&log).unwrap_or_default().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the first run never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past the command's end (the first process may have exited by now).
    std::thread::sleep(Duration::from_millis(500));
    let second = once("second").wait_with_output().expect("second");
    let first = first.wait_with_output().expect("first");
    let runs = std::fs::read_to_string(&log).expect("log");
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        ["first"],
        "{url}: {second:?}"
    );
    assert_eq!(second.status.code(), Some(79), "{url}: {second:?}");
    assert_eq!(first.status.code(), Some(0), "{url}: {first:?}");
}

#[cfg(feature = "postgres")]
#[test]
fn a_finished_run_holds_the_interval_on_postgres_sessions() {
    let pg = distlock_testkit::PostgresServer::start().expect("postgres");
    a_finished_run_holds_the_interval_until_its_end(&pg.url());
}

#[cfg(feature = "mysql")]
#[test]
fn a_finished_run_holds_the_interval_on_mysql_sessions() {
    let db = distlock_testkit::MariaDbServer::start().expect("mariadb");
    a_finished_run_holds_the_interval_until_its_end(&db.url());
}

/// Hosts whose clocks are off (the `DLOCK_TEST_CLOCK_SKEW_MS` hook: 3 s behind, 3.9 s
/// ahead, with 4 s intervals: by their own clocks the previous and the next interval) fire just after one host ran the job: on a backend with a clock
/// (Redis), they read the interval on it and skip (79) instead of running the job for the
/// interval their own clock shows.
#[test]
fn hosts_with_skewed_clocks_do_not_run_the_job_twice() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("runs");
    let every = Duration::from_secs(4);
    sleep_to_boundary(every, Duration::from_millis(150));
    let first = fire(&url, "4s", &log).wait_with_output().expect("once");
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let skewed: Vec<Child> = ["-3000", "3900"]
        .iter()
        .map(|skew| {
            dlock(&url)
                .env("DLOCK_TEST_CLOCK_SKEW_MS", skew)
                .args(["once", "--every", "4s", "job", "-c"])
                .arg(format!("echo skewed >> '{}'", log.display()))
                .stderr(Stdio::piped())
                .spawn()
                .expect("once")
        })
        .collect();
    for child in skewed {
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(79), "{err}");
    }
    let runs = std::fs::read_to_string(&log).expect("log");
    assert_eq!(runs.lines().count(), 1, "{runs}");
}

/// The time to live (ms) of job `name`'s interval lock (of the two names, the one held).
fn interval_ttl(server: &RedisServer, name: &str) -> i64 {
    (0..2)
        .map(|slot| {
            server
                .command(&["PTTL", &format!("dlock:{{{name}@{slot}}}")])
                .expect("pttl")
                .trim()
                .parse()
                .expect("ttl")
        })
        .max()
        .expect("two")
}

/// On a backend whose leases expire, dlock once exits when the command ends and the server
/// keeps the name locked for the rest of the interval: a second firing is skipped with 79.
#[test]
fn a_finished_run_keeps_the_interval_on_the_server() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    // An interval far longer than the test: the next firing is in the same one.
    let out = dlock(&url)
        .args(["once", "--every", "1h", "report", "--", "true"])
        .output()
        .expect("once");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ttl = interval_ttl(&server, "report");
    assert!(ttl > 60_000, "the name stays locked past the run: {ttl} ms");
    let out = dlock(&url)
        .args(["once", "--every", "1h", "report", "--", "echo", "again"])
        .output()
        .expect("once");
    assert_eq!(out.status.code(), Some(79), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    // --at-most caps the hold.
    let out = dlock(&url)
        .args([
            "once",
            "--every",
            "1h",
            "--at-most",
            "2s",
            "capped",
            "--",
            "true",
        ])
        .output()
        .expect("once");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ttl = interval_ttl(&server, "capped");
    assert!(ttl > 0 && ttl <= 2_000, "{ttl}");
}

/// A run that outlasts its interval: the next interval's firing skips with 75 (running
/// elsewhere) instead of running the job twice at once.
#[test]
fn a_run_still_going_at_the_next_interval_is_not_joined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", dir.path().display());
    let every = Duration::from_secs(1);
    sleep_to_boundary(every, Duration::from_millis(100));
    let long = dlock(&url)
        .args(["once", "--every", "1s", "long", "--", "sleep", "2.5"])
        .spawn()
        .expect("once");
    sleep_to_boundary(every, Duration::from_millis(300));
    let out = dlock(&url)
        .args(["once", "--every", "1s", "long", "--", "echo", "twice"])
        .output()
        .expect("once");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let st = long.wait_with_output().expect("wait").status;
    assert_eq!(st.code(), Some(0), "{st:?}");
}
