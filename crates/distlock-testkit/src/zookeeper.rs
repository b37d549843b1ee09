//! A real ZooKeeper ensemble (three `QuorumPeerMain` JVMs by default) for tests.
//!
//! Every node runs `java … org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg` in the
//! foreground, as our child, with its own temp dir (`myid`, data, logs) and three free
//! loopback ports (client, quorum, election). The jars come from Debian's `zookeeper` package
//! (`/usr/share/java/zookeeper.jar`, whose manifest lists its dependencies); Debian's
//! `zkServer.sh` wrapper is not used, so nothing daemonizes and nothing touches
//! `/etc/zookeeper`, `/var/lib/zookeeper` or port 2181.
//!
//! Settings chosen for fast, quiet tests: `tickTime=200` (elections and session checks in
//! fractions of a second), `initLimit=25`/`syncLimit=10` (5 s / 2 s), `maxSessionTimeout=60000`
//! (clients may ask for long sessions), `admin.enableServer=false` (every node would otherwise
//! bind port 8080), `4lw.commands.whitelist=*` (for `srvr`, which tells the leader apart),
//! `forceSync=no` (no fsync: tests do not survive power loss anyway) and a small JVM
//! (`-Xmx128m`, serial GC, C1 only).
//!
//! ```no_run
//! use distlock_testkit::ZkEnsemble;
//! let mut zk = ZkEnsemble::start()?;
//! let url = zk.url(); // zk://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
//! let leader = zk.leader().expect("a leader");
//! zk.kill(leader); // SIGKILL: the other two elect a new leader
//! zk.wait_ready(std::time::Duration::from_secs(10))?;
//! zk.restart(leader)?; // same ports, same data: it rejoins as a follower
//! # let _ = url;
//! # Ok::<(), distlock_testkit::Error>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{ServerProcess, ServerSpec};
use crate::spawn::resolve_binary;
use crate::{Error, Result, TempDir, TestCerts};

/// Environment variable overriding the Java class path of the ZooKeeper server
/// (default: `/usr/share/java/zookeeper.jar`, plus `slf4j-simple.jar` for logs when present).
pub const ZOOKEEPER_CLASSPATH_ENV: &str = "DLOCK_ZOOKEEPER_CLASSPATH";

/// Environment variable overriding the `java` binary (a name on `PATH` or a path).
pub const ZOOKEEPER_JAVA_ENV: &str = "DLOCK_ZOOKEEPER_JAVA";

/// The jar Debian's `zookeeper` package installs (its manifest names every dependency).
pub const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

const PACKAGE: &str = "zookeeper";
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codec jar (Debian's `libnetty-java`), which TLS needs and the manifest omits.
const NETTY_CODEC: &str = "/usr/share/java/netty-codec.jar";
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// `tickTime` of the test ensemble, in milliseconds.
pub const ZOOKEEPER_TICK_MS: u64 = 200;
const START_ATTEMPTS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// One node of a [`ZkEnsemble`].
#[derive(Debug)]
struct Node {
    client_port: u16,
    /// The TLS client port (`secureClientPort`), on an ensemble started with TLS.
    secure_port: Option<u16>,
    process: ServerProcess,
}

impl Node {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port))
    }
}

/// A ZooKeeper ensemble of real server processes on free `127.0.0.1` ports.
///
/// Nodes are addressed by index `0..len()`. Every node is killed (even when paused) and the
/// temp dir removed when the ensemble is dropped.
#[derive(Debug)]
pub struct ZkEnsemble {
    nodes: Vec<Node>,
    tls: Option<Tls>,
    /// The digest superuser's password, on an ensemble started with one.
    superuser: Option<String>,
    // Dropped after the nodes are killed.
    dir: TempDir,
}

/// The TLS setup of an ensemble started by [`ZkEnsemble::start_tls`].
#[derive(Debug)]
struct Tls {
    certs: TestCerts,
    /// The client certificate and key the servers trust, when they require one.
    client: Option<(PathBuf, PathBuf)>,
}

impl ZkEnsemble {
    /// Starts a three-node ensemble and waits until it has a leader and every node serves.
    ///
    /// Returns [`Error::BinaryMissing`] naming the Debian package `zookeeper` if `java` or the
    /// ZooKeeper jar is missing.
    pub fn start() -> Result<Self> {
        Self::start_with(3)
    }

    /// Starts an ensemble of `nodes` servers (1 gives a standalone-like single-node quorum).
    pub fn start_with(nodes: usize) -> Result<Self> {
        Self::start_inner(nodes, None, None)
    }

