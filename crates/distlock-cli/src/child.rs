//! The command's process group and the guard process that keeps it from outliving the lock.
//!
//! ```text
//! dlock run            holds the lock, renews it, knows the confirmed lease end
//!  └─ dlock __guard    leader of a new process group, child subreaper
//!      └─ command      PR_SET_PDEATHSIG(SIGKILL) towards the guard
//!          └─ …        the command's children, in the same group
//! ```
//!
//! Why a guard process and not just the command in its own group: `PR_SET_PDEATHSIG` only
//! reaches the direct child, and SIGKILL cannot be caught, so with the command as dlock's
//! direct child a `kill -9` of dlock would kill the command but leave its children running.
//! The guard is what notices dlock's death (its end of a socket pair reads EOF the moment the
//! kernel closes dlock's files; PR_SET_PDEATHSIG(SIGTERM) and a `getppid()` check back that up)
//! and SIGKILLs the whole group, itself included.
//!
//! The guard also enforces the lease on its own: dlock sends it, after every confirmed renewal,
//! when to send SIGTERM and when SIGKILL to the group. A dlock that is paused (SIGSTOP, a long
//! stall) stops sending; the guard, a separate process, still stops the command before the
//! last confirmed lease ends. What nothing here can prevent: the guard and the command frozen
//! together with dlock (a paused VM or container, a whole-cgroup freeze, a suspended laptop):
//! then the command resumes after the lease ended and another owner may hold the lock. The
//! fencing token (`DLOCK_FENCING_TOKEN`) is the protection there: the resource must reject
//! writes with a token lower than one it has seen.
//!
//! The socket pair carries one-line messages:
//! - dlock → guard: `D <term_ns> <kill_ns>`: the stop schedule on CLOCK_BOOTTIME (one clock for
//!   every process of the machine, counting through suspend like the server's lease).
//! - guard → dlock: `X code <n> <ended_ns>` / `X signal <n> <ended_ns>` (the command ended, and
//!   when), `F <exit> <message>` (the command could not be started), `L` (the lease was already
//!   too short to start the command).
//!
//! Process-group ids are only used while the group's leader (the guard) is alive or an
//! unreaped zombie of dlock, so a signal to `-pgid` can never reach a recycled, unrelated group.

use clap::Args;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Time since boot on CLOCK_BOOTTIME: comparable between dlock and its guard, and counting
/// while the machine is suspended (a server's lease does too).
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

/// Sends `sig` to process group `pgid`. Only called while its leader is alive or unreaped.
pub fn kill_group(pgid: libc::pid_t, sig: libc::c_int) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill(2) has no memory effects; the group is ours (see the module docs).
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// How the command ended, as the guard reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

impl Ended {
    /// dlock's exit code for it (128 + signal, as shells do).
    pub fn exit_code(self) -> u8 {
        match self {
            Ended::Code(c) => u8::try_from(c).unwrap_or(crate::EXIT_ERROR),
            Ended::Signal(s) => u8::try_from(128 + s).unwrap_or(crate::EXIT_ERROR),
        }
    }

    fn from_wait_status(st: libc::c_int) -> Ended {
        if libc::WIFSIGNALED(st) {
            Ended::Signal(libc::WTERMSIG(st))
        } else {
            Ended::Code(libc::WEXITSTATUS(st))
        }
    }
}

/// What the guard told dlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// The command ended, at this boot-clock instant.
    Ended(Ended, Duration),
    /// The command could not be started: dlock's exit code and why.
    Failed(u8, String),
    /// The lease was too short to start the command when the guard was about to.
    LeaseTooShort,
}

fn parse_report(line: &str) -> Option<Report> {
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

/// The stop schedule: SIGTERM to the group at `term`, SIGKILL at `kill` (boot clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub term: Duration,
    pub kill: Duration,
}

fn parse_schedule(line: &str) -> Option<Schedule> {
    let mut it = line.split(' ');
    if it.next()? != "D" {
        return None;
    }
    let term: u64 = it.next()?.parse().ok()?;
    let kill: u64 = it.next()?.parse().ok()?;
    Some(Schedule {
        term: Duration::from_nanos(term),
        kill: Duration::from_nanos(kill),
    })
}

/// dlock's side: the guard process, its group and the socket to it.
pub struct Group {
    pid: libc::pid_t,
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    writer: tokio::net::unix::OwnedWriteHalf,
    /// Bytes not yet taken by the socket (a frozen guard stops reading).
    pending: Vec<u8>,
    eof: bool,
    reaped: Option<Ended>,
}

