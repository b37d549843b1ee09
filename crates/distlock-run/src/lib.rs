//! Run a command only while a lock (or any lease) is held: the machinery behind `dlock run`.
//!
//! ```text
//! host (dlock run)     holds the lock, renews it, knows the confirmed lease end; subreaper
//!  └─ host __guard     leader of a new process group, child subreaper; on file://, holds a
//!      │               duplicate of the lock file's descriptor
//!      └─ command      PR_SET_PDEATHSIG(SIGKILL) towards the guard; in a cgroup of its own
//!          └─ …        everything it starts, in whatever process group or session
//! ```
//!
//! Why a guard process and not just the command in its own group: `PR_SET_PDEATHSIG` only
//! reaches the direct child, and SIGKILL cannot be caught, so with the command as the host's
//! direct child a `kill -9` of the host would kill the command but leave its children running.
//! The guard is what notices the host's death (its end of a socket pair reads EOF the moment
//! the kernel closes the host's files; PR_SET_PDEATHSIG(SIGTERM) and a `getppid()` check back
//! that up) and then SIGKILLs every process of the command.
//!
//! The guard also enforces the lease on its own: the host sends it, after every confirmed
//! renewal, when to send SIGTERM and when SIGKILL ([`Supervisor::send_schedule`]). A host that
//! is paused (SIGSTOP, a long stall) stops sending; the guard, a separate process, still stops
//! the command before the last confirmed lease ends. What nothing here can prevent: the guard
//! and the command frozen together with the host (a paused VM or container, a whole-cgroup
//! freeze, a suspended laptop): then the command resumes after the lease ended and another
//! owner may hold the lock. A fencing token is the protection there: the resource must reject
//! writes with a token lower than one it has seen.
//!
//! # Every process the command started
//!
//! A process group is no boundary: coreutils `timeout` puts itself in a group of its own,
//! `setsid` and daemons start sessions of their own, a shell with job control (`bash -m`) puts
//! every job in its own group. So nothing here signals a process group. What a process cannot
//! leave is its parenthood: the guard is a child subreaper, so an orphan (a daemon's double
//! fork) is re-parented to it, and every process the command started is a descendant of the
//! guard. Stopping the command means:
//! - SIGTERM (at the stop schedule's `term`, or to what the command left running when it
//!   ended): to every descendant of the guard, found by walking `/proc`, between two SIGCONTs
//!   (a stopped process keeps a handled SIGTERM pending until continued);
//! - SIGKILL (at `kill`, `grace` after a command's end, when the host dies): `cgroup.kill` if
//!   there is a cgroup, and every descendant, round after round (what forked in between is
//!   found next round), until the guard has no child left and the cgroup is empty; never the
//!   guard itself. Each pid is pinned with a pidfd and its start time checked, so a pid that
//!   was recycled since the walk is never signalled.
//!
//! The guard exits only then, and the host releases the lock (or reports it lost) only after
//! the guard exited. When the lock is lost or the host's own schedule says SIGKILL, the host
//! kills its own descendants (the guard included, in case it is frozen) the same way; the host
//! is a child subreaper too, so what a killed guard leaves comes to it and is killed and
//! reaped before [`Supervisor::wait`] returns. SIGTERM, SIGINT, SIGHUP and SIGQUIT the host gets
//! go to the guard, which forwards them to the command's own process (wherever it moved) and
//! to the processes still in its process group, as a terminal signals its foreground job,
//! each followed by SIGCONT; after SIGTERM or SIGINT, every process of the command is
//! SIGKILLed `grace` later.
//!
//! ## The terminal
//!
//! When the host is in the foreground process group of the terminal on its standard input,
//! the guard makes its own group (the command's) the terminal's foreground group before it
//! starts the command, so the command can read the terminal and gets Ctrl-C and Ctrl-\ as a
//! foreground job does. A Ctrl-Z stops the command; the guard gives the terminal back to the
//! host's group and sends the host SIGTSTP, so the shell sees its job stopped. When the host
//! is continued (`fg`), it tells the guard (`C`), which takes the terminal again if the host
//! has it and continues the command. The host takes the terminal back once the guard is gone.
//!
//! ## The cgroup
//!
//! Where the host can make a cgroup v2 under its own cgroup (`/proc/self/cgroup`), it does
//! (`dlock-PID-N`) and the command joins it between fork and exec, so everything it starts is
//! born there. `cgroup.kill` (Linux 5.14) then kills all of it at once, including what forks
//! while it is being killed and processes of another user (a setuid program) that a signal
//! from the guard could not reach. A cgroup is made only where its parent is writable (root,
//! or a cgroup delegated to the user) and, under systemd, only where systemd delegated it (a
//! unit with `Delegate=yes`, marked `trusted.delegate`/`user.delegate`): systemd is the only
//! writer of the cgroups it did not delegate. Elsewhere (cgroup v1 only, a read-only cgroupfs
//! in a container, a systemd service without `Delegate=yes`, an ssh session's scope) the walk
//! alone finds the processes; nothing fails for the want of a cgroup. [`Spawn::cgroup`] turns
//! it off (`dlock`: `DLOCK_CGROUP=off`).
//!
//! ## `file://`: the lock outlives a killed host
//!
//! A `flock` belongs to the open file, and the kernel frees it when the last descriptor of it
//! closes: when the host dies, at once, while its guard is only starting to kill the command.
//! [`Spawn::hold`] gives the guard a duplicate of the lock file's descriptor, which it keeps
//! until every process of the command is gone: the next owner gets the lock only then.
//!
//! ## What remains out of reach
//!
//! - A process started on the command's behalf by a process outside its tree: a service
//!   manager (`systemd-run`, `systemctl start`), a running tmux or screen server, `at`, a
//!   container runtime, `ssh localhost`. It was never the command's descendant; if it also runs
//!   outside the cgroup (it does, being the other process's child), nothing here sees it.
//! - Double forks, `setsid`, other process groups, other cgroups (root can move a process)
//!   and subreapers inside the tree do not leave it: an orphan goes to the nearest living
//!   subreaper among its ancestors, which is the guard or one of its descendants. Only when the
//!   guard was killed (from outside) does an orphan go further up: to the host, which kills it;
//!   if the host is gone too, to init, where only the cgroup still has it.
//! - Without a cgroup: a descendant running as another user (a setuid program) that the guard
//!   may not signal, or one in uninterruptible sleep. The guard then keeps SIGKILLing, says so
//!   on stderr after 5 s, and the lock is not released while it runs (on `file://` the guard
//!   keeps holding it; on a server the host keeps renewing it, unless the lock is lost anyway
//!   or the host was killed, when the lease runs out).
//! - The host and its guard both SIGKILLed at once (`kill -9 -1`, the OOM killer taking both):
//!   what the command started then goes to init, and nobody is left to kill it (a cgroup, if
//!   one was made, still holds it, for `cat cgroup.procs` or `echo 1 > cgroup.kill`).
//!
//! # The host binary re-execs itself
//!
//! [`Supervisor::spawn`] starts `/proc/self/exe __guard --fd N --parent PID --grace-ns NS
//! [--cgroup DIR] [--hold-fd N] -- COMMAND…`: the host binary itself, with `__guard` as its first argument. So the host's
//! `main` must hand that invocation to the guard before it parses its own command line:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     if let Some(code) = distlock_run::dispatch_guard() {
//!         return std::process::ExitCode::from(code);
//!     }
//!     // … the host's own command line …
//!     std::process::ExitCode::SUCCESS
//! }
//! ```
//!
//! # Protocol
//!
//! The socket pair carries one-line messages:
//! - host → guard: `D <term_ns> <kill_ns>`: the stop schedule on CLOCK_BOOTTIME (one clock for
//!   every process of the machine, counting through suspend like the server's lease);
//!   `S <n>`: forward signal n (SIGTERM, SIGINT, SIGHUP or SIGQUIT) to the command.
//! - guard → host: `X code <n> <ended_ns>` / `X signal <n> <ended_ns>` (the command ended, and
//!   when), `F <exit> <message>` (the command could not be started), `L` (the lease was already
//!   too short to start the command).
//!
//! # Times
//!
//! Every instant here is a [`Duration`] since boot on CLOCK_BOOTTIME ([`boot_now`]): the guard
//! is another process, and this clock's raw value is the same in every process of the machine.

