//! Every descendant of a process, found by walking /proc, and signalling them without ever
//! hitting a recycled pid.
//!
//! A process group or a session is no boundary: coreutils `timeout`, `setsid`, daemons and
//! shells with job control all leave the group they were started in. Parenthood is what they
//! cannot leave: an orphan is re-parented to the nearest ancestor that is a child subreaper
//! (the guard, and the host for what the guard leaves), so as long as that ancestor lives,
//! everything the command started is found under it by its parent pid.
//!
//! `/proc/PID/task/TID/children` would be cheaper, but needs `CONFIG_PROC_CHILDREN`, which
//! many kernels (this project's CI among them) do not have; reading every `/proc/PID/stat`
//! works everywhere and costs a few milliseconds for a few hundred processes, only while a
//! command is being stopped.

use crate::cgroup::Cgroup;
use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Everything a process started: its descendants, and the cgroup they run in if one was made.
pub(crate) struct Tree {
    /// The subreaper the descendants are found under (never signalled itself).
    pub(crate) root: libc::pid_t,
    pub(crate) cgroup: Option<Cgroup>,
    /// When SIGKILLing began, and whether the user was told that it takes long.
    killing_since: Option<(Instant, bool)>,
}

impl Tree {
    pub(crate) fn new(root: libc::pid_t, cgroup: Option<Cgroup>) -> Tree {
        Tree {
            root,
            cgroup,
            killing_since: None,
        }
    }

    /// Sends `sig` to every live descendant.
    pub(crate) fn signal(&self, sig: libc::c_int) {
        signal_descendants(self.root, sig, |_| true);
    }

    /// Asks everything to end: SIGCONT, SIGTERM, SIGCONT. A stopped process (Ctrl-Z, a read
    /// of the terminal from the background) would keep a handled SIGTERM pending for ever;
    /// the SIGCONT after it wakes whatever stopped again in between.
    pub(crate) fn terminate(&self) {
        for sig in [libc::SIGCONT, libc::SIGTERM, libc::SIGCONT] {
            self.signal(sig);
        }
    }

    /// SIGKILLs everything: the cgroup at once, then every live descendant. Called again and
    /// again until nothing is left (what a process forked before it died is found next time).
    /// Says so on stderr, once, when that takes more than a few seconds (a process in
    /// uninterruptible sleep, or one of another user that only a cgroup could have killed).
    pub(crate) fn kill(&mut self, who: &str) {
        if let Some(c) = &self.cgroup {
            c.kill();
        }
        self.signal(libc::SIGKILL);
        let (since, told) = self.killing_since.get_or_insert((Instant::now(), false));
        if !*told && since.elapsed() > Duration::from_secs(5) {
            *told = true;
            let left: Vec<String> = descendants(self.root)
                .iter()
                .filter(|p| !p.ended)
                .map(|p| p.pid.to_string())
                .collect();
            eprintln!(
                "dlock: {who}: processes of the command are still there 5 s after SIGKILL \
                 (pids {}); waiting for them to end",
                left.join(" ")
            );
        }
    }

    /// True while the cgroup holds a process.
    pub(crate) fn populated(&self) -> bool {
        self.cgroup.as_ref().is_some_and(Cgroup::populated)
    }

    /// Removes the cgroup, once it is empty.
    pub(crate) fn remove_cgroup(&self) {
        if let Some(c) = &self.cgroup {
            c.remove();
        }
    }
}

/// One process, as its `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: libc::pid_t,
    pub(crate) ppid: libc::pid_t,
    pub(crate) pgrp: libc::pid_t,
    /// In clock ticks since boot: with the pid, names one process for good.
    pub(crate) start: u64,
    /// A zombie (or dead): it has ended and only waits to be reaped.
    pub(crate) ended: bool,
}

impl Proc {
    /// Parses a `/proc/PID/stat` line: `pid (comm) state ppid pgrp … starttime …` (the command
    /// name may hold spaces and parentheses, so the fields are counted from the last `)`).
    pub(crate) fn parse(stat: &str) -> Option<Proc> {
        let (head, rest) = stat.rsplit_once(')')?;
        let pid = head.split_once(" (")?.0.trim().parse().ok()?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // f[0] is field 3 (state), so field N is f[N - 3]; starttime is field 22.
        Some(Proc {
            pid,
            ppid: f.get(1)?.parse().ok()?,
            pgrp: f.get(2)?.parse().ok()?,
            start: f.get(19)?.parse().ok()?,
            ended: matches!(*f.first()?, "Z" | "X" | "x"),
        })
    }

    fn read(pid: libc::pid_t) -> Option<Proc> {
        Proc::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }
}

/// Every process of /proc.
fn scan() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter_map(Proc::read)
        .collect()
}

