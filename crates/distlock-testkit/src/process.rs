//! [`ServerProcess`]: the one lifecycle every server starter of this crate shares.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::spawn::{self, group_states};
use crate::{try_free_port, Error, Result, TempDir};

/// Lines of each log quoted in a failure message.
const LOG_TAIL_LINES: usize = 20;
/// How long [`ServerProcess::pause`] and [`resume`](ServerProcess::resume) wait for the
/// kernel to report the new state.
const SIGNAL_SETTLE: Duration = Duration::from_secs(1);

/// What a readiness probe found (see [`ServerSpec::ready`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ready {
    /// Our server answers: the start is done.
    Yes,
    /// Not yet: probe again after the poll interval.
    NotYet,
    /// Another process answered on the port (it was taken in a race): start again, on a new
    /// port when the port was free-picked.
    Foreign(String),
}

/// What a readiness probe is asked about.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ReadyCheck<'a> {
    /// The server's directory.
    pub dir: &'a Path,
    /// The port it was started on.
    pub port: u16,
    /// The pid of our child (to tell it apart from a foreign server on the port).
    pub pid: u32,
}

type CommandFn = dyn Fn(&Path, u16) -> Command + Send + Sync;
type ReadyFn = dyn Fn(&ReadyCheck<'_>) -> Ready + Send + Sync;

/// How to run one server: its command line for a directory and a port, its readiness probe,
/// and the logs quoted when it fails. [`ServerProcess`] runs it.
pub struct ServerSpec {
    what: String,
    package: String,
    command: Box<CommandFn>,
    ready: Box<ReadyFn>,
    output: String,
    logs: Vec<String>,
    ready_timeout: Duration,
    poll: Duration,
    start_attempts: usize,
    restart_attempts: usize,
    restart_backoff: Duration,
}

impl std::fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerSpec")
            .field("what", &self.what)
            .field("package", &self.package)
            .field("output", &self.output)
            .field("logs", &self.logs)
            .finish_non_exhaustive()
    }
}

impl ServerSpec {
    /// A server called `what` in messages (e.g. `redis-server`), whose binary comes from the
    /// Debian `package`, started by `command(dir, port)`.
    ///
    /// The command needs no stdio or working directory: the process runs in `dir`, with
    /// stdin from `/dev/null`, stdout and stderr appended to the [output log](Self::output),
    /// in its own process group (so kill and pause reach every process it forks), and dies
    /// with the test process (`PR_SET_PDEATHSIG`). Until [`ready`](Self::ready) is set, the
    /// server counts as ready as soon as it is spawned.
    pub fn new(
        what: impl Into<String>,
        package: impl Into<String>,
        command: impl Fn(&Path, u16) -> Command + Send + Sync + 'static,
    ) -> Self {
        ServerSpec {
            what: what.into(),
            package: package.into(),
            command: Box::new(command),
            ready: Box::new(|_| Ready::Yes),
            output: "output.log".into(),
            logs: Vec::new(),
            ready_timeout: Duration::from_secs(20),
            poll: Duration::from_millis(10),
            start_attempts: 5,
            restart_attempts: 20,
            restart_backoff: Duration::from_millis(100),
        }
    }

