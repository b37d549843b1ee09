//! The coordinator of a run: the register, the worker processes and their proxies, the
//! nemesis schedule, then the checker.

use crate::checker::{self, Analysis};
use crate::history::{now_us, Event, History, Kind, NemesisEvent};
use crate::register::Register;
use crate::server::Server;
use crate::worker::{Target, WorkerConfig};
use distlock::conn::{ConnectionString, Host};
use distlock_proxy::DelayProxy;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A fault the coordinator applies to one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Nemesis {
    /// SIGSTOP a worker (a holder when there is one) for 1.5–2.5 leases, then SIGCONT: the
    /// GC pause of Kleppmann's argument.
    Pause,
    /// SIGKILL a worker (a holder when there is one) and start a new one in its place.
    Kill,
    /// Delay the worker's traffic to the lock service by 0.3–1.2 leases each way for two
    /// leases.
    Delay,
    /// Drop all the worker's traffic to the lock service for 1.5–2.5 leases.
    Drop,
    /// Reset every connection of the worker to the lock service.
    Reset,
    /// Hold the worker's next request to the lock service in the proxy past the client's
    /// per-call timeout, so that the client sends it again on a fresh connection, then let
    /// the first copy through: the server gets the request twice, the first copy late.
    Duplicate,
    /// SIGSTOP a server named by `--server-pid` for 1.5–2.5 leases, then SIGCONT.
    PauseServer,
    /// SIGKILL a server named by `--server-pid` (a crash: no shutdown save) and wait until its
    /// supervisor has it listening again on its port.
    RestartServer,
    /// Ask the sentinels of a `redis+sentinel://` URL for a failover and wait until they name
    /// the new master.
    Failover,
}

impl Nemesis {
    /// Every nemesis.
    pub const ALL: [Nemesis; 9] = [
        Nemesis::Pause,
        Nemesis::Kill,
        Nemesis::Delay,
        Nemesis::Drop,
        Nemesis::Reset,
        Nemesis::Duplicate,
        Nemesis::PauseServer,
        Nemesis::RestartServer,
        Nemesis::Failover,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Nemesis::Pause => "pause",
            Nemesis::Kill => "kill",
            Nemesis::Delay => "delay",
            Nemesis::Drop => "drop",
            Nemesis::Reset => "reset",
            Nemesis::Duplicate => "duplicate",
            Nemesis::PauseServer => "pause-server",
            Nemesis::RestartServer => "restart-server",
            Nemesis::Failover => "failover",
        }
    }

    /// Whether it acts on the lock service rather than a worker: never applied unless asked.
    pub fn on_server(self) -> bool {
        matches!(
            self,
            Nemesis::PauseServer | Nemesis::RestartServer | Nemesis::Failover
        )
    }

    /// Whether it works through the proxy.
    pub fn needs_proxy(self) -> bool {
        matches!(
            self,
            Nemesis::Delay | Nemesis::Drop | Nemesis::Reset | Nemesis::Duplicate
        )
    }

    /// Parses a comma-separated list (`pause,kill,delay`).
    pub fn parse_list(s: &str) -> Result<Vec<Nemesis>, String> {
        let mut v = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let n = Nemesis::ALL
                .into_iter()
                .find(|n| n.name() == part)
                .ok_or_else(|| {
                    let names: Vec<&str> = Nemesis::ALL.iter().map(|n| n.name()).collect();
                    format!("unknown nemesis `{part}`; choose from {}", names.join(", "))
                })?;
            if !v.contains(&n) {
                v.push(n);
            }
        }
        Ok(v)
    }
}

/// How to start a worker: this program with these leading arguments (the worker's own follow).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The program (usually the running `dlock`).
    pub program: PathBuf,
    /// Arguments before the worker's (e.g. the hidden subcommand).
    pub args: Vec<String>,
}

/// A run's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// What the workers lock.
    pub target: Target,
    /// The kind of lock, and so the rule the checker holds the grants to.
    pub kind: Kind,
    /// How many lock names the workers spread over (each attempt picks one).
    pub names: u32,
    /// Worker processes at any time.
    pub clients: usize,
    /// How long the workers loop.
    pub duration: Duration,
    /// Lease.
    pub lease: Duration,
    /// Mean work between a section's read and write.
    pub work: Duration,
    /// Nemeses to apply (none: a quiet run).
    pub nemeses: Vec<Nemesis>,
    /// Seed of the schedule and the workers' work times.
    pub seed: u64,
    /// How to start a worker.
    pub worker: WorkerCommand,
    /// The lock name.
    pub name: String,
    /// Where to write the whole history as JSON, if anywhere.
    pub history_out: Option<PathBuf>,
    /// Pids of the lock servers the server nemeses may pause and crash (`--server-pid`).
    pub server_pids: Vec<u32>,
    /// Where to draw the run as an SVG timeline, if anywhere.
    pub timeline_out: Option<PathBuf>,
}

