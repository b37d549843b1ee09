//! Spawning server processes so that they die with the test process.
//!
//! On Linux, children get `PR_SET_PDEATHSIG = SIGKILL`. The kernel delivers
//! that signal when the *thread* that forked the child exits, not the
//! process, so all children are forked from one dedicated spawner thread that
//! lives as long as the test process. That way a server started from a
//! short-lived thread (a tokio blocking thread, a helper thread) is not
//! killed when that thread ends, but still dies when the test binary does.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::OnceLock;

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
pub(crate) fn resolve_binary(binary: &str, package: &str) -> crate::Result<std::path::PathBuf> {
    let missing = || crate::Error::BinaryMissing {
        binary: binary.to_string(),
        package: package.to_string(),
    };
    if binary.contains('/') {
        let p = std::path::PathBuf::from(binary);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(missing())
        };
    }
    let path = std::env::var_os("PATH").ok_or_else(missing)?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| is_executable(p))
        .ok_or_else(missing)
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// SIGKILLs (and SIGCONTs, for a stopped one) a child unless it was already reaped, then
/// reaps it.
pub(crate) fn kill_and_reap(mut child: Child) {
    if let Ok(None) = child.try_wait() {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: plain syscalls; the child is not reaped yet, so the pid is still ours.
            // SIGKILL also ends stopped processes.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGCONT);
            }
        } else {
            let _ = child.kill();
        }
    }
    let _ = child.wait();
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T`…), if readable.
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// Waits (up to `limit`) until `/proc/PID/stat` shows a state accepted by `ok`. Best effort:
/// returns silently when /proc is unavailable or the process is gone.
pub(crate) fn wait_proc_state(pid: u32, limit: std::time::Duration, ok: impl Fn(char) -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while let Some(s) = proc_state(pid) {
        if ok(s) || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The last `n` non-empty lines of the log at `path`, with a heading; empty if none.
pub(crate) fn log_tail(path: &std::path::Path, n: usize) -> String {
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
