//! A real multi-member etcd cluster (child processes) for tests.
//!
//! Each member listens on its own free loopback client and peer port and keeps its data in its
//! own directory (on `/dev/shm` when there is one: etcd fsyncs its WAL on every write, and a
//! RAM-backed directory keeps a loaded CI machine from turning fsync stalls into leader
//! elections). Members can be killed (`SIGKILL`: a crash, no graceful leadership hand-over),
//! paused (`SIGSTOP`), resumed and restarted on the same ports with their data, so they rejoin.
//!
//! The testkit stays free of gRPC: [`EtcdCluster::leader`] and the readiness checks use etcd's
//! JSON gateway (`POST /v3/maintenance/status` on the client port) over a plain TCP socket.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::spawn::{kill_and_reap, log_tail, resolve_binary, wait_proc_state};
use crate::{spawn, try_free_port, Error, Result, TempDir};

/// Environment variable that overrides the `etcd` binary used by [`EtcdCluster::start`]:
/// a name looked up on `PATH` or a path. Unset or empty means `etcd`.
pub const ETCD_BINARY_ENV: &str = "DLOCK_ETCD";

const DEFAULT_BINARY: &str = "etcd";
const PACKAGE: &str = "etcd-server";
/// Attempts (with fresh ports each) made by `start*`.
const START_ATTEMPTS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(25);
const STATUS_TIMEOUT: Duration = Duration::from_millis(700);
const LOG_TAIL_LINES: usize = 20;

/// One member's status as reported by the member itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdStatus {
    /// The member's raft id.
    pub member_id: u64,
    /// The raft id of the leader this member knows (0: none).
    pub leader_id: u64,
    /// The member's current revision.
    pub revision: i64,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// A running etcd cluster of one or more members on `127.0.0.1`.
///
/// Everything is killed, and the data directories removed, on drop.
///
/// ```no_run
/// use distlock_testkit::EtcdCluster;
/// let mut cluster = EtcdCluster::start()?;
/// let url = cluster.url(); // etcd://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C
/// let leader = cluster.leader()?;
/// cluster.kill(leader); // a crash: a new leader is elected within about a second
/// cluster.restart(leader)?; // back, with its data
/// # let _ = url;
/// # Ok::<(), distlock_testkit::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    binary: PathBuf,
    token: String,
    members: Vec<Member>,
    extra_args: Vec<String>,
    // Dropped last (after the members are killed in `Drop`).
    _data: DataDir,
    _logs: TempDir,
}

impl EtcdCluster {
    /// Starts a 3-member cluster and waits until it has a leader and every member answers.
    ///
    /// The binary is `etcd` from `PATH`, or the value of [`ETCD_BINARY_ENV`] (`DLOCK_ETCD`).
    /// Returns [`Error::BinaryMissing`] (naming the Debian package `etcd-server`) without it.
    pub fn start() -> Result<Self> {
        Self::start_with_members(3)
    }

    /// Starts a cluster of `n` members (1 to 7).
    pub fn start_with_members(n: usize) -> Result<Self> {
        let binary = match std::env::var(ETCD_BINARY_ENV) {
            Ok(b) if !b.is_empty() => b,
            _ => DEFAULT_BINARY.to_string(),
        };
        Self::start_with(&binary, n, &[])
    }