    /// The readiness probe, asked every poll interval until it says [`Ready::Yes`] (or the
    /// process exits, or the [timeout](Self::ready_timeout) passes).
    pub fn ready(
        mut self,
        probe: impl Fn(&ReadyCheck<'_>) -> Ready + Send + Sync + 'static,
    ) -> Self {
        self.ready = Box::new(probe);
        self
    }

    /// How long a start may take (default 20 s) and how often it is probed (default 10 ms).
    pub fn ready_timeout(mut self, timeout: Duration, poll: Duration) -> Self {
        self.ready_timeout = timeout;
        self.poll = poll;
        self
    }

    /// The file in the server's directory that captures stdout and stderr (default
    /// `output.log`).
    pub fn output(mut self, name: impl Into<String>) -> Self {
        self.output = name.into();
        self
    }

    /// Further log files (in the server's directory) quoted in failure messages.
    pub fn logs(mut self, names: &[&str]) -> Self {
        self.logs = names.iter().map(|n| n.to_string()).collect();
        self
    }

    /// Attempts of a start on a free port (each on a new port; default 5) and of a restart on
    /// the same port (default 20, `backoff` apart; default 100 ms).
    pub fn attempts(mut self, start: usize, restart: usize, backoff: Duration) -> Self {
        self.start_attempts = start.max(1);
        self.restart_attempts = restart.max(1);
        self.restart_backoff = backoff;
        self
    }
}

/// The methods every single-process starter hands through to its `process` field
/// ([`ServerProcess`]), with the same meaning everywhere: `port`, `addr`, `dir`, `pid`,
/// `is_running`, `kill`, `pause`, `resume` and `restart` (the wrapper's own `restart`, if
/// it needs one, goes by `restart = false`).
macro_rules! process_methods {
    () => {
        $crate::process::process_methods!(restart = true);
        /// Kills the server if it runs and starts it again on the **same port** in the
        /// **same directory**, so it keeps its data (crash recovery). Retries while the
        /// port is briefly busy; on error the server is left stopped.
        ///
        /// # Errors
        /// [`Error::Start`](crate::Error::Start) with the tail of the logs.
        pub fn restart(&mut self) -> $crate::Result<()> {
            self.process.restart()
        }
    };
    (restart = $r:tt) => {
        /// The TCP port (stable across [`restart`](Self::restart)).
        pub fn port(&self) -> u16 {
            self.process.port()
        }

        /// `127.0.0.1:port`.
        pub fn addr(&self) -> std::net::SocketAddr {
            self.process.addr()
        }

        /// The server's temp dir (its working and data directory, with `output.log` or the
        /// log named in the type's docs).
        pub fn dir(&self) -> &std::path::Path {
            self.process.dir()
        }

        /// The OS pid of the server process, or `None` after [`kill`](Self::kill).
        pub fn pid(&self) -> Option<u32> {
            self.process.pid()
        }

        /// Whether the server process exists and has not exited (a paused server counts as
        /// running).
        pub fn is_running(&self) -> bool {
            self.process.is_running()
        }

        /// Kills the server (`SIGKILL` to its process group: a crash) and reaps it.
        /// Idempotent; works on a paused server too. Clients see their connections reset.
        pub fn kill(&mut self) {
            self.process.kill();
        }

        /// Freezes the server (`SIGSTOP` to its process group) and returns once the kernel
        /// reports it stopped: connections are still accepted by the kernel but nothing is
        /// answered. No-op if not running.
        pub fn pause(&mut self) {
            self.process.pause();
        }

        /// Resumes a [paused](Self::pause) server with `SIGCONT`. No-op if not running.
        pub fn resume(&mut self) {
            self.process.resume();
        }

        /// Freezes one process of the server (e.g. one PostgreSQL backend, by the pid
        /// `pg_backend_pid()` reports) with `SIGSTOP`, returning once it is stopped. False if
        /// `pid` is not a process of this server.
        pub fn pause_member(&self, pid: u32) -> bool {
            self.process.pause_member(pid)
        }

        /// Resumes a process frozen by [`pause_member`](Self::pause_member) with `SIGCONT`.
        /// False if `pid` is not a process of this server.
        pub fn resume_member(&self, pid: u32) -> bool {
            self.process.resume_member(pid)
        }
    };
}
pub(crate) use process_methods;

/// Why one launch failed.
enum Attempt {
    /// Worth trying again (exited early, port taken).
    Retry(Error),
    /// Not worth it.
    Fatal(Error),
}

/// One server process on a loopback port, in its own directory: started and probed until
/// ready, killed (`SIGKILL` to its process group), paused (`SIGSTOP`, returning once the
/// kernel reports it stopped), resumed (`SIGCONT`), restarted on the same port and directory,
/// and killed on drop (its directory removed, when it owns one).
///
/// ```
/// use distlock_testkit::{ServerProcess, ServerSpec};
/// use std::process::Command;
///
/// let spec = ServerSpec::new("sleep", "coreutils", |_dir, _port| {
///     let mut cmd = Command::new("sleep");
///     cmd.arg("60");
///     cmd
/// });
/// let server = ServerProcess::start(spec, tempfile::tempdir()?)?;
/// server.pause();
/// assert!(server.is_paused());
/// server.resume();
/// server.restart()?;
/// assert!(server.is_running());
/// server.kill();
/// assert!(!server.is_running());
/// # Ok::<(), distlock_testkit::Error>(())
/// ```
#[derive(Debug)]
pub struct ServerProcess {
    spec: ServerSpec,
    port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    paused: AtomicBool,
    // Dropped after the process is killed (see `Drop`).
    _owned: Option<TempDir>,
}

impl ServerProcess {
    /// Starts `spec` on a free loopback port in `dir`, which it owns (and removes on drop).
    /// A start whose process exits early or whose port answers for someone else is tried
    /// again on a new port.
    ///
    /// # Errors
    /// [`Error::BinaryMissing`] without the binary; [`Error::Start`] (with the tail of the
    /// logs) when no attempt became ready.
    pub fn start(spec: ServerSpec, dir: TempDir) -> Result<Self> {
        let path = dir.path().to_path_buf();
        Self::start_free(spec, path, Some(dir))
    }

