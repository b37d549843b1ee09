//! `cargo bench -p distlock-redis --bench watchdog`: the watchdog at scale. One client holds
//! 10,000 locks (`--holds N`) with a 3 s watchdog lease (renewed every second) on one real
//! redis-server, and the bench watches several ticks (`--ticks T`, default 5; `--quick`: 2,000
//! holds, 3 ticks). It prints, per tick:
//!
//! - the round trips: `Backend::renew` calls seen by a counting wrapper around the backend
//!   (each call is one pipeline, so one round trip), and on the server the `EVALSHA` calls
//!   and all commands processed (`INFO commandstats` / `total_commands_processed` deltas after
//!   a `CONFIG RESETSTAT`; commands the scripts call count in the latter), with the goal
//!   ≤ ceil(N/1000);
//! - how the chunks are spread: offset of each chunk's send from the tick's first, holds per
//!   chunk, each call's latency, the server's time per script;
//! - the tick's duration (first send to last reply) against lease/3;
//! - this process's CPU time per tick;
//!
//! and the resident set size (`VmRSS` of `/proc/self/status`) after connecting, after
//! acquiring and after the ticks, with the goal < 50 MB.

use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, Backend, Capabilities, GrantRef, LockInfo, LockKind,
    ReleaseOutcome, ReleaseWatch, RenewOutcome,
};
use distlock_core::{Client, ClientOptions, LockGuard, Result};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One `renew` call: when it started, how long it took, how many holds it carried.
#[derive(Clone, Copy)]
struct Call {
    start: Instant,
    took: Duration,
    holds: usize,
}

/// The Redis backend, with every `renew` call recorded.
struct Counting {
    inner: RedisBackend,
    calls: Mutex<Vec<Call>>,
}

#[async_trait]
impl Backend for Counting {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn endpoint(&self) -> String {
        self.inner.endpoint()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.inner.acquire(req).await
    }
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.inner.watch(req).await
    }
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.inner.give_up(req).await
    }
    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.inner.release(grant).await
    }
    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        let start = Instant::now();
        let r = self.inner.renew(holds).await;
        let call = Call {
            start,
            took: start.elapsed(),
            holds: holds.len(),
        };
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(call);
        r
    }
    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.inner.inspect(name, kind).await
    }
}

/// `VmRSS` of this process in MB.
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// This process's user + system CPU time so far, in ms (`/proc/self/stat`, 10 ms ticks).
fn cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) * 10.0
}