    /// Starts a cluster of `n` members of the given binary, each with `extra_args` appended
    /// (e.g. `["--auth-token", "simple"]`).
    pub fn start_with(binary: &str, n: usize, extra_args: &[&str]) -> Result<Self> {
        if n == 0 || n > 7 {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an etcd test cluster has 1 to 7 members, not {n}"),
            )));
        }
        let binary = resolve_binary(binary, PACKAGE)?;
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&binary, n, &extra_args) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: "etcd cluster".into(),
            detail: "no start attempt was made".into(),
        }))
    }

    fn try_start(binary: &Path, n: usize, extra_args: &[String]) -> Result<Self> {
        let data = DataDir::new()?;
        let logs = TempDir::with_prefix("distlock-etcd-logs")?;
        let token = format!(
            "dlock-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut members = Vec::with_capacity(n);
        let mut ports = Vec::new();
        for i in 0..n {
            // Distinct ports: the kernel may hand out a just-closed port again.
            let mut pick = || -> Result<u16> {
                loop {
                    let p = try_free_port()?;
                    if !ports.contains(&p) {
                        ports.push(p);
                        return Ok(p);
                    }
                }
            };
            let (client_port, peer_port) = (pick()?, pick()?);
            let name = format!("m{i}");
            members.push(Member {
                data_dir: data.path().join(&name),
                log: logs.path().join(format!("{name}.log")),
                name,
                client_port,
                peer_port,
                child: None,
                paused: false,
            });
        }
        let mut cluster = EtcdCluster {
            binary: binary.to_path_buf(),
            token,
            members,
            extra_args: extra_args.to_vec(),
            _data: data,
            _logs: logs,
        };
        for i in 0..n {
            cluster.spawn_member(i)?;
        }
        cluster.wait_ready(READY_TIMEOUT)?;
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn_member(&mut self, i: usize) -> Result<()> {
        let initial = self.initial_cluster();
        let fsync_flag = supports_no_fsync(&self.binary);
        let m = &mut self.members[i];
        let log = File::options().create(true).append(true).open(&m.log)?;
        let log2 = log.try_clone()?;
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "error"]);
        if fsync_flag {
            cmd.arg("--unsafe-no-fsync");
        }
        cmd.args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = match spawn::spawn(cmd) {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::BinaryMissing {
                    binary: self.binary.display().to_string(),
                    package: PACKAGE.to_string(),
                })
            }
            Err(e) => return Err(Error::Io(e)),
        };
        m.child = Some(child);
        m.paused = false;
        Ok(())
    }

    /// Waits until every running, unpaused member answers and knows the same leader.
    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            for (i, m) in self.members.iter_mut().enumerate() {
                if let Some(child) = m.child.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        m.child = None;
                        return Err(Error::Start {
                            what: describe(&self.members[i]),
                            detail: format!(
                                "process exited early ({status}){}",
                                log_tail(&self.members[i].log, LOG_TAIL_LINES)
                            ),
                        });
                    }
                }
            }
            if self.agreed_leader().is_some() {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                let logs: String = self
                    .members
                    .iter()
                    .map(|m| log_tail(&m.log, LOG_TAIL_LINES))
                    .collect();
                return Err(Error::Start {
                    what: "etcd cluster".into(),
                    detail: format!("no leader agreed on by all members after {timeout:?}{logs}"),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// The leader's index if every running, unpaused member answers and names it.
    fn agreed_leader(&self) -> Option<usize> {
        let mut leader_id = None;
        let mut ids = Vec::new();
        for m in self.members.iter() {
            if m.child.is_none() || m.paused {
                continue;
            }
            let st = status(m.client_port).ok()?;
            if st.leader_id == 0 || leader_id.is_some_and(|l| l != st.leader_id) {
                return None;
            }
            leader_id = Some(st.leader_id);
            ids.push(st.member_id);
        }
        let leader_id = leader_id?;
        // The leader must be one of the members we could ask.
        let idx = self
            .live_indices()
            .zip(ids)
            .find(|(_, id)| *id == leader_id)?;
        Some(idx.0)
    }

    fn live_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.child.is_some() && !m.paused)
            .map(|(i, _)| i)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `etcd://127.0.0.1:A,127.0.0.1:B,…` with the client ports of all members.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// `etcd://127.0.0.1:PORT` of member `i` only.
    pub fn member_url(&self, i: usize) -> String {
        format!("etcd://127.0.0.1:{}", self.members[i].client_port)
    }

    /// `http://127.0.0.1:PORT` of every member (what etcd clients call endpoints).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The client address of member `i` (stable across restarts), e.g. to put a
    /// [`DelayProxy`](crate::DelayProxy) in front of it.
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.members[i].client_port))
    }

    /// The OS pid of member `i`, or `None` after [`kill`](Self::kill).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Whether member `i` is running (a paused member counts as running).
    pub fn is_running(&mut self, i: usize) -> bool {
        match self.members[i].child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Member `i`'s status, asked of member `i` itself (fails on a killed or paused member).
    pub fn status(&self, i: usize) -> Result<EtcdStatus> {
        status(self.members[i].client_port)
    }

    /// The index of the current leader, as agreed by all running, unpaused members.
    /// Fails if they do not agree right now (e.g. during an election): see
    /// [`wait_leader`](Self::wait_leader).
    pub fn leader(&self) -> Result<usize> {
        self.agreed_leader().ok_or_else(|| {
            Error::Io(io::Error::other(
                "the running etcd members do not agree on a leader right now",
            ))
        })
    }

    /// Waits up to `timeout` for all running, unpaused members to agree on a leader; returns
    /// its index.
    pub fn wait_leader(&self, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.agreed_leader() {
                return Ok(i);
            }
            if start.elapsed() >= timeout {
                return Err(Error::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no etcd leader agreed on within {timeout:?}"),
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Kills member `i` with `SIGKILL` (a crash) and reaps it; its data stays for
    /// [`restart`](Self::restart). Idempotent.
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = self.members[i].child.take() {
            kill_and_reap(child);
        }
        self.members[i].paused = false;
    }

    /// Freezes member `i` with `SIGSTOP`: its sockets stay open but nothing answers.
    pub fn pause(&mut self, i: usize) {
        if let Some(pid) = self.signal(i, libc::SIGSTOP) {
            wait_proc_state(pid, Duration::from_millis(200), |s| s == 'T');
            self.members[i].paused = true;
        }
    }

    /// Resumes a [paused](Self::pause) member with `SIGCONT`.
    pub fn resume(&mut self, i: usize) {
        if let Some(pid) = self.signal(i, libc::SIGCONT) {
            wait_proc_state(pid, Duration::from_millis(200), |s| s != 'T');
        }
        self.members[i].paused = false;
    }

    /// Kills member `i` if it runs and starts it again on the same ports with its data, then
    /// waits until the running members agree on a leader again.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        let start = Instant::now();
        loop {
            // The peer port may linger briefly; etcd exits early if it cannot bind.
            self.spawn_member(i)?;
            match self.wait_ready(READY_TIMEOUT) {
                Ok(()) => return Ok(()),
                Err(e) if start.elapsed() < READY_TIMEOUT => {
                    self.kill(i);
                    std::thread::sleep(Duration::from_millis(100));
                    let _ = e;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Member `i`'s log (stderr, error level).
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.members[i].log).unwrap_or_default()
    }

    fn signal(&mut self, i: usize, sig: libc::c_int) -> Option<u32> {
        let child = self.members[i].child.as_mut()?;
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

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn describe(m: &Member) -> String {
    format!(
        "etcd member {} (client 127.0.0.1:{}, peer 127.0.0.1:{})",
        m.name, m.client_port, m.peer_port
    )
}

/// Asks the member on `port` for its status through the JSON gateway.
fn status(port: u16) -> Result<EtcdStatus> {
    let body = http_post(port, "/v3/maintenance/status", "{}")?;
    let bad = || {
        Error::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected status reply from etcd on port {port}: {body}"),
        ))
    };
    let member_id = json_u64(&body, "member_id").ok_or_else(bad)?;
    let leader_id = json_u64(&body, "leader").unwrap_or(0);
    let revision = json_u64(&body, "revision").unwrap_or(0) as i64;
    Ok(EtcdStatus {
        member_id,
        leader_id,
        revision,
    })
}

/// A minimal HTTP/1.1 POST with `Connection: close`; returns the body.
fn http_post(port: u16, path: &str, body: &str) -> Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, STATUS_TIMEOUT)?;
    s.set_read_timeout(Some(STATUS_TIMEOUT))?;
    s.set_write_timeout(Some(STATUS_TIMEOUT))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(Error::Io(io::Error::other(format!(
            "etcd on port {port} answered {}",
            head.lines().next().unwrap_or("nothing")
        ))));
    }
    Ok(rest.to_string())
}