    /// Starts an ensemble of `nodes` servers with a digest superuser `super` whose password is
    /// `password` (`-Dzookeeper.DigestAuthenticationProvider.superDigest=super:…`): a session
    /// authenticated as `digest super:password` passes every ACL. See
    /// [`superuser`](Self::superuser), [`protect`](Self::protect).
    pub fn start_with_superuser(nodes: usize, password: &str) -> Result<Self> {
        Self::start_inner(nodes, None, Some(password.to_owned()))
    }

    /// The superuser's `(user, password)`, on an ensemble started by
    /// [`start_with_superuser`](Self::start_with_superuser).
    pub fn superuser(&self) -> Option<(&str, &str)> {
        self.superuser.as_deref().map(|p| ("super", p))
    }

    /// ZooKeeper's digest id of `user` with `password`: `user:BASE64(SHA1("user:password"))`,
    /// as in a `digest:` ACL or the `superDigest` property.
    pub fn digest_id(user: &str, password: &str) -> String {
        use base64::Engine as _;
        use sha1::Digest as _;
        let hash = sha1::Sha1::digest(format!("{user}:{password}").as_bytes());
        format!(
            "{user}:{}",
            base64::engine::general_purpose::STANDARD.encode(hash)
        )
    }

    /// A session on node `i`, authenticated as `digest user:password` when given (e.g. to
    /// force a delete as another identity).
    pub async fn client(
        &self,
        i: usize,
        auth: Option<(&str, &str)>,
    ) -> Result<zookeeper_client::Client> {
        let mut connector = zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .with_fail_eagerly();
        if let Some((user, password)) = auth {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let addr = self.addr(i);
        tokio::time::timeout(READY_TIMEOUT, connector.connect(&addr.to_string()))
            .await
            .map_err(|_| zk_error(&addr.to_string(), "connecting timed out"))?
            .map_err(|e| zk_error(&addr.to_string(), e))
    }

    /// Creates `path` (and missing parents) so that only digest user `user` with `password`
    /// (and the superuser) may read, create in, change or delete it: its ACL (and its new
    /// parents') is `digest:user:…:cdrwa` alone. For tests of refused or missing
    /// credentials. A `path` that exists already is left as it is.
    pub async fn protect(&self, path: &str, user: &str, password: &str) -> Result<()> {
        let zk = self.client(0, Some((user, password))).await?;
        let id = Self::digest_id(user, password);
        let acl = [zookeeper_client::Acl::new(
            zookeeper_client::Permission::ALL,
            zookeeper_client::AuthId::new("digest", &id),
        )];
        let opts =
            zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::new(&acl));
        zk.mkdir(path, &opts).await.map_err(|e| zk_error(path, e))?;
        // Every node must see it before the test connects elsewhere.
        zk.sync(path).await.map_err(|e| zk_error(path, e))
    }

    /// Starts an ensemble of `nodes` servers that also serve TLS, on a `secureClientPort`
    /// next to the plain client port (which the testkit keeps for its `srvr` checks), with
    /// a throwaway CA ([`TestCerts`]): Netty's connection factory
    /// (`serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory`), PEM key and
    /// trust stores (`ssl.keyStore.type=PEM`: the server certificate and its PKCS#8 key in
    /// one file). With `client_auth` the servers require a client certificate signed by the
    /// CA (`ssl.clientAuth=need`; one is made, see [`client_cert`](Self::client_cert)),
    /// otherwise they ask for none (`ssl.clientAuth=none`).
    ///
    /// [`tls_url`](Self::tls_url) is the `zks://` URL with the CA (and the client
    /// certificate).
    pub fn start_tls(nodes: usize, client_auth: bool) -> Result<Self> {
        let certs = TestCerts::generate()?;
        let client = if client_auth {
            Some(certs.client("dlock-client")?)
        } else {
            None
        };
        let keystore = certs.dir().join("zk-keystore.pem");
        let mut pem = std::fs::read_to_string(certs.cert())?;
        pem.push_str(&std::fs::read_to_string(certs.key())?);
        std::fs::write(&keystore, pem)?;
        Self::start_inner(nodes, Some(Tls { certs, client }), None)
    }