mod cgroup;
mod guard;
mod schedule;
mod signals;
mod supervisor;
mod tree;

pub use guard::{dispatch_guard, guard_main, GuardArgs};
pub use schedule::{margin, max_grace, verdict, Facts, Schedule};
pub use signals::{forwarded_signals, recv_any};
pub use supervisor::{Ended, Event, Outcome, Report, Spawn, Supervisor};

use std::io;
use std::time::Duration;

/// The guard's (and a host's) exit code for an error of its own.
pub const EXIT_ERROR: u8 = 1;
/// The guard's exit code when the lease was too short to start the command.
pub const EXIT_LOST: u8 = 76;
/// The first argument the host binary is re-executed with to become the guard.
pub const GUARD_SUBCOMMAND: &str = "__guard";

/// Time since boot on CLOCK_BOOTTIME: comparable between the host and its guard, and counting
/// while the machine is suspended (a server's lease does too).
// `distlock_core::clock::Instant` reads the same clock but keeps its value opaque; the guard
// protocol needs the raw nanoseconds (requested from the core in /work/notes/requests.md).
pub fn boot_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes through it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        // CLOCK_BOOTTIME exists on every Linux since 2.6.39; fall back to the monotonic clock
        // (which only differs across a suspend) rather than fail.
        // SAFETY: as above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The tokio timer instant of a boot-clock instant (a past one is now).
pub fn to_tokio(at: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    let ahead = at.saturating_sub(boot_now());
    now.checked_add(ahead)
        .unwrap_or(now + Duration::from_secs(86_400 * 365))
}

fn set_pdeathsig(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