/// What a run found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// One line: PASS or FAIL and why.
    pub verdict: String,
    /// No violation.
    pub ok: bool,
    /// The backend URL (or the broken lock's name).
    pub target: String,
    /// Seed.
    pub seed: u64,
    /// Worker processes.
    pub clients: usize,
    /// Run time, ms.
    pub duration_ms: u64,
    /// Lease, ms.
    pub lease_ms: u64,
    /// The pids of the named servers at the end (a restarted server has a new one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_pids: Vec<u32>,
    /// The checker's findings.
    #[serde(flatten)]
    pub analysis: Analysis,
}

impl Report {
    /// Builds the report of a checked history.
    pub fn new(cfg: &Config, analysis: Analysis) -> Report {
        let ok = analysis.ok();
        let nem: Vec<String> = analysis
            .nemeses
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let nem = if nem.is_empty() {
            "no nemesis".to_string()
        } else {
            nem.join(", ")
        };
        let verdict = if ok {
            format!(
                "PASS: no violation in {} grants, {} writes ({nem})",
                analysis.stats.grants, analysis.stats.writes
            )
        } else {
            let kinds: Vec<String> = analysis
                .violation_counts
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            format!(
                "FAIL: {} in {} grants ({nem})",
                kinds.join(", "),
                analysis.stats.grants
            )
        };
        Report {
            verdict,
            ok,
            target: match &cfg.target {
                Target::Url(u) => u.clone(),
                Target::Broken(v, _) => format!("broken lock {}", v.name()),
            },
            seed: cfg.seed,
            clients: cfg.clients,
            duration_ms: cfg.duration.as_millis() as u64,
            lease_ms: cfg.lease.as_millis() as u64,
            server_pids: Vec::new(),
            analysis,
        }
    }
}

/// Where the workers' proxies forward to, and the URL to rewrite to a proxy.
#[derive(Debug, Clone)]
struct Upstream {
    target: SocketAddr,
    url: ConnectionString,
}

/// The address a single-host URL points at, for the proxy; `None` for a URL the proxy cannot
/// stand in front of (file://, several hosts, TLS, unix sockets).
fn upstream(u: &str) -> Result<Option<Upstream>, String> {
    let url = ConnectionString::parse(u).map_err(|e| format!("bad backend URL: {e}"))?;
    let port = match url.scheme() {
        "redis" => 6379,
        "postgres" | "postgresql" => 5432,
        "mysql" => 3306,
        "etcd" => 2379,
        "zk" => 2181,
        _ => return Ok(None),
    };
    // Several hosts (`h1:p1,h2:p2`, a cluster): one proxy cannot stand in front of them.
    let [host] = url.hosts() else {
        return Ok(None);
    };
    if url.raw_path().contains(',') {
        return Ok(None);
    }
    let (name, port) = (host.host.clone(), host.port_or(port));
    let target = (name.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?;
    Ok(Some(Upstream { target, url }))
}

/// Whether `target` lets the network nemeses run.
pub fn proxyable(target: &Target) -> Result<bool, String> {
    match target {
        Target::Url(u) => Ok(upstream(u)?.is_some()),
        Target::Broken(..) => Ok(false),
    }
}

/// One worker slot: its process now, its proxy.
struct Slot {
    generation: u64,
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
    proxy: Option<DelayProxy>,
}

struct Coordinator<'a> {
    cfg: &'a Config,
    register: Register,
    events: Arc<Mutex<Vec<Event>>>,
    slots: Vec<Slot>,
    nemeses: Vec<NemesisEvent>,
    killed: Vec<(String, u64)>,
    upstream: Option<Upstream>,
    servers: Vec<Server>,
    rng: fastrand::Rng,
}

