//! What dlock prints, as real processes against real servers (Redis, the file backend):
//! broken pipes, an unknown name given to `release --force`, `list` with wide characters,
//! `inspect` of a semaphore, one-line Redis connection errors, `--json` objects, and the
//! "this host only" note.
//!
//! `DLOCK_TEST_BIN=/path/to/dlock` runs these against another build of dlock (to see how an
//! older one fails them).

use distlock_testkit::{RedisOptions, RedisServer};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn bin() -> String {
    std::env::var("DLOCK_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_dlock").to_owned())
}

fn dlock(url: &str) -> Command {
    let mut c = Command::new(bin());
    c.env("DLOCK_BACKEND", url).stdin(Stdio::null());
    c
}

fn run(url: &str, args: &[&str]) -> Output {
    dlock(url).args(args).output().expect("run dlock")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn file_url(dir: &tempfile::TempDir) -> String {
    format!("file://{}", dir.path().display())
}

/// Runs `dlock ARGS` with standard output a pipe whose reader is gone (`dlock … | true`).
fn into_closed_pipe(url: &str, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    dlock(url)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run dlock")
}

/// Writing to a pipe whose reader has gone ends dlock as it ends `ls` or `cat`, by SIGPIPE,
/// with nothing on stderr: never a panic (exit 101) with a backtrace.
#[test]
fn broken_pipes_end_dlock_quietly() {
    let dir = tempfile::tempdir().expect("dir");
    let url = file_url(&dir);
    // Something for list and inspect to show.
    assert_eq!(
        run(&url, &["run", "shown", "--", "true"]).status.code(),
        Some(0)
    );
    for args in [
        &["completions", "bash"][..],
        &["man"],
        &["man", "run"],
        &["list"],
        &["list", "--json"],
        &["inspect", "shown"],
        &["leader", "nobody"],
        &["doctor"],
        &["release", "--force", "--yes", "shown"],
    ] {
        let out = into_closed_pipe(&url, args);
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "dlock {args:?}: {err}");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "dlock {args:?}: {:?} {err}",
            out.status
        );
    }
}

