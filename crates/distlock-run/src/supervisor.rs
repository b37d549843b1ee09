//! The host's side of the guard: starting it, feeding it stop schedules, waiting for the
//! command's end while following the lease.

use crate::cgroup::Cgroup;
use crate::guard::{GuardArgs, Order};
use crate::signals::{forwarded_signals, recv, recv_any};
use crate::tree::{self, Tree};
use crate::{boot_now, set_pdeathsig, to_tokio, Schedule, EXIT_ERROR};
use distlock_core::LostReason;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How the command ended, as the guard reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ended {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
}

impl Ended {
    /// The exit code for it (128 + signal, as shells do; [`EXIT_ERROR`] if out of range).
    pub fn exit_code(self) -> u8 {
        match self {
            Ended::Code(c) => u8::try_from(c).unwrap_or(EXIT_ERROR),
            Ended::Signal(s) => u8::try_from(128 + s).unwrap_or(EXIT_ERROR),
        }
    }

    pub(crate) fn from_wait_status(st: libc::c_int) -> Ended {
        if libc::WIFSIGNALED(st) {
            Ended::Signal(libc::WTERMSIG(st))
        } else {
            Ended::Code(libc::WEXITSTATUS(st))
        }
    }
}

/// What the guard told the host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Report {
    /// The command ended, at this boot-clock instant.
    Ended(Ended, Duration),
    /// The command could not be started: the exit code (126, or 127 if not found) and why.
    Failed(u8, String),
    /// The lease was too short to start the command when the guard was about to.
    LeaseTooShort,
}

impl Report {
    pub(crate) fn to_line(&self) -> String {
        match self {
            Report::Ended(Ended::Code(c), at) => format!("X code {c} {}\n", crate::ns(*at)),
            Report::Ended(Ended::Signal(s), at) => format!("X signal {s} {}\n", crate::ns(*at)),
            Report::Failed(code, msg) => {
                let line = format!("F {code} {msg}").replace('\n', " ");
                format!("{}\n", line.trim_end())
            }
            Report::LeaseTooShort => "L\n".into(),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Report> {
        let mut it = line.split(' ');
        match it.next()? {
            "X" => {
                let kind = it.next()?;
                let n: i32 = it.next()?.parse().ok()?;
                let at: u64 = it.next()?.parse().ok()?;
                let ended = match kind {
                    "code" => Ended::Code(n),
                    "signal" => Ended::Signal(n),
                    _ => return None,
                };
                Some(Report::Ended(ended, Duration::from_nanos(at)))
            }
            "F" => {
                let code: u8 = it.next()?.parse().ok()?;
                Some(Report::Failed(code, it.collect::<Vec<_>>().join(" ")))
            }
            "L" => Some(Report::LeaseTooShort),
            _ => None,
        }
    }
}

/// How [`Supervisor::spawn_with`] starts a command: [`Spawn::new`], then the options.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Spawn<'a> {
    /// The command and its arguments.
    pub command: &'a [String],
    /// Added to the command's environment (and the guard's).
    pub env: &'a [(&'a str, String)],
    /// How long the command (and what it leaves running) gets between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// How far before the confirmed lease end the command must be dead.
    pub margin: Duration,
    /// The end of the lease confirmed before the start (boot clock).
    pub first_lease_end: Duration,
    /// A descriptor whose open file carries the lock (a `file://` lock's `flock`): the guard
    /// keeps a duplicate open until every process of the command is gone, so that the lock
    /// outlives a host that dies (the kernel would free it with the host's last descriptor,
    /// while the command is still being killed).
    pub hold: Option<BorrowedFd<'a>>,
    /// Put the command in a cgroup of its own where one can be made (see the crate docs).
    pub cgroup: bool,
}

