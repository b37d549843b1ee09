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
//!
//! [`EtcdCluster::start_tls`] starts members that serve clients over **https** only, with a
//! server certificate from a throwaway CA ([`TestCerts`]) and, if asked, `--client-cert-auth`;
//! each member then also listens on a second, plain-http loopback port that only the testkit's
//! status checks use (never handed out by [`EtcdCluster::url`]).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::process::{ServerProcess, ServerSpec};
use crate::spawn::resolve_binary;
use crate::{try_free_port, Error, Result, TempDir, TestCerts};

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
    client_port: u16,
    /// Where the testkit asks for the member's status: the client port, or with TLS a
    /// plain-http listener of its own.
    status_port: u16,
    process: ServerProcess,
}

/// The TLS files of a cluster started by [`EtcdCluster::start_tls`].
#[derive(Debug)]
struct Tls {
    certs: TestCerts,
    /// The client certificate and key the URL hands out (`--client-cert-auth` clusters only).
    client: Option<(PathBuf, PathBuf)>,
}

/// What every member's command line needs.
#[derive(Debug)]
struct Launch {
    binary: PathBuf,
    token: String,
    initial_cluster: String,
    extra_args: Vec<String>,
    no_fsync: bool,
    /// `--cert-file`, `--key-file`, `--trusted-ca-file` and whether `--client-cert-auth`.
    tls: Option<(PathBuf, PathBuf, PathBuf, bool)>,
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
    members: Vec<Member>,
    // Dropped after the members are killed.
    tls: Option<Tls>,
    // Dropped last (after the members are killed).
    _data: TempDir,
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
        Self::start_with(&Self::default_binary(), n, &[])
    }

    fn default_binary() -> String {
        match std::env::var(ETCD_BINARY_ENV) {
            Ok(b) if !b.is_empty() => b,
            _ => DEFAULT_BINARY.to_string(),
        }
    }

    /// Starts a cluster of `n` members that serve clients over https only, with a server
    /// certificate (for `127.0.0.1` and `localhost`) signed by a fresh throwaway CA
    /// ([`certs`](Self::certs)). With `client_cert_auth`, members run with
    /// `--client-cert-auth --trusted-ca-file CA`: a client must show a certificate signed by
    /// that CA; the testkit signs one (`dlock-client`) and [`url`](Self::url) names it.
    ///
    /// [`url`](Self::url) is then `etcds://127.0.0.1:A,…?cacert=CA[&cert=C&key=K]`. Peers talk
    /// plain http on loopback.
    pub fn start_tls(n: usize, client_cert_auth: bool) -> Result<Self> {
        Self::start_tls_with(&Self::default_binary(), n, client_cert_auth, &[])
    }

    /// [`start_tls`](Self::start_tls) with a given binary and extra arguments.
    pub fn start_tls_with(
        binary: &str,
        n: usize,
        client_cert_auth: bool,
        extra_args: &[&str],
    ) -> Result<Self> {
        let certs = TestCerts::generate()?;
        let client = if client_cert_auth {
            Some(certs.client("dlock-client")?)
        } else {
            None
        };
        Self::start_inner(binary, n, extra_args, Some(Tls { certs, client }))
    }

    /// Starts a cluster of `n` members of the given binary, each with `extra_args` appended
    /// (e.g. `["--auth-token", "simple"]`).
    pub fn start_with(binary: &str, n: usize, extra_args: &[&str]) -> Result<Self> {
        Self::start_inner(binary, n, extra_args, None)
    }

    fn start_inner(binary: &str, n: usize, extra_args: &[&str], tls: Option<Tls>) -> Result<Self> {
        if n == 0 || n > 7 {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an etcd test cluster has 1 to 7 members, not {n}"),
            )));
        }
        let binary = resolve_binary(binary, PACKAGE)?;
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut last = None;
        let mut tls = tls;
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&binary, n, &extra_args, &mut tls) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: "etcd cluster".into(),
            detail: "no start attempt was made".into(),
        }))
    }

    fn try_start(
        binary: &Path,
        n: usize,
        extra_args: &[String],
        tls: &mut Option<Tls>,
    ) -> Result<Self> {
        let data = data_dir()?;
        let mut ports: Vec<u16> = Vec::new();
        // Client and peer port per member, and with TLS a plain status port.
        let per = if tls.is_some() { 3 } else { 2 };
        while ports.len() < per * n {
            // Distinct ports: the kernel may hand out a just-closed port again.
            let p = try_free_port()?;
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let launch = Arc::new(Launch {
            binary: binary.to_path_buf(),
            token: format!(
                "dlock-test-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ),
            initial_cluster: (0..n)
                .map(|i| format!("m{i}=http://127.0.0.1:{}", ports[per * i + 1]))
                .collect::<Vec<_>>()
                .join(","),
            extra_args: extra_args.to_vec(),
            no_fsync: supports_no_fsync(binary),
            tls: tls.as_ref().map(|t| {
                (
                    t.certs.cert(),
                    t.certs.key(),
                    t.certs.ca(),
                    t.client.is_some(),
                )
            }),
        });
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let dir = data.path().join(format!("m{i}"));
            std::fs::create_dir_all(&dir)?;
            let (client_port, peer_port) = (ports[per * i], ports[per * i + 1]);
            let status_port = if per == 3 {
                ports[per * i + 2]
            } else {
                client_port
            };
            let spec = member_spec(&launch, i, peer_port, status_port);
            members.push(Member {
                client_port,
                status_port,
                process: ServerProcess::start_at(spec, &dir, client_port)?,
            });
        }
        let cluster = EtcdCluster {
            members,
            tls: tls.take(),
            _data: data,
        };
        if let Err(e) = cluster.wait_ready(READY_TIMEOUT) {
            // Keep the certificates for the next attempt.
            let mut cluster = cluster;
            *tls = cluster.tls.take();
            return Err(e);
        }
        Ok(cluster)
    }

    /// Waits until every running, unpaused member answers and knows the same leader.
    fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            for m in &self.members {
                if m.process.pid().is_some() && !m.process.is_running() {
                    let detail = format!("process exited early{}", m.process.log_tail());
                    m.process.kill();
                    return Err(Error::Start {
                        what: m.process.describe(),
                        detail,
                    });
                }
            }
            if self.agreed_leader().is_some() {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                let logs: String = self.members.iter().map(|m| m.process.log_tail()).collect();
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
            if !m.live() {
                continue;
            }
            let st = status(m.status_port).ok()?;
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
            .filter(|(_, m)| m.live())
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

    /// `etcd://127.0.0.1:A,127.0.0.1:B,…` with the client ports of all members; for a
    /// [TLS](Self::start_tls) cluster `etcds://…?cacert=CA`, and `&cert=C&key=K` (the
    /// testkit's client certificate) with `--client-cert-auth`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        self.url_for(&hosts.join(","))
    }

    /// [`url`](Self::url) of member `i` only.
    pub fn member_url(&self, i: usize) -> String {
        self.url_for(&format!("127.0.0.1:{}", self.members[i].client_port))
    }

    fn url_for(&self, hosts: &str) -> String {
        match &self.tls {
            None => format!("etcd://{hosts}"),
            Some(t) => {
                let mut url = format!("etcds://{hosts}?cacert={}", t.certs.ca().display());
                if let Some((cert, key)) = &t.client {
                    url.push_str(&format!("&cert={}&key={}", cert.display(), key.display()));
                }
                url
            }
        }
    }

    /// `http://127.0.0.1:PORT` (`https://` for a [TLS](Self::start_tls) cluster) of every
    /// member (what etcd clients call endpoints).
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The certificates of a [TLS](Self::start_tls) cluster (CA, server certificate; sign
    /// more client certificates with [`TestCerts::client`]); `None` for a plain one.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.tls.as_ref().map(|t| &t.certs)
    }

    /// The client certificate and key [`url`](Self::url) names (`--client-cert-auth` TLS
    /// clusters only).
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        self.tls
            .as_ref()
            .and_then(|t| t.client.as_ref())
            .map(|(c, k)| (c.as_path(), k.as_path()))
    }

    /// The client address of member `i` (stable across restarts), e.g. to put a
    /// [`DelayProxy`](crate::DelayProxy) in front of it.
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.members[i].client_port))
    }

    /// The OS pid of member `i`, or `None` after [`kill`](Self::kill).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.pid()
    }

    /// Whether member `i` is running (a paused member counts as running).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.members[i].process.is_running()
    }

    /// Member `i`'s status, asked of member `i` itself (fails on a killed or paused member).
    pub fn status(&self, i: usize) -> Result<EtcdStatus> {
        status(self.members[i].status_port)
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
        self.members[i].process.kill();
    }

    /// Freezes member `i` with `SIGSTOP` (returning once it is stopped): its sockets stay
    /// open but nothing answers.
    pub fn pause(&mut self, i: usize) {
        self.members[i].process.pause();
    }

    /// Resumes a [paused](Self::pause) member with `SIGCONT`.
    pub fn resume(&mut self, i: usize) {
        self.members[i].process.resume();
    }

    /// Kills member `i` if it runs and starts it again on the same ports with its data, then
    /// waits until the running members agree on a leader again.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let start = Instant::now();
        loop {
            // The peer port may linger briefly; etcd exits early if it cannot bind.
            self.members[i].process.restart()?;
            match self.wait_ready(READY_TIMEOUT) {
                Ok(()) => return Ok(()),
                Err(_) if start.elapsed() < READY_TIMEOUT => {
                    self.kill(i);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Member `i`'s log (stderr, error level).
    pub fn log(&self, i: usize) -> String {
        self.members[i].process.output()
    }
}

impl Member {
    /// Running and not paused: a member that should answer.
    fn live(&self) -> bool {
        self.process.pid().is_some() && !self.process.is_paused()
    }
}

/// Member `i` of the cluster `launch` describes, with its data in `DIR/data`.
fn member_spec(launch: &Arc<Launch>, i: usize, peer_port: u16, status_port: u16) -> ServerSpec {
    let l = launch.clone();
    let name = format!("m{i}");
    ServerSpec::new(
        format!("etcd member {name} (peer 127.0.0.1:{peer_port})"),
        PACKAGE,
        move |dir, port| {
            let peer = format!("http://127.0.0.1:{peer_port}");
            let (client, listen) = match &l.tls {
                None => {
                    let c = format!("http://127.0.0.1:{port}");
                    (c.clone(), c)
                }
                Some(_) => {
                    let c = format!("https://127.0.0.1:{port}");
                    let listen = format!("{c},http://127.0.0.1:{status_port}");
                    (c, listen)
                }
            };
            let mut cmd = Command::new(&l.binary);
            cmd.arg("--name")
                .arg(&name)
                .arg("--data-dir")
                .arg(dir.join("data"))
                .args(["--listen-client-urls", &listen])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &l.initial_cluster])
                .args(["--initial-cluster-token", &l.token])
                .args(["--initial-cluster-state", "new"])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .args(["--log-level", "error"]);
            if l.no_fsync {
                cmd.arg("--unsafe-no-fsync");
            }
            if let Some((cert, key, ca, client_cert_auth)) = &l.tls {
                cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
                // etcd checks client certificates whenever it has a trusted CA file.
                if *client_cert_auth {
                    cmd.arg("--trusted-ca-file")
                        .arg(ca)
                        .arg("--client-cert-auth");
                }
            }
            cmd.args(&l.extra_args);
            cmd
        },
    )
    .output("etcd.log")
    // Readiness is the cluster's (a leader all members agree on): see `wait_ready`.
    .attempts(1, 5, Duration::from_millis(100))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

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

const SHM: &str = "/dev/shm";
const DATA_PREFIX: &str = "distlock-etcd-data";

/// The data directory of a cluster: under `/dev/shm` when it is a writable directory (no
/// fsync cost), else under the system temp dir. Directories left behind by test processes
/// that died without unwinding are swept at the next start.
fn data_dir() -> Result<TempDir> {
    let shm = Path::new(SHM);
    let prefix = format!("{DATA_PREFIX}-{}-", std::process::id());
    if shm.is_dir() && std::fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly()) {
        sweep_stale(shm);
        if let Ok(d) = tempfile::Builder::new().prefix(&prefix).tempdir_in(shm) {
            return Ok(d);
        }
    }
    Ok(tempfile::Builder::new().prefix(&prefix).tempdir()?)
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
