//! `dlock run` never lets the command (or its children) outlive the lock: real processes,
//! file:// (no server) and a real redis-server for the lease-based cases.

mod descendants;

use descendants::{alive, Cmd, Where};
use distlock_testkit::{RedisServer, TempDir};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// The binary under test: this build, or `DLOCK_TEST_BIN` (to run these tests against another
/// build, e.g. the one before a fix, and see them fail).
fn bin() -> String {
    std::env::var("DLOCK_TEST_BIN").unwrap_or_else(|_| DLOCK.to_string())
}

fn dlock(url: &str) -> Command {
    let mut c = Command::new(bin());
    c.env("DLOCK_BACKEND", url);
    c
}

fn file_url(dir: &TempDir) -> String {
    format!("file://{}", dir.path().display())
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling a process this test started.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

fn pids(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A command whose shell and a background child write their pids to `file`, then wait.
fn family(file: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "sleep 300 & echo $! >> {f}; echo $$ >> {f}; wait",
            f = file.display()
        ),
    ]
}

/// Starts `dlock run ARGS… -- family` (stderr piped) and waits until the shell and its child
/// have written their pids; returns dlock and the two pids.
fn run_family(url: &str, args: &[&str], pidfile: &Path) -> (Child, Vec<u32>) {
    let holder = dlock(url)
        .arg("run")
        .args(args)
        .arg("--")
        .args(family(pidfile))
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock");
    wait_until("the command and its child", Duration::from_secs(10), || {
        pids(pidfile).len() == 2
    });
    (holder, pids(pidfile))
}

fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut s) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut s, &mut err);
    }
    err
}

fn held(server: &RedisServer, name: &str) -> bool {
    server
        .command(&["EXISTS", &format!("dlock:{{{name}}}")])
        .expect("exists")
        == "1"
}