/// The number in `"field":"123"` or `"field":123` (gRPC-gateway renders 64-bit ints as strings).
fn json_u64(body: &str, field: &str) -> Option<u64> {
    let pat = format!("\"{field}\":");
    let at = body.find(&pat)? + pat.len();
    let digits: String = body[at..]
        .trim_start()
        .trim_start_matches('"')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Whether this etcd binary knows `--unsafe-no-fsync` (etcd 3.5 and later).
fn supports_no_fsync(binary: &Path) -> bool {
    static CACHE: OnceLock<std::sync::Mutex<Vec<(PathBuf, bool)>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, known)) = cache.iter().find(|(b, _)| b == binary) {
        return *known;
    }
    let known = Command::new(binary)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).contains("unsafe-no-fsync")
                || String::from_utf8_lossy(&o.stderr).contains("unsafe-no-fsync")
        })
        .unwrap_or(false);
    cache.push((binary.to_path_buf(), known));
    known
}

/// The data directory of a cluster: under `/dev/shm` when it is a writable directory (no
/// fsync cost), else under the system temp dir. Removed on drop. Directories left behind by
/// test processes that died without unwinding are swept at the next start.
#[derive(Debug)]
struct DataDir {
    path: PathBuf,
}

const SHM: &str = "/dev/shm";
const DATA_PREFIX: &str = "distlock-etcd-data";

impl DataDir {
    fn new() -> Result<Self> {
        let shm = Path::new(SHM);
        let base =
            if shm.is_dir() && std::fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly()) {
                sweep_stale(shm);
                shm.to_path_buf()
            } else {
                std::env::temp_dir()
            };
        for _ in 0..100 {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let path = base.join(format!(
                "{DATA_PREFIX}-{}-{}-{nanos}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(DataDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) if base == shm => {
                    // /dev/shm not usable after all: fall back to the temp dir.
                    let _ = e;
                    let t = TempDir::with_prefix(DATA_PREFIX)?;
                    let path = t.path().to_path_buf();
                    std::mem::forget(t);
                    return Ok(DataDir { path });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Io(io::Error::other("could not create a data dir")))
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes `distlock-etcd-data-PID-*` directories whose process is gone.
fn sweep_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&format!("{DATA_PREFIX}-")))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_numbers() {
        let body = r#"{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"5"},"leader":"10276657743932975437"}"#;
        assert_eq!(json_u64(body, "member_id"), Some(10276657743932975437));
        assert_eq!(json_u64(body, "leader"), Some(10276657743932975437));
        assert_eq!(json_u64(body, "revision"), Some(5));
        assert_eq!(json_u64(body, "nope"), None);
        assert_eq!(json_u64(r#"{"n": 7}"#, "n"), Some(7));
    }

    #[test]
    fn missing_binary_names_the_package() {
        let err = resolve_binary("dlock-no-such-etcd-xyz", PACKAGE).expect_err("missing");
        assert!(err.to_string().contains("etcd-server"), "{err}");
    }
}
