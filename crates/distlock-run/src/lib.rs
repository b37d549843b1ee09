//! Run a command only while a lock (or any lease) is held: the machinery behind `dlock run`.
//!
//! ```text
//! host (dlock run)     holds the lock, renews it, knows the confirmed lease end
//!  └─ host __guard     leader of a new process group, child subreaper
//!      └─ command      PR_SET_PDEATHSIG(SIGKILL) towards the guard
//!          └─ …        the command's children, in the same group
//! ```
//!
//! Why a guard process and not just the command in its own group: `PR_SET_PDEATHSIG` only
//! reaches the direct child, and SIGKILL cannot be caught, so with the command as the host's
//! direct child a `kill -9` of the host would kill the command but leave its children running.
//! The guard is what notices the host's death (its end of a socket pair reads EOF the moment
//! the kernel closes the host's files; PR_SET_PDEATHSIG(SIGTERM) and a `getppid()` check back
//! that up) and SIGKILLs the whole group, itself included.
//!
//! The guard also enforces the lease on its own: the host sends it, after every confirmed
//! renewal, when to send SIGTERM and when SIGKILL to the group ([`Supervisor::send_schedule`]).
//! A host that is paused (SIGSTOP, a long stall) stops sending; the guard, a separate process,
//! still stops the command before the last confirmed lease ends. What nothing here can prevent:
//! the guard and the command frozen together with the host (a paused VM or container, a
//! whole-cgroup freeze, a suspended laptop): then the command resumes after the lease ended and
//! another owner may hold the lock. A fencing token is the protection there: the resource must
//! reject writes with a token lower than one it has seen.
//!
//! # The host binary re-execs itself
//!
//! [`Supervisor::spawn`] starts `/proc/self/exe __guard --fd N --parent PID --grace-ns NS --
//! COMMAND…`: the host binary itself, with `__guard` as its first argument. So the host's
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
//!   every process of the machine, counting through suspend like the server's lease).
//! - guard → host: `X code <n> <ended_ns>` / `X signal <n> <ended_ns>` (the command ended, and
//!   when), `F <exit> <message>` (the command could not be started), `L` (the lease was already
//!   too short to start the command).
//!
//! Process-group ids are only used while the group's leader (the guard) is alive or an
//! unreaped zombie of the host, so a signal to `-pgid` can never reach a recycled, unrelated
//! group.
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