#[test]
fn kill_9_of_dlock_takes_the_command_and_its_children_down_within_a_second() {
    let dir = TempDir::new().expect("tempdir");
    let url = file_url(&dir);
    let pidfile = dir.path().join("pids");
    let (mut holder, family) = run_family(&url, &["k9"], &pidfile);
    assert!(family.iter().all(|&p| alive(p)), "{family:?}");
    signal(holder.id(), libc::SIGKILL);
    let _ = holder.wait();
    let t = Instant::now();
    wait_until(
        "the command's family to die",
        Duration::from_secs(1),
        || !family.iter().any(|&p| alive(p)),
    );
    eprintln!("family gone {:?} after kill -9", t.elapsed());
    // The lock is free (file:// frees it with the guard, which exits just after the family it
    // killed: a one-try run right after raced it, 1 in 5) and nothing of the old run is left.
    let out = dlock(&url)
        .args(["run", "--wait", "2s", "k9", "--", "true"])
        .output()
        .expect("next run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn leftover_children_are_stopped_before_the_lock_is_released() {
    let dir = TempDir::new().expect("tempdir");
    let url = file_url(&dir);
    let pidfile = dir.path().join("pids");
    // The shell exits at once and leaves a child behind in its group.
    let out = dlock(&url)
        .args(["run", "--grace", "200ms", "left", "--", "sh", "-c"])
        .arg(format!(
            "sleep 300 & echo $! >> {f}; exit 3",
            f = pidfile.display()
        ))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let left = pids(&pidfile);
    assert_eq!(left.len(), 1);
    assert!(!alive(left[0]), "a child of the command outlived the run");
}

#[test]
fn signals_are_forwarded_to_the_whole_group() {
    let dir = TempDir::new().expect("tempdir");
    let url = file_url(&dir);
    let pidfile = dir.path().join("pids");
    let (mut holder, family) = run_family(&url, &["sig"], &pidfile);
    signal(holder.id(), libc::SIGINT);
    let st = holder.wait().expect("wait");
    assert_eq!(st.code(), Some(128 + libc::SIGINT), "{st:?}");
    wait_until("the family to die", Duration::from_secs(2), || {
        !family.iter().any(|&p| alive(p))
    });
}

#[test]
fn wait_1_waits_one_second() {
    let dir = TempDir::new().expect("tempdir");
    let url = file_url(&dir);
    let marker = dir.path().join("running");
    let mut holder = dlock(&url)
        .args(["run", "busy", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 30", marker.display()))
        .spawn()
        .expect("holder");
    wait_until("the holder", Duration::from_secs(10), || marker.exists());
    let t = Instant::now();
    let out = dlock(&url)
        .args(["run", "--wait", "1", "busy", "--", "true"])
        .output()
        .expect("run");
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    signal(holder.id(), libc::SIGTERM);
    let _ = holder.wait();
}

#[test]
fn a_lost_lock_stops_grandchildren() {
    let server = RedisServer::start().expect("redis");
    let dir = TempDir::new().expect("tempdir");
    let pidfile = dir.path().join("pids");
    let (mut child, family) = run_family(&server.url(), &["--lease", "2s", "lost"], &pidfile);
    server.command(&["DEL", "dlock:{lost}"]).expect("del");
    let st = child.wait().expect("wait");
    assert_eq!(st.code(), Some(76), "{st:?}");
    let err = stderr_of(&mut child);
    assert!(err.contains("was lost"), "{err}");
    // dlock exits only once the group is gone.
    let alive_now: Vec<_> = family.iter().filter(|&&p| alive(p)).collect();
    assert!(alive_now.is_empty(), "still running: {alive_now:?}");
}

/// Appends a nanosecond timestamp to `log` every 20 ms, for `secs` seconds (forever if None).
fn ticker(log: &Path, secs: Option<u32>) -> Vec<String> {
    let body = match secs {
        None => "while :; do date +%s%N >> LOG; sleep 0.02; done".to_string(),
        Some(s) => format!(
            "end=$(( $(date +%s) + {s} )); while [ $(date +%s) -lt $end ]; do date +%s%N >> LOG; sleep 0.02; done; echo done >> LOG"
        ),
    };
    vec![
        "sh".into(),
        "-c".into(),
        body.replace("LOG", &log.display().to_string()),
    ]
}

fn stamps(log: &Path) -> (Vec<u128>, bool) {
    let s = std::fs::read_to_string(log).unwrap_or_default();
    let done = s.lines().any(|l| l == "done");
    (
        s.lines().filter_map(|l| l.trim().parse().ok()).collect(),
        done,
    )
}

/// Pauses a holding dlock past its lease while the next holder takes the lock; checks that the
/// command wrote nothing after the next holder started and that dlock exits 76 on resume.
fn paused_holder_case(name: &str, command_secs: Option<u32>) {
    let server = RedisServer::start().expect("redis");
    let dir = TempDir::new().expect("tempdir");
    let log = dir.path().join("log");
    let start = dir.path().join("next-started");
    let mut holder = dlock(&server.url())
        .args(["run", "--lease", "2s", "--grace", "200ms", name, "--"])
        .args(ticker(&log, command_secs))
        .stderr(Stdio::piped())
        .spawn()
        .expect("holder");
    wait_until("the command to write", Duration::from_secs(10), || {
        stamps(&log).0.len() >= 3
    });
    signal(holder.id(), libc::SIGSTOP);
    let paused = Instant::now();
    let out = dlock(&server.url())
        .args(["run", "--wait", "20s", name, "--", "sh", "-c"])
        .arg(format!("date +%s%N > {}", start.display()))
        .output()
        .expect("next holder");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let next_started: u128 = std::fs::read_to_string(&start)
        .expect("start time")
        .trim()
        .parse()
        .expect("number");
    eprintln!("next holder ran {:?} into the pause", paused.elapsed());
    // Let the old command write on, if it still could.
    std::thread::sleep(Duration::from_millis(300));
    let (before_resume, _) = stamps(&log);
    signal(holder.id(), libc::SIGCONT);
    let st = holder.wait().expect("wait");
    let err = stderr_of(&mut holder);
    let (after, done) = stamps(&log);
    let last = after.iter().copied().max().expect("stamps");
    // The safety property first: nothing written once the next holder had the lock.
    assert!(
        last < next_started,
        "the command wrote {} ms after the next holder started: {err}",
        (last - next_started) / 1_000_000
    );
    assert!(!done, "the command ran to its end without the lock: {err}");
    assert_eq!(
        before_resume.len(),
        after.len(),
        "the command wrote after dlock resumed: {err}"
    );
    assert_eq!(st.code(), Some(76), "{st:?}: {err}");
    assert!(err.contains("lease ended"), "{err}");
}

#[test]
fn a_paused_dlock_exits_76_and_its_command_stops_before_the_next_holder() {
    paused_holder_case("paused", None);
}

#[test]
fn a_paused_dlock_exits_76_when_its_command_would_have_finished_during_the_pause() {
    // The command means to finish 3 to 4 s in, during the pause, after the lease (2 s) ended.
    paused_holder_case("paused-finish", Some(4));
}

#[test]
fn a_command_that_finished_within_the_lease_during_a_pause_keeps_its_status() {
    let server = RedisServer::start().expect("redis");
    let dir = TempDir::new().expect("tempdir");
    let go = dir.path().join("go");
    let started = dir.path().join("started");
    let mut holder = dlock(&server.url())
        .args([
            "run", "--lease", "2s", "--grace", "200ms", "brief", "--", "sh", "-c",
        ])
        .arg(format!(
            "touch {s}; while [ ! -e {g} ]; do sleep 0.01; done; exit 4",
            s = started.display(),
            g = go.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .expect("holder");
    wait_until("the command", Duration::from_secs(10), || started.exists());
    signal(holder.id(), libc::SIGSTOP);
    // The command ends at once, well within the lease; dlock stays paused past the lease.
    std::fs::write(&go, "").expect("go");
    wait_until("the lease to run out", Duration::from_secs(10), || {
        !held(&server, "brief")
    });
    signal(holder.id(), libc::SIGCONT);
    let st = holder.wait().expect("wait");
    let err = stderr_of(&mut holder);
    assert_eq!(st.code(), Some(4), "{st:?}: {err}");
}

#[test]
fn a_paused_waiter_still_acquires_within_wait() {
    let server = RedisServer::start().expect("redis");
    let mut holder = dlock(&server.url())
        .args(["run", "q", "--", "sleep", "30"])
        .spawn()
        .expect("holder");
    wait_until("the holder", Duration::from_secs(10), || held(&server, "q"));
    let mut waiter = dlock(&server.url())
        .args(["run", "--wait", "30s", "--lease", "2s", "q", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("waiter");
    wait_until("the waiter to queue", Duration::from_secs(10), || {
        server
            .command(&["ZCARD", "dlock:{q}:queue"])
            .expect("zcard")
            == "1"
    });
    // Paused past the life of its place in the queue.
    signal(waiter.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    signal(waiter.id(), libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(300));
    signal(holder.id(), libc::SIGTERM);
    let _ = holder.wait();
    let t = Instant::now();
    let st = waiter.wait().expect("wait");
    let err = stderr_of(&mut waiter);
    assert_eq!(st.code(), Some(0), "{st:?}: {err}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
}

#[test]
fn connection_errors_are_retried_within_wait() {
    let mut server = RedisServer::start().expect("redis");
    let url = server.url();
    server.kill();
    // Nothing listens: connecting is retried for --connect-timeout, then exit 69 with the
    // last error (not 75: nobody was found holding the lock).
    let t = Instant::now();
    let out = dlock(&url)
        .args([
            "run",
            "--wait",
            "1",
            "--connect-timeout",
            "1",
            "x",
            "--",
            "true",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(t.elapsed() >= Duration::from_secs(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach"), "{err}");
    assert!(err.contains("refused"), "{err}");
    // The server comes back while dlock tries to connect: the run goes ahead.
    let mut waiter = dlock(&url)
        .args(["run", "--wait", "30", "x", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("waiter");
    std::thread::sleep(Duration::from_millis(700));
    server.restart().expect("restart");
    let st = waiter.wait().expect("wait");
    let err = stderr_of(&mut waiter);
    assert_eq!(st.code(), Some(0), "{st:?}: {err}");
    // What cannot heal ends at once with 1.
    let t = Instant::now();
    let out = dlock("nope://x")
        .args(["run", "--wait", "30", "x", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn completions_and_man_page() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(bin())
            .args(["completions", shell])
            .output()
            .expect("completions");
        assert!(out.status.success(), "{out:?}");
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(s.contains("dlock") && s.contains("grace"), "{shell}");
        assert!(!s.contains("__guard"), "hidden commands leak into {shell}");
    }
    let out = Command::new(bin()).arg("man").output().expect("man");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH dlock"));
    let out = Command::new(bin())
        .args(["man", "run"])
        .output()
        .expect("man run");
    assert!(out.status.success(), "{out:?}");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("grace") && s.contains("FENCING"), "{s}");
    let out = Command::new(bin())
        .args(["man", "__guard"])
        .output()
        .expect("man");
    // No such (visible) subcommand: a usage error.
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_guard_refuses_to_run_on_its_own() {
    let out = Command::new(bin())
        .args([
            "__guard",
            "--fd",
            "3",
            "--parent",
            "1",
            "--grace-ns",
            "0",
            "--",
            "true",
        ])
        .output()
        .expect("guard");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn failing_renewals_stop_the_command_before_the_lease_ends() {
    let server = RedisServer::start().expect("redis");
    let proxy = distlock_testkit::DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let via_proxy = format!("redis://127.0.0.1:{}", proxy.port());
    let dir = TempDir::new().expect("tempdir");
    let log = dir.path().join("log");
    let start = dir.path().join("next-started");
    // The command ignores SIGTERM: only the SIGKILL at the end of --grace stops it, and that
    // too must come before the lease ends.
    let mut holder = dlock(&via_proxy)
        .args([
            "run", "--lease", "2s", "--grace", "300ms", "cut", "--", "sh", "-c",
        ])
        .arg(format!(
            "trap '' TERM; while :; do date +%s%N >> {l}; sleep 0.02; done",
            l = log.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .expect("holder");
    wait_until("the command to write", Duration::from_secs(10), || {
        stamps(&log).0.len() >= 3
    });
    // Renewals stop getting through; the server lets the lease run out.
    proxy.set_blackhole(true);
    let out = dlock(&server.url())
        .args(["run", "--wait", "20s", "cut", "--", "sh", "-c"])
        .arg(format!("date +%s%N > {}", start.display()))
        .output()
        .expect("next holder");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let next_started: u128 = std::fs::read_to_string(&start)
        .expect("start time")
        .trim()
        .parse()
        .expect("number");
    let st = holder.wait().expect("wait");
    let err = stderr_of(&mut holder);
    assert_eq!(st.code(), Some(76), "{st:?}: {err}");
    assert!(err.contains("stopping the command"), "{err}");
    let last = stamps(&log).0.into_iter().max().expect("stamps");
    assert!(
        last < next_started,
        "the command wrote {} ms after the next holder started: {err}",
        (last - next_started) / 1_000_000
    );
}

// Every process the command started, whatever group or session it moved to, is gone before
// the lock is reported lost, released, or can go to another owner (see `descendants`).

#[test]
fn a_lost_lock_stops_descendants_in_other_groups_and_sessions() {
    descendants::lost_lock(Cmd::Run);
}

#[test]
fn failing_renewals_stop_descendants_in_other_groups_before_the_next_owner() {
    descendants::renewals_fail(Cmd::Run);
}

#[test]
fn descendants_a_finished_command_leaves_are_gone_before_the_release_redis() {
    descendants::normal_exit(Cmd::Run, Where::Redis);
}

#[test]
fn descendants_a_finished_command_leaves_are_gone_before_the_release_file() {
    descendants::normal_exit(Cmd::Run, Where::File);
}

#[test]
fn kill_9_of_dlock_on_file_holds_the_lock_until_every_descendant_is_gone() {
    descendants::dlock_killed_on_file(Cmd::Run, libc::SIGKILL);
}

#[test]
fn sigterm_to_dlock_on_file_stops_every_descendant_before_the_release() {
    descendants::dlock_killed_on_file(Cmd::Run, libc::SIGTERM);
}

#[test]
fn a_killed_dlock_on_file_keeps_the_lock_while_its_guard_is_still_stopping_the_command() {
    descendants::dlock_killed_while_its_guard_is_held(Cmd::Run);
}

#[test]
fn a_guard_killed_from_outside_leaves_nothing_running_when_dlock_releases() {
    descendants::guard_killed(Cmd::Run);
}
