//! A Sentinel setup for tests: a master, a replica and three `redis-server --sentinel`
//! processes watching it, all on free loopback ports.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{Ready, ServerProcess, ServerSpec};
use crate::resp::{Conn, Reply};
use crate::spawn::resolve_binary;
use crate::{Error, RedisServer, Result, REDIS_SERVER_ENV};

/// The master name the sentinels monitor.
pub const SENTINEL_MASTER: &str = "dlockmaster";

const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Options for [`SentinelSetup::start_with`].
#[derive(Debug, Clone, Default)]
pub struct SentinelOptions {
    /// The sentinels' `requirepass` (and `sentinel sentinel-pass`, so they reach each
    /// other). `None`: no password.
    pub sentinel_password: Option<String>,
    /// A second replica with `replica-priority 0` (never promoted): after a failover it
    /// replicates the new master, so `?wait_replicas=1` can still be confirmed while the old
    /// master is away.
    pub standby_replica: bool,
    /// The master's and replicas' `requirepass` (each also syncs with it: `masterauth`; the
    /// sentinels reach them with `sentinel auth-pass`). [`SentinelSetup::url`] carries it.
    pub master_password: Option<String>,
}

/// A master, one replica (two with [`SentinelOptions::standby_replica`]) and three sentinels (quorum 2, `down-after-milliseconds` 1000,
/// `failover-timeout` 5000). Everything is killed and removed on drop.
#[derive(Debug)]
pub struct SentinelSetup {
    master: RedisServer,
    replica: RedisServer,
    standby: Option<RedisServer>,
    sentinels: Vec<ServerProcess>,
    password: Option<String>,
    master_password: Option<String>,
}

impl SentinelSetup {
    /// Starts the master and its replica (linked), then the three sentinels, and waits until
    /// every sentinel sees the master, the replica and the two other sentinels (so that a
    /// failover can be agreed on).
    ///
    /// # Errors
    /// [`Error::BinaryMissing`] without `redis-server` (or [`REDIS_SERVER_ENV`]);
    /// [`Error::Start`] when a server does not come up or the sentinels do not settle.
    pub fn start() -> Result<Self> {
        Self::start_with(SentinelOptions::default())
    }

