//! Spawning server processes so that they die with the test process.
//!
//! On Linux, children get `PR_SET_PDEATHSIG = SIGKILL`. The kernel delivers
//! that signal when the *thread* that forked the child exits, not the
//! process, so all children are forked from one dedicated spawner thread that
//! lives as long as the test process. That way a server started from a
//! short-lived thread (a tokio blocking thread, a helper thread) is not
//! killed when that thread ends, but still dies when the test binary does.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

type Job = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> Option<&'static mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("distlock-testkit-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in rx {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // The pid of this (the parent) process, as seen by the child's getppid().
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only calls the
    // async-signal-safe functions prctl, getppid and _exit.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

/// Spawns `cmd` from the long-lived spawner thread, with the parent-death
/// signal set (Linux).
pub(crate) fn spawn(mut cmd: Command) -> io::Result<Child> {
    set_parent_death_signal(&mut cmd);
    let Some(tx) = spawner() else {
        return cmd.spawn();
    };
    let (reply_tx, reply_rx) = mpsc::channel();
    match tx.send((cmd, reply_tx)) {
        Ok(()) => reply_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("distlock-testkit spawner thread is gone"))),
        Err(mpsc::SendError((mut cmd, _))) => cmd.spawn(),
    }
}

/// Finds `binary` (a name on `PATH`, or a path containing `/`) that is an executable file;
/// otherwise [`Error::BinaryMissing`](crate::Error::BinaryMissing) naming the Debian `package`.
pub(crate) fn resolve_binary(binary: &str, package: &str) -> crate::Result<PathBuf> {
    let missing = || crate::Error::BinaryMissing {
        binary: binary.to_string(),
        package: package.to_string(),
    };
    if binary.contains('/') {
        let p = PathBuf::from(binary);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(missing())
        };
    }
    find_on_path(binary).ok_or_else(missing)
}

/// Runs `cmd` to completion with stdin from `/dev/null` and returns its output; a missing
/// program is [`Error::BinaryMissing`](crate::Error::BinaryMissing) naming the Debian `package`.
pub(crate) fn run(mut cmd: Command, package: &str) -> crate::Result<std::process::Output> {
    cmd.stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                crate::Error::BinaryMissing {
                    binary: PathBuf::from(cmd.get_program()).display().to_string(),
                    package: package.to_string(),
                }
            } else {
                crate::Error::Io(e)
            }
        })
}

/// [`run`] for a setup step: a failed exit is an [`Error::Start`](crate::Error::Start) of
/// `what` with the status, stdout and stderr.
pub(crate) fn run_setup(cmd: Command, package: &str, what: &str) -> crate::Result<()> {
    let out = run(cmd, package)?;
    if out.status.success() {
        return Ok(());
    }
    Err(crate::Error::Start {
        what: what.to_string(),
        detail: format!(
            "{what} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// The first executable `binary` in a directory of `PATH`.
pub(crate) fn find_on_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| is_executable(p))
}

pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// SIGKILLs a child's whole process group (and SIGCONTs it, harmlessly, for stopped ones),
/// reaps the child, and waits (at most 3 s) until no live member of the group is left.
pub(crate) fn kill_group_and_reap(mut child: Child) {
    let pid = libc::pid_t::try_from(child.id()).ok();
    if let Some(pid) = pid {
        // SAFETY: plain syscalls; the group was created for our (unreaped) child.
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
            libc::killpg(pid, libc::SIGCONT);
        }
    } else {
        let _ = child.kill();
    }
    let _ = child.wait();
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(3);
        while !group_states(pid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The states (`R`, `S`, `T`…) of the live (not zombie) processes of group `pgid`, read from
/// `/proc/PID/stat`; empty when there is none (or no `/proc`).
/// The state letter of process `pid` (`R`, `S`, `T`, …), `None` if it is gone.
pub(crate) fn process_state(pid: libc::pid_t) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The parent of process `pid`, `None` if it is gone.
fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` is `ancestor` or one of its descendants (a server's worker processes may
/// run in sessions of their own, so their process group does not tell).
pub(crate) fn descends_from(pid: libc::pid_t, ancestor: libc::pid_t) -> bool {
    let mut p = pid;
    for _ in 0..16 {
        if p == ancestor {
            return true;
        }
        match parent_of(p) {
            Some(parent) if parent > 1 => p = parent,
            _ => return false,
        }
    }
    false
}

pub(crate) fn group_states(pgid: libc::pid_t) -> Vec<char> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
            let state = fields.next()?.chars().next()?;
            let _ppid = fields.next();
            let pgrp = fields.next()?.parse::<libc::pid_t>().ok()?;
            (pgrp == pgid && state != 'Z' && state != 'X').then_some(state)
        })
        .collect()
}

/// The last `n` non-empty lines of the log at `path`, with a heading; empty if none.
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let mut out = format!("\n--- last lines of {} ---", path.display());
    for line in &lines[lines.len().saturating_sub(n)..] {
        out.push('\n');
        out.push_str(line);
    }
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for passwords in URLs).
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(percent_encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
    }

    #[test]
    fn missing_binary_is_reported() {
        let err = resolve_binary("dlock-no-such-binary-xyz", "pkg").expect_err("missing");
        assert!(err.to_string().contains("pkg"), "{err}");
        let err = resolve_binary("/nonexistent/bin", "pkg").expect_err("missing");
        assert!(matches!(err, crate::Error::BinaryMissing { .. }));
    }
}
