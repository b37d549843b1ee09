//! `dlock elect` and `dlock leader` as real processes on the `file://` backend (no server):
//! a hot standby taking over from a killed leader, the leader's output and exit codes, and
//! bad input.

mod descendants;

use descendants::{wait_exit, Cmd, Where};
use distlock_testkit::TempDir;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// How long to wait for something that must happen: far above what it takes on a loaded
/// machine; it only costs time when the test fails anyway.
const PATIENCE: Duration = Duration::from_secs(30);

fn dir() -> TempDir {
    TempDir::with_prefix("dlock-elect-test").expect("temp dir")
}

fn url(dir: &TempDir) -> String {
    format!("file://{}", dir.path().join("locks").display())
}

fn dlock(dir: &TempDir) -> Command {
    let mut c = Command::new(DLOCK);
    c.env("DLOCK_BACKEND", url(dir));
    c
}

/// A `dlock` process, SIGKILLed and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A standby: `dlock elect --value VALUE NAME -- sh -c …` whose command writes `TAG PID TOKEN
/// VALUE` to `out` and then sleeps (or exits with `exit`).
fn standby(dir: &TempDir, tag: &str, out: &Path, exit: Option<u8>) -> Proc {
    let tail = match exit {
        Some(code) => format!("exit {code}"),
        None => "exec sleep 120".to_owned(),
    };
    let script = format!(
        "echo \"{tag} $$ $DLOCK_FENCING_TOKEN $DLOCK_LEADER_VALUE\" > {out}.tmp && mv {out}.tmp {out}; {tail}",
        out = out.display()
    );
    let child = dlock(dir)
        .args(["elect", "--value", &format!("value-{tag}"), "--owner"])
        .arg(format!("owner-{tag}"))
        .args(["job", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dlock elect");
    Proc(child)
}

/// `TAG PID TOKEN VALUE` a standby's command wrote.
fn ran(out: &Path) -> (String, i32, u64, String) {
    let text = std::fs::read_to_string(out).expect("command output");
    let mut it = text.trim().splitn(4, ' ');
    let tag = it.next().expect("tag").to_owned();
    let pid = it.next().and_then(|p| p.parse().ok()).expect("pid");
    let token = it.next().and_then(|t| t.parse().ok()).expect("token");
    let value = it.next().unwrap_or_default().to_owned();
    (tag, pid, token, value)
}

/// Alive and not a zombie.
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

fn leader_json(dir: &TempDir) -> serde_json::Value {
    let out = dlock(dir)
        .args(["leader", "job", "--json"])
        .output()
        .expect("dlock leader");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn hot_standby_takes_over_from_a_killed_leader() {
    let d = dir();
    let (out_a, out_b): (PathBuf, PathBuf) = (d.path().join("a"), d.path().join("b"));
    let mut a = standby(&d, "a", &out_a, None);
    wait_until("the first standby to run its command", || out_a.exists());
    let (_, pid_a, token_a, value_a) = ran(&out_a);
    assert_eq!(value_a, "value-a");
    let mut b = standby(&d, "b", &out_b, Some(0));
    // B campaigns and waits; it cannot run while A leads.
    let l = leader_json(&d);
    assert_eq!(l["owner"], "owner-a", "{l}");
    assert_eq!(l["value"], "value-a", "{l}");
    assert_eq!(l["fencing_token"], token_a, "{l}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !out_b.exists(),
        "the standby ran its command beside the leader"
    );

    // kill -9 of the leading dlock: its guard kills the command, the kernel frees the
    // leadership, and B takes over.
    a.0.kill().expect("kill -9");
    let _ = a.0.wait();
    wait_until("the standby to run its command", || out_b.exists());
    let (_, _, token_b, value_b) = ran(&out_b);
    assert!(token_b > token_a, "{token_b} <= {token_a}");
    assert_eq!(value_b, "value-b");
    wait_until("the killed leader's command to die", || !running(pid_a));
    // B's command exits 0; B resigns and exits with its code.
    let status = wait_exit(&mut b.0);
    assert_eq!(status, Some(0));
    let l = leader_json(&d);
    assert_eq!(l["led"], false, "{l}");
}

#[test]
fn leader_output_and_exit_codes() {
    let d = dir();
    // Nobody leads: exit 0, saying so.
    let out = dlock(&d).args(["leader", "job"]).output().expect("leader");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nobody leads"), "{text}");
    let l = leader_json(&d);
    assert_eq!(l["led"], false, "{l}");
    assert!(l["owner"].is_null() && l["fencing_token"].is_null(), "{l}");

    let out_a = d.path().join("a");
    let _a = standby(&d, "a", &out_a, None);
    wait_until("the leader to run its command", || out_a.exists());
    let (_, _, token, _) = ran(&out_a);
    let out = dlock(&d).args(["leader", "job"]).output().expect("leader");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "owner-a".to_owned(),
        "value-a".to_owned(),
        token.to_string(),
    ] {
        assert!(text.contains(&want), "{want} not in {text}");
    }
    // Not elected within --wait: 75, and the command never runs.
    let out = dlock(&d)
        .args([
            "elect", "--wait", "200ms", "job", "--", "sh", "-c", "echo ran",
        ])
        .output()
        .expect("elect");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("within 200ms: led by owner-a"), "{err}");
    // An election is not the lock of the same name.
    let out = dlock(&d)
        .args(["run", "--wait", "0", "job", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn the_command_exit_code_and_resignation() {
    let d = dir();
    let out = dlock(&d)
        .args(["elect", "job", "--", "sh", "-c", "exit 7"])
        .output()
        .expect("elect");
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(leader_json(&d)["led"], false);
    let out = dlock(&d)
        .args(["elect", "--wait", "0", "job", "--", "/no/such/program"])
        .output()
        .expect("elect");
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert_eq!(
        leader_json(&d)["led"],
        false,
        "leadership left after a failed spawn"
    );
}

#[test]
fn leader_watch_prints_each_change() {
    let d = dir();
    let mut watch = Proc(
        dlock(&d)
            .args(["leader", "job", "--watch", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dlock leader --watch"),
    );
    let stdout = watch.0.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || -> serde_json::Value {
        let line = rx.recv_timeout(PATIENCE).expect("a line from --watch");
        serde_json::from_str(&line).expect("JSON")
    };
    assert_eq!(next()["led"], false);
    // A leader comes, runs its command until told to stop, resigns.
    let stop = d.path().join("stop");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", stop.display());
    let mut a = Proc(
        dlock(&d)
            .args([
                "elect", "--value", "value-a", "job", "--", "sh", "-c", &script,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dlock elect"),
    );
    let l = next();
    assert_eq!(
        (l["led"].as_bool(), l["value"].as_str()),
        (Some(true), Some("value-a")),
        "{l}"
    );
    std::fs::write(&stop, b"").expect("stop file");
    assert_eq!(wait_exit(&mut a.0), Some(0));
    // Nobody leads in the end. (A resigning process removes its holder line, then unlocks:
    // an observer that reads in between, if the resigner is held up for more than its
    // retries, sees an unnamed holder first.)
    loop {
        let l = next();
        if l["led"] == false {
            break;
        }
        let owner = l["owner"].as_str().unwrap_or_default();
        assert!(owner.contains("unknown"), "{l}");
    }
}

#[test]
fn bad_input_gives_clear_errors() {
    let d = dir();
    let long = "x".repeat(4097);
    let cases: &[(&[&str], &str)] = &[
        (&["elect", "", "--", "true"], "empty"),
        (&["elect", "--value", &long, "job", "--", "true"], "4096"),
        (
            &["elect", "--wait", "soon", "job", "--", "true"],
            "not a duration",
        ),
        (&["leader", ""], "empty"),
    ];
    for (args, want) in cases {
        let out = dlock(&d).args(*args).output().expect("dlock");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: the command ran");
    }
    // A value is refused before anything runs.
    let out = dlock(&d)
        .args([
            "elect", "--value", &long, "job", "--", "sh", "-c", "echo ran",
        ])
        .output()
        .expect("dlock");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}

/// Every `*.election` file under `dir`.
fn election_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(election_files(&p));
        } else if p.extension().is_some_and(|x| x == "election") {
            out.push(p);
        }
    }
    out
}

/// Leadership lost while the command runs (its file deleted, as a `/tmp` cleaner might): the
/// next renewal finds it gone, the command is killed and dlock exits 76.
#[test]
fn lost_leadership_kills_the_command_exit_76() {
    let d = dir();
    let pidfile = d.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut a = Proc(
        dlock(&d)
            .args([
                "elect", "--lease", "1500ms", "job", "--", "sh", "-c", &script,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("dlock elect"),
    );
    wait_until("the command to start", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    let files = election_files(d.path());
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::remove_file(&files[0]).expect("remove the election file");
    assert_eq!(wait_exit(&mut a.0), Some(76));
    // Killed (a zombie until its new parent reaps it) by the time dlock exits.
    assert!(!running(pid), "the command outlived the leadership");
    let mut err = String::new();
    if let Some(mut e) = a.0.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        err.contains("leadership of election `job` was lost"),
        "{err}"
    );
}

// Every process the leader's command started, whatever group or session it moved to, is gone
// before the leadership is reported lost, resigned, or can go to another candidate (see
// `descendants`).

#[test]
fn lost_leadership_stops_descendants_in_other_groups_and_sessions() {
    descendants::lost_lock(Cmd::Elect);
}

#[test]
fn failing_renewals_stop_the_leaders_descendants_before_the_next_leader() {
    descendants::renewals_fail(Cmd::Elect);
}

#[test]
fn descendants_a_finished_leader_command_leaves_are_gone_before_it_resigns_redis() {
    descendants::normal_exit(Cmd::Elect, Where::Redis);
}

#[test]
fn descendants_a_finished_leader_command_leaves_are_gone_before_it_resigns_file() {
    descendants::normal_exit(Cmd::Elect, Where::File);
}

#[test]
fn kill_9_of_the_leader_on_file_keeps_leading_until_every_descendant_is_gone() {
    descendants::dlock_killed_on_file(Cmd::Elect, libc::SIGKILL);
}

#[test]
fn sigterm_to_the_leader_on_file_stops_every_descendant_before_it_resigns() {
    descendants::dlock_killed_on_file(Cmd::Elect, libc::SIGTERM);
}

#[test]
fn a_killed_leader_on_file_keeps_leading_while_its_guard_is_still_stopping_the_command() {
    descendants::dlock_killed_while_its_guard_is_held(Cmd::Elect);
}