    /// [`start`](Self::start) with `opts` (a password on the sentinels).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with(opts: SentinelOptions) -> Result<Self> {
        let password = opts.sentinel_password.clone();
        let master = RedisServer::start_with(crate::RedisOptions {
            password: opts.master_password.clone(),
            extra_args: match &opts.master_password {
                Some(pw) => vec!["--masterauth".into(), pw.clone()],
                None => Vec::new(),
            },
            ..Default::default()
        })?;
        let replica = RedisServer::start_replica_of(&master)?;
        let standby = if opts.standby_replica {
            Some(RedisServer::start_replica_with(
                &master,
                &["--replica-priority", "0"],
            )?)
        } else {
            None
        };
        let binary = match std::env::var(REDIS_SERVER_ENV) {
            Ok(b) if !b.is_empty() => b,
            _ => "redis-server".to_string(),
        };
        let binary = resolve_binary(&binary, "redis-server")?;
        let master_port = master.port();
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let dir = tempfile::Builder::new()
                .prefix("distlock-sentinel")
                .tempdir()?;
            let b = binary.clone();
            let mut auth = match &password {
                Some(pw) => format!("requirepass \"{pw}\"\nsentinel sentinel-pass \"{pw}\"\n"),
                None => String::new(),
            };
            if let Some(pw) = &opts.master_password {
                auth.push_str(&format!("sentinel auth-pass {SENTINEL_MASTER} \"{pw}\"\n"));
            }
            let pw = password.clone();
            let spec = ServerSpec::new("redis-sentinel", "redis-server", move |dir, port| {
                let conf = dir.join("sentinel.conf");
                let text = format!(
                    "port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {d}/sentinel.log\n\
                     sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 5000\n{auth}",
                    d = dir.display()
                );
                // A failed write shows as a server that does not start (its log says why).
                let _ = std::fs::write(&conf, text);
                let mut cmd = Command::new(&b);
                cmd.arg(&conf).arg("--sentinel");
                cmd
            })
            .ready(move |c| probe(SocketAddr::from(([127, 0, 0, 1], c.port)), pw.as_deref()))
            .logs(&["sentinel.log"])
            .attempts(5, 10, Duration::from_millis(50));
            sentinels.push(ServerProcess::start(spec, dir)?);
        }
        let setup = SentinelSetup {
            master,
            replica,
            standby,
            sentinels,
            password,
            master_password: opts.master_password.clone(),
        };
        setup.settle()?;
        Ok(setup)
    }

    /// Waits until each sentinel knows every replica and two other sentinels.
    fn settle(&self) -> Result<()> {
        let t = Instant::now();
        let want = 1 + usize::from(self.standby.is_some());
        loop {
            let mut ready = true;
            for s in &self.sentinels {
                let pw = self.password.as_deref();
                let replicas = count(s.addr(), pw, &["SENTINEL", "REPLICAS", SENTINEL_MASTER]);
                let peers = count(s.addr(), pw, &["SENTINEL", "SENTINELS", SENTINEL_MASTER]);
                ready &= replicas >= want && peers >= 2;
            }
            if ready {
                return Ok(());
            }
            if t.elapsed() > SETTLE_TIMEOUT {
                return Err(Error::Start {
                    what: "redis-sentinel".into(),
                    detail: format!(
                        "the sentinels did not see the replica and each other within {:?}: {}",
                        SETTLE_TIMEOUT,
                        self.sentinels[0].log_tail()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/dlockmaster` (with
    /// `:PASSWORD@` before the hosts for [`SentinelOptions::master_password`]; the sentinel
    /// password is not in it).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let auth = match &self.master_password {
            Some(pw) => format!(":{}@", crate::spawn::percent_encode(pw)),
            None => String::new(),
        };
        format!(
            "redis+sentinel://{auth}{}/{SENTINEL_MASTER}",
            hosts.join(",")
        )
    }

    /// The master as started (after a failover, the old one).
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The replica as started (after a failover, possibly the new master).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Mutable access to the master (to kill or pause it).
    pub fn master_mut(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// Mutable access to the replica (to pause it).
    pub fn replica_mut(&mut self) -> &mut RedisServer {
        &mut self.replica
    }

    /// Asks a sentinel for a failover now (`SENTINEL FAILOVER`: the master is demoted to a
    /// replica of the promoted one, without waiting for it to be down).
    ///
    /// # Errors
    /// [`Error::Start`] if no sentinel accepts.
    pub fn failover(&self) -> Result<()> {
        for s in &self.sentinels {
            if let Some(Reply::Simple(ok)) = call(
                s.addr(),
                self.password.as_deref(),
                &["SENTINEL", "FAILOVER", SENTINEL_MASTER],
            ) {
                if ok == "OK" {
                    return Ok(());
                }
            }
        }
        Err(Error::Start {
            what: "redis-sentinel".into(),
            detail: "no sentinel accepted SENTINEL FAILOVER".into(),
        })
    }

    /// The standby replica ([`SentinelOptions::standby_replica`]), if started.
    pub fn standby(&self) -> Option<&RedisServer> {
        self.standby.as_ref()
    }

    /// Waits (up to `timeout`) until the sentinels name the replica as the master and it
    /// says so itself (`ROLE` master: it takes writes), and the standby replica (if any)
    /// replicates it, online. Returns how long it took.
    ///
    /// # Errors
    /// [`Error::Start`] if it is not promoted in time (with the first sentinel's log).
    pub fn wait_for_promotion(&self, timeout: Duration) -> Result<Duration> {
        let t = Instant::now();
        let new = self.replica.port();
        loop {
            let standby_online = self.standby.as_ref().is_none_or(|s| {
                self.replica
                    .command(&["INFO", "replication"])
                    .map(|i| i.contains(&format!("port={},state=online", s.port())))
                    .unwrap_or(false)
            });
            if self.current_master_port() == Some(new)
                && role(&self.replica) == "master"
                && standby_online
            {
                return Ok(t.elapsed());
            }
            if t.elapsed() > timeout {
                return Err(Error::Start {
                    what: "redis-sentinel".into(),
                    detail: format!(
                        "the replica was not promoted within {timeout:?}: {}",
                        self.sentinels[0].log_tail()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (up to `timeout`) until the old master says it is a replica (`ROLE` slave) with
    /// its link up, and the promoted replica counts it as an online replica (it can confirm
    /// a `WAIT`): after it came back and the sentinels reconfigured it.
    ///
    /// # Errors
    /// [`Error::Start`] if it is not a linked replica in time.
    pub fn wait_old_master_demoted(&self, timeout: Duration) -> Result<Duration> {
        let t = Instant::now();
        loop {
            let linked = self
                .master
                .command(&["INFO", "replication"])
                .map(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
                .unwrap_or(false)
                && self
                    .replica
                    .command(&["INFO", "replication"])
                    .map(|i| i.contains(&format!("port={},state=online", self.master.port())))
                    .unwrap_or(false);
            if linked {
                return Ok(t.elapsed());
            }
            if t.elapsed() > timeout {
                return Err(Error::Start {
                    what: "redis-sentinel".into(),
                    detail: format!(
                        "the old master is not a linked replica after {timeout:?} (role: {})",
                        role(&self.master)
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The sentinel processes.
    pub fn sentinels(&self) -> &[ServerProcess] {
        &self.sentinels
    }

    /// The reply of sentinel `i` to `args` (with the sentinel password, if any), as text;
    /// `None` when it does not answer.
    pub fn sentinel_command(&self, i: usize, args: &[&str]) -> Option<String> {
        call(
            self.sentinels.get(i)?.addr(),
            self.password.as_deref(),
            args,
        )
        .map(|r| r.to_string())
    }

    /// The port of the master the first reachable sentinel names now
    /// (`SENTINEL get-master-addr-by-name`).
    pub fn current_master_port(&self) -> Option<u16> {
        let pw = self.password.as_deref();
        self.sentinels
            .iter()
            .find_map(|s| master_port(s.addr(), pw))
    }
}

/// `master`, `slave`, or empty when the server does not answer.
fn role(server: &RedisServer) -> String {
    server
        .command(&["ROLE"])
        .ok()
        .and_then(|r| r.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

fn call(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Option<Reply> {
    let mut conn = Conn::connect(addr, PROBE_TIMEOUT).ok()?;
    if let Some(pw) = password {
        conn.call(&["AUTH", pw]).ok()?;
    }
    conn.call(args).ok()
}

fn count(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> usize {
    match call(addr, password, args) {
        Some(Reply::Array(Some(items))) => items.len(),
        _ => 0,
    }
}

fn master_port(addr: SocketAddr, password: Option<&str>) -> Option<u16> {
    match call(
        addr,
        password,
        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER],
    )? {
        Reply::Array(Some(items)) => match items.get(1) {
            Some(Reply::Bulk(Some(p))) => std::str::from_utf8(p).ok()?.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

fn probe(addr: SocketAddr, password: Option<&str>) -> Ready {
    match call(addr, password, &["PING"]) {
        Some(Reply::Simple(s)) if s == "PONG" => {}
        _ => return Ready::NotYet,
    }
    match master_port(addr, password) {
        Some(_) => Ready::Yes,
        None => Ready::NotYet,
    }
}