impl<'a> Spawn<'a> {
    /// The command `command` with `env` added, stopped `grace` after SIGTERM, dead `margin`
    /// before the lease end, the first confirmed lease ending at `first_lease_end`; no
    /// descriptor to hold, a cgroup where one can be made.
    pub fn new(
        command: &'a [String],
        env: &'a [(&'a str, String)],
        grace: Duration,
        margin: Duration,
        first_lease_end: Duration,
    ) -> Spawn<'a> {
        Spawn {
            command,
            env,
            grace,
            margin,
            first_lease_end,
            hold: None,
            cgroup: true,
        }
    }

    /// The guard holds a duplicate of `fd` until every process of the command is gone.
    pub fn hold(mut self, fd: BorrowedFd<'a>) -> Spawn<'a> {
        self.hold = Some(fd);
        self
    }

    /// Whether a cgroup may be used (default: yes, where one can be made).
    pub fn cgroup(mut self, on: bool) -> Spawn<'a> {
        self.cgroup = on;
        self
    }
}

/// The host's side: the guard process, the command's processes and the socket to the guard.
///
/// Dropping it closes the socket: the guard reads EOF, SIGKILLs every process of the
/// command and exits once they are all gone (the guard is then left unreaped until the host
/// exits). [`Supervisor::wait`] ends it properly.
pub struct Supervisor {
    pid: libc::pid_t,
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    writer: tokio::net::unix::OwnedWriteHalf,
    /// Bytes not yet taken by the socket (a frozen guard stops reading).
    pending: Vec<u8>,
    eof: bool,
    reaped: Option<Ended>,
    grace: Duration,
    margin: Duration,
    /// The guard gave the command the terminal: taken back once the guard is gone.
    terminal: bool,
    /// This process's descendants (the guard and, if it dies, what it leaves) and the cgroup.
    tree: Tree,
}

impl Supervisor {
    /// [`Supervisor::spawn_with`] with a cgroup where one can be made and no descriptor to
    /// hold.
    ///
    /// # Errors
    /// As [`Supervisor::spawn_with`].
    pub fn spawn(
        command: &[String],
        env: &[(&str, String)],
        grace: Duration,
        margin: Duration,
        first_lease_end: Duration,
    ) -> io::Result<Supervisor> {
        Supervisor::spawn_with(Spawn::new(command, env, grace, margin, first_lease_end))
    }