    /// Like [`start`](Self::start) in a directory the caller keeps (and removes).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_in(spec: ServerSpec, dir: &Path) -> Result<Self> {
        Self::start_free(spec, dir.to_path_buf(), None)
    }

    /// Starts `spec` on the given `port` in `dir` (kept by the caller), trying again on the
    /// same port like [`restart`](Self::restart) (for servers whose ports are picked
    /// together, like the members of a cluster).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_at(spec: ServerSpec, dir: &Path, port: u16) -> Result<Self> {
        let server = Self::stopped(spec, dir.to_path_buf(), None, port);
        server.launch_retrying()?;
        Ok(server)
    }

    fn stopped(spec: ServerSpec, dir: PathBuf, owned: Option<TempDir>, port: u16) -> Self {
        ServerProcess {
            spec,
            port,
            dir,
            child: Mutex::new(None),
            paused: AtomicBool::new(false),
            _owned: owned,
        }
    }

    fn start_free(spec: ServerSpec, dir: PathBuf, owned: Option<TempDir>) -> Result<Self> {
        let mut server = Self::stopped(spec, dir, owned, 0);
        let mut last = None;
        for _ in 0..server.spec.start_attempts {
            server.port = try_free_port()?;
            match server.launch() {
                Ok(child) => {
                    *server.lock() = Some(child);
                    return Ok(server);
                }
                Err(Attempt::Retry(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| server.start_error("no start attempt was made".into())))
    }

    /// The port (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's directory (its working directory, with the logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's pid, or `None` once killed.
    pub fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    /// Whether the process exists and has not exited (a paused one counts as running).
    pub fn is_running(&self) -> bool {
        matches!(self.lock().as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Whether the server is [paused](Self::pause) (and not resumed, killed or restarted since).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// `SIGKILL`s the process group (a crash: no shutdown work), reaps the process and waits
    /// briefly until no member of the group is left. Idempotent; works on a paused server.
    pub fn kill(&self) {
        let child = self.lock().take();
        if let Some(child) = child {
            spawn::kill_group_and_reap(child);
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Sends `sig` (a shutdown request such as `SIGTERM`) to the server and waits up to
    /// `timeout` for it to exit; then kills what is left of the group.
    pub fn stop(&self, sig: libc::c_int, timeout: Duration) {
        if self.signal(sig, false).is_some() {
            let deadline = Instant::now() + timeout;
            while self.is_running() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.kill();
    }

    /// Freezes every process of the server with `SIGSTOP` and returns once the kernel reports
    /// them stopped (at most 1 s): its sockets stay open, nothing is answered. No-op unless
    /// running.
    pub fn pause(&self) {
        if let Some(pgid) = self.signal(libc::SIGSTOP, true) {
            self.paused.store(true, Ordering::SeqCst);
            settle(pgid, |states| states.iter().all(|&s| s == 'T'));
        }
    }

    /// Resumes a [paused](Self::pause) server with `SIGCONT` and returns once the kernel
    /// reports none of its processes stopped (at most 1 s). No-op unless running.
    pub fn resume(&self) {
        if let Some(pgid) = self.signal(libc::SIGCONT, true) {
            settle(pgid, |states| states.iter().all(|&s| s != 'T'));
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Freezes one process of the server (a descendant of the process it started, e.g. a
    /// PostgreSQL backend) with `SIGSTOP`, returning once the kernel reports it stopped (at
    /// most 1 s). False if `pid` is not a process of the server.
    pub fn pause_member(&self, pid: u32) -> bool {
        self.signal_member(pid, libc::SIGSTOP, |s| s == 'T')
    }

    /// Resumes a process frozen by [`pause_member`](Self::pause_member) with `SIGCONT`.
    /// False if `pid` is not a process of the server.
    pub fn resume_member(&self, pid: u32) -> bool {
        self.signal_member(pid, libc::SIGCONT, |s| s != 'T')
    }

    fn signal_member(&self, pid: u32, sig: libc::c_int, done: fn(char) -> bool) -> bool {
        let guard = self.lock();
        let Some(leader) = guard
            .as_ref()
            .and_then(|c| libc::pid_t::try_from(c.id()).ok())
        else {
            return false;
        };
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        if !spawn::descends_from(pid, leader) {
            return false;
        }
        // SAFETY: a plain syscall on a descendant of our unreaped child (so not reused).
        unsafe {
            libc::kill(pid, sig);
        }
        drop(guard);
        let deadline = Instant::now() + SIGNAL_SETTLE;
        while Instant::now() < deadline {
            match spawn::process_state(pid) {
                Some(s) if !done(s) => std::thread::sleep(Duration::from_millis(1)),
                _ => break,
            }
        }
        true
    }

    /// Kills the server if it runs and starts it again on the **same port** in the **same
    /// directory** (so a durable server keeps its data), trying again while the port is
    /// briefly busy. On error the server is left stopped.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn restart(&self) -> Result<()> {
        self.kill();
        self.launch_retrying()
    }

    /// The captured stdout and stderr of the server (every start appends to it).
    pub fn output(&self) -> String {
        std::fs::read_to_string(self.dir.join(&self.spec.output)).unwrap_or_default()
    }

    /// The last lines of the captured output and of the other logs, with headings: what a
    /// failure message quotes.
    pub fn log_tail(&self) -> String {
        std::iter::once(&self.spec.output)
            .chain(&self.spec.logs)
            .map(|name| spawn::log_tail(&self.dir.join(name), LOG_TAIL_LINES))
            .collect()
    }

    /// `what on 127.0.0.1:PORT`.
    pub fn describe(&self) -> String {
        format!("{} on 127.0.0.1:{}", self.spec.what, self.port)
    }

    fn start_error(&self, detail: String) -> Error {
        Error::Start {
            what: self.describe(),
            detail,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `sig` to the server (its whole group if `group`) if it still runs (not yet
    /// reaped, so the pid cannot have been reused). Returns its pid (= the group id).
    fn signal(&self, sig: libc::c_int, group: bool) -> Option<libc::pid_t> {
        let mut guard = self.lock();
        let child = guard.as_mut()?;
        if !matches!(child.try_wait(), Ok(None)) {
            return None;
        }
        let pid = libc::pid_t::try_from(child.id()).ok()?;
        // SAFETY: plain syscalls; the pid is our unreaped child, the leader of its own group.
        unsafe {
            if group {
                libc::killpg(pid, sig);
            } else {
                libc::kill(pid, sig);
            }
        }
        Some(pid)
    }

    fn launch_retrying(&self) -> Result<()> {
        let mut last = None;
        for attempt in 0..self.spec.restart_attempts {
            if attempt > 0 {
                std::thread::sleep(self.spec.restart_backoff);
            }
            match self.launch() {
                Ok(child) => {
                    *self.lock() = Some(child);
                    return Ok(());
                }
                Err(Attempt::Retry(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| self.start_error("no start attempt was made".into())))
    }

    /// Spawns the server once on `self.port` and waits until the probe says it is ready.
    fn launch(&self) -> std::result::Result<Child, Attempt> {
        let fatal = |e: io::Error| Attempt::Fatal(Error::Io(e));
        let out = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(&self.spec.output))
            .map_err(fatal)?;
        let err = out.try_clone().map_err(fatal)?;
        let mut cmd = (self.spec.command)(&self.dir, self.port);
        cmd.current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let program = PathBuf::from(cmd.get_program());
        let mut child = match spawn::spawn(cmd) {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Attempt::Fatal(Error::BinaryMissing {
                    binary: program.display().to_string(),
                    package: self.spec.package.clone(),
                }))
            }
            Err(e) => return Err(fatal(e)),
        };
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    // Processes a half-started server forked, if any.
                    spawn::kill_group_and_reap(child);
                    return Err(Attempt::Retry(self.start_error(format!(
                        "process exited early ({status}){}",
                        self.log_tail()
                    ))));
                }
                Err(e) => {
                    spawn::kill_group_and_reap(child);
                    return Err(fatal(e));
                }
            }
            let check = ReadyCheck {
                dir: &self.dir,
                port: self.port,
                pid: child.id(),
            };
            match (self.spec.ready)(&check) {
                Ready::Yes => return Ok(child),
                Ready::NotYet => {}
                Ready::Foreign(what) => {
                    spawn::kill_group_and_reap(child);
                    return Err(Attempt::Retry(self.start_error(format!(
                        "another server answered on the port ({what}){}",
                        self.log_tail()
                    ))));
                }
            }
            if start.elapsed() >= self.spec.ready_timeout {
                spawn::kill_group_and_reap(child);
                return Err(Attempt::Fatal(self.start_error(format!(
                    "not ready after {:?}{}",
                    self.spec.ready_timeout,
                    self.log_tail()
                ))));
            }
            std::thread::sleep(self.spec.poll);
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits (at most [`SIGNAL_SETTLE`]) until the states of the live members of group `pgid`
/// satisfy `done`. Best effort: returns at once without `/proc`.
fn settle(pgid: libc::pid_t, done: impl Fn(&[char]) -> bool) {
    let deadline = Instant::now() + SIGNAL_SETTLE;
    loop {
        let states = group_states(pgid);
        if states.is_empty() || done(&states) || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> ServerSpec {
        ServerSpec::new("sh", "dash", |_, port| {
            let mut cmd = Command::new("sh");
            // A child of its own, to check that kill and pause reach the whole group.
            cmd.args(["-c", &format!("echo port {port}; sleep 60 & sleep 60")]);
            cmd
        })
    }

    #[test]
    fn pause_resume_restart_kill_reach_the_group() {
        let server =
            ServerProcess::start(sleeper(), tempfile::tempdir().expect("dir")).expect("start");
        let pid = server.pid().expect("pid");
        let pgid = libc::pid_t::try_from(pid).expect("pid");
        std::thread::sleep(Duration::from_millis(100));
        server.pause();
        assert!(server.is_paused() && server.is_running());
        let states = group_states(pgid);
        assert!(states.len() >= 2, "{states:?}");
        assert!(states.iter().all(|&s| s == 'T'), "{states:?}");
        server.resume();
        assert!(!server.is_paused());
        assert!(group_states(pgid).iter().all(|&s| s != 'T'));
        let port = server.port();
        server.restart().expect("restart");
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), Some(pid));
        assert!(
            group_states(pgid).is_empty(),
            "old group survived the restart"
        );
        assert!(server.output().contains(&format!("port {port}")));
        server.kill();
        assert!(!server.is_running() && server.pid().is_none());
    }

    #[test]
    fn early_exit_is_reported_with_the_log() {
        let spec = ServerSpec::new("sh", "dash", |_, _| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "echo boom >&2; exit 3"]);
            cmd
        })
        .ready(|_| Ready::NotYet)
        .attempts(2, 1, Duration::ZERO);
        let err =
            ServerProcess::start(spec, tempfile::tempdir().expect("dir")).expect_err("exits early");
        let text = err.to_string();
        assert!(
            text.contains("exited early") && text.contains("boom"),
            "{text}"
        );
    }

    #[test]
    fn missing_binary_names_the_package() {
        let spec = ServerSpec::new("x", "some-package", |_, _| {
            Command::new("dlock-no-such-xyz")
        });
        let err =
            ServerProcess::start(spec, tempfile::tempdir().expect("dir")).expect_err("missing");
        assert!(
            matches!(err, Error::BinaryMissing { ref package, .. } if package == "some-package")
        );
    }
}
