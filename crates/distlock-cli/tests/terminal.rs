//! `dlock run` and terminals: in the foreground of a (pseudo) terminal the command gets the
//! terminal, Ctrl-Z and `fg` under a job-control shell work; a stopped command cannot hang
//! dlock's stop; a wait shows its status line on a terminal only. On the `file://` backend (no
//! server needed: what is tested is the process and terminal handling).

mod descendants;

use descendants::{bin, wait_exit, wait_until, PATIENCE};
use distlock_testkit::TempDir;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

fn dlock(dir: &TempDir) -> Command {
    let mut c = Command::new(bin());
    c.env(
        "DLOCK_BACKEND",
        format!("file://{}", dir.path().join("locks").display()),
    );
    c
}

/// A pseudo terminal: (master, slave).
fn openpty() -> (std::fs::File, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes the two descriptors; the name, termios and winsize are null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned here alone.
    unsafe {
        let flags = libc::fcntl(master, libc::F_GETFL);
        libc::fcntl(master, libc::F_SETFL, flags | libc::O_NONBLOCK);
        (
            std::fs::File::from_raw_fd(master),
            OwnedFd::from_raw_fd(slave),
        )
    }
}

/// Reads what the terminal shows until it contains `want`; everything read so far is
/// appended to `seen`.
fn read_until(master: &mut std::fs::File, seen: &mut String, want: &str) -> bool {
    read_until_from(master, seen, 0, want)
}