/// A field of `INFO` (`name:value` lines) as a number.
fn info_field(info: &str, section_line: &str, field: &str) -> f64 {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(section_line))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn arg(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let holds = arg("--holds").unwrap_or(if quick { 2_000 } else { 10_000 });
    let ticks = arg("--ticks").unwrap_or(if quick { 3 } else { 5 });
    let lease = Duration::from_secs(3);
    let interval = lease / 3;
    let server = RedisServer::start().expect("redis-server");
    let opts = ClientOptions::default()
        .namespace("wdbench")
        .watchdog_lease(lease);
    let inner = RedisBackend::connect(&server.url(), &opts)
        .await
        .expect("connect");
    let backend = Arc::new(Counting {
        inner,
        calls: Mutex::new(Vec::new()),
    });
    let client = Client::new(backend.clone(), opts).expect("client");
    let rss_connected = rss_mb();

    // Acquire, 32 at a time.
    let t = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(holds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..holds {
        let c = client.clone();
        tasks.spawn(async move {
            c.lock(&format!("lock-{i}"))
                .expect("lock")
                .acquire()
                .await
                .expect("acquire")
        });
        if tasks.len() >= 32 {
            guards.push(tasks.join_next().await.expect("task").expect("join"));
        }
    }
    while let Some(g) = tasks.join_next().await {
        guards.push(g.expect("join"));
    }
    let acquire_took = t.elapsed();
    let rss_acquired = rss_mb();
    println!(
        "watchdog: {holds} locks held by one client, lease {lease:?} (renewed every {interval:?}), acquired in {:.0} ms",
        ms(acquire_took)
    );

    // Let the first tick pass (it may load the script), then watch `ticks` ticks.
    let first = backend.calls.lock().expect("calls").len();
    while backend.calls.lock().expect("calls").len() == first {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(interval / 2).await;
    server.command(&["CONFIG", "RESETSTAT"]).expect("resetstat");
    let from = backend.calls.lock().expect("calls").len();
    let cpu = cpu_ms();
    let watched = Instant::now();
    tokio::time::sleep(interval * ticks as u32).await;
    let wall = watched.elapsed();
    let cpu = cpu_ms() - cpu;
    let info = server.command(&["INFO", "all"]).expect("INFO");
    let calls: Vec<Call> = backend.calls.lock().expect("calls")[from..].to_vec();

    // Group the calls into ticks: a new tick where a call starts more than half an interval
    // after the previous one.
    let mut rounds: Vec<Vec<Call>> = Vec::new();
    for c in calls {
        match rounds.last_mut() {
            Some(r) if c.start.duration_since(r[r.len() - 1].start) < interval / 2 => r.push(c),
            _ => rounds.push(vec![c]),
        }
    }
    let goal_trips = holds.div_ceil(1000);
    let mut worst_tick = Duration::ZERO;
    let mut worst_trips = 0;
    for (i, r) in rounds.iter().enumerate() {
        let t0 = r[0].start;
        let end = r
            .iter()
            .map(|c| c.start + c.took)
            .max()
            .unwrap_or(t0)
            .duration_since(t0);
        worst_tick = worst_tick.max(end);
        worst_trips = worst_trips.max(r.len());
        let offsets: Vec<String> = r
            .iter()
            .map(|c| {
                format!(
                    "+{:.0}ms {}h {:.1}ms",
                    ms(c.start.duration_since(t0)),
                    c.holds,
                    ms(c.took)
                )
            })
            .collect();
        println!(
            "  tick {i}: {} round trips, {} holds, done in {:.1} ms ({:.1}% of lease/3); chunks [{}]",
            r.len(),
            r.iter().map(|c| c.holds).sum::<usize>(),
            ms(end),
            100.0 * end.as_secs_f64() / interval.as_secs_f64(),
            offsets.join(", ")
        );
    }
    let n = rounds.len().max(1) as f64;
    let evalsha = info_field(&info, "cmdstat_evalsha:", "calls");
    let evalsha_us = info_field(&info, "cmdstat_evalsha:", "usec_per_call");
    let total = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("total_commands_processed:"))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    // What a client sends (the commands the scripts call are counted on their own too).
    let client_cmds: f64 = [
        "evalsha",
        "eval",
        "ping",
        "script",
        "subscribe",
        "unsubscribe",
    ]
    .iter()
    .map(|c| info_field(&info, &format!("cmdstat_{c}:"), "calls"))
    .sum();
    println!(
        "  per tick over {} ticks ({:.2} s): {:.1} round trips (client side), server: {:.1} EVALSHA ({:.0} us each, {:.1} ms of server time), {:.1} client commands, {:.0} commands processed incl. those the scripts call; client cpu {:.1} ms/tick",
        rounds.len(),
        wall.as_secs_f64(),
        rounds.iter().map(Vec::len).sum::<usize>() as f64 / n,
        evalsha / n,
        evalsha_us,
        evalsha * evalsha_us / n / 1e3,
        client_cmds / n,
        (total - 2.0) / n, // less CONFIG RESETSTAT and this INFO
        cpu / n,
    );
    let rss_after = rss_mb();
    println!(
        "  rss: {rss_connected:.1} MB connected, {rss_acquired:.1} MB with {holds} locks, {rss_after:.1} MB after {} ticks",
        rounds.len()
    );
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "  goals: round trips/tick {worst_trips} ≤ {goal_trips}: {}; rss {:.1} MB < 50 MB: {}; slowest tick {:.1} ms = {:.2} × lease/3: {}",
        verdict(worst_trips <= goal_trips && !rounds.is_empty()),
        rss_after.max(rss_acquired),
        verdict(rss_after.max(rss_acquired) < 50.0),
        ms(worst_tick),
        worst_tick.as_secs_f64() / interval.as_secs_f64(),
        verdict(worst_tick < interval / 2),
    );
    assert!(guards.iter().all(|g| !g.is_lost()), "a lock was lost");
    let t = Instant::now();
    for g in guards {
        let _ = g.release().await.expect("release");
    }
    println!(
        "  released {holds} in {:.0} ms; holds left {}",
        ms(t.elapsed()),
        client.held_count()
    );
}
