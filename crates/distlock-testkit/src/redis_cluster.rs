//! A Redis Cluster for tests: `redis-server`s with `cluster-enabled yes` on free loopback
//! ports, joined by `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::spawn::resolve_binary;
use crate::{try_free_port, Error, RedisOptions, RedisServer, Result};

/// `cluster-node-timeout` of the test clusters: a master unreachable this long is failed over
/// (its replica waits a little more, see the Redis docs, before it asks for votes).
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1000;

const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// A node's role, as `CLUSTER NODES` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterRole {
    /// Owns slots.
    Master,
    /// Replicates a master.
    Replica,
}

/// One node of a [`RedisCluster`] as the cluster sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Index in [`RedisCluster::servers`].
    pub index: usize,
    /// The node id.
    pub id: String,
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Its role now.
    pub role: ClusterRole,
}

/// A running Redis Cluster: `masters` masters with `replicas` replicas each (6 nodes for
/// [`start`](Self::start)), every slot covered and `cluster_state:ok` on every node.
/// Every node is killed (and its temp dir removed) on drop.
#[derive(Debug)]
pub struct RedisCluster {
    servers: Vec<RedisServer>,
    /// For [`start_tls`](Self::start_tls): the test CA and each node's TLS port.
    tls: Option<(crate::TestCerts, Vec<u16>)>,
}

impl RedisCluster {
    /// Three masters with one replica each.
    pub fn start() -> Result<Self> {
        Self::start_with(3, 1)
    }

    /// `masters` masters (at least 3, as `redis-cli --cluster create` wants) with `replicas`
    /// replicas each.
    pub fn start_with(masters: usize, replicas: usize) -> Result<Self> {
        Self::start_inner(masters, replicas, None)
    }

    /// Three masters without replicas that also serve TLS (client connections, the cluster
    /// bus and replication), with a fresh test CA: [`tls_url`](Self::tls_url) is the
    /// `rediss+cluster://` URL. The plain ports stay open for [`command`](Self::command).
    pub fn start_tls() -> Result<Self> {
        Self::start_inner(3, 0, Some(crate::TestCerts::generate()?))
    }