    fn start_inner(nodes: usize, tls: Option<Tls>, superuser: Option<String>) -> Result<Self> {
        let nodes = nodes.max(1);
        let java = resolve_java()?;
        let mut classpath = classpath()?;
        if tls.is_some() && Path::new(NETTY_CODEC).is_file() {
            // Netty's SslHandler is a netty-codec class, which zookeeper.jar's manifest omits.
            classpath.push(':');
            classpath.push_str(NETTY_CODEC);
        }
        let mut tls = tls;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            // A port grabbed by someone else between probing and binding: new ports.
            match Self::try_start(&java, &classpath, nodes, &mut tls, superuser.as_deref()) {
                Ok(ensemble) => return Ok(ensemble),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Start {
            what: "ZooKeeper ensemble".into(),
            detail: "no start attempt was made".into(),
        }))
    }

    fn try_start(
        java: &Path,
        classpath: &str,
        n: usize,
        tls: &mut Option<Tls>,
        superuser: Option<&str>,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("dlock-zk").tempdir()?;
        let ports = free_ports(n * 4)?;
        let servers: String = (0..n)
            .map(|i| {
                let (quorum, election) = (ports[i * 3 + 1], ports[i * 3 + 2]);
                format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
            })
            .collect();
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let node_dir = dir.path().join(format!("node{}", i + 1));
            std::fs::create_dir_all(node_dir.join("data"))?;
            std::fs::write(node_dir.join("data").join("myid"), format!("{}\n", i + 1))?;
            let client_port = ports[i * 3];
            let secure_port = tls.as_ref().map(|_| ports[n * 3 + i]);
            let mut cfg = config(&node_dir, client_port, &servers);
            if let (Some(t), Some(port)) = (tls.as_ref(), secure_port) {
                cfg.push_str(&tls_config(t, port));
            }
            std::fs::write(node_dir.join("zoo.cfg"), cfg)?;
            let super_digest = superuser.map(|p| Self::digest_id("super", p));
            let spec = node_spec(java, classpath, i + 1, super_digest);
            nodes.push(Node {
                client_port,
                secure_port,
                process: ServerProcess::start_at(spec, &node_dir, client_port)?,
            });
        }
        let mut ensemble = ZkEnsemble {
            nodes,
            tls: tls.take(),
            superuser: superuser.map(str::to_owned),
            dir,
        };
        if let Err(e) = ensemble.wait_ready(READY_TIMEOUT) {
            // Keep the certificates for the next attempt.
            *tls = ensemble.tls.take();
            return Err(e);
        }
        Ok(ensemble)
    }

    /// A process-wide three-node ensemble, started on first use and shared by every test of
    /// the test binary (so tests must use unique lock names and must not kill its nodes).
    /// Its processes and temp dir are removed when the process exits.
    ///
    /// # Panics
    /// Panics with the start error (e.g. the missing Debian package) if it cannot start.
    pub fn shared() -> &'static ZkEnsemble {
        static SHARED: OnceLock<std::result::Result<ZkEnsemble, String>> = OnceLock::new();
        let res = SHARED.get_or_init(|| {
            let r = ZkEnsemble::start().map_err(|e| e.to_string());
            if r.is_ok() {
                extern "C" fn cleanup() {
                    if let Some(Ok(e)) = SHARED.get() {
                        e.shutdown();
                    }
                }
                // SAFETY: registers a plain `extern "C"` function; it only kills our children
                // and removes our temp dir, without unwinding.
                unsafe {
                    libc::atexit(cleanup);
                }
            }
            r
        });
        match res {
            Ok(e) => e,
            Err(e) => panic!("distlock-testkit: cannot start the shared ZooKeeper ensemble: {e}"),
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: an ensemble has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,…`: the client connect string of every node.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zk://` followed by [`connect_string`](Self::connect_string).
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// `zks://127.0.0.1:S1,…?cacert=CA` (plus `&cert=…&key=…` when the servers require a
    /// client certificate): the TLS ports of an ensemble started by
    /// [`start_tls`](Self::start_tls), or `None` for a plain one.
    pub fn tls_url(&self) -> Option<String> {
        let tls = self.tls.as_ref()?;
        let hosts = self
            .nodes
            .iter()
            .filter_map(|n| n.secure_port)
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut url = format!("zks://{hosts}?cacert={}", tls.certs.ca().display());
        if let Some((cert, key)) = &tls.client {
            url.push_str(&format!("&cert={}&key={}", cert.display(), key.display()));
        }
        Some(url)
    }

    /// The TLS port (`secureClientPort`) of node `i`, on an ensemble started with TLS.
    pub fn secure_port(&self, i: usize) -> Option<u16> {
        self.nodes.get(i)?.secure_port
    }

    /// The throwaway CA and server certificate of an ensemble started with TLS (its
    /// [`client`](TestCerts::client) signs more client certificates the servers trust).
    pub fn certs(&self) -> Option<&TestCerts> {
        self.tls.as_ref().map(|t| &t.certs)
    }

    /// The client certificate and key the servers trust, when they require one.
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        let (c, k) = self.tls.as_ref()?.client.as_ref()?;
        Some((c.as_path(), k.as_path()))
    }

    /// Client address of node `i` (stable across [`restart`](Self::restart)).
    ///
    /// # Panics
    /// Panics if `i >= len()`.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].addr()
    }

    /// The ensemble's temp dir (one `nodeN` dir per node, with `zoo.cfg`, `data/` and
    /// `server.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// OS pid of node `i`, or `None` once killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes.get(i)?.process.pid()
    }

    /// Whether node `i` runs (a paused node counts as running).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.process.is_running())
    }

    /// Sends a four-letter-word command (`srvr`, `ruok`, `mntr`, …) to node `i` and returns
    /// the reply.
    pub fn four_letter(&self, i: usize, cmd: &str) -> Result<String> {
        let node = self.nodes.get(i).ok_or_else(|| no_such_node(i))?;
        four_letter(node.addr(), cmd)
    }

    /// Node `i`'s role from `srvr`: `leader`, `follower` or `standalone`, or `None` when it is
    /// down, paused, or not serving (looking for a leader).
    pub fn mode(&self, i: usize) -> Option<String> {
        let reply = self.four_letter(i, "srvr").ok()?;
        reply
            .lines()
            .find_map(|l| l.strip_prefix("Mode:"))
            .map(|m| m.trim().to_owned())
    }

    /// Index of the current leader, if one node says so.
    pub fn leader(&self) -> Option<usize> {
        (0..self.len()).find(|&i| matches!(self.mode(i).as_deref(), Some("leader" | "standalone")))
    }

    /// Waits until there is a leader and every running, unpaused node serves clients.
    pub fn wait_ready(&self, timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut leader = None;
            let mut all = true;
            for (i, node) in self.nodes.iter().enumerate() {
                if !self.is_running(i) || node.process.is_paused() {
                    continue;
                }
                match self.mode(i).as_deref() {
                    Some("leader" | "standalone") => leader = Some(i),
                    Some(_) => {}
                    None => all = false,
                }
            }
            if let (Some(l), true) = (leader, all) {
                return Ok(l);
            }
            for (i, node) in self.nodes.iter().enumerate() {
                if node.process.pid().is_some() && !node.process.is_running() {
                    let detail = format!("node {i} exited{}", node.process.log_tail());
                    node.process.kill();
                    return Err(Error::Start {
                        what: node.process.describe(),
                        detail,
                    });
                }
            }
            if Instant::now() >= deadline {
                let mut detail = format!("no serving quorum after {timeout:?}");
                for node in &self.nodes {
                    detail.push_str(&node.process.log_tail());
                }
                return Err(Error::Start {
                    what: "ZooKeeper ensemble".into(),
                    detail,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Kills node `i` with `SIGKILL` and reaps it. Idempotent; works on a paused node.
    pub fn kill(&mut self, i: usize) {
        if let Some(node) = self.nodes.get(i) {
            node.process.kill();
        }
    }

    /// Freezes node `i` with `SIGSTOP` (its sockets stay open, nothing is answered),
    /// returning once it is stopped.
    pub fn pause(&mut self, i: usize) {
        if let Some(node) = self.nodes.get(i) {
            node.process.pause();
        }
    }

    /// Resumes a [paused](Self::pause) node with `SIGCONT`.
    pub fn resume(&mut self, i: usize) {
        if let Some(node) = self.nodes.get(i) {
            node.process.resume();
        }
    }

    /// Kills node `i` if it runs and starts it again on the same ports with the **same data**
    /// (a crash and restart of one server), then waits until the ensemble serves again.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let node = self.nodes.get(i).ok_or_else(|| no_such_node(i))?;
        // A port may linger briefly in the kernel: a node that exits at once is started again.
        let mut last = None;
        for attempt in 0..5 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            node.process.restart()?;
            match self.wait_ready(READY_TIMEOUT) {
                Ok(_) => return Ok(()),
                Err(e) if !self.is_running(i) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| no_such_node(i)))
    }

    /// Kills every node and removes the temp dir, through `&self` (for the shared ensemble).
    fn shutdown(&self) {
        for node in &self.nodes {
            node.process.kill();
        }
        let _ = std::fs::remove_dir_all(self.dir.path());
    }
}

fn config(dir: &Path, client_port: u16, servers: &str) -> String {
    format!(
        "tickTime={ZOOKEEPER_TICK_MS}\n\
         initLimit=25\n\
         syncLimit=10\n\
         dataDir={data}\n\
         clientPort={client_port}\n\
         clientPortAddress=127.0.0.1\n\
         maxSessionTimeout=60000\n\
         maxClientCnxns=0\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=*\n\
         forceSync=no\n\
         preAllocSize=1024\n\
         cnxTimeout=1000\n\
         electionPortBindRetry=20\n\
         standaloneEnabled=false\n\
         {servers}",
        data = dir.join("data").display(),
    )
}

/// The TLS lines of a node's `zoo.cfg`: Netty, a PEM key store (certificate + PKCS#8 key in
/// one file, written by `start_tls`) and a PEM trust store (the CA), on a loopback
/// `secureClientPort`. The servers do not check client certificates' host names (test
/// client certificates name no host).
fn tls_config(tls: &Tls, port: u16) -> String {
    format!(
        "secureClientPort={port}\n\
         secureClientPortAddress=127.0.0.1\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={keystore}\n\
         ssl.keyStore.type=PEM\n\
         ssl.trustStore.location={ca}\n\
         ssl.trustStore.type=PEM\n\
         ssl.clientAuth={auth}\n\
         ssl.hostnameVerification=false\n",
        keystore = tls.certs.dir().join("zk-keystore.pem").display(),
        ca = tls.certs.ca().display(),
        auth = if tls.client.is_some() { "need" } else { "none" },
    )
}

/// Node `id` (1-based `myid`): a JVM running `QuorumPeerMain DIR/zoo.cfg` in the foreground.
fn node_spec(java: &Path, classpath: &str, id: usize, super_digest: Option<String>) -> ServerSpec {
    let (java, classpath) = (java.to_path_buf(), classpath.to_string());
    ServerSpec::new(
        format!("ZooKeeper node {id}"),
        PACKAGE,
        move |dir, _port| {
            let mut cmd = Command::new(&java);
            cmd.args([
                "-Xmx128m",
                "-Xss512k",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData",
                "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            ]);
            if let Some(d) = &super_digest {
                cmd.arg(format!(
                    "-Dzookeeper.DigestAuthenticationProvider.superDigest={d}"
                ));
            }
            cmd.arg("-cp")
                .arg(&classpath)
                .arg(MAIN_CLASS)
                .arg(dir.join("zoo.cfg"));
            cmd
        },
    )
    .output("server.log")
    // Readiness is the ensemble's (a leader, every node serving): see `wait_ready`.
    .attempts(1, 5, Duration::from_millis(200))
}

fn zk_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(io::Error::other(format!("ZooKeeper client on {what}: {e}")))
}

fn no_such_node(i: usize) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("no ZooKeeper node {i} in this ensemble"),
    ))
}