/// `release --force` of a name the backend has no state for says so, exits 1 and creates
/// nothing (no fencing key that `list` would show forever); --allow-unknown goes ahead.
#[test]
fn release_force_of_an_unknown_name_changes_nothing() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let out = run(&url, &["release", "--force", "--yes", "nothere"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(err.contains("`nothere` (mutex) is unknown"), "{err}");
    assert!(err.contains("nothing changed"), "{err}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let keys = server.command(&["KEYS", "*nothere*"]).expect("keys");
    assert!(keys.trim().is_empty(), "release created {keys:?}");
    let listed = run(&url, &["list", "--json"]);
    assert_eq!(text(&listed.stdout).trim(), "[]", "{listed:?}");

    let out = run(&url, &["release", "--force", "--yes", "--json", "nothere"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one object");
    assert_eq!(v["unknown"], true, "{v}");
    assert_eq!(v["removed"], serde_json::json!([]), "{v}");

    // Asked for: the name gets its fencing counter.
    let out = run(
        &url,
        &[
            "release",
            "--force",
            "--yes",
            "--allow-unknown",
            "--json",
            "nothere",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one object");
    assert_eq!(v["unknown"], false, "{v}");
    assert_eq!(v["name"], "nothere", "{v}");
}

/// The display width of `s` in a terminal (two columns for a CJK character).
fn columns(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// `list` pads names by the columns they take on a terminal, so the KIND column starts at
/// the same place after a CJK name as after an ASCII one.
#[test]
fn list_aligns_columns_after_wide_names() {
    let dir = tempfile::tempdir().expect("dir");
    let url = file_url(&dir);
    for name in ["注文-42", "order-42"] {
        assert_eq!(
            run(&url, &["run", name, "--", "true"]).status.code(),
            Some(0)
        );
    }
    let out = run(&url, &["list"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let table = text(&out.stdout);
    let starts: Vec<usize> = table
        .lines()
        .map(|l| {
            let at = l.find(" mutex ").or_else(|| l.find(" KIND ")).expect(l);
            columns(&l[..at])
        })
        .collect();
    assert_eq!(starts.len(), 3, "{table}");
    assert!(
        starts.iter().all(|s| *s == starts[0]),
        "{starts:?}\n{table}"
    );
}

/// `inspect NAME` of a semaphore whose permits are all taken, without --kind: it finds the
/// kind and says held, with the permits in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_finds_the_kind_of_a_full_semaphore() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let client = distlock::connect(&url).await.expect("connect");
    let sem = client.semaphore("pool", 2).expect("semaphore");
    let guard = sem.acquire(2).await.expect("both permits");
    let out = run(&url, &["inspect", "pool"]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(shown.contains("kind:          semaphore"), "{shown}");
    assert!(shown.contains("held:          yes"), "{shown}");
    assert!(shown.contains("permits:       2 of 2 in use"), "{shown}");
    let out = run(&url, &["inspect", "--json", "pool"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one object");
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["permits_in_use"], 2, "{v}");
    guard.release().await.expect("release");
}

/// One line, exit 1, nothing retried, and no driver dump.
fn one_permanent_line(out: &Output) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("retrying"), "{err}");
    assert!(!err.contains("Pipeline"), "{err}");
    err
}

/// A password-protected Redis without a password; a password sent to a Redis that has
/// none; `redis://` at a server that is not Redis (an HTTP server): each one line a person
/// can act on, exit 1 at once.
#[test]
fn redis_connection_mistakes_are_one_clear_line() {
    let guarded = RedisServer::start_with(RedisOptions {
        password: Some("sekret".into()),
        ..RedisOptions::default()
    })
    .expect("redis");
    let bare = format!("redis://127.0.0.1:{}", guarded.port());
    for args in [&["list"][..], &["run", "-w", "5", "x", "--", "true"]] {
        let err = one_permanent_line(&run(&bare, args));
        assert!(
            err.contains("requires a password and none was given"),
            "{err}"
        );
    }

    let open = RedisServer::start().expect("redis");
    let with_password = format!("redis://:pw@127.0.0.1:{}", open.port());
    for args in [&["list"][..], &["run", "-w", "5", "x", "--", "true"]] {
        let err = one_permanent_line(&run(&with_password, args));
        assert!(!err.contains("refused the credentials"), "{err}");
        assert!(err.contains("lets clients in without one"), "{err}");
        assert!(err.contains("drop the password"), "{err}");
    }

    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = http.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in http.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 512];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(
                b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/html\r\n\r\n<!DOCTYPE html>\n",
            );
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    for args in [&["list"][..], &["run", "-w", "5", "x", "--", "true"]] {
        let err = one_permanent_line(&run(&url, args));
        assert!(
            err.contains("does not answer in the Redis protocol"),
            "{err}"
        );
    }
}

/// `--json` of run, elect, release and doctor: one object on the last line of stdout, after
/// the command's own output, with the documented fields.
#[test]
fn json_reports_of_run_elect_release_and_doctor() {
    let dir = tempfile::tempdir().expect("dir");
    let url = file_url(&dir);
    let last_object = |out: &Output| -> serde_json::Value {
        let stdout = text(&out.stdout);
        let last = stdout.lines().last().unwrap_or_default().to_owned();
        serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    };
    let out = run(
        &url,
        &["run", "--json", "j", "--", "sh", "-c", "echo hi; exit 3"],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(text(&out.stdout).starts_with("hi\n"), "{out:?}");
    let v = last_object(&out);
    assert_eq!(v["outcome"], "ran", "{v}");
    assert_eq!(v["exit_code"], 3, "{v}");
    assert_eq!(v["command_status"], 3, "{v}");
    assert_eq!(v["kind"], "mutex", "{v}");
    assert!(v["fencing_token"].as_u64().is_some_and(|t| t > 0), "{v}");
    assert!(v["owner"].is_string() && v["held_ms"].is_u64(), "{v}");

    // Held elsewhere: not acquired on the one try of -n.
    let mut holder = dlock(&url)
        .args(["hold", "j"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("hold");
    let mut token = String::new();
    let mut stdout = holder.stdout.take().expect("stdout");
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).expect("token") == 1 && byte[0] != b'\n' {
        token.push(byte[0] as char);
    }
    let out = run(&url, &["run", "--json", "-n", "j", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let v = last_object(&out);
    assert_eq!(v["outcome"], "not_acquired", "{v}");
    assert_eq!(v["owner"], serde_json::Value::Null, "{v}");
    assert_eq!(v["command_status"], serde_json::Value::Null, "{v}");
    drop(holder.stdin.take());
    assert_eq!(holder.wait().expect("hold").code(), Some(0));

    let out = run(&url, &["elect", "--json", "e", "echo", "leading"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).starts_with("leading\n"), "{out:?}");
    let v = last_object(&out);
    assert_eq!(
        (v["kind"].as_str(), v["outcome"].as_str()),
        (Some("election"), Some("ran")),
        "{v}"
    );

    let out = run(&url, &["release", "--force", "--yes", "--json", "j"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = last_object(&out);
    assert_eq!(v["name"], "j", "{v}");
    assert!(v["fencing_token"].as_u64().is_some_and(|t| t > 0), "{v}");

    let out = run(&url, &["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = last_object(&out);
    assert_eq!(v["backend"], "file", "{v}");
    assert_eq!(v["unsafe"], false, "{v}");
    assert!(
        v["findings"]
            .as_array()
            .is_some_and(|f| !f.is_empty() && f[0]["severity"] == "ok"),
        "{v}"
    );
}

/// With no --backend and no DLOCK_BACKEND, `doctor` (as run and elect) says once that the
/// lock covers this host only.
#[test]
fn doctor_on_the_default_backend_says_this_host_only() {
    let out = Command::new(bin())
        .env_remove("DLOCK_BACKEND")
        .arg("doctor")
        .stdin(Stdio::null())
        .output()
        .expect("doctor");
    let err = text(&out.stderr);
    assert_eq!(err.matches("this host only").count(), 1, "{out:?}");
}

/// The man pages: a SYNOPSIS with each option's value, EXIT STATUS, ENVIRONMENT and
/// EXAMPLES sections, and no text lines that start with a space (roff breaks the line there:
/// the long help re-filled into ragged lines).
#[test]
fn man_pages_have_exit_status_environment_examples_and_placeholders() {
    for (page, synopsis) in [
        (None, "[\\fB\\-\\-backend\\fR \\fIBACKEND\\fR]"),
        (
            Some("run"),
            "[\\fB\\-w\\fR|\\fB\\-\\-wait\\fR \\fIDURATION\\fR]",
        ),
        (Some("once"), "[\\fB\\-\\-every\\fR \\fIDURATION\\fR]"),
        (
            Some("hold"),
            "[\\fB\\-E\\fR|\\fB\\-\\-conflict\\-exit\\-code\\fR \\fICODE\\fR]",
        ),
    ] {
        let mut args = vec!["man"];
        args.extend(page);
        let out = run("file:///nonexistent", &args);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let roff = text(&out.stdout);
        for section in [
            ".SH SYNOPSIS",
            ".SH \"EXIT STATUS\"",
            ".SH ENVIRONMENT",
            ".SH EXAMPLES",
        ] {
            assert!(roff.contains(section), "{page:?}: no {section}");
        }
        let synopsis_line = roff
            .lines()
            .skip_while(|l| *l != ".SH SYNOPSIS")
            .nth(1)
            .unwrap_or_default();
        assert!(
            synopsis_line.contains(synopsis),
            "{page:?}: {synopsis_line}"
        );
        let ragged: Vec<&str> = roff.lines().filter(|l| l.starts_with(' ')).collect();
        assert!(
            ragged.is_empty(),
            "{page:?}: lines that break early: {ragged:?}"
        );
        assert!(
            roff.is_ascii(),
            "{page:?}: troff reads non-ASCII bytes as Latin-1"
        );
    }
}

/// A command line dlock cannot use exits 2, as clap's own usage errors do: release without
/// --force and a man page of no subcommand as much as no command to run or a bad duration.
#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let url = file_url(&dir);
    for args in [
        &["release", "x", "--yes"][..],
        &["run", "x"],
        &["elect", "x"],
        &["man", "nosuch"],
        &["run", "--wait", "soon", "x", "--", "true"],
    ] {
        let out = run(&url, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "dlock {args:?}: {err}");
        assert!(!err.trim().is_empty(), "dlock {args:?}: says nothing");
    }
}
