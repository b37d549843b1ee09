//! The host's side of the guard: starting it, feeding it stop schedules, waiting for the
//! command's end while following the lease.

use crate::guard::GuardArgs;
use crate::signals::{forwarded_signals, recv, recv_any};
use crate::{boot_now, kill_group, set_pdeathsig, to_tokio, Schedule, EXIT_ERROR};
use distlock_core::LostReason;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
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

/// The host's side: the guard process, the command's group and the socket to the guard.
///
/// Dropping it closes the socket: the guard reads EOF and SIGKILLs the group (the guard is
/// then left unreaped until the host exits). [`Supervisor::wait`] ends it properly.
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
}

impl Supervisor {
    /// Starts `<this binary> __guard … -- command` in a new process group, with `env` added,
    /// and hands it the stop schedule of a lease confirmed until `first_lease_end` (boot clock,
    /// [`crate::boot_now`]) before it starts the command: SIGTERM `margin + grace` before the
    /// lease end, SIGKILL `margin` before it ([`Schedule::for_lease`]). `grace` is also how
    /// long what the command leaves running gets between SIGTERM and SIGKILL once it ended.
    ///
    /// The host binary must dispatch `__guard` to [`crate::dispatch_guard`] (see the crate
    /// docs). The command's outcome comes from [`Supervisor::wait`].
    ///
    /// # Errors
    /// The socket pair, the binary's path or the fork/exec of the guard failed.
    pub fn spawn(
        command: &[String],
        env: &[(&str, String)],
        grace: Duration,
        margin: Duration,
        first_lease_end: Duration,
    ) -> io::Result<Supervisor> {
        let first = Schedule::for_lease(first_lease_end, grace, margin);
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        // The first schedule is in the socket before the guard exists: a host paused right
        // after the fork must not leave the guard without one.
        io::Write::write_all(&mut ours, first.to_line().as_bytes())?;
        let fd = theirs.as_raw_fd();
        let parent = std::process::id();
        // /proc/self/exe is this very binary even if the file was replaced since (an upgrade
        // while a long job runs).
        let exe = if std::path::Path::new("/proc/self/exe").exists() {
            std::path::PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe()?
        };
        let mut cmd = std::process::Command::new(exe);
        let args = GuardArgs {
            fd,
            parent,
            grace,
            command: command.to_vec(),
        };
        cmd.args(args.to_args()).process_group(0);
        for (k, v) in env {
            cmd.env(k, v);
        }
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // calls (fcntl, prctl, getppid), allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                // The guard's end of the pair survives the exec; dlock's end does not.
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
                set_pdeathsig(libc::SIGTERM)?;
                // dlock may have died before the prctl: then no signal will ever come.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(theirs);
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| io::Error::other("process id out of range"))?;
        // The child is reaped by `wait` below (waitid/waitpid), never through `child`, so that
        // the group id stays reserved until the host has signalled the group for the last time.
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
            grace,
            margin,
        })
    }

    /// Signals the whole group while its leader is not reaped yet.
    pub fn signal(&self, sig: libc::c_int) {
        if self.reaped.is_none() {
            kill_group(self.pid, sig);
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

    /// True once the guard has exited (it is left a zombie, so the group id stays ours).
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

    /// After the guard exited: SIGKILLs whatever is left of the group (a guard killed from
    /// outside leaves its grandchildren behind), then reaps the guard. Returns its status.
    pub(crate) fn finish(&mut self) -> Ended {
        if let Some(e) = self.reaped {
            return e;
        }
        kill_group(self.pid, libc::SIGKILL);
        let mut st: libc::c_int = 0;
        // SAFETY: waitpid writes only into `st`; the guard has exited, so this does not block.
        let rc = unsafe { libc::waitpid(self.pid, &mut st, 0) };
        let e = if rc == self.pid {
            Ended::from_wait_status(st)
        } else {
            Ended::Code(i32::from(EXIT_ERROR))
        };
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
    /// publishes each confirmed lease end (boot clock); while it stays unconfirmed the group
    /// gets SIGTERM at its schedule's `term` and SIGKILL at its `kill`. When `lost` resolves
    /// the group is SIGKILLed at once (another owner may hold the lock already). SIGTERM,
    /// SIGINT, SIGHUP and SIGQUIT the host gets are forwarded to the group. `on_event` hears
    /// of the stops, for the host's messages.
    ///
    /// When the guard has exited, what is left of the group is SIGKILLed and the guard reaped.
    ///
    /// # Errors
    /// None: every way the command or the guard ended is in the [`Outcome`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future drops the supervisor, whose guard then SIGKILLs the
    /// group (see [`Supervisor`]) and the command's outcome is lost.
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
        let mut lost = std::pin::pin!(lost);
        let mut renewer_alive = true;
        let mut lost_seen: Option<(Duration, LostReason)> = None;
        let mut report: Option<Report> = None;
        let mut termed_at: Option<Duration> = None;
        let mut killed = false;
        // When the host first signalled the group to stop it (the command may have ended
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
                self.signal(libc::SIGKILL);
            } else if report.is_none() && now >= sched.term && termed_at.is_none() {
                termed_at = Some(now);
                on_event(Event::Stopping {
                    lease_end: end,
                    kill_at: sched.kill,
                });
                self.signal(libc::SIGTERM);
            }
            let next = if termed_at.is_none() {
                sched.term
            } else {
                sched.kill
            };
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
                    self.signal(libc::SIGKILL);
                    lost_seen = Some((now, reason));
                }
                sig = recv_any(&mut sigs) => self.signal(sig),
                _ = recv(&mut sigchld) => {}
                // A safety net under SIGCHLD.
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tokio::time::sleep_until(to_tokio(next)), if !killed => {}
            }
        }
        let guard_status = self.finish();
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
    /// The lease was not confirmed in time: the group gets SIGTERM now and SIGKILL at
    /// `kill_at`, before the lease ends at `lease_end` (boot clock).
    Stopping {
        /// The last confirmed lease end.
        lease_end: Duration,
        /// When the group gets SIGKILL.
        kill_at: Duration,
    },
    /// The lock was lost while the command ran: the group is SIGKILLed now.
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