/// Every descendant of `root` (not `root` itself), ended ones included.
pub(crate) fn descendants(root: libc::pid_t) -> Vec<Proc> {
    let all = scan();
    let mut children: HashMap<libc::pid_t, Vec<Proc>> = HashMap::new();
    for p in all {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(parent) = next.pop() {
        for c in children.remove(&parent).unwrap_or_default() {
            next.push(c.pid);
            out.push(c);
        }
    }
    out
}

/// Sends `sig` to every live descendant of `root` that `pick` selects (never `root`); returns
/// how many it reached.
pub(crate) fn signal_descendants(
    root: libc::pid_t,
    sig: libc::c_int,
    mut pick: impl FnMut(&Proc) -> bool,
) -> usize {
    descendants(root)
        .iter()
        .filter(|p| !p.ended && pick(p))
        .filter(|p| signal(p, sig))
        .count()
}

/// Sends `sig` to `p` if the process behind its pid is still the one the scan saw: the pid is
/// pinned with a pidfd, then its start time compared, so a pid recycled since the scan is
/// never signalled. (Without pidfds, before Linux 5.3, the same check is made just before a
/// plain kill(2), which leaves a window of microseconds.)
fn signal(p: &Proc, sig: libc::c_int) -> bool {
    let same = || Proc::read(p.pid).is_some_and(|now| now.start == p.start && !now.ended);
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, p.pid, 0) };
    if fd < 0 {
        if io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) || !same() {
            return false;
        }
        // SAFETY: kill(2) has no memory effects; the pid was checked just above.
        return unsafe { libc::kill(p.pid, sig) } == 0;
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if !same() {
        return false;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal takes the pidfd, the signal, a null siginfo and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

/// Reaps every child of this process that has ended; `false` once it has no child left at all
/// (ECHILD). `on_reaped` hears of each (pid, wait status).
pub(crate) fn reap(mut on_reaped: impl FnMut(libc::pid_t, libc::c_int)) -> bool {
    loop {
        let mut st: libc::c_int = 0;
        // SAFETY: waitpid writes only into `st`.
        let rc = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if rc > 0 {
            on_reaped(rc, st);
            continue;
        }
        // rc == 0: children left, none ended; rc < 0: ECHILD, nothing left.
        return rc == 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn stat_lines_parse_with_odd_command_names() {
        let line = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                    98765 1000 100 18446744073709551615";
        assert_eq!(
            Proc::parse(line),
            Some(Proc {
                pid: 4242,
                ppid: 17,
                pgrp: 4242,
                start: 98765,
                ended: false,
            })
        );
        let zombie = "7 (sh) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0";
        assert!(Proc::parse(zombie).is_some_and(|p| p.ended));
        assert_eq!(Proc::parse("7 (sh) S 1"), None);
        assert_eq!(Proc::parse("garbage"), None);
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(30), "timed out: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A shell whose grandchild moved to a session of its own (and whose parent exited) is
    /// still found under the shell's parent chain while its parent lives, and is killed;
    /// the root itself is never signalled.
    #[test]
    fn finds_and_kills_a_grandchild_in_another_session() {
        let dir = std::env::temp_dir().join(format!("distlock-run-tree-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let pidfile = dir.join("pid");
        let mut root = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "setsid sh -c 'echo $$ > {}; exec sleep 60' & wait",
                pidfile.display()
            ))
            .spawn()
            .expect("sh");
        let root_pid = root.id() as libc::pid_t;
        wait_for("the grandchild", || {
            std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
        });
        let leaf: libc::pid_t = std::fs::read_to_string(&pidfile)
            .expect("pid")
            .trim()
            .parse()
            .expect("number");
        let found = descendants(root_pid);
        let p = found.iter().find(|p| p.pid == leaf).expect("found");
        assert_ne!(p.pgrp, root_pid, "it left the group");
        assert_eq!(
            signal_descendants(root_pid, libc::SIGKILL, |p| p.pid == leaf),
            1
        );
        wait_for("the grandchild to die", || {
            Proc::read(leaf).is_none_or(|p| p.ended)
        });
        // The root was never signalled: it exits by itself once its child is gone.
        let st = root.wait().expect("wait");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_recycled_pid_is_not_signalled() {
        // A process that is gone: its pid and a start time that no live process has.
        let gone = Proc {
            pid: i32::MAX - 1,
            ppid: 1,
            pgrp: 1,
            start: 1,
            ended: false,
        };
        assert!(!signal(&gone, 0));
        // Our own pid with another start time: refused, too.
        let me = Proc::read(std::process::id() as libc::pid_t).expect("self");
        assert!(signal(&me, 0));
        let other = Proc {
            start: me.start + 1,
            ..me
        };
        assert!(!signal(&other, 0));
    }
}
