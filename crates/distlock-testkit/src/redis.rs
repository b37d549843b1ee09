//! A real `redis-server` child process for tests.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply};
use crate::spawn::{kill_and_reap, resolve_binary, wait_proc_state};
use crate::{spawn, try_free_port, Error, Result, TempDir};

/// Environment variable that overrides the `redis-server` binary used by
/// [`RedisServer::start`] and [`RedisServer::start_with`]: either a name
/// looked up on `PATH` or a path. Unset or empty means `redis-server`.
pub const REDIS_SERVER_ENV: &str = "DLOCK_REDIS_SERVER";

const DEFAULT_BINARY: &str = "redis-server";
const PACKAGE: &str = "redis-server";
/// Attempts (with a fresh port each) made by `start*`.
const START_ATTEMPTS: usize = 5;
/// Attempts (on the same port) made by `restart`.
const RESTART_ATTEMPTS: usize = 10;
const RESTART_BACKOFF: Duration = Duration::from_millis(50);
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const READY_POLL: Duration = Duration::from_millis(10);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
const LOG_TAIL_LINES: usize = 20;

/// Options for [`RedisServer::start_with`].
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// Password of the `default` user (`--requirepass`). `None`: no password.
    pub password: Option<String>,
    /// An extra ACL user `(name, password)` with all permissions
    /// (`--user NAME on >PASS ~* &* +@all`).
    pub acl_user: Option<(String, String)>,
    /// Further `redis-server` arguments, appended last
    /// (e.g. `["--enable-debug-command", "yes"]`).
    pub extra_args: Vec<String>,
}

/// A `redis-server` running on a free `127.0.0.1` port in its own temp dir,
/// without persistence (`--save "" --appendonly no`).
///
/// Killed (even when paused), reaped, and its temp dir removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    opts: RedisOptions,
    port: u16,
    child: Mutex<Option<Child>>,
    dir: TempDir,
    /// Certificates and TLS port, for servers made by [`RedisServer::start_tls`].
    tls: Option<(crate::TestCerts, u16)>,
}

/// Why one launch attempt failed.
enum Attempt {
    /// Worth retrying (process exited early, port taken by someone else).
    Retry(Error),
    /// Not worth retrying.
    Fatal(Error),
}

impl RedisServer {
    /// Starts `redis-server` with default options on a free port.
    ///
    /// The binary is `redis-server` from `PATH`, or the value of
    /// [`REDIS_SERVER_ENV`] (`DLOCK_REDIS_SERVER`) if set.
    pub fn start() -> Result<Self> {
        Self::start_with(RedisOptions::default())
    }

    /// Starts `redis-server` with `opts` on a free port (binary as in
    /// [`start`](Self::start)).
    pub fn start_with(opts: RedisOptions) -> Result<Self> {
        let binary = match std::env::var(REDIS_SERVER_ENV) {
            Ok(b) if !b.is_empty() => b,
            _ => DEFAULT_BINARY.to_string(),
        };
        Self::start_with_binary(&binary, opts)
    }

    /// Starts the given `redis-server` binary (a name looked up on `PATH`,
    /// or a path containing `/`) with `opts` on a free port.
    ///
    /// Returns [`Error::BinaryMissing`] if the binary does not exist. If the
    /// server exits early (e.g. the port was taken in a race) it is retried
    /// on a new port, up to 5 times; the final failure is an
    /// [`Error::Start`] carrying the tail of the server's log.
    pub fn start_with_binary(binary: &str, opts: RedisOptions) -> Result<Self> {
        let binary = resolve_binary(binary, PACKAGE)?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = try_free_port()?;
            match launch(&binary, &opts, port) {
                Ok((child, dir)) => {
                    return Ok(RedisServer {
                        binary,
                        opts,
                        port,
                        child: Mutex::new(Some(child)),
                        dir,
                        tls: None,
                    })
                }
                Err(Attempt::Retry(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: "redis-server".into(),
            detail: "no start attempt was made".into(),
        }))
    }