/// Runs a torture run and checks it.
///
/// # Errors
///
/// A message when the run could not be made (bad URL, a nemesis that needs a proxy on a URL
/// that cannot have one, a worker that could not start or reported an error).
pub fn run(cfg: &Config) -> Result<Report, String> {
    let upstream = match &cfg.target {
        Target::Url(u) => upstream(u)?,
        Target::Broken(..) => None,
    };
    if upstream.is_none() {
        if let Some(n) = cfg.nemeses.iter().find(|n| n.needs_proxy()) {
            return Err(format!(
                "nemesis `{}` needs a single-host redis://, postgres://, mysql://, etcd:// or zk:// URL (the proxy stands in front of it)",
                n.name()
            ));
        }
    }
    let servers = cfg
        .server_pids
        .iter()
        .map(|&p| Server::named(p))
        .collect::<Result<Vec<_>, _>>()?;
    for n in &cfg.nemeses {
        match n {
            Nemesis::PauseServer | Nemesis::RestartServer if servers.is_empty() => {
                return Err(format!(
                    "nemesis `{}` needs the lock server's pid: --server-pid PID",
                    n.name()
                ))
            }
            Nemesis::Failover => match &cfg.target {
                Target::Url(u) => {
                    crate::server::sentinel_of(u)?;
                }
                Target::Broken(..) => return Err("failover needs a redis+sentinel:// URL".into()),
            },
            _ => {}
        }
    }
    let register = Register::start().map_err(|e| format!("cannot start the register: {e}"))?;
    let mut c = Coordinator {
        cfg,
        register,
        events: Arc::new(Mutex::new(Vec::new())),
        slots: Vec::new(),
        nemeses: Vec::new(),
        killed: Vec::new(),
        upstream,
        servers,
        rng: fastrand::Rng::with_seed(cfg.seed),
    };
    let result = c.drive();
    c.stop_all();
    result?;
    let history = History {
        events: std::mem::take(&mut *c.events.lock().unwrap_or_else(PoisonError::into_inner)),
        register: c.register.ops(),
        nemeses: c.nemeses,
        killed: c.killed,
        kind: cfg.kind,
        lease_us: crate::history::to_us(cfg.lease),
    };
    if let Some(path) = &cfg.history_out {
        let json = serde_json::to_vec(&history).map_err(|e| e.to_string())?;
        std::fs::write(path, json)
            .map_err(|e| format!("cannot write the history to {}: {e}", path.display()))?;
    }
    // A run in which no worker ever got the lock and attempts failed with errors could not be
    // made (the service unreachable, bad credentials): that is bad input, not a verdict. Once
    // grants happen, a failed attempt is an event of the run like any other (a waiter paused
    // or cut off by a nemesis loses its place: etcd says "cannot talk to etcd … gone").
    let granted = history
        .events
        .iter()
        .any(|e| matches!(e.kind, crate::history::EventKind::Grant { .. }));
    if !granted {
        if let Some(e) = history.events.iter().find_map(|e| match &e.kind {
            crate::history::EventKind::AttemptFailed { error } if error.starts_with("cannot") => {
                Some(error.clone())
            }
            _ => None,
        }) {
            return Err(e);
        }
    }
    let mut report = Report::new(cfg, checker::check(&history));
    report.server_pids = c.servers.iter().map(|s| s.pid).collect();
    if let Some(path) = &cfg.timeline_out {
        let title = format!("{} — {}", report.target, report.verdict);
        std::fs::write(
            path,
            crate::draw::render(&history, &report.analysis, &title),
        )
        .map_err(|e| format!("cannot write the timeline to {}: {e}", path.display()))?;
    }
    Ok(report)
}

