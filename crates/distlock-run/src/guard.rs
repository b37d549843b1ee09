//! The guard process: leader of the command's process group, child subreaper of everything the
//! command starts, enforcer of the stop schedule (see the crate docs).

use crate::cgroup::Cgroup;
use crate::signals::{forwarded_signals, recv, recv_any};
use crate::supervisor::{Ended, Report};
use crate::tree::{self, Tree};
use crate::{boot_now, set_pdeathsig, to_tokio, Schedule, EXIT_ERROR, EXIT_LOST};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The guard's command line, as [`crate::Supervisor::spawn`] writes it after
/// [`crate::GUARD_SUBCOMMAND`]: `--fd N --parent PID --grace-ns NS [--cgroup DIR] [--hold-fd N]
/// -- COMMAND…`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuardArgs {
    /// The guard's end of the socket pair to the host.
    pub fd: i32,
    /// The host's pid.
    pub parent: u32,
    /// How long the command's leftover children get between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// The cgroup the host made for the command, if it could.
    pub cgroup: Option<String>,
    /// A duplicate of the descriptor whose open file carries the lock (`file://`): kept open
    /// until every process of the command is gone.
    pub hold_fd: Option<i32>,
    /// The host runs in the foreground of the terminal on standard input: the command gets
    /// that terminal (its process group becomes the foreground one), and a Ctrl-Z that stops
    /// the command stops the host too, as a shell expects of its job.
    pub terminal: bool,
    /// The command and its arguments.
    pub command: Vec<String>,
}

impl GuardArgs {
    /// Reads the arguments that follow [`crate::GUARD_SUBCOMMAND`].
    ///
    /// # Errors
    /// A message when an option is missing, repeated, unknown or not a number, or when no
    /// command follows `--`.
    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<GuardArgs, String> {
        let mut it = args.into_iter();
        let (mut fd, mut parent, mut grace) = (None, None, None);
        let (mut cgroup, mut hold_fd, mut terminal) = (None, None, None);
        loop {
            let Some(opt) = it.next() else {
                return Err("no `-- COMMAND` given".into());
            };
            if opt == "--" {
                break;
            }
            let value = it.next().ok_or_else(|| format!("{opt} needs a value"))?;
            let bad = || format!("{opt} {value}: not a number");
            let twice = match opt.as_str() {
                "--fd" => fd
                    .replace(value.parse::<i32>().map_err(|_| bad())?)
                    .is_some(),
                "--parent" => parent
                    .replace(value.parse::<u32>().map_err(|_| bad())?)
                    .is_some(),
                "--grace-ns" => grace
                    .replace(value.parse::<u64>().map_err(|_| bad())?)
                    .is_some(),
                "--hold-fd" => hold_fd
                    .replace(value.parse::<i32>().map_err(|_| bad())?)
                    .is_some(),
                "--cgroup" => cgroup.replace(value).is_some(),
                "--terminal" => terminal.replace(value == "1").is_some(),
                _ => return Err(format!("unknown option {opt}")),
            };
            if twice {
                return Err(format!("{opt} given twice"));
            }
        }
        let command: Vec<String> = it.collect();
        match (fd, parent, grace) {
            _ if command.is_empty() => Err("no command after `--`".into()),
            (Some(fd), Some(parent), Some(grace)) => Ok(GuardArgs {
                fd,
                parent,
                grace: Duration::from_nanos(grace),
                cgroup,
                hold_fd,
                terminal: terminal.unwrap_or(false),
                command,
            }),
            _ => Err("--fd, --parent and --grace-ns are required".into()),
        }
    }

    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            crate::GUARD_SUBCOMMAND.to_string(),
            "--fd".into(),
            self.fd.to_string(),
            "--parent".into(),
            self.parent.to_string(),
            "--grace-ns".into(),
            crate::ns(self.grace).to_string(),
        ];
        if let Some(c) = &self.cgroup {
            v.extend(["--cgroup".into(), c.clone()]);
        }
        if let Some(h) = self.hold_fd {
            v.extend(["--hold-fd".into(), h.to_string()]);
        }
        if self.terminal {
            v.extend(["--terminal".into(), "1".into()]);
        }
        v.push("--".into());
        v.extend(self.command.iter().cloned());
        v
    }
}

/// What the host tells the guard, one line each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// `D <term_ns> <kill_ns>`: the stop schedule.
    Schedule(Schedule),
    /// `S <n>`: forward signal n (one the host forwards) to the command.
    Signal(libc::c_int),
    /// `C`: the host was continued (after a Ctrl-Z stopped it with the command): the
    /// command gets the terminal back if the host has it, and SIGCONT.
    Continue,
}