    /// Starts a replica of `master` (`--replicaof`, default options otherwise) and waits until
    /// the two are linked: the master counts one more connected replica and the replica's link
    /// is up. For tests of `?wait_replicas` and of `dlock doctor`'s replication checks.
    pub fn start_replica_of(master: &RedisServer) -> Result<Self> {
        let before = connected_replicas(master)?;
        let replica = Self::start_with(RedisOptions {
            extra_args: vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                master.port().to_string(),
            ],
            ..Default::default()
        })?;
        let t = Instant::now();
        loop {
            let linked = replica
                .command(&["INFO", "replication"])?
                .contains("master_link_status:up");
            if linked && connected_replicas(master)? > before {
                return Ok(replica);
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err(Error::Start {
                    what: describe(replica.port),
                    detail: format!(
                        "replica of port {} not linked after {:?}",
                        master.port(),
                        t.elapsed()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts a server that also serves TLS on a second free port, with a fresh test CA.
    /// [`tls_url`](Self::tls_url) is the `rediss://` URL (with `ca_file=` pointing at the CA);
    /// the plain port stays open for [`command`](Self::command).
    pub fn start_tls() -> Result<Self> {
        let certs = crate::TestCerts::generate()?;
        let tls_port = try_free_port()?;
        let mut opts = RedisOptions::default();
        opts.extra_args.extend([
            "--tls-port".to_string(),
            tls_port.to_string(),
            "--tls-cert-file".to_string(),
            certs.cert().display().to_string(),
            "--tls-key-file".to_string(),
            certs.key().display().to_string(),
            "--tls-ca-cert-file".to_string(),
            certs.ca().display().to_string(),
            "--tls-auth-clients".to_string(),
            "no".to_string(),
        ]);
        let mut server = Self::start_with(opts)?;
        server.tls = Some((certs, tls_port));
        Ok(server)
    }

    /// `rediss://127.0.0.1:TLS_PORT?ca_file=CA` for servers made by
    /// [`start_tls`](Self::start_tls); `None` otherwise.
    pub fn tls_url(&self) -> Option<String> {
        self.tls.as_ref().map(|(certs, port)| {
            format!("rediss://127.0.0.1:{port}?ca_file={}", certs.ca().display())
        })
    }

    /// The TCP port the server listens on (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A connection URL: `redis://127.0.0.1:PORT`, or
    /// `redis://:PASSWORD@127.0.0.1:PORT` when [`RedisOptions::password`] is
    /// set (the password is percent-encoded). The ACL user is not part of the
    /// URL (the `default` user stays usable alongside it).
    pub fn url(&self) -> String {
        match &self.opts.password {
            Some(pw) => format!("redis://:{}@127.0.0.1:{}", percent_encode(pw), self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The server's temp dir (data dir; contains `redis.log`, `stdout.log`,
    /// `stderr.log`). A [`restart`](Self::restart) switches to a new, empty dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The OS pid of the server process, or `None` after [`kill`](Self::kill).
    pub fn pid(&self) -> Option<u32> {
        self.lock_child().as_ref().map(Child::id)
    }

    /// Whether the server process exists and has not exited (a paused server
    /// counts as running).
    pub fn is_running(&self) -> bool {
        match self.lock_child().as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server with `SIGKILL` and reaps it. Idempotent; works on a
    /// paused server too.
    pub fn kill(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(child) = child {
            kill_and_reap(child);
        }
    }

    /// Freezes the server with `SIGSTOP`: connections are still accepted by
    /// the kernel but nothing is answered. No-op if not running.
    pub fn pause(&mut self) {
        if let Some(pid) = self.signal(libc::SIGSTOP) {
            wait_proc_state(pid, Duration::from_millis(200), |s| s == 'T');
        }
    }

    /// Resumes a [paused](Self::pause) server with `SIGCONT`. No-op if not running.
    pub fn resume(&mut self) {
        if let Some(pid) = self.signal(libc::SIGCONT) {
            wait_proc_state(pid, Duration::from_millis(200), |s| s != 'T');
        }
    }

    /// Kills the server if running and starts a fresh one on the **same
    /// port** with **empty data** (a new temp dir), simulating a restart
    /// without persistence. Retries a few times if the port is briefly busy.
    ///
    /// On error the server is left stopped.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let mut last = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(RESTART_BACKOFF);
            }
            match launch(&self.binary, &self.opts, self.port) {
                Ok((child, dir)) => {
                    *self.child.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(child);
                    self.dir = dir;
                    return Ok(());
                }
                Err(Attempt::Retry(e)) => last = Some(e),
                Err(Attempt::Fatal(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: describe(self.port),
            detail: "no restart attempt was made".into(),
        }))
    }

    /// The server's `run_id` (from `INFO server`); changes on every
    /// (re)start.
    pub fn run_id(&self) -> Result<String> {
        let info = self.command_reply(&["INFO", "server"])?;
        info_field(&info, "run_id").ok_or_else(|| {
            Error::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no run_id in INFO reply: {info}"),
            ))
        })
    }

    /// Sends one command over a fresh raw connection and returns the reply
    /// rendered as text (see [`Reply`]'s `Display`):
    /// simple strings as-is (`"OK"`, `"PONG"`), errors with a leading `-`
    /// (`"-NOAUTH Authentication required."`), integers in decimal, bulk
    /// strings as (lossy UTF-8) text, nil as `"(nil)"`, arrays as their
    /// elements joined by `\n`.
    ///
    /// Error *replies* are returned as `Ok("-...")`; `Err` means the server
    /// could not be reached, timed out (2 s), spoke garbage, or rejected the
    /// authentication. Authentication happens first when configured:
    /// `AUTH password` if [`RedisOptions::password`] is set, else
    /// `AUTH user password` if [`RedisOptions::acl_user`] is set.
    pub fn command(&self, args: &[&str]) -> Result<String> {
        Ok(self.command_reply(args)?.to_string())
    }

    /// Like [`command`](Self::command) but returns the structured [`Reply`].
    pub fn command_reply(&self, args: &[&str]) -> Result<Reply> {
        self.command_reply_timeout(args, COMMAND_TIMEOUT)
    }

    /// Like [`command_reply`](Self::command_reply) with an explicit timeout
    /// for connecting and for each read/write.
    pub fn command_reply_timeout(&self, args: &[&str], timeout: Duration) -> Result<Reply> {
        let mut conn = Conn::connect(self.addr(), timeout)?;
        authenticate(&mut conn, &self.opts)?;
        Ok(conn.call(args)?)
    }

    fn lock_child(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `sig` if the child is still running (not yet reaped, so the pid
    /// cannot have been reused). Returns the pid signalled.
    fn signal(&mut self, sig: libc::c_int) -> Option<u32> {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()?;
        if !matches!(child.try_wait(), Ok(None)) {
            return None;
        }
        let pid = child.id();
        let raw = libc::pid_t::try_from(pid).ok()?;
        // SAFETY: plain syscall; the pid belongs to our unreaped child.
        unsafe {
            libc::kill(raw, sig);
        }
        Some(pid)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        // `self.dir` (the TempDir) is removed when the fields drop.
    }
}

fn describe(port: u16) -> String {
    format!("redis-server on 127.0.0.1:{port}")
}

/// Spawns one server on `port` in a fresh temp dir and waits until it is
/// ready.
fn launch(
    binary: &Path,
    opts: &RedisOptions,
    port: u16,
) -> std::result::Result<(Child, TempDir), Attempt> {
    let dir = TempDir::with_prefix("distlock-redis").map_err(Attempt::Fatal)?;
    let d = dir.path();
    let io_fatal = |e: io::Error| Attempt::Fatal(Error::Io(e));
    let stdout = File::create(d.join("stdout.log")).map_err(io_fatal)?;
    let stderr = File::create(d.join("stderr.log")).map_err(io_fatal)?;

    let mut cmd = Command::new(binary);
    cmd.arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(d)
        .arg("--logfile")
        .arg(d.join("redis.log"))
        .args(["--daemonize", "no"]);
    if let Some(pw) = &opts.password {
        cmd.arg("--requirepass").arg(pw);
    }
    if let Some((user, pass)) = &opts.acl_user {
        cmd.arg("--user")
            .arg(user)
            .arg("on")
            .arg(format!(">{pass}"))
            .args(["~*", "&*", "+@all"]);
    }
    cmd.args(&opts.extra_args)
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);

    let mut child = match spawn::spawn(cmd) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Attempt::Fatal(Error::BinaryMissing {
                binary: binary.display().to_string(),
                package: PACKAGE.to_string(),
            }))
        }
        Err(e) => return Err(io_fatal(e)),
    };

    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                let detail = format!("process exited early ({status}){}", log_tail(d));
                return Err(Attempt::Retry(Error::Start {
                    what: describe(port),
                    detail,
                }));
            }
            Err(e) => {
                kill_and_reap(child);
                return Err(io_fatal(e));
            }
        }
        match probe(addr, opts, child.id()) {
            Probe::Ready => return Ok((child, dir)),
            Probe::NotReady => {}
            Probe::Foreign(what) => {
                kill_and_reap(child);
                return Err(Attempt::Retry(Error::Start {
                    what: describe(port),
                    detail: format!(
                        "another server answered on the port ({what}){}",
                        log_tail(d)
                    ),
                }));
            }
        }
        if start.elapsed() >= READY_TIMEOUT {
            kill_and_reap(child);
            return Err(Attempt::Fatal(Error::Start {
                what: describe(port),
                detail: format!("not ready after {READY_TIMEOUT:?}{}", log_tail(d)),
            }));
        }
        std::thread::sleep(READY_POLL);
    }
}

