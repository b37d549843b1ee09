//! `dlock run` and `dlock inspect` as real processes against a real redis-server.

use distlock_testkit::RedisServer;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(url: &str) -> Command {
    let mut c = Command::new(DLOCK);
    c.env("DLOCK_BACKEND", url);
    c
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn held(server: &RedisServer, name: &str) -> bool {
    server
        .command(&["EXISTS", &format!("dlock:{{{name}}}")])
        .expect("exists")
        == "1"
}

/// Runs `cmd` to its end, or kills it after `limit` and fails: a test of "ends at once" must
/// not hang when it does not.
fn output_within(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // SAFETY: signalling a child we spawned (not yet reaped: its waiter still waits).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().expect("output").expect("wait");
            panic!(
                "still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        }
    }
}

fn kill(child: &std::process::Child, sig: i32) {
    // SAFETY: signalling a child we spawned.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

#[test]
fn runs_the_command_with_the_token_and_passes_its_exit_code() {
    let server = RedisServer::start().expect("redis");
    let out = dlock(&server.url())
        .args(["run", "--wait", "2s", "job", "--"])
        .args([
            "sh",
            "-c",
            "echo \"$DLOCK_NAME $DLOCK_FENCING_TOKEN\"; exit 7",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let first: u64 = match stdout.trim().split_once(' ') {
        Some(("job", token)) => token.parse().expect("token"),
        _ => panic!("unexpected output {stdout:?}"),
    };
    // Released afterwards; the next run gets a higher token.
    assert!(!held(&server, "job"));
    let out = dlock(&server.url())
        .args(["run", "job", "--", "sh", "-c", "echo $DLOCK_FENCING_TOKEN"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let second: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("token");
    // Tokens only grow (the counter is seeded from the server clock, so not from 1).
    assert!(second > first, "{first} then {second}");
}

#[test]
fn exit_75_when_not_acquired_in_time_and_inspect_shows_the_holder() {
    let server = RedisServer::start().expect("redis");
    let mut holder = dlock(&server.url())
        .args(["run", "busy", "--", "sleep", "30"])
        .spawn()
        .expect("holder");
    wait_until("the holder", Duration::from_secs(10), || {
        held(&server, "busy")
    });
    let t = Instant::now();
    let out = dlock(&server.url())
        .args(["run", "--wait", "300ms", "busy", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not acquired within"));
    let out = dlock(&server.url())
        .args(["run", "--wait", "0", "busy", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75), "--wait 0 tries once");

    let out = dlock(&server.url())
        .args(["inspect", "busy", "--json"])
        .output()
        .expect("inspect");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["name"], "busy");
    assert_eq!(v["held"], true);
    assert!(v["fencing_token"].as_u64().is_some_and(|t| t > 0), "{v}");
    assert_eq!(v["holders"][0]["count"], 1);
    let left = v["holders"][0]["lease_ms_left"].as_u64().expect("lease");
    assert!(left > 0 && left <= 30_000, "{left}");
    // SIGTERM is forwarded to the command; its exit status is passed on and the lock released.
    kill(&holder, libc::SIGTERM);
    let st = holder.wait().expect("wait");
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "{st:?}");
    assert!(!held(&server, "busy"));
}

#[test]
fn exit_76_and_the_command_is_stopped_when_the_lock_is_lost() {
    let server = RedisServer::start().expect("redis");
    let mut child = dlock(&server.url())
        .args([
            "run", "--lease", "600ms", "--grace", "1s", "lost", "--", "sleep", "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    wait_until("the holder", Duration::from_secs(10), || {
        held(&server, "lost")
    });
    let t = Instant::now();
    server.command(&["DEL", "dlock:{lost}"]).expect("del");
    let st = child.wait().expect("wait");
    assert_eq!(st.code(), Some(76), "{st:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(err.contains("was lost"), "{err}");
}

#[test]
fn a_killed_holder_process_frees_the_lock_at_lease_end() {
    let server = RedisServer::start().expect("redis");
    // Its own process group, so the crash takes the command (`sleep`) down with it.
    let mut holder = dlock(&server.url())
        .args(["run", "--lease", "1s", "crash", "--", "sleep", "30"])
        .process_group(0)
        .spawn()
        .expect("holder");
    wait_until("the holder", Duration::from_secs(10), || {
        held(&server, "crash")
    });
    // SAFETY: signalling the process group of a child we spawned.
    unsafe {
        libc::kill(-(holder.id() as libc::pid_t), libc::SIGKILL);
    }
    let _ = holder.wait();
    let t = Instant::now();
    let out = dlock(&server.url())
        .args(["run", "--wait", "10s", "crash", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?} {out:?}");
}

#[test]
fn a_killed_waiter_does_not_block_the_queue() {
    let server = RedisServer::start().expect("redis");
    let mut holder = dlock(&server.url())
        .args(["run", "queue", "--", "sleep", "30"])
        .spawn()
        .expect("holder");
    wait_until("the holder", Duration::from_secs(10), || {
        held(&server, "queue")
    });
    let mut waiter = dlock(&server.url())
        .args(["run", "--lease", "20s", "queue", "--", "true"])
        .spawn()
        .expect("waiter");
    wait_until("the waiter to queue", Duration::from_secs(10), || {
        server
            .command(&["ZCARD", "dlock:{queue}:queue"])
            .expect("zcard")
            == "1"
    });
    kill(&waiter, libc::SIGKILL);
    let _ = waiter.wait();
    // The dead waiter's place expires (a queue place lives 2 s without heartbeats); a live
    // waiter queues behind. Handing the lock to the dead waiter would block it for its 20 s
    // lease.
    std::thread::sleep(Duration::from_millis(2200));
    let mut second = dlock(&server.url())
        .args(["run", "--wait", "20s", "queue", "--", "true"])
        .spawn()
        .expect("second waiter");
    wait_until(
        "the second waiter to queue",
        Duration::from_secs(10),
        || {
            server
                .command(&["ZRANGE", "dlock:{queue}:queue", "0", "-1"])
                .expect("zrange")
                .lines()
                .count()
                >= 1
        },
    );
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    kill(&holder, libc::SIGTERM);
    let _ = holder.wait();
    let st = second.wait().expect("wait");
    assert_eq!(st.code(), Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "handoff skipped the dead waiter too slowly: {:?}",
        t.elapsed()
    );
}

#[test]
fn bad_input_gives_clear_errors() {
    let server = RedisServer::start().expect("redis");
    let cases: &[(&[&str], &str)] = &[
        (&["run", "", "--", "true"], "empty"),
        (
            &["run", "--lease", "0", "x", "--", "true"],
            "watchdog lease",
        ),
        (
            &["run", "--wait", "soon", "x", "--", "true"],
            "not a duration",
        ),
        (&["inspect", ""], "empty"),
    ];
    for (args, want) in cases {
        let out = dlock(&server.url()).args(*args).output().expect("run");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = dlock("redis://127.0.0.1:1")
        .args(["inspect", "x"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:1"));
    let out = dlock("nope://x")
        .args(["inspect", "x"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scheme"));
    let out = dlock(&server.url())
        .args(["run", "x", "--", "/no/such/program"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(127));
    assert!(!held(&server, "x"), "lock left behind after a failed spawn");
}

#[test]
fn kinds_read_write_semaphore_fair() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    // Two readers at once; a writer cannot get in meanwhile.
    let r1 = dlock(&url)
        .args(["run", "--kind", "read", "doc", "--", "sleep", "30"])
        .spawn()
        .expect("reader");
    let r2 = dlock(&url)
        .args([
            "run", "--kind", "read", "--wait", "5s", "doc", "--", "sleep", "30",
        ])
        .spawn()
        .expect("reader");
    let inspect = |args: &[&str]| -> serde_json::Value {
        let out = dlock(&url).args(args).output().expect("inspect");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("json")
    };
    wait_until("two readers", Duration::from_secs(10), || {
        inspect(&["inspect", "--kind", "read", "--json", "doc"])["holders"]
            .as_array()
            .is_some_and(|h| h.len() == 2)
    });
    let v = inspect(&["inspect", "--kind", "write", "--json", "doc"]);
    assert_eq!(v["holders"][0]["side"], "read");
    let out = dlock(&url)
        .args([
            "run", "--kind", "write", "--wait", "300ms", "doc", "--", "true",
        ])
        .output()
        .expect("writer");
    assert_eq!(
        out.status.code(),
        Some(75),
        "a writer got in with readers inside"
    );
    for mut r in [r1, r2] {
        kill(&r, libc::SIGTERM);
        let _ = r.wait();
    }
    let out = dlock(&url)
        .args([
            "run", "--kind", "write", "--wait", "5s", "doc", "--", "true",
        ])
        .output()
        .expect("writer");
    assert_eq!(out.status.code(), Some(0));

    // A semaphore of 2: two holders, the third waits in vain.
    let s1 = dlock(&url)
        .args(["run", "--kind", "semaphore=2", "pool", "--", "sleep", "30"])
        .spawn()
        .expect("permit");
    let s2 = dlock(&url)
        .args(["run", "--kind", "semaphore=2", "pool", "--", "sleep", "30"])
        .spawn()
        .expect("permit");
    wait_until("two permits", Duration::from_secs(10), || {
        inspect(&["inspect", "--kind", "semaphore=2", "--json", "pool"])["permits_in_use"] == 2
    });
    let out = dlock(&url)
        .args([
            "run",
            "--kind",
            "semaphore=2",
            "--wait",
            "300ms",
            "pool",
            "--",
            "true",
        ])
        .output()
        .expect("third");
    assert_eq!(out.status.code(), Some(75));
    for mut s in [s1, s2] {
        kill(&s, libc::SIGTERM);
        let _ = s.wait();
    }
    let out = dlock(&url)
        .args([
            "run", "--kind", "fair", "--wait", "5s", "queue", "--", "true",
        ])
        .output()
        .expect("fair");
    assert_eq!(out.status.code(), Some(0));
    let out = dlock(&url)
        .args(["run", "--kind", "semaphore=0", "pool", "--", "true"])
        .output()
        .expect("bad kind");
    assert_eq!(out.status.code(), Some(2));
}

/// `--wait 0` and `-n` are one attempt *after* connecting: a free lock is acquired on a
/// server, every time (the connection is not timed against the zero wait).
#[test]
fn wait_0_and_nonblock_acquire_free_locks_on_redis() {
    let server = RedisServer::start().expect("redis");
    let mut failed = Vec::new();
    for i in 0..20 {
        let try_once: &[&str] = if i % 2 == 0 {
            &["--wait", "0"]
        } else {
            &["-n"]
        };
        let name = format!("free-{i}");
        let out = dlock(&server.url())
            .arg("run")
            .args(try_once)
            .args([name.as_str(), "--", "true"])
            .output()
            .expect("run");
        if out.status.code() != Some(0) {
            failed.push(format!(
                "{try_once:?} {name}: {:?} {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 20 failed: {failed:#?}",
        failed.len()
    );
}

/// A server that cannot be reached is its own exit status (69) and message, with or without
/// a wait; never 75 "another owner held it".
#[test]
fn an_unreachable_server_is_exit_69_never_another_owner() {
    let url = format!("redis://127.0.0.1:{}", distlock_testkit::free_port());
    for wait in [&["--wait", "0"][..], &["--wait", "100ms"], &["-n"]] {
        let t = Instant::now();
        let out = output_within(
            dlock(&url).arg("run").args(wait).args([
                "--connect-timeout",
                "1s",
                "down",
                "--",
                "true",
            ]),
            Duration::from_secs(30),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{wait:?}: {out:?}");
        assert!(err.contains("cannot reach"), "{wait:?}: {err}");
        assert!(!err.contains("another owner"), "{wait:?}: {err}");
        // The connection is retried for --connect-timeout, not longer.
        assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    }
}

/// Errors that waiting cannot heal end at once with exit 1 and one line, never "retrying":
/// a `file://` path that is not a directory, a server that does not speak the protocol.
#[test]
fn permanent_errors_end_at_once_with_exit_1_and_one_line() {
    let dir = distlock_testkit::TempDir::with_prefix("dlock-run-permanent").expect("dir");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").expect("write");
    // Not a redis server: answers every connection with an HTTP error and closes it.
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let http_url = format!("redis://{}", http.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for conn in http.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 512];
            let _ = std::io::Read::read(&mut conn, &mut buf);
            let _ = std::io::Write::write_all(
                &mut conn,
                b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            );
        }
    });
    let file_url = format!("file://{}", file.display());
    for url in [file_url.as_str(), http_url.as_str()] {
        // No --wait (forever) and a long one: neither is spent on an error waiting cannot heal.
        for wait in [&[][..], &["--wait", "60s"]] {
            let out = output_within(
                dlock(url)
                    .arg("run")
                    .args(wait)
                    .args(["perm", "--", "true"])
                    .stdin(Stdio::null()),
                Duration::from_secs(30),
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{url} {wait:?}: {out:?}");
            assert!(!err.contains("retrying"), "{url} {wait:?}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{url} {wait:?}: {err}");
        }
    }
}

/// With neither --backend nor DLOCK_BACKEND, `run` says once that the lock (a file on this
/// host) covers this host only: a cron job on several hosts gets no exclusion from it.
#[test]
fn the_default_backend_says_it_covers_this_host_only() {
    let name = format!("default-backend-{}", std::process::id());
    let out = Command::new(DLOCK)
        .env_remove("DLOCK_BACKEND")
        .args(["run", "-n", &name, "--", "true"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(err.matches("this host only").count(), 1, "{err}");
    // Named explicitly: nothing to say.
    let out = dlock("file://")
        .args(["run", "-n", &name, "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
}