impl Order {
    pub(crate) fn to_line(self) -> String {
        match self {
            Order::Schedule(s) => s.to_line(),
            Order::Signal(n) => format!("S {n}\n"),
            Order::Continue => "C\n".into(),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Order> {
        if let Some(s) = Schedule::parse(line) {
            return Some(Order::Schedule(s));
        }
        if line == "C" {
            return Some(Order::Continue);
        }
        let n: libc::c_int = line.strip_prefix("S ")?.parse().ok()?;
        // Only what a host forwards: never a SIGKILL or SIGSTOP from a confused peer.
        crate::signals::FORWARDED
            .contains(&n)
            .then_some(Order::Signal(n))
    }
}

/// The guard's entry point for the host's `main`: if this process was started as the guard
/// (its first argument is [`crate::GUARD_SUBCOMMAND`]), runs it and returns its exit code;
/// otherwise returns `None` at once. See the crate docs.
pub fn dispatch_guard() -> Option<u8> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != crate::GUARD_SUBCOMMAND {
        return None;
    }
    let args: Option<Vec<String>> = args.map(|a| a.into_string().ok()).collect();
    let parsed = args
        .ok_or_else(|| "an argument is not UTF-8".to_string())
        .and_then(GuardArgs::parse);
    Some(match parsed {
        Ok(args) => guard_main(args),
        Err(e) => {
            eprintln!("dlock: __guard: {e}; it is started by `dlock run`, not for direct use");
            EXIT_ERROR
        }
    })
}

/// Runs the guard (see the crate docs) with its parsed arguments; its exit code.
pub fn guard_main(args: GuardArgs) -> u8 {
    // SAFETY: getpgrp/getpid/getppid only read process state.
    let (pgrp, pid, ppid) = unsafe { (libc::getpgrp(), libc::getpid(), libc::getppid()) };
    // Signalling "our" group would hit the caller's own group if this was not started by
    // `dlock run` (which makes it a group leader).
    if pgrp != pid || ppid as u32 != args.parent {
        eprintln!("dlock: __guard is started by `dlock run`; it is not for direct use");
        return EXIT_ERROR;
    }
    // SAFETY: F_GETFD only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(args.fd, libc::F_GETFD) };
    if args.fd < 3 || flags < 0 {
        eprintln!("dlock: __guard: no socket at descriptor {}", args.fd);
        return EXIT_ERROR;
    }
    // SAFETY: as above; the command must not inherit the socket (dlock would not see EOF when
    // the guard dies, and the command could write to it).
    unsafe { libc::fcntl(args.fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    // SAFETY: dlock handed this descriptor to us alone; nothing else in this process owns it.
    let sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(args.fd) };
    // The lock's file (file://): held, not inherited by the command, closed only when this
    // process exits, after every process of the command is gone.
    let hold = args.hold_fd.and_then(|fd| {
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if fd < 3 || fd == args.fd || flags < 0 {
            eprintln!("dlock: __guard: no lock file at descriptor {fd}");
            return None;
        }
        // SAFETY: as above; F_SETFD only changes the descriptor's flags.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        // SAFETY: dlock handed this duplicate to us alone.
        Some(unsafe { OwnedFd::from_raw_fd(fd) })
    });
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
            return EXIT_ERROR;
        }
    };
    let code = rt.block_on(guard(args, sock, pid));
    // Only now may the kernel free a file:// lock (if dlock is gone too).
    drop(hold);
    code
}