enum Probe {
    NotReady,
    Ready,
    /// Something that is not our child answered.
    Foreign(String),
}

/// PING until `+PONG` or `-NOAUTH`, then check via `INFO server` that the
/// answering process is our child (and not another server that owns the port).
fn probe(addr: SocketAddr, opts: &RedisOptions, pid: u32) -> Probe {
    let Ok(mut conn) = Conn::connect(addr, PROBE_TIMEOUT) else {
        return Probe::NotReady;
    };
    match conn.call(&["PING"]) {
        Ok(Reply::Simple(s)) if s == "PONG" => {}
        Ok(Reply::Error(e)) if e.starts_with("NOAUTH") => {}
        _ => return Probe::NotReady,
    }
    if authenticate(&mut conn, opts).is_err() {
        return Probe::Foreign("authentication failed".into());
    }
    match conn.call(&["INFO", "server"]) {
        Ok(info) => match info_field(&info, "process_id") {
            Some(p) if p == pid.to_string() => Probe::Ready,
            Some(p) => Probe::Foreign(format!("process_id {p}, expected {pid}")),
            None => Probe::NotReady,
        },
        Err(_) => Probe::NotReady,
    }
}

fn authenticate(conn: &mut Conn, opts: &RedisOptions) -> Result<()> {
    let reply = if let Some(pw) = &opts.password {
        conn.call(&["AUTH", pw.as_str()])?
    } else if let Some((user, pw)) = &opts.acl_user {
        conn.call(&["AUTH", user.as_str(), pw.as_str()])?
    } else {
        return Ok(());
    };
    match reply {
        Reply::Error(e) => Err(Error::Io(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("AUTH failed: {e}"),
        ))),
        _ => Ok(()),
    }
}