/// [`read_until`] `want` shows at or after byte `from` of `seen`.
fn read_until_from(master: &mut std::fs::File, seen: &mut String, from: usize, want: &str) -> bool {
    let t = Instant::now();
    let mut buf = [0u8; 1024];
    while !seen.get(from..).is_some_and(|s| s.contains(want)) {
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

/// Makes `cmd` the leader of a session of its own whose controlling terminal is its standard
/// input (the pty), in the foreground of it: as a shell runs a command typed at its prompt,
/// or as a terminal emulator starts the shell.
fn in_terminal_session(cmd: &mut Command) {
    // SAFETY: between fork and exec, only setsid and ioctl.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// `dlock hold NAME` off any terminal, holding until its stdin closes: (process, its pid).
fn holder(dir: &TempDir, name: &str) -> std::process::Child {
    let mut child = dlock(dir)
        .args(["hold", name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("hold");
    // The token line: the lock is held.
    let mut out = child.stdout.take().expect("stdout");
    let mut byte = [0u8; 1];
    while out.read(&mut byte).expect("token") == 1 && byte[0] != b'\n' {}
    child
}

/// Erases the terminal line (carriage return, erase to end of line).
const ERASE: &str = "\r\x1b[K";

/// Waiting in the foreground of a terminal: after about a second, a status line names the
/// holder (its host and pid) and how long dlock has waited; it is erased when the lock is
/// granted, before the command's output.
#[test]
fn a_wait_on_a_terminal_shows_the_holder_and_is_erased_when_granted() {
    let dir = TempDir::with_prefix("dlock-status").expect("dir");
    let mut held = holder(&dir, "busy");
    let (mut master, slave) = openpty();
    let mut cmd = dlock(&dir);
    cmd.args(["run", "-w", "60", "busy", "--", "echo", "granted-now"])
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    in_terminal_session(&mut cmd);
    let mut waiter = cmd.spawn().expect("spawn");
    drop(cmd);
    let mut seen = String::new();
    let pid = format!("pid {}", held.id());
    let shown = read_until(&mut master, &mut seen, &pid);
    drop(held.stdin.take());
    assert_eq!(wait_exit(&mut held), Some(0));
    let granted = read_until(&mut master, &mut seen, "granted-now");
    let code = wait_exit(&mut waiter);
    assert!(shown, "no status line naming the holder's {pid}: {seen:?}");
    assert!(seen.contains("dlock: waiting "), "{seen:?}");
    assert!(seen.contains("for lock `busy`: held by "), "{seen:?}");
    assert!(granted, "{seen:?}");
    assert_eq!(code, Some(0), "{seen:?}");
    let last_status = seen.rfind("dlock: waiting").expect("a status");
    let output = seen.find("granted-now").expect("output");
    let erased = seen[last_status..output].contains(ERASE);
    assert!(
        erased,
        "the status line was not erased before the command ran: {seen:?}"
    );
}

/// Off a terminal (stderr a pipe) a wait prints nothing but the final word.
#[test]
fn a_wait_off_a_terminal_is_silent() {
    let dir = TempDir::with_prefix("dlock-status-pipe").expect("dir");
    let mut held = holder(&dir, "busy");
    let out = dlock(&dir)
        .args(["run", "-w", "1.5", "busy", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    drop(held.stdin.take());
    assert_eq!(wait_exit(&mut held), Some(0));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(!err.contains("waiting"), "{err}");
    assert!(!err.contains(ERASE), "{err:?}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Off a terminal with -v, the wait is reported as a log line (no line to redraw).
#[test]
fn a_wait_off_a_terminal_with_v_is_logged() {
    let dir = TempDir::with_prefix("dlock-status-v").expect("dir");
    let mut held = holder(&dir, "busy");
    let out = dlock(&dir)
        .args(["-v", "run", "-w", "2.5", "busy", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    drop(held.stdin.take());
    assert_eq!(wait_exit(&mut held), Some(0));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(75), "{err}");
    let pid = format!("pid {}", held.id());
    let logged = err
        .lines()
        .any(|l| l.contains("still waiting") && l.contains("for lock `busy`") && l.contains(&pid));
    assert!(logged, "{err}");
    assert!(!err.contains(ERASE), "{err:?}");
}

/// Ctrl-Z and `fg` under a job-control shell (bash as the session leader of the terminal, as
/// in a terminal emulator): Ctrl-Z stops dlock's job (the shell reports it stopped), `fg`
/// resumes it with the command in the foreground again, so it reads the line typed next;
/// the shell then sees dlock's exit status 0.
#[test]
fn ctrl_z_and_fg_under_a_job_control_shell() {
    let dir = TempDir::with_prefix("dlock-jobs").expect("dir");
    let (mut master, slave) = openpty();
    let mut shell = Command::new("bash");
    shell
        .args(["--norc", "--noprofile", "-i"])
        .env("PS1", "PROMPT$ ")
        .env(
            "DLOCK_BACKEND",
            format!("file://{}", dir.path().join("locks").display()),
        )
        .env("DLOCK", bin())
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    in_terminal_session(&mut shell);
    let mut shell = shell.spawn().expect("bash");
    let mut seen = String::new();
    // Types `line`; true once the terminal shows `want` after it.
    let step = |master: &mut std::fs::File, seen: &mut String, line: &str, want: &str| {
        let mark = seen.len();
        master.write_all(line.as_bytes()).expect("type");
        read_until_from(master, seen, mark, want)
    };
    assert!(read_until(&mut master, &mut seen, "PROMPT$ "), "{seen:?}");
    // `go%s ` prints `goahead `, which the echo of the typed line does not contain.
    let ready = step(
        &mut master,
        &mut seen,
        "\"$DLOCK\" run jobs -- sh -c 'printf \"go%s \" ahead; read l; echo \"got:$l\"'\n",
        "goahead ",
    );
    // Ctrl-Z, the terminal's suspend character: bash reports the job stopped.
    let stopped = step(&mut master, &mut seen, "\x1a", "Stopped");
    let prompt = read_until(&mut master, &mut seen, "PROMPT$ ");
    // bash prints the job's command line as it resumes it.
    let resumed = step(&mut master, &mut seen, "fg\n", "run jobs");
    let got = step(&mut master, &mut seen, "hello\n", "got:hello");
    let rc = step(&mut master, &mut seen, "echo \"rc=$?\"\n", "rc=0");
    let _ = master.write_all(b"exit\n");
    let _ = shell.kill();
    let _ = shell.wait();
    assert!(ready, "the command did not start: {seen:?}");
    assert!(stopped && prompt, "Ctrl-Z did not stop the job: {seen:?}");
    assert!(resumed, "fg did not resume it: {seen:?}");
    assert!(
        got,
        "after fg the command did not read the terminal: {seen:?}"
    );
    assert!(rc, "dlock did not exit 0: {seen:?}");
}

/// dlock in the foreground of a terminal (as typed at a shell prompt): the command reads a
/// line from the terminal and gets it, instead of being stopped in the background.
#[test]
fn a_command_in_the_foreground_of_a_terminal_reads_it() {
    let dir = TempDir::with_prefix("dlock-terminal").expect("dir");
    let (mut master, slave) = openpty();
    let tag = format!("dlock-tty-{}", std::process::id());
    let script = format!("printf 'name? '; read l; echo \"got:$l\" # {tag}");
    let mut cmd = dlock(&dir);
    cmd.args(["run", "--lease", "5s", "tty", "--", "sh", "-c", &script])
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    in_terminal_session(&mut cmd);
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