impl Group {
    /// Starts `dlock __guard … -- command` in a new process group, with `env` added, and
    /// hands it `first` as its stop schedule before it starts the command.
    pub fn spawn(
        command: &[String],
        env: &[(&str, String)],
        grace: Duration,
        first: Schedule,
    ) -> io::Result<Group> {
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        // The first schedule is in the socket before the guard exists: a dlock paused right
        // after the fork must not leave the guard without one.
        io::Write::write_all(
            &mut ours,
            format!("D {} {}\n", ns(first.term), ns(first.kill)).as_bytes(),
        )?;
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
        cmd.arg("__guard")
            .arg("--fd")
            .arg(fd.to_string())
            .arg("--parent")
            .arg(parent.to_string())
            .arg("--grace-ns")
            .arg(ns(grace).to_string())
            .arg("--")
            .args(command)
            .process_group(0);
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
        // the group id stays reserved until dlock has signalled the group for the last time.
        drop(child);
        ours.set_nonblocking(true)?;
        let sock = tokio::net::UnixStream::from_std(ours)?;
        let (rd, writer) = sock.into_split();
        Ok(Group {
            pid,
            lines: BufReader::new(rd).lines(),
            writer,
            pending: Vec::new(),
            eof: false,
            reaped: None,
        })
    }

    /// Signals the whole group while its leader is not reaped yet.
    pub fn signal(&self, sig: libc::c_int) {
        if self.reaped.is_none() {
            kill_group(self.pid, sig);
        }
    }

    /// Tells the guard a new stop schedule (never blocks: a frozen guard gets it later).
    pub fn send(&mut self, s: Schedule) {
        self.pending
            .extend_from_slice(format!("D {} {}\n", ns(s.term), ns(s.kill)).as_bytes());
        self.flush();
    }