impl Coordinator<'_> {
    fn drive(&mut self) -> Result<(), String> {
        for i in 0..self.cfg.clients {
            let proxy = match &self.upstream {
                Some(u) => Some(
                    DelayProxy::start(u.target, Duration::ZERO)
                        .map_err(|e| format!("cannot start a proxy: {e}"))?,
                ),
                None => None,
            };
            let slot = self.spawn(i, 0, proxy)?;
            self.slots.push(slot);
        }
        let end = Instant::now() + self.cfg.duration;
        let lease = self.cfg.lease;
        let mut round: Vec<Nemesis> = Vec::new();
        while Instant::now() < end {
            // A quiet gap of 0.5–1 lease, then the next nemesis.
            thread::sleep(lease.mul_f64(0.5 + self.rng.f64() * 0.5));
            if self.cfg.nemeses.is_empty() || Instant::now() >= end {
                continue;
            }
            // Rounds: every nemesis once per round, in an order drawn from the seed.
            if round.is_empty() {
                round = self.cfg.nemeses.clone();
                self.rng.shuffle(&mut round);
            }
            let n = round.remove(0);
            self.apply(n)?;
            // A worker that ended on its own (an error) ends the run.
            for s in &mut self.slots {
                if let Ok(Some(status)) = s.child.try_wait() {
                    return Err(format!("a worker exited early ({status})"));
                }
            }
        }
        Ok(())
    }

    fn worker_id(slot: usize, generation: u64) -> String {
        format!("w{slot}.{generation}")
    }

    fn spawn(
        &self,
        slot: usize,
        generation: u64,
        proxy: Option<DelayProxy>,
    ) -> Result<Slot, String> {
        let id = Self::worker_id(slot, generation);
        let target = match (&self.cfg.target, &proxy, &self.upstream) {
            (Target::Url(_), Some(p), Some(u)) => {
                let mut url = u.url.clone();
                let addr = p.addr();
                url.set_hosts(vec![Host::new(addr.ip().to_string(), Some(addr.port()))]);
                Target::Url(url.expose_url().to_owned())
            }
            (t, _, _) => t.clone(),
        };
        let wc = WorkerConfig {
            id: id.clone(),
            target,
            name: self.cfg.name.clone(),
            kind: self.cfg.kind,
            names: self.cfg.names,
            lease: self.cfg.lease,
            work: self.cfg.work,
            wait: self.cfg.lease * 3 + Duration::from_secs(1),
            register: self.register.addr(),
            seed: self.cfg.seed ^ ((slot as u64) << 32) ^ generation,
        };
        let mut child = Command::new(&self.cfg.worker.program)
            .args(&self.cfg.worker.args)
            .args(wc.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a worker: {e}"))?;
        let stdout = child.stdout.take().ok_or("worker without stdout")?;
        let events = Arc::clone(&self.events);
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut e) = serde_json::from_str::<Event>(&line) {
                    e.t_coord = now_us();
                    events
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(e);
                }
            }
        });
        Ok(Slot {
            generation,
            stdin: child.stdin.take(),
            child,
            reader: Some(reader),
            proxy,
        })
    }

    /// A slot whose worker holds the lock now, if any (by the events so far), else any.
    fn victim(&mut self) -> usize {
        let holders: Vec<usize> = {
            let ev = self.events.lock().unwrap_or_else(PoisonError::into_inner);
            let mut open = std::collections::BTreeMap::new();
            for e in ev.iter() {
                match e.kind {
                    crate::history::EventKind::Grant { .. } => {
                        open.insert(e.id.worker.clone(), true);
                    }
                    crate::history::EventKind::ReleaseStart => {
                        open.insert(e.id.worker.clone(), false);
                    }
                    _ => {}
                }
            }
            (0..self.slots.len())
                .filter(|&i| {
                    let id = Self::worker_id(i, self.slots[i].generation);
                    open.get(&id).copied().unwrap_or(false)
                })
                .collect()
        };
        if holders.is_empty() {
            self.rng.usize(..self.slots.len())
        } else {
            holders[self.rng.usize(..holders.len())]
        }
    }

    /// Applies a server nemesis.
    fn apply_server(&mut self, n: Nemesis) -> Result<(), String> {
        let lease = self.cfg.lease;
        let t = now_us();
        match n {
            Nemesis::PauseServer => {
                let s = &self.servers[self.rng.usize(..self.servers.len())];
                s.pause(lease.mul_f64(1.5 + self.rng.f64()))?;
            }
            Nemesis::RestartServer => {
                let i = self.rng.usize(..self.servers.len());
                self.servers[i].crash_and_wait(crate::server::RESTART_TIMEOUT)?;
            }
            Nemesis::Failover => {
                let Target::Url(u) = &self.cfg.target else {
                    return Ok(());
                };
                if !crate::server::sentinel_failover(u, crate::server::FAILOVER_TIMEOUT)? {
                    // Not now (the last one still settling): not counted.
                    return Ok(());
                }
            }
            _ => return Ok(()),
        }
        self.nemeses.push(NemesisEvent {
            nemesis: n.name().to_string(),
            worker: crate::history::SERVER.to_string(),
            t,
            until: now_us(),
        });
        Ok(())
    }

    fn apply(&mut self, n: Nemesis) -> Result<(), String> {
        if n.on_server() {
            return self.apply_server(n);
        }
        let i = self.victim();
        let lease = self.cfg.lease;
        let worker = Self::worker_id(i, self.slots[i].generation);
        let t = now_us();
        match n {
            Nemesis::Pause => {
                let pid = self.slots[i].child.id() as libc::pid_t;
                // SAFETY: signals to a child this coordinator started and has not reaped.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                thread::sleep(lease.mul_f64(1.5 + self.rng.f64()));
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            Nemesis::Kill => {
                // The section of the killed worker ends at the latest when it dies, which is
                // after this reading: the earliest possible end, so no overlap is invented.
                self.killed.push((worker.clone(), now_us()));
                let _ = self.slots[i].child.kill();
                let _ = self.slots[i].child.wait();
                let generation = self.slots[i].generation + 1;
                let proxy = self.slots[i].proxy.take();
                let new = self.spawn(i, generation, proxy)?;
                let old = std::mem::replace(&mut self.slots[i], new);
                if let Some(r) = old.reader {
                    let _ = r.join();
                }
            }
            Nemesis::Delay => {
                if let Some(p) = &self.slots[i].proxy {
                    p.set_delay(lease.mul_f64(0.3 + self.rng.f64() * 0.9));
                    thread::sleep(lease * 2);
                    p.heal();
                }
            }
            Nemesis::Drop => {
                if let Some(p) = &self.slots[i].proxy {
                    p.set_blackhole(true);
                    thread::sleep(lease.mul_f64(1.5 + self.rng.f64()));
                    p.heal();
                }
            }
            Nemesis::Reset => {
                if let Some(p) = &self.slots[i].proxy {
                    p.reset_all();
                }
            }
            Nemesis::PauseServer | Nemesis::RestartServer | Nemesis::Failover => {}
            Nemesis::Duplicate => {
                let Some(p) = &self.slots[i].proxy else {
                    return Ok(());
                };
                let before = p.held_connections();
                p.hold_next_request();
                // The worker's next request (a holder's renewal or release, a waiter's try)
                // comes within a renewal interval; a worker with nothing to say is left.
                let caught = wait_until(lease, || p.held_connections() > before);
                if caught {
                    // Past the per-call timeout the client gives up on that connection and
                    // sends the request again on another one; then the first copy arrives.
                    thread::sleep(distlock::ClientOptions::default().get_op_timeout() + lease / 2);
                }
                p.release_held();
                if !caught {
                    return Ok(());
                }
                wait_until(lease, || p.held_requests_answered());
            }
        }
        self.nemeses.push(NemesisEvent {
            nemesis: n.name().to_string(),
            worker,
            t,
            until: now_us(),
        });
        Ok(())
    }

    /// Closes every worker's stdin (it stops after its attempt), waits for them, kills the
    /// ones still running after a grace period.
    fn stop_all(&mut self) {
        for s in &mut self.slots {
            if let Some(p) = &s.proxy {
                p.heal();
            }
            s.stdin = None;
        }
        let grace =
            Instant::now() + self.cfg.lease * 4 + self.cfg.work * 2 + Duration::from_secs(3);
        for (i, s) in self.slots.iter_mut().enumerate() {
            loop {
                match s.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= grace => {
                        self.killed
                            .push((Self::worker_id(i, s.generation), now_us()));
                        let _ = s.child.kill();
                        let _ = s.child.wait();
                        break;
                    }
                    Ok(None) => thread::sleep(Duration::from_millis(20)),
                }
            }
            if let Some(r) = s.reader.take() {
                let _ = r.join();
            }
        }
    }
}