async fn guard(args: GuardArgs, sock: std::os::unix::net::UnixStream, me: libc::pid_t) -> u8 {
    use tokio::signal::unix::{signal, SignalKind};
    let grace = args.grace;
    let Ok(()) = sock.set_nonblocking(true) else {
        return EXIT_ERROR;
    };
    let Ok(sock) = tokio::net::UnixStream::from_std(sock) else {
        return EXIT_ERROR;
    };
    let (rd, mut wr) = sock.into_split();
    let mut lines = BufReader::new(rd).lines();
    // Handlers, not SIG_IGN: the command starts with default dispositions (exec resets
    // handled signals), and a signal someone sends to the group does not end the guard.
    let mut sigs = forwarded_signals();
    let mut sigchld = signal(SignalKind::child()).ok();
    // Ctrl-Z at the terminal the command has: the command stops (its default), the guard
    // hands the terminal back to the host's group and stops the host, so the shell sees its
    // job stopped. Without a terminal, no handler: nobody types a Ctrl-Z at this group.
    let mut sigtstp = if args.terminal {
        signal(SignalKind::from_raw(libc::SIGTSTP)).ok()
    } else {
        None
    };
    // SAFETY: getpgid only reads state.
    let host_pgrp = unsafe { libc::getpgid(args.parent as libc::pid_t) };
    let parent_gone = || {
        // SAFETY: getppid only reads process state.
        (unsafe { libc::getppid() }) as u32 != args.parent
    };
    // The first schedule comes before the command starts.
    let mut sched = match lines.next_line().await {
        Ok(Some(l)) => match Schedule::parse(&l) {
            Some(s) => s,
            None => return EXIT_ERROR,
        },
        _ => return EXIT_ERROR,
    };
    let cgroup = args.cgroup.clone().map(|d| Cgroup::at(d.into()));
    // The command joins the cgroup between fork and exec (so everything it starts is born
    // there); if it cannot, the walk alone finds what it starts.
    let procs = cgroup.as_ref().and_then(|c| c.open_procs().ok());
    let mut tree = Tree::new(me, cgroup);
    if parent_gone() {
        tree.remove_cgroup();
        return EXIT_ERROR;
    }
    if boot_now() >= sched.term {
        let _ = wr
            .write_all(Report::LeaseTooShort.to_line().as_bytes())
            .await;
        tree.remove_cgroup();
        return EXIT_LOST;
    }
    let Some((program, rest)) = args.command.split_first() else {
        return EXIT_ERROR;
    };
    // The host was in the foreground: the command's group (this one) takes the terminal, so
    // that the command can read it and a Ctrl-C reaches it as under flock. Before the
    // command starts: its first read must not find itself in the background.
    if args.terminal && !crate::signals::give_terminal(me) {
        eprintln!("dlock: __guard: cannot give the terminal to the command");
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    let procs_fd = procs.as_ref().map(AsRawFd::as_raw_fd);
    // SAFETY: between fork and exec; write, prctl and getppid are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = procs_fd {
                // "0": the writing process. A failure leaves the command outside the cgroup.
                libc::write(fd, b"0".as_ptr().cast(), 1);
            }
            set_pdeathsig(libc::SIGKILL)?;
            // The guard may have died before the prctl took effect.
            if libc::getppid() != me {
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
            let msg = Report::Failed(code, e.to_string()).to_line();
            let _ = wr.write_all(msg.as_bytes()).await;
            tree.remove_cgroup();
            return code;
        }
    };
    drop(procs);
    let cmd_pid = libc::pid_t::try_from(child.id()).unwrap_or(-1);
    // Reaped below with waitpid(-1), together with orphans; never through `child`.
    drop(child);
    let mut ended: Option<(Ended, Duration)> = None;
    let mut reported = false;
    let mut termed = false;
    // After the command ended: when what it left running gets SIGKILL.
    let mut leftovers_kill: Option<Duration> = None;
    // SIGKILL everything, again and again, until nothing is left.
    let mut killing = false;
    let mut eof = false;
    loop {
        // Reap every child that ended (the command and orphans alike).
        let children_left = tree::reap(|pid, st| {
            if pid == cmd_pid {
                ended = Some((Ended::from_wait_status(st), boot_now()));
            }
        });
        let left = children_left || tree.populated();
        if let (Some((e, at)), false) = (ended, reported) {
            reported = true;
            let msg = Report::Ended(e, at).to_line();
            let _ =
                tokio::time::timeout(Duration::from_secs(1), wr.write_all(msg.as_bytes())).await;
            if left {
                // What the command left running stops too before the lock is released,
                // whatever process group or session it moved to.
                tree.terminate();
                leftovers_kill = Some((boot_now() + grace).min(sched.kill));
            }
        }
        if ended.is_some() && !left {
            // Nothing of the command is left: the host may release the lock (and a file://
            // lock this process holds goes with it).
            tree.remove_cgroup();
            return 0;
        }
        let now = boot_now();
        if now >= sched.kill || leftovers_kill.is_some_and(|k| now >= k) {
            killing = true;
        }
        if killing {
            tree.kill("__guard");
        } else if now >= sched.term && !termed && ended.is_none() {
            termed = true;
            tree.terminate();
        }
        let mut next = sched.kill;
        if !termed {
            next = next.min(sched.term);
        }
        if let Some(k) = leftovers_kill {
            next = next.min(k);
        }
        let tick = if killing { 20 } else { 200 };
        tokio::select! {
            line = lines.next_line(), if !eof => match line {
                Ok(Some(l)) => match Order::parse(&l) {
                    Some(Order::Schedule(s)) => sched = s,
                    // To the command's own process wherever it moved, and to what stayed in
                    // its group (as a terminal signals its foreground job).
                    Some(Order::Signal(n)) => {
                        let command = if ended.is_none() { cmd_pid } else { -1 };
                        let pick = |p: &tree::Proc| p.pgrp == me || p.pid == command;
                        tree::signal_descendants(me, n, pick);
                        // A stopped command would keep the signal pending, and dlock waiting.
                        tree::signal_descendants(me, libc::SIGCONT, pick);
                        if n == libc::SIGTERM || n == libc::SIGINT {
                            // dlock was told to end: the command gets --grace, then SIGKILL.
                            let k = boot_now() + grace;
                            leftovers_kill = Some(leftovers_kill.map_or(k, |l| l.min(k)));
                        }
                    }
                    Some(Order::Continue) => {
                        if args.terminal && crate::signals::terminal_owner() == Some(host_pgrp) {
                            crate::signals::give_terminal(me);
                        }
                        tree.signal(libc::SIGCONT);
                    }
                    None => {}
                },
                // dlock is gone: nothing holds the lock any more.
                Ok(None) | Err(_) => {
                    eof = true;
                    killing = true;
                }
            },
            _ = recv_any(&mut sigs) => {
                if parent_gone() {
                    killing = true;
                }
            }
            _ = recv(&mut sigchld) => {}
            _ = recv(&mut sigtstp) => {
                if crate::signals::terminal_owner() == Some(me) {
                    crate::signals::give_terminal(host_pgrp);
                }
                // SAFETY: signalling the host, our parent (checked at the start).
                unsafe { libc::kill(args.parent as libc::pid_t, libc::SIGTSTP) };
            }
            // A safety net under SIGCHLD and the parent checks; while killing, the pace of
            // the kill rounds.
            _ = tokio::time::sleep(Duration::from_millis(tick)) => {
                if parent_gone() {
                    killing = true;
                }
            }
            _ = tokio::time::sleep_until(to_tokio(next)), if !killing => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn guard_args_round_trip() {
        let a = GuardArgs {
            fd: 5,
            parent: 42,
            grace: Duration::from_millis(1500),
            cgroup: None,
            hold_fd: None,
            terminal: false,
            command: strings(&["sh", "-c", "echo --fd"]),
        };
        let argv = a.to_args();
        assert_eq!(argv[0], crate::GUARD_SUBCOMMAND);
        assert_eq!(GuardArgs::parse(argv.into_iter().skip(1)), Ok(a.clone()));
        let b = GuardArgs {
            cgroup: Some("/sys/fs/cgroup/x/dlock-1-0".into()),
            hold_fd: Some(7),
            terminal: true,
            ..a
        };
        assert_eq!(GuardArgs::parse(b.to_args().into_iter().skip(1)), Ok(b));
    }

    #[test]
    fn orders_round_trip_and_only_forwarded_signals_pass() {
        let s = Schedule {
            term: Duration::from_secs(1),
            kill: Duration::from_secs(2),
        };
        for o in [
            Order::Schedule(s),
            Order::Signal(libc::SIGINT),
            Order::Continue,
        ] {
            assert_eq!(Order::parse(o.to_line().trim_end()), Some(o));
        }
        assert_eq!(Order::parse("S 9"), None);
        assert_eq!(Order::parse("S 19"), None);
        assert_eq!(Order::parse("S x"), None);
    }

    #[test]
    fn bad_guard_args_are_refused() {
        for bad in [
            &["--fd", "5", "--parent", "1", "--grace-ns", "1"][..],
            &["--fd", "5", "--parent", "1", "--grace-ns", "1", "--"],
            &["--fd", "5", "--parent", "1", "--", "true"],
            &[
                "--fd",
                "x",
                "--parent",
                "1",
                "--grace-ns",
                "1",
                "--",
                "true",
            ],
            &[
                "--fd",
                "5",
                "--fd",
                "6",
                "--parent",
                "1",
                "--grace-ns",
                "1",
                "--",
                "true",
            ],
            &["--what", "5", "--", "true"],
            &[
                "--fd",
                "5",
                "--parent",
                "1",
                "--grace-ns",
                "1",
                "--hold-fd",
                "x",
                "--",
                "true",
            ],
        ] {
            assert!(GuardArgs::parse(strings(bad)).is_err(), "{bad:?}");
        }
    }
}