/// `n` distinct free loopback ports (all bound at once, then released).
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

fn resolve_java() -> Result<PathBuf> {
    match std::env::var(ZOOKEEPER_JAVA_ENV) {
        Ok(b) if !b.is_empty() => resolve_binary(&b, PACKAGE),
        _ => resolve_binary("java", PACKAGE),
    }
}

fn classpath() -> Result<String> {
    if let Ok(cp) = std::env::var(ZOOKEEPER_CLASSPATH_ENV) {
        if !cp.is_empty() {
            return Ok(cp);
        }
    }
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        return Err(Error::BinaryMissing {
            binary: ZOOKEEPER_JAR.into(),
            package: PACKAGE.into(),
        });
    }
    let mut cp = ZOOKEEPER_JAR.to_owned();
    if Path::new(SLF4J_SIMPLE).is_file() {
        cp.push(':');
        cp.push_str(SLF4J_SIMPLE);
    }
    Ok(cp)
}

/// Sends a four-letter word and reads the reply until the server closes the connection.
fn four_letter(addr: SocketAddr, cmd: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    s.set_read_timeout(Some(PROBE_TIMEOUT))?;
    s.set_write_timeout(Some(PROBE_TIMEOUT))?;
    s.write_all(cmd.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_ports() {
        let ports = free_ports(12).expect("ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 12);
    }

    #[test]
    fn missing_java_names_the_package() {
        let err = resolve_binary("/nonexistent/java", PACKAGE).expect_err("missing");
        assert!(err.to_string().contains("zookeeper"), "{err}");
        let err = resolve_binary("dlock-no-such-java-xyz", PACKAGE).expect_err("missing");
        assert!(matches!(err, Error::BinaryMissing { .. }));
    }
}
