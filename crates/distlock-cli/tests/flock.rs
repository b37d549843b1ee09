//! `dlock` the way operators use flock(1): the holder named when a wait runs out, `-v` and
//! `DLOCK_LOG`, `-c`, `-E`, `-s`/`-x`; real processes against a redis-server and `file://`.

use distlock_testkit::RedisServer;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(url: &str) -> Command {
    let mut c = Command::new(DLOCK);
    c.env("DLOCK_BACKEND", url)
        .env_remove("DLOCK_LOG")
        .env_remove("RUST_LOG");
    c
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether `dlock inspect NAME` (of `kind`) shows a holder.
fn held(url: &str, name: &str, kind: &str) -> bool {
    let out = dlock(url)
        .args(["inspect", name, "--json", "--kind", kind])
        .output()
        .expect("inspect");
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .map(|v| v["held"] == true)
        .unwrap_or(false)
}

/// A `dlock run NAME -- sleep 30` holding `name` (of `kind`) until killed.
struct Holder(Child);

impl Holder {
    fn start(url: &str, name: &str, kind: &str) -> Holder {
        let child = dlock(url)
            .args(["run", "--kind", kind, name, "--", "sleep", "30"])
            .stderr(Stdio::null())
            .spawn()
            .expect("holder");
        wait_until("the holder", Duration::from_secs(10), || {
            held(url, name, kind)
        });
        Holder(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: signalling a child we spawned; dlock forwards it and releases.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// The timeout message names the holder: owner, host, pid, how long it has held at least,
/// and its lease. (Before: "lock `busy` was not acquired within 1s: another owner held it
/// the whole time".)
fn names_the_holder(url: &str, lease: bool) {
    let holder = Holder::start(url, "busy", "mutex");
    let pid = format!("pid {})", holder.0.id());
    let out = dlock(url)
        .args(["run", "--wait", "1s", "busy", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("was not acquired within 1s: held by "),
        "{err}"
    );
    assert!(err.contains(&pid), "{err}");
    assert!(err.contains("for at least "), "{err}");
    if lease {
        assert!(err.contains(" left"), "{err}");
    }
    let out = dlock(url)
        .args(["run", "-n", "busy", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("on its one try (-n, --wait 0): held by "),
        "{err}"
    );
    assert!(err.contains(&pid), "{err}");
}

#[test]
fn the_timeout_names_the_holder_on_redis() {
    let server = RedisServer::start().expect("redis");
    names_the_holder(&server.url(), true);
}

#[test]
fn the_timeout_names_the_holder_on_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    names_the_holder(&format!("file://{}", dir.path().display()), false);
}

/// `-v` shows dlock's and the library's events on stderr; `DLOCK_LOG` and `RUST_LOG` filter
/// them; nothing by default; a bad directive is a usage error naming the variable. (Before:
/// `-v` was "unexpected argument '-v' found", exit 2, and RUST_LOG printed nothing.)
#[test]
fn verbose_and_log_filters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", dir.path().display());
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let mut c = dlock(&url);
        c.args(extra).args(["run", "logged", "--", "true"]);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run")
    };
    let quiet = run(&[], &[]);
    assert_eq!(quiet.status.code(), Some(0), "{quiet:?}");
    assert!(!stderr(&quiet).contains("INFO"), "{}", stderr(&quiet));

    let out = run(&["-v"], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("INFO") && err.contains("lock `logged` acquired"),
        "{err}"
    );
    assert!(!err.contains("DEBUG"), "{err}");

    // After the subcommand too (a global flag), and more of them is more detail.
    let mut c = dlock(&url);
    let out = c
        .args(["run", "-vv", "logged", "--", "true"])
        .output()
        .expect("run");
    assert!(stderr(&out).contains("DEBUG"), "{}", stderr(&out));

    for var in ["DLOCK_LOG", "RUST_LOG"] {
        let out = run(&[], &[(var, "dlock=info")]);
        let err = stderr(&out);
        assert!(err.contains("lock `logged` acquired"), "{var}: {err}");
    }
    // DLOCK_LOG wins over RUST_LOG.
    let out = run(&[], &[("DLOCK_LOG", "error"), ("RUST_LOG", "info")]);
    assert!(!stderr(&out).contains("INFO"), "{}", stderr(&out));

    let out = run(&[], &[("DLOCK_LOG", "dlock=loud")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.starts_with("dlock: DLOCK_LOG: `dlock=loud` is not a log directive"),
        "{err}"
    );
}

/// flock's flags: -s/-x (the two sides of a read-write lock), -n, -w, -E CODE, -c CMD, and the
/// command without `--`. (Before: "error: unexpected argument '-s' found", exit 2, and
/// "unexpected argument 'true' found" for a command without `--`.)
fn flock_flags(url: &str) {
    let shared = Holder::start(url, "db", "read");
    // Another shared holder gets it at once, with the command right after the name.
    let out = dlock(url)
        .args(["run", "-s", "-n", "db", "sh", "-c", "exit 4"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    // An exclusive one does not: 75, or the -E code.
    let out = dlock(url)
        .args(["run", "-x", "-n", "db", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let out = dlock(url)
        .args(["run", "-x", "-w", "0.2", "-E", "9", "db", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(9), "{out:?}");
    assert!(
        stderr(&out).contains("not acquired within 200ms"),
        "{out:?}"
    );
    drop(shared);
    // Free now: -x gets it; -c runs a shell command line with the lock's environment.
    let out = dlock(url)
        .args([
            "run",
            "-x",
            "-n",
            "db",
            "-c",
            "echo \"$DLOCK_NAME\" | tr a-z A-Z; exit 3",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "DB\n");
    // Durations as people write them (before: "`1h30m` is not a duration", exit 2).
    let out = dlock(url)
        .args(["run", "-w", "1h30m", "--lease", "1m30s", "db", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Flags after the command's first word are the command's.
    let out = dlock(url)
        .args(["run", "db", "echo", "-n", "-x"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "-x");
    // Usage errors: both sides, -c with a command, no command.
    for bad in [
        &["run", "-s", "-x", "db", "true"][..],
        &["run", "-c", "true", "db", "true"],
        &["run", "db"],
        &["run", "-s", "--kind", "write", "db", "true"],
    ] {
        let out = dlock(url).args(bad).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
}

#[test]
fn flock_flags_on_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    flock_flags(&format!("file://{}", dir.path().display()));
}

#[test]
fn flock_flags_on_redis() {
    let server = RedisServer::start().expect("redis");
    flock_flags(&server.url());
}
