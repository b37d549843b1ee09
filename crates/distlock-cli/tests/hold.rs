//! `dlock hold`: the token on stdout, held until stdin closes or a signal, exit 76 when the
//! lock is lost; real processes against `file://` and a redis-server.

use distlock_testkit::RedisServer;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(url: &str) -> Command {
    let mut c = Command::new(DLOCK);
    c.env("DLOCK_BACKEND", url);
    c
}

/// One try at `name`: dlock run's exit code.
fn try_once(url: &str, name: &str) -> Option<i32> {
    dlock(url)
        .args(["run", "-n", name, "true"])
        .stderr(Stdio::null())
        .status()
        .expect("run")
        .code()
}

/// `dlock hold ARGS…` with piped stdin and stdout, and the token line it printed.
fn hold(url: &str, args: &[&str]) -> (Child, u64, BufReader<ChildStdout>) {
    let mut child = dlock(url)
        .arg("hold")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hold");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read the token");
    let token = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("token {line:?}"));
    (child, token, out)
}

/// Waits for `child`, failing after `limit`.
fn exit_within(child: &mut Child, limit: Duration) -> Option<i32> {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st.code();
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("dlock hold still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stdin_and_signal_release(url: &str) {
    let (mut child, token, _out) = hold(url, &["-w", "5", "job"]);
    assert!(token > 0);
    assert_eq!(try_once(url, "job"), Some(75), "held while dlock hold runs");
    // Closing its stdin releases.
    drop(child.stdin.take());
    assert_eq!(exit_within(&mut child, Duration::from_secs(10)), Some(0));
    assert_eq!(try_once(url, "job"), Some(0), "released");

    // SIGTERM releases too, and the next holder gets a higher token.
    let (mut child, next, _out) = hold(url, &["job"]);
    assert!(next > token, "{token} then {next}");
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(exit_within(&mut child, Duration::from_secs(10)), Some(0));
    assert_eq!(try_once(url, "job"), Some(0), "released");
}

#[test]
fn stdin_end_and_sigterm_release_on_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    stdin_and_signal_release(&format!("file://{}", dir.path().display()));
}

#[test]
fn stdin_end_and_sigterm_release_on_redis() {
    let server = RedisServer::start().expect("redis");
    stdin_and_signal_release(&server.url());
}

#[test]
fn not_acquired_prints_no_token_and_a_lost_lock_exits_76() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let (mut holder, _, _out) = hold(&url, &["--lease", "1s", "gone"]);
    // Taken: exit 75 (or -E), nothing on stdout for a script's `read`.
    let out = dlock(&url)
        .args(["hold", "-n", "-E", "3", "gone"])
        .stdin(Stdio::piped())
        .output()
        .expect("hold");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    // The lock taken away: the watchdog's next renewal finds it gone; exit 76 at once.
    server.command(&["DEL", "dlock:{gone}"]).expect("del");
    assert_eq!(exit_within(&mut holder, Duration::from_secs(10)), Some(76));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert!(err.contains("lock `gone` was lost while held"), "{err}");
}
