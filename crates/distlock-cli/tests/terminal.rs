//! `dlock run` and terminals: in the foreground of a (pseudo) terminal the command gets the
//! terminal; a stopped command cannot hang dlock's stop. On the `file://` backend (no server
//! needed: what is tested is the process and terminal handling).

mod descendants;
mod pty;

use descendants::{wait_exit, wait_until, PATIENCE};
use distlock_testkit::TempDir;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(dir: &TempDir) -> Command {
    let mut c = Command::new(DLOCK);
    c.env(
        "DLOCK_BACKEND",
        format!("file://{}", dir.path().join("locks").display()),
    );
    c
}

/// Reads what the terminal shows until it contains `want`; everything read so far is
/// appended to `seen`.
fn read_until(master: &mut std::fs::File, seen: &mut String, want: &str) -> bool {
    let t = Instant::now();
    let mut buf = [0u8; 1024];
    while !seen.contains(want) {
        match master.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t.elapsed() > PATIENCE / 3 {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // EIO: every process on the terminal has closed it.
            Err(_) => return false,
        }
    }
    true
}

/// The state letters (`S`, `T`…) of the processes whose command line contains `tag`.
fn states_of(tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = entry.path();
        let cmdline = std::fs::read(p.join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(tag) {
            let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
            if let Some((_, rest)) = stat.rsplit_once(") ") {
                out.push(rest.chars().take(1).collect());
            }
        }
    }
    out
}

/// dlock in the foreground of a terminal (as typed at a shell prompt): the command reads a
/// line from the terminal and gets it, instead of being stopped in the background.
#[test]
fn a_command_in_the_foreground_of_a_terminal_reads_it() {
    let dir = TempDir::with_prefix("dlock-terminal").expect("dir");
    let (mut master, slave) = pty::openpty(None);
    let tag = format!("dlock-tty-{}", std::process::id());
    let script = format!("printf 'name? '; read l; echo \"got:$l\" # {tag}");
    let mut cmd = dlock(&dir);
    cmd.args(["run", "--lease", "5s", "tty", "--", "sh", "-c", &script])
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    pty::controlling_terminal(&mut cmd);
    let mut child = cmd.spawn().expect("spawn");
    drop(cmd);
    let mut seen = String::new();
    let prompted = read_until(&mut master, &mut seen, "name? ");
    assert!(prompted, "no prompt; the terminal showed {seen:?}");
    master.write_all(b"hello\n").expect("type");
    let got = read_until(&mut master, &mut seen, "got:hello");
    if !got {
        let states = states_of(&tag);
        let _ = child.kill();
        let _ = child.wait();
        panic!("the command did not get the line (its processes' states: {states:?}); the terminal showed {seen:?}");
    }
    assert_eq!(wait_exit(&mut child), Some(0), "{seen:?}");
}

/// A command that is stopped (SIGSTOP, as a read of the terminal from the background stops
/// it) and handles SIGTERM: SIGTERM to dlock still ends it (SIGCONT goes with the SIGTERM),
/// and dlock exits with its status.
#[test]
fn sigterm_to_dlock_ends_a_stopped_command() {
    let dir = TempDir::with_prefix("dlock-stopped").expect("dir");
    let pidfile = dir.path().join("pid");
    let script = format!(
        "trap 'exit 9' TERM; echo $$ > {}; kill -STOP $$; sleep 60",
        pidfile.display()
    );
    let mut child = dlock(&dir)
        .args(["run", "--grace", "2s", "stopped", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn");
    let stopped = || {
        let pid = std::fs::read_to_string(&pidfile).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
        stat.ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false)
    };
    wait_until("the command to stop itself", stopped);
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let t = Instant::now();
    let ended = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break Some(st.code());
        }
        if t.elapsed() > std::time::Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    if ended.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(
        ended,
        Some(Some(9)),
        "dlock did not end 20 s after SIGTERM with the stopped command's trap status"
    );
}
