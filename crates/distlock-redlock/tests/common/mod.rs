//! A Redlock cluster of real redis-server processes for the tests.
#![allow(dead_code)]

use distlock_core::{Client, ClientOptions, LockGuard, Result};
use distlock_redlock::RedlockBackend;
use distlock_testkit::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// N independent redis-servers on free ports.
pub struct Cluster {
    pub servers: Vec<RedisServer>,
    started: Instant,
}

impl Cluster {
    pub fn start(n: usize) -> Cluster {
        let servers = (0..n)
            .map(|_| RedisServer::start().expect("start redis-server"))
            .collect();
        Cluster {
            servers,
            started: Instant::now(),
        }
    }

    /// `redlock://127.0.0.1:P1,…?PARAMS`.
    pub fn url(&self, params: &str) -> String {
        let hosts: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redlock://{}?{params}", hosts.join(","))
    }

    /// Waits until every server has been up for a whole second by its own count, so a
    /// quarantine of at most 1 s does not apply to servers that just started.
    pub async fn settle(&self) {
        tokio::time::sleep_until((self.started + Duration::from_millis(1000)).into()).await;
        for s in &self.servers {
            if !s.is_running() {
                continue;
            }
            let t = Instant::now();
            loop {
                let info = s.command(&["INFO", "server"]).expect("INFO");
                let up = info
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("uptime_in_seconds:"))
                    .and_then(|u| u.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                if up >= 1 {
                    break;
                }
                assert!(t.elapsed() < Duration::from_secs(5), "uptime stuck at {up}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    pub async fn backend(&self, params: &str, opts: &ClientOptions) -> RedlockBackend {
        RedlockBackend::connect(&self.url(params), opts)
            .await
            .expect("connect redlock")
    }

    pub async fn client(&self, params: &str, opts: ClientOptions) -> Client {
        self.client_and_backend(params, opts).await.0
    }

    pub async fn client_and_backend(
        &self,
        params: &str,
        opts: ClientOptions,
    ) -> (Client, Arc<RedlockBackend>) {
        let b = Arc::new(self.backend(params, &opts).await);
        let c = Client::new(b.clone(), opts).expect("client");
        (c, b)
    }

    /// The node's fencing counter of `name` (0 if none).
    pub fn fence(&self, i: usize, name: &str) -> u64 {
        let v = self.servers[i]
            .command(&["GET", &format!("dlock:{{{name}}}:fence")])
            .expect("GET");
        v.parse().unwrap_or(0)
    }

    /// Whether node `i` has the lock `name`.
    pub fn has_lock(&self, i: usize, name: &str) -> bool {
        self.servers[i]
            .command(&["EXISTS", &format!("dlock:{{{name}}}")])
            .expect("EXISTS")
            == "1"
    }
}

impl Cluster {
    /// Waits until every node in `idx` has the lock `name`. A grant returns once a majority
    /// confirmed it; the slower nodes' votes finish in the background, so they may get their
    /// hold a moment later (on a loaded machine).
    pub async fn wait_held_on(&self, idx: &[usize], name: &str, within: Duration) {
        let t = Instant::now();
        loop {
            let missing: Vec<usize> = idx
                .iter()
                .copied()
                .filter(|&i| !self.has_lock(i, name))
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                t.elapsed() < within,
                "nodes {missing:?} never got the hold of {name}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Waits until `count` nodes of `b` count toward a majority.
pub async fn wait_counting(b: &RedlockBackend, count: usize, within: Duration) {
    let t = Instant::now();
    loop {
        let st = b.node_status();
        if st.iter().filter(|s| s.counts).count() >= count {
            return;
        }
        assert!(t.elapsed() < within, "nodes never counted: {st:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `b` counts the nodes `idx` again with their current processes (after a
/// restart: detected, seeded, out of quarantine).
pub async fn wait_recounted(b: &RedlockBackend, c: &Cluster, idx: &[usize], within: Duration) {
    let runs: Vec<String> = idx
        .iter()
        .map(|&i| c.servers[i].run_id().expect("run id"))
        .collect();
    let t = Instant::now();
    loop {
        let st = b.node_status();
        if idx
            .iter()
            .zip(&runs)
            .all(|(&i, r)| st[i].counts && st[i].run_id.as_ref() == Some(r))
        {
            return;
        }
        assert!(
            t.elapsed() < within,
            "restarted nodes not counted again: {st:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Options for fault tests: short watchdog lease, default (3 s) per-call timeout, so that a
/// call bounded by the node timeout is told apart from one bounded by the call timeout.
pub fn opts(lease_ms: u64) -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(Duration::from_millis(lease_ms))
        .connect_timeout(Duration::from_secs(3))
}

/// Strictly increasing?
pub fn assert_increasing(tokens: &[u64]) {
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing: {tokens:?}"
    );
}

impl Cluster {
    /// Waits until every running node's clock is in a later step of a vote's clock floor
    /// ([`distlock_redis::QUORUM_FLOOR_STEP`]) than `token`: a counter rolled back now is then
    /// a step old, as a node's restart quarantine makes every loss of its data.
    pub async fn wait_past_floor_step(&self, token: u64) {
        let step = distlock_redis::QUORUM_FLOOR_STEP.as_micros() as u64;
        let t = Instant::now();
        for s in self.servers.iter().filter(|s| s.is_running()) {
            loop {
                let time = s.command(&["TIME"]).expect("TIME");
                let (secs, micros) = time.split_once('\n').expect("TIME: two numbers");
                let secs: u64 = secs.trim().parse().expect("seconds");
                let micros: u64 = micros.trim().parse().expect("microseconds");
                if (secs * 1_000_000 + micros) / step > token / step {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "the clock stood still"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Deletes the lock's hash on every running node; how many had it.
    pub fn break_lock(&self, name: &str) -> usize {
        self.servers
            .iter()
            .filter(|s| s.is_running())
            .filter(|s| {
                s.command(&["DEL", &format!("dlock:{{{name}}}")])
                    .expect("DEL")
                    == "1"
            })
            .count()
    }
}

impl Cluster {
    /// The length of node `i`'s wait queue of `name`.
    pub fn queued_on(&self, i: usize, name: &str) -> usize {
        self.servers[i]
            .command(&["ZCARD", &format!("dlock:{{{name}}}:rlq")])
            .expect("ZCARD")
            .parse()
            .expect("ZCARD is a number")
    }

    /// Deletes the lock's hash on node `i` (as if its lease had run out there only).
    pub fn break_lock_on(&self, i: usize, name: &str) {
        assert_eq!(
            self.servers[i]
                .command(&["DEL", &format!("dlock:{{{name}}}")])
                .expect("DEL"),
            "1",
            "node {i} did not have {name}"
        );
    }
}

/// `name` acquired through `client` (waiting without a bound).
pub async fn acquired(client: &Client, name: &str) -> LockGuard {
    client
        .lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire")
}

/// `name` acquired through `client`, waiting at most `secs` seconds.
pub async fn acquire_within(client: &Client, name: &str, secs: u64) -> Result<LockGuard> {
    client
        .lock(name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(secs))
        .await
}

/// Node `i`'s `PTTL` of the lock `name` (ms; -2 if it has none).
pub fn pttl(c: &Cluster, i: usize, name: &str) -> i64 {
    c.servers[i]
        .command(&["PTTL", &format!("dlock:{{{name}}}")])
        .expect("PTTL")
        .parse()
        .expect("PTTL is a number")
}

/// Calls of `EVALSHA` the server has run so far (`INFO commandstats`), failed ones included.
pub fn evalsha_calls(s: &RedisServer) -> u64 {
    s.command_calls("evalsha").expect("INFO commandstats")
}

impl Cluster {
    /// The length of node `i`'s wait queue of election `name`.
    pub fn queued_on_election(&self, i: usize, name: &str) -> usize {
        self.servers[i]
            .command(&["ZCARD", &format!("dlock:{{{name}}}:election:rlq")])
            .expect("ZCARD")
            .parse()
            .expect("ZCARD is a number")
    }
}