    /// Writes what is pending as far as the socket takes it. A plain non-blocking send, not
    /// tokio's `try_write`: that answers WouldBlock until the reactor has seen the socket
    /// writable, which would hold the first schedule back (and the guard waits for it).
    pub fn flush(&mut self) {
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
    pub async fn report(&mut self) -> Option<Report> {
        if self.eof {
            std::future::pending::<()>().await;
        }
        loop {
            match self.lines.next_line().await {
                Ok(Some(l)) => {
                    if let Some(r) = parse_report(&l) {
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
    pub fn exited(&self) -> bool {
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
    pub fn finish(&mut self) -> Ended {
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
            Ended::Code(i32::from(crate::EXIT_ERROR))
        };
        self.reaped = Some(e);
        e
    }

    /// Reports the guard wrote before it exited and that were not read yet.
    pub async fn drain(&mut self) -> Vec<Report> {
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
}

fn set_pdeathsig(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `dlock __guard`: started by `dlock run` only.
#[derive(Args, Debug)]
pub struct GuardArgs {
    /// The guard's end of the socket pair to dlock.
    #[arg(long)]
    fd: i32,
    /// dlock's pid.
    #[arg(long)]
    parent: u32,
    /// How long the command's leftover children get between SIGTERM and SIGKILL.
    #[arg(long)]
    grace_ns: u64,
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs the guard; returns its exit code (dlock reads the command's status from the socket).
pub fn guard_main(args: GuardArgs) -> u8 {
    // SAFETY: getpgrp/getpid/getppid only read process state.
    let (pgrp, pid, ppid) = unsafe { (libc::getpgrp(), libc::getpid(), libc::getppid()) };
    // Signalling "our" group would hit the caller's own group if this was not started by
    // `dlock run` (which makes it a group leader).
    if pgrp != pid || ppid as u32 != args.parent {
        eprintln!("dlock: __guard is started by `dlock run`; it is not for direct use");
        return crate::EXIT_ERROR;
    }
    // SAFETY: F_GETFD only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(args.fd, libc::F_GETFD) };
    if args.fd < 3 || flags < 0 {
        eprintln!("dlock: __guard: no socket at descriptor {}", args.fd);
        return crate::EXIT_ERROR;
    }
    // SAFETY: as above; the command must not inherit the socket (dlock would not see EOF when
    // the guard dies, and the command could write to it).
    unsafe { libc::fcntl(args.fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    // SAFETY: dlock handed this descriptor to us alone; nothing else in this process owns it.
    let sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(args.fd) };
    // Orphaned grandchildren are reparented to the guard, which can then wait until the whole
    // tree is gone (and reap it) before it lets dlock release the lock.
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: __guard: cannot start the runtime: {e}");
            return crate::EXIT_ERROR;
        }
    };
    rt.block_on(guard(args, sock, pid))
}

async fn guard(args: GuardArgs, sock: std::os::unix::net::UnixStream, pgid: libc::pid_t) -> u8 {
    use tokio::signal::unix::{signal, SignalKind};
    let grace = Duration::from_nanos(args.grace_ns);
    let Ok(()) = sock.set_nonblocking(true) else {
        return crate::EXIT_ERROR;
    };
    let Ok(sock) = tokio::net::UnixStream::from_std(sock) else {
        return crate::EXIT_ERROR;
    };
    let (rd, mut wr) = sock.into_split();
    let mut lines = BufReader::new(rd).lines();
    // Handlers, not SIG_IGN: the command starts with default dispositions (exec resets
    // handled signals), and a signal dlock sends to the group does not end the guard.
    let mut sigs = forwarded_signals();
    let mut sigchld = signal(SignalKind::child()).ok();
    let parent_gone = || {
        // SAFETY: getppid only reads process state.
        (unsafe { libc::getppid() }) as u32 != args.parent
    };
    // The first schedule comes before the command starts.
    let mut sched = match lines.next_line().await {
        Ok(Some(l)) => match parse_schedule(&l) {
            Some(s) => s,
            None => return crate::EXIT_ERROR,
        },
        _ => return crate::EXIT_ERROR,
    };
    if parent_gone() {
        return crate::EXIT_ERROR;
    }
    if boot_now() >= sched.term {
        let _ = wr.write_all(b"L\n").await;
        return crate::EXIT_LOST;
    }
    let Some((program, rest)) = args.command.split_first() else {
        return crate::EXIT_ERROR;
    };
    let guard_pid = pgid;
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    // SAFETY: between fork and exec; prctl and getppid are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            set_pdeathsig(libc::SIGKILL)?;
            // The guard may have died before the prctl took effect.
            if libc::getppid() != guard_pid {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            let msg = format!("F {code} {e}\n");
            let _ = wr
                .write_all(msg.replace('\n', " ").trim_end().as_bytes())
                .await;
            let _ = wr.write_all(b"\n").await;
            return code;
        }
    };
    let cmd_pid = libc::pid_t::try_from(child.id()).unwrap_or(-1);
    // Reaped below with waitpid(-1), together with orphans; never through `child`.
    drop(child);
    let mut ended: Option<(Ended, Duration)> = None;
    let mut reported = false;
    let mut termed = false;
    // After the command ended: when the leftover children get SIGKILL.
    let mut leftovers_kill: Option<Duration> = None;
    let mut eof = false;
    loop {
        // Reap every child that ended (the command and orphans alike).
        let mut children_left = true;
        loop {
            let mut st: libc::c_int = 0;
            // SAFETY: waitpid writes only into `st`.
            let rc = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if rc > 0 {
                if rc == cmd_pid {
                    ended = Some((Ended::from_wait_status(st), boot_now()));
                }
                continue;
            }
            if rc < 0 {
                // ECHILD: nothing of the tree is left.
                children_left = false;
            }
            break;
        }
        if let (Some((e, at)), false) = (ended, reported) {
            reported = true;
            let msg = match e {
                Ended::Code(c) => format!("X code {c} {}\n", ns(at)),
                Ended::Signal(s) => format!("X signal {s} {}\n", ns(at)),
            };
            let _ =
                tokio::time::timeout(Duration::from_secs(1), wr.write_all(msg.as_bytes())).await;
            if children_left {
                // What the command left running stops too before the lock is released.
                kill_group(pgid, libc::SIGTERM);
                leftovers_kill = Some((boot_now() + grace).min(sched.kill));
            }
        }
        if ended.is_some() && !children_left {
            return 0;
        }
        let now = boot_now();
        if now >= sched.kill || leftovers_kill.is_some_and(|k| now >= k) {
            kill_group(pgid, libc::SIGKILL);
        }
        if now >= sched.term && !termed && ended.is_none() {
            termed = true;
            kill_group(pgid, libc::SIGTERM);
        }
        let mut next = sched.kill;
        if !termed {
            next = next.min(sched.term);
        }
        if let Some(k) = leftovers_kill {
            next = next.min(k);
        }
        tokio::select! {
            line = lines.next_line(), if !eof => match line {
                Ok(Some(l)) => {
                    if let Some(s) = parse_schedule(&l) {
                        sched = s;
                    }
                }
                // dlock is gone: nothing holds the lock any more.
                Ok(None) | Err(_) => {
                    eof = true;
                    kill_group(pgid, libc::SIGKILL);
                }
            },
            _ = recv_any(&mut sigs) => {
                if parent_gone() {
                    kill_group(pgid, libc::SIGKILL);
                }
            }
            _ = recv(&mut sigchld) => {}
            // A safety net under SIGCHLD and the parent checks.
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if parent_gone() {
                    kill_group(pgid, libc::SIGKILL);
                }
            }
            _ = tokio::time::sleep_until(to_tokio(next)) => {}
        }
    }
}

pub async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Handlers for the signals dlock forwards to the group (SIGTERM, SIGINT, SIGHUP, SIGQUIT).
pub fn forwarded_signals() -> Vec<(libc::c_int, tokio::signal::unix::Signal)> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigs = Vec::new();
    for (n, k) in [
        (libc::SIGTERM, SignalKind::terminate()),
        (libc::SIGINT, SignalKind::interrupt()),
        (libc::SIGHUP, SignalKind::hangup()),
        (libc::SIGQUIT, SignalKind::quit()),
    ] {
        if let Ok(s) = signal(k) {
            sigs.push((n, s));
        }
    }
    sigs
}

/// Resolves with the number of whichever of `sigs` arrives first.
pub async fn recv_any(sigs: &mut [(libc::c_int, tokio::signal::unix::Signal)]) -> libc::c_int {
    std::future::poll_fn(|cx| {
        for (n, s) in sigs.iter_mut() {
            if let std::task::Poll::Ready(Some(())) = s.poll_recv(cx) {
                return std::task::Poll::Ready(*n);
            }
        }
        std::task::Poll::Pending
    })
    .await
}