/// Extracts `field:value` from an `INFO` reply.
fn info_field(info: &Reply, field: &str) -> Option<String> {
    let Reply::Bulk(Some(bytes)) = info else {
        return None;
    };
    let text = String::from_utf8_lossy(bytes);
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then(|| v.trim().to_string())
    })
}

/// The last lines of the server log and stderr, formatted for an error.
fn log_tail(dir: &Path) -> String {
    let mut out = String::new();
    for name in ["redis.log", "stderr.log", "stdout.log"] {
        out.push_str(&spawn::log_tail(&dir.join(name), LOG_TAIL_LINES));
    }
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `connected_slaves` from the server's `INFO replication`.
fn connected_replicas(server: &RedisServer) -> Result<u32> {
    let info = server.command(&["INFO", "replication"])?;
    Ok(info
        .lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding() {
        assert_eq!(percent_encode("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(percent_encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
    }

    #[test]
    fn info_field_parsing() {
        let info = Reply::Bulk(Some(
            b"# Server\r\nrun_id:abc\r\nprocess_id:42\r\n".to_vec(),
        ));
        assert_eq!(info_field(&info, "run_id").as_deref(), Some("abc"));
        assert_eq!(info_field(&info, "process_id").as_deref(), Some("42"));
        assert_eq!(info_field(&info, "nope"), None);
    }

    #[test]
    fn missing_binary_is_reported() {
        let err =
            resolve_binary("dlock-no-such-binary-xyz", PACKAGE).expect_err("should be missing");
        assert!(matches!(err, Error::BinaryMissing { .. }));
    }
}