    /// Starts `<this binary> __guard … -- command` in a new process group, with `env` added,
    /// and hands it the stop schedule of a lease confirmed until `first_lease_end` (boot clock,
    /// [`crate::boot_now`]) before it starts the command: SIGTERM `margin + grace` before the
    /// lease end, SIGKILL `margin` before it ([`Schedule::for_lease`]). `grace` is also how
    /// long what the command leaves running gets between SIGTERM and SIGKILL once it ended.
    ///
    /// This process becomes a child subreaper (what the guard leaves if it is killed comes
    /// here, to be killed too) and reaps every child it has once the guard is gone: the host
    /// must have no children of its own besides the guard.
    ///
    /// The host binary must dispatch `__guard` to [`crate::dispatch_guard`] (see the crate
    /// docs). The command's outcome comes from [`Supervisor::wait`].
    ///
    /// # Errors
    /// The socket pair, the binary's path, duplicating `hold` or the fork/exec of the guard
    /// failed.
    pub fn spawn_with(s: Spawn<'_>) -> io::Result<Supervisor> {
        let first = Schedule::for_lease(s.first_lease_end, s.grace, s.margin);
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        // The first schedule is in the socket before the guard exists: a host paused right
        // after the fork must not leave the guard without one.
        io::Write::write_all(&mut ours, first.to_line().as_bytes())?;
        let fd = theirs.as_raw_fd();
        // Our own duplicate, close-on-exec here, inherited by the guard alone (pre_exec).
        let hold = s.hold.map(|h| h.try_clone_to_owned()).transpose()?;
        let hold_fd = hold.as_ref().map(AsRawFd::as_raw_fd);
        let parent = std::process::id();
        // /proc/self/exe is this very binary even if the file was replaced since (an upgrade
        // while a long job runs).
        let exe = if std::path::Path::new("/proc/self/exe").exists() {
            std::path::PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe()?
        };
        // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory. If it
        // fails, what a killed guard leaves goes to init (the cgroup, if any, still has it).
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
        let cgroup = if s.cgroup { Cgroup::create() } else { None };
        // In the foreground of a terminal: the guard gives it to the command's group.
        let terminal = crate::signals::foreground_terminal();
        let mut cmd = std::process::Command::new(exe);
        let args = GuardArgs {
            fd,
            parent,
            grace: s.grace,
            cgroup: cgroup
                .as_ref()
                .and_then(|c| c.path().to_str().map(str::to_owned)),
            hold_fd,
            terminal,
            command: s.command.to_vec(),
        };
        cmd.args(args.to_args()).process_group(0);
        for (k, v) in s.env {
            cmd.env(k, v);
        }
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // calls (fcntl, prctl, getppid), allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                // The guard's end of the pair (and the held lock file) survive the exec;
                // dlock's end does not.
                for fd in std::iter::once(fd).chain(hold_fd) {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                set_pdeathsig(libc::SIGTERM)?;
                // dlock may have died before the prctl: then no signal will ever come.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                if let Some(c) = &cgroup {
                    c.remove();
                }
                return Err(e);
            }
        };
        drop(theirs);
        // The guard has its own now (spawn returns once the exec succeeded).
        drop(hold);
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| io::Error::other("process id out of range"))?;
        // The child is reaped by `finish` below (waitpid), never through `child`.
        drop(child);
        ours.set_nonblocking(true)?;
        let sock = tokio::net::UnixStream::from_std(ours)?;
        let (rd, writer) = sock.into_split();
        Ok(Supervisor {
            pid,
            lines: BufReader::new(rd).lines(),
            writer,
            pending: Vec::new(),
            eof: false,
            reaped: None,
            grace: s.grace,
            margin: s.margin,
            terminal,
            // SAFETY: getpid only reads process state.
            tree: Tree::new(unsafe { libc::getpid() }, cgroup),
        })
    }

    /// Forwards `sig` (SIGTERM, SIGINT, SIGHUP or SIGQUIT) to the command, through the guard:
    /// to the command's own process wherever it moved, and to the processes still in its
    /// process group (what a terminal signals for its foreground job). What the command
    /// leaves running when it ends is stopped by the guard in any case.
    pub fn signal(&mut self, sig: libc::c_int) {
        if self.reaped.is_none() {
            self.pending
                .extend_from_slice(Order::Signal(sig).to_line().as_bytes());
            self.flush();
        }
    }

    /// The stop schedule of a lease confirmed until `lease_end`, with this supervisor's grace
    /// and margin.
    pub fn schedule(&self, lease_end: Duration) -> Schedule {
        Schedule::for_lease(lease_end, self.grace, self.margin)
    }

    /// Tells the guard a new stop schedule (never blocks: a frozen guard gets it later).
    pub fn send_schedule(&mut self, s: Schedule) {
        self.pending.extend_from_slice(s.to_line().as_bytes());
        self.flush();
    }

    /// Writes what is pending as far as the socket takes it. A plain non-blocking send, not
    /// tokio's `try_write`: that answers WouldBlock until the reactor has seen the socket
    /// writable, which would hold the first schedule back (and the guard waits for it).
    pub(crate) fn flush(&mut self) {
        let fd = self.writer.as_ref().as_raw_fd();
        while !self.pending.is_empty() {
            // SAFETY: `pending` is a valid buffer of that length; `fd` is our open socket.
            let n = unsafe {
                libc::send(
                    fd,
                    self.pending.as_ptr().cast(),
                    self.pending.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            match usize::try_from(n) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.pending.drain(..n);
                }
            }
        }
    }

    /// The next report of the guard; `None` once its socket closed (pends forever after).
    pub(crate) async fn report(&mut self) -> Option<Report> {
        if self.eof {
            std::future::pending::<()>().await;
        }
        loop {
            match self.lines.next_line().await {
                Ok(Some(l)) => {
                    if let Some(r) = Report::parse(&l) {
                        return Some(r);
                    }
                }
                Ok(None) | Err(_) => {
                    self.eof = true;
                    return None;
                }
            }
        }
    }

    /// True once the guard has exited (it is left a zombie until `finish` reaps it).
    pub(crate) fn exited(&self) -> bool {
        if self.reaped.is_some() {
            return true;
        }
        // SAFETY: a zeroed siginfo_t is a valid output buffer for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`; WNOWAIT leaves the child unreaped.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                self.pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid is meaningful for SIGCHLD-style infos, which waitid fills in (0 when
        // no child changed state).
        rc == 0 && unsafe { info.si_pid() } == self.pid
    }

    /// After the guard exited: SIGKILLs whatever is left (a guard killed from outside, or by
    /// the host, leaves what it had started to this process, a subreaper, and to the
    /// cgroup), until nothing is, reaping it all and the guard; then removes the cgroup.
    /// Returns the guard's status.
    pub(crate) async fn finish(&mut self) -> Ended {
        if let Some(e) = self.reaped {
            return e;
        }
        let mut sigchld =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
        let mut status = None;
        loop {
            let guard = self.pid;
            let children_left = tree::reap(|pid, st| {
                if pid == guard {
                    status = Some(Ended::from_wait_status(st));
                }
            });
            if !children_left && !self.tree.populated() {
                break;
            }
            self.tree.kill("dlock");
            tokio::select! {
                _ = recv(&mut sigchld) => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        self.tree.remove_cgroup();
        // Back from the command's group (gone now) to this one, unless the shell has taken
        // it meanwhile.
        if self.terminal && crate::signals::terminal_owner() == Some(self.pid) {
            // SAFETY: getpgrp only reads process state.
            crate::signals::give_terminal(unsafe { libc::getpgrp() });
        }
        let e = status.unwrap_or(Ended::Code(i32::from(EXIT_ERROR)));
        self.reaped = Some(e);
        e
    }

    /// Reports the guard wrote before it exited and that were not read yet.
    pub(crate) async fn drain(&mut self) -> Vec<Report> {
        let mut out = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        while !self.eof {
            match tokio::time::timeout_at(until, self.report()).await {
                Ok(Some(r)) => out.push(r),
                Ok(None) | Err(_) => break,
            }
        }
        out
    }

    /// Supervises the command until the guard is gone, following the lease: `lease_end`
    /// publishes each confirmed lease end (boot clock); while it stays unconfirmed the command
    /// gets SIGTERM at its schedule's `term` (from the guard) and SIGKILL at its `kill`. When
    /// `lost` resolves every process of the command is SIGKILLed at once (another owner may
    /// hold the lock already). SIGTERM, SIGINT, SIGHUP and SIGQUIT the host gets are forwarded
    /// to the command ([`Supervisor::signal`]). `on_event` hears of the stops, for the host's
    /// messages. "Every process of the command" is everything it started, in whatever process
    /// group or session (see the crate docs).
    ///
    /// Returns only when nothing of the command runs any more: once the guard has exited,
    /// whatever is left (a guard killed from outside leaves it here) is SIGKILLed, round after
    /// round, and reaped with the guard.
    ///
    /// # Errors
    /// None: every way the command or the guard ended is in the [`Outcome`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future drops the supervisor, whose guard then SIGKILLs
    /// every process of the command (see [`Supervisor`]) and the command's outcome is lost.
    pub async fn wait<L>(
        mut self,
        lease_end: &mut tokio::sync::watch::Receiver<Duration>,
        lost: L,
        mut on_event: impl FnMut(Event),
    ) -> Outcome
    where
        L: Future<Output = LostReason>,
    {
        let mut sigs = forwarded_signals();
        let mut sigchld =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
        // Continued after a Ctrl-Z (see `GuardArgs::terminal`): so is the command.
        let mut sigcont = if self.terminal {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(libc::SIGCONT))
                .ok()
        } else {
            None
        };
        let mut lost = std::pin::pin!(lost);
        let mut renewer_alive = true;
        let mut lost_seen: Option<(Duration, LostReason)> = None;
        let mut report: Option<Report> = None;
        let mut termed_at: Option<Duration> = None;
        let mut killed = false;
        // When the host first set out to kill the command (it may have ended
        // before, while the host was paused: the verdict compares the times).
        let mut stopped_at: Option<Duration> = None;
        loop {
            // First: a guard that is gone needs no more stopping (and a paused host that
            // resumes should not report stopping a command that ended during the pause).
            if self.exited() {
                break;
            }
            self.flush();
            let end = *lease_end.borrow();
            let sched = self.schedule(end);
            let now = boot_now();
            if now >= sched.kill && !killed {
                // Also what the command left behind (the guard kills it then too).
                killed = true;
                stopped_at.get_or_insert(now);
            } else if report.is_none() && now >= sched.term && termed_at.is_none() {
                // The guard, which has every schedule sent here, sends the SIGTERM: one,
                // not two (a second SIGTERM means "hurry" to many programs).
                termed_at = Some(now);
                on_event(Event::Stopping {
                    lease_end: end,
                    kill_at: sched.kill,
                });
            }
            if killed {
                // Everything this process started: the guard, the command and all it
                // started (a frozen guard cannot hold this up); `finish` does the rest.
                self.tree.kill("dlock");
            }
            let next = if termed_at.is_none() {
                sched.term
            } else {
                sched.kill
            };
            let tick = Duration::from_millis(if killed { 20 } else { 100 });
            tokio::select! {
                r = self.report(), if report.is_none() => {
                    if let Some(r) = r {
                        report = Some(r);
                    }
                }
                changed = lease_end.changed(), if renewer_alive => match changed {
                    Ok(()) => {
                        let s = self.schedule(*lease_end.borrow());
                        self.send_schedule(s);
                    }
                    Err(_) => renewer_alive = false,
                },
                reason = &mut lost, if lost_seen.is_none() => {
                    let now = boot_now();
                    if report.is_none() {
                        on_event(Event::Lost(reason.clone()));
                    }
                    // No grace: another owner may hold the lock already. Also whatever the
                    // command left running if it ended.
                    killed = true;
                    self.tree.kill("dlock");
                    lost_seen = Some((now, reason));
                }
                sig = recv_any(&mut sigs) => self.signal(sig),
                _ = recv(&mut sigcont) => {
                    self.pending.extend_from_slice(Order::Continue.to_line().as_bytes());
                    self.flush();
                }
                _ = recv(&mut sigchld) => {}
                // A safety net under SIGCHLD; while killing, the pace of the kill rounds.
                _ = tokio::time::sleep(tick) => {}
                _ = tokio::time::sleep_until(to_tokio(next)), if !killed => {}
            }
        }
        let guard_status = self.finish().await;
        if report.is_none() {
            report = self.drain().await.into_iter().next();
        }
        Outcome {
            report,
            guard_status,
            seen_end: boot_now(),
            stopped_at,
            lost_seen,
        }
    }
}