    fn start_inner(
        masters: usize,
        replicas: usize,
        certs: Option<crate::TestCerts>,
    ) -> Result<Self> {
        let cli = resolve_binary("redis-cli", "redis-tools")?;
        let n = masters * (1 + replicas);
        let mut servers = Vec::with_capacity(n);
        let mut tls_ports = Vec::new();
        for _ in 0..n {
            let bus = try_free_port()?;
            let mut tls_args = Vec::new();
            if let Some(c) = &certs {
                // The nodes are each other's TLS clients (bus, replication): they show a
                // client certificate of the test CA.
                let (client_cert, client_key) = c.client("redis-node")?;
                let port = try_free_port()?;
                tls_ports.push(port);
                tls_args = vec![
                    "--tls-port".to_string(),
                    port.to_string(),
                    "--tls-cert-file".to_string(),
                    c.cert().display().to_string(),
                    "--tls-key-file".to_string(),
                    c.key().display().to_string(),
                    "--tls-ca-cert-file".to_string(),
                    c.ca().display().to_string(),
                    "--tls-client-cert-file".to_string(),
                    client_cert.display().to_string(),
                    "--tls-client-key-file".to_string(),
                    client_key.display().to_string(),
                    "--tls-auth-clients".to_string(),
                    "no".to_string(),
                    "--tls-cluster".to_string(),
                    "yes".to_string(),
                    "--tls-replication".to_string(),
                    "yes".to_string(),
                ];
            }
            servers.push(RedisServer::start_with(RedisOptions {
                extra_args: [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &CLUSTER_NODE_TIMEOUT_MS.to_string(),
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-require-full-coverage",
                    "no",
                ]
                .iter()
                .map(|s| s.to_string())
                .chain(tls_args)
                .collect(),
                ..Default::default()
            })?);
        }
        let mut create = Command::new(cli);
        create.arg("--cluster").arg("create");
        for s in &servers {
            create.arg(format!("127.0.0.1:{}", s.port()));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string()])
            .arg("--cluster-yes");
        let out = output_within(create, FORM_TIMEOUT)?;
        if !out.status.success() {
            return Err(Error::Start {
                what: format!("redis cluster of {n} nodes"),
                detail: format!(
                    "redis-cli --cluster create failed: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let cluster = RedisCluster {
            servers,
            tls: certs.map(|c| (c, tls_ports)),
        };
        let servers = &cluster.servers;
        cluster.wait_ok(FORM_TIMEOUT, |nodes| {
            // A replica that has not synced with its master yet would not take over from it.
            nodes
                .iter()
                .filter(|n| n.role == ClusterRole::Master)
                .count()
                == masters
                && nodes.len() == n
                && nodes
                    .iter()
                    .filter(|n| n.role == ClusterRole::Replica)
                    .all(|n| {
                        servers[n.index]
                            .command(&["INFO", "replication"])
                            .is_ok_and(|i| i.contains("master_link_status:up"))
                    })
        })?;
        Ok(cluster)
    }

    /// `redis+cluster://h:p,h:p,…` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// `rediss+cluster://h:TLS_PORT,…?ca_file=CA` for clusters made by
    /// [`start_tls`](Self::start_tls); `None` otherwise.
    pub fn tls_url(&self) -> Option<String> {
        self.tls.as_ref().map(|(certs, ports)| {
            let seeds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
            format!(
                "rediss+cluster://{}?ca_file={}",
                seeds.join(","),
                certs.ca().display()
            )
        })
    }

    /// The node processes (killed ones included), in start order.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Node `i`'s process.
    pub fn server(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// Kills node `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        self.servers[i].kill();
    }

    /// Freezes node `i` (SIGSTOP).
    pub fn pause(&mut self, i: usize) {
        self.servers[i].pause();
    }

    /// Resumes node `i` after [`pause`](Self::pause).
    pub fn resume(&mut self, i: usize) {
        self.servers[i].resume();
    }

    /// A command on the first live node that answers (see [`RedisServer::command`]).
    pub fn command(&self, args: &[&str]) -> Result<String> {
        let mut last = None;
        for s in self.servers.iter().filter(|s| s.is_running()) {
            match s.command(args) {
                Ok(r) if r.starts_with("-MOVED") || r.starts_with("-ASK") => {}
                Ok(r) => return Ok(r),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| start_error("no live node answered")))
    }

    /// A command on the master that owns the slot of `key` (whose name is `args[key]`).
    pub fn command_at_key(&self, key: &str, args: &[&str]) -> Result<String> {
        let i = self.master_of(key)?;
        self.servers[i].command(args)
    }

    /// The nodes (as the first live node that answers sees them), with their roles now.
    /// Nodes marked failed are left out.
    pub fn nodes(&self) -> Result<Vec<ClusterNode>> {
        let text = self.command(&["CLUSTER", "NODES"])?;
        Ok(self.parse_nodes(&text))
    }

    fn parse_nodes(&self, text: &str) -> Vec<ClusterNode> {
        let mut out = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 || f[2].contains("fail") && !f[2].contains("fail?") {
                continue;
            }
            let addr = f[1].split('@').next().unwrap_or_default().to_string();
            let Some(index) = self
                .servers
                .iter()
                .position(|s| format!("127.0.0.1:{}", s.port()) == addr)
            else {
                continue;
            };
            let role = if f[2].contains("master") {
                ClusterRole::Master
            } else {
                ClusterRole::Replica
            };
            out.push(ClusterNode {
                index,
                id: f[0].to_string(),
                addr,
                role,
            });
        }
        out.sort_by_key(|n| n.index);
        out
    }

    /// Indexes of the live masters.
    pub fn masters(&self) -> Result<Vec<usize>> {
        Ok(self
            .nodes()?
            .into_iter()
            .filter(|n| n.role == ClusterRole::Master && self.servers[n.index].is_running())
            .map(|n| n.index)
            .collect())
    }

    /// The index of the master that owns the slot of `key` (`CLUSTER KEYSLOT`, then the
    /// node that does not answer `MOVED` for it).
    pub fn master_of(&self, key: &str) -> Result<usize> {
        let slot = self.command(&["CLUSTER", "KEYSLOT", key])?;
        let slots = self.command_reply_slots()?;
        let slot: u16 = slot
            .trim()
            .parse()
            .map_err(|_| start_error(&format!("CLUSTER KEYSLOT said {slot}")))?;
        slots
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, i)| *i)
            .ok_or_else(|| start_error(&format!("no live master owns slot {slot}")))
    }

    /// (first slot, last slot, master index) of every slot range (from `CLUSTER NODES`).
    fn command_reply_slots(&self) -> Result<Vec<(u16, u16, usize)>> {
        let text = self.command(&["CLUSTER", "NODES"])?;
        let mut out = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") {
                continue;
            }
            let addr = f[1].split('@').next().unwrap_or_default();
            let Some(index) = self
                .servers
                .iter()
                .position(|s| format!("127.0.0.1:{}", s.port()) == addr)
            else {
                continue;
            };
            for range in &f[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse(), hi.parse()) {
                    out.push((lo, hi, index));
                }
            }
        }
        Ok(out)
    }

    /// Waits until `master` (an index) is no longer a master and another node took its
    /// slots: every live node says `cluster_state:ok` and the cluster has no failed master
    /// left with slots. For after [`kill`](Self::kill) or [`pause`](Self::pause) of a master.
    /// Returns the index of the node that took the slots over.
    pub fn wait_failover(&self, master: usize, timeout: Duration) -> Result<usize> {
        let port = format!("127.0.0.1:{}", self.servers[master].port());
        // Other nodes list a dead master with its slots until a replica takes them.
        let first_slot = self
            .command_reply_slots()?
            .iter()
            .find(|(_, _, i)| *i == master)
            .map(|(lo, _, _)| *lo)
            .ok_or_else(|| start_error("the node to fail over owns no slots"))?;
        self.wait_ok(timeout, |nodes| {
            !nodes
                .iter()
                .any(|n| n.addr == port && n.role == ClusterRole::Master)
        })?;
        let slots = self.command_reply_slots()?;
        if slots.iter().any(|(_, _, i)| *i == master) {
            return Err(start_error("the failed master still owns slots"));
        }
        slots
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&first_slot))
            .map(|(_, _, i)| *i)
            .ok_or_else(|| start_error("no master took the slots over"))
    }

    /// The index of a replica of master `master` (as `CLUSTER NODES` says; call it while
    /// the master is up).
    pub fn replica_of(&self, master: usize) -> Result<usize> {
        let text = self.command(&["CLUSTER", "NODES"])?;
        let nodes = self.parse_nodes(&text);
        let id = &nodes
            .iter()
            .find(|n| n.index == master)
            .ok_or_else(|| start_error("no such node"))?
            .id;
        let replica = text
            .lines()
            .find(|l| l.split_whitespace().nth(3) == Some(id.as_str()))
            .and_then(|l| l.split_whitespace().next())
            .ok_or_else(|| start_error(&format!("node {master} has no replica")))?;
        nodes
            .iter()
            .find(|n| n.id == replica)
            .map(|n| n.index)
            .ok_or_else(|| start_error("the replica is not one of ours"))
    }

    /// Waits until every live node says `cluster_state:ok`, all 16384 slots are covered by
    /// live masters, and `more(nodes)` holds.
    fn wait_ok(
        &self,
        timeout: Duration,
        mut more: impl FnMut(&[ClusterNode]) -> bool,
    ) -> Result<()> {
        let t = Instant::now();
        let mut last = String::new();
        loop {
            let ok = self.servers.iter().filter(|s| s.is_running()).all(|s| {
                s.command(&["CLUSTER", "INFO"]).is_ok_and(|i| {
                    let ok = i.contains("cluster_state:ok") && i.contains("cluster_slots_ok:16384");
                    if !ok {
                        last = i.lines().take(3).collect::<Vec<_>>().join(" ");
                    }
                    ok
                })
            });
            if ok {
                let slots = self.command_reply_slots()?;
                let covered: u32 = slots
                    .iter()
                    .filter(|(_, _, i)| self.servers[*i].is_running())
                    .map(|(lo, hi, _)| u32::from(hi - lo) + 1)
                    .sum();
                let nodes = self.nodes()?;
                if covered == 16384 && more(&nodes) {
                    return Ok(());
                }
                last = format!("{covered} slots on live masters; nodes {nodes:?}");
            }
            if t.elapsed() > timeout {
                return Err(start_error(&format!(
                    "cluster not ok after {:?}: {last}",
                    t.elapsed()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `cmd`'s output, or an error if it does not exit within `timeout` (it is killed).
fn output_within(mut cmd: Command, timeout: Duration) -> Result<std::process::Output> {
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let t = Instant::now();
    while child.try_wait()?.is_none() {
        if t.elapsed() > timeout {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            return Err(start_error(&format!(
                "redis-cli --cluster create did not finish within {timeout:?}: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child.wait_with_output()?)
}

fn start_error(detail: &str) -> Error {
    Error::Start {
        what: "redis cluster".into(),
        detail: detail.to_string(),
    }
}
