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
                .name("dlock-testkit-spawner".into())
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
            .unwrap_or_else(|_| Err(io::Error::other("dlock-testkit spawner thread is gone"))),
        Err(mpsc::SendError((mut cmd, _))) => cmd.spawn(),
    }
}