/// Polls `done` every 10 ms for at most `d`; whether it became true.
fn wait_until(d: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + d;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

impl Report {
    /// A line of counts: grants, writes accepted and refused, lost signals and their lateness,
    /// the liveness figures.
    pub fn analysis_line(&self) -> String {
        let s = &self.analysis.stats;
        let l = &self.analysis.lost_lateness;
        let mut line = format!(
            "{} attempts, {} grants, {} writes (register {} accepted, {} refused), final value {}, {} lost signals",
            s.attempts, s.grants, s.writes, s.register_accepted, s.register_rejected, s.final_value, s.lost
        );
        if l.count > 0 {
            line += &format!(
                " ({} after the lease end: p50 {} µs, p99 {} µs, max {} µs",
                l.count, l.p50_us, l.p99_us, l.max_us
            );
        } else {
            line += " (none after the lease end";
        }
        if l.early > 0 {
            line += &format!("; {} before it", l.early);
        }
        if l.unknown > 0 {
            line += &format!("; {} with no known lease end", l.unknown);
        }
        line += &format!(
            "), at most {} holders at once, longest wait with the lock held by nobody {} ms, {} waiters passed over",
            s.max_holders,
            s.longest_unheld_wait_us / 1000,
            s.starved
        );
        line
    }
}

#[cfg(test)]
mod tests {
    use super::upstream;

    #[test]
    fn several_hosts_get_no_proxy_and_no_error() {
        // Before: "bad backend URL `redlock://…`: invalid port number".
        for u in [
            "redlock://127.0.0.1:21380,127.0.0.1:21381,127.0.0.1:21382",
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
            "etcd://127.0.0.1:2379,127.0.0.1:2380/prefix",
        ] {
            assert!(matches!(upstream(u), Ok(None)), "{u}");
        }
        let one = upstream("redis://127.0.0.1:6390").expect("one host");
        assert_eq!(one.map(|u| u.target.port()), Some(6390));
    }
}
