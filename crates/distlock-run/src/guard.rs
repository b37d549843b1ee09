//! The guard process: leader of the command's process group, child subreaper, enforcer of the
//! stop schedule (see the crate docs).

use crate::signals::{forwarded_signals, recv, recv_any};
use crate::supervisor::{Ended, Report};
use crate::{boot_now, kill_group, set_pdeathsig, to_tokio, Schedule, EXIT_ERROR, EXIT_LOST};
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The guard's command line, as [`crate::Supervisor::spawn`] writes it after
/// [`crate::GUARD_SUBCOMMAND`]: `--fd N --parent PID --grace-ns NS -- COMMAND…`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GuardArgs {
    /// The guard's end of the socket pair to the host.
    pub fd: i32,
    /// The host's pid.
    pub parent: u32,
    /// How long the command's leftover children get between SIGTERM and SIGKILL.
    pub grace: Duration,
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
        loop {
            let Some(opt) = it.next() else {
                return Err("no `-- COMMAND` given".into());
            };
            if opt == "--" {
                break;
            }
            let value = it.next().ok_or_else(|| format!("{opt} needs a value"))?;
            let bad = || format!("{opt} {value}: not a number");
            let slot = match opt.as_str() {
                "--fd" => fd.replace(value.parse::<i32>().map_err(|_| bad())?),
                "--parent" => parent
                    .replace(value.parse::<u32>().map_err(|_| bad())?)
                    .map(|_| 0),
                "--grace-ns" => grace
                    .replace(value.parse::<u64>().map_err(|_| bad())?)
                    .map(|_| 0),
                _ => return Err(format!("unknown option {opt}")),
            };
            if slot.is_some() {
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
            "--".into(),
        ];
        v.extend(self.command.iter().cloned());
        v
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
    rt.block_on(guard(args, sock, pid))
}

async fn guard(args: GuardArgs, sock: std::os::unix::net::UnixStream, pgid: libc::pid_t) -> u8 {
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
    // handled signals), and a signal dlock sends to the group does not end the guard.
    let mut sigs = forwarded_signals();
    let mut sigchld = signal(SignalKind::child()).ok();
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
    if parent_gone() {
        return EXIT_ERROR;
    }
    if boot_now() >= sched.term {
        let _ = wr
            .write_all(Report::LeaseTooShort.to_line().as_bytes())
            .await;
        return EXIT_LOST;
    }
    let Some((program, rest)) = args.command.split_first() else {
        return EXIT_ERROR;
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
            let msg = Report::Failed(code, e.to_string()).to_line();
            let _ = wr.write_all(msg.as_bytes()).await;
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
            let msg = Report::Ended(e, at).to_line();
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
                    if let Some(s) = Schedule::parse(&l) {
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
            command: strings(&["sh", "-c", "echo --fd"]),
        };
        let argv = a.to_args();
        assert_eq!(argv[0], crate::GUARD_SUBCOMMAND);
        assert_eq!(GuardArgs::parse(argv.into_iter().skip(1)), Ok(a));
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
        ] {
            assert!(GuardArgs::parse(strings(bad)).is_err(), "{bad:?}");
        }
    }
}