/// A stop [`Supervisor::wait`] makes, for the host to tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The lease was not confirmed in time: the command gets SIGTERM now and SIGKILL at
    /// `kill_at`, before the lease ends at `lease_end` (boot clock).
    Stopping {
        /// The last confirmed lease end.
        lease_end: Duration,
        /// When the command gets SIGKILL.
        kill_at: Duration,
    },
    /// The lock was lost while the command ran: every process of the command is SIGKILLed
    /// now.
    Lost(LostReason),
}

/// How a supervised run ended, from [`Supervisor::wait`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Outcome {
    /// What the guard reported; `None` if it died without a word (killed from outside, or by
    /// the stop schedule).
    pub report: Option<Report>,
    /// The guard's own exit status.
    pub guard_status: Ended,
    /// When the host saw the guard gone (boot clock).
    pub seen_end: Duration,
    /// When the host started stopping the command, if it did.
    pub stopped_at: Option<Duration>,
    /// When the host saw `lost` resolve, and why.
    pub lost_seen: Option<(Duration, LostReason)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_round_trip() {
        for r in [
            Report::Ended(Ended::Code(3), Duration::from_nanos(12_345)),
            Report::Ended(Ended::Signal(9), Duration::from_secs(7)),
            Report::Failed(127, "No such file or directory (os error 2)".into()),
            Report::LeaseTooShort,
        ] {
            let line = r.to_line();
            assert!(
                line.ends_with('\n') && line.matches('\n').count() == 1,
                "{line:?}"
            );
            assert_eq!(Report::parse(line.trim_end()), Some(r));
        }
        assert_eq!(
            Report::Failed(126, "two\nlines \n".into()).to_line(),
            "F 126 two lines\n"
        );
        assert_eq!(Report::parse("X code x 1"), None);
        assert_eq!(Ended::Signal(15).exit_code(), 143);
        assert_eq!(Ended::Code(300).exit_code(), EXIT_ERROR);
    }
}
