//! `cargo bench -p distlock-redlock [-- --quick] [--contended]`: Redlock on 5 real redis-servers next to the
//! single-node Redis backend, measured in the same run (the machine is shared and noisy;
//! ratios travel, absolute figures do not).
//!
//! - the fan-out floor: 5 parallel PINGs vs 1 PING. On a machine with fewer cores than
//!   redis-servers the five servers and the client share the CPUs, so even a parallel fan-out
//!   costs several times one round trip; this is the ratio to judge the next one by;
//! - uncontended: one client, acquire + release in a loop, 5 nodes vs 1 (interleaved in
//!   blocks so both see the same machine), on loopback and over links with 1 ms of delay
//!   each way (where the network, not the CPU, dominates, as between real hosts); the goal
//!   is a ratio within 1.5x, because the fan-out to the nodes is parallel;
//! - contended: 32 clients on one name, critical sections per second, acquire wait p50/p99,
//!   per-client grants min/max and give-ups (an acquire not granted within 10 s), for one
//!   `redis://` node (the baseline), Redlock without a queue (`wait=retry`: every release
//!   wakes every waiter, the behaviour before the queue) and Redlock with the nodes' queues
//!   (the default), all in this run (with a mutual-exclusion check);
//! - renewals (`-- --renew [N]`, only this scenario): one client holds N locks (10,000 by
//!   default) on the 5 nodes with a 3 s watchdog lease; per node and tick, from the server's
//!   `INFO commandstats` after `CONFIG RESETSTAT`: `EVALSHA` calls (the goal: at most
//!   ceil(N/1000), one script per chunk), µs per script, and all commands processed.
//! - `-- --profile [PAIRS]` (only this): PAIRS (default 1,000) uncontended acquire+release pairs
//!   on the 5 nodes, then this process's CPU per pair and, per node, every command's calls and
//!   µs per call (`INFO commandstats`); run it under callgrind to count the client's
//!   instructions (two runs of different PAIRS, the difference per pair).

use distlock_core::{Client, ClientOptions, ReleaseOutcome};
use distlock_redis::RedisBackend;
use distlock_redlock::RedlockBackend;
use distlock_testkit::{DelayProxy, RedisServer};
use futures_util::future::join_all;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mean(v: &[Duration]) -> Duration {
    v.iter().sum::<Duration>() / v.len().max(1) as u32
}

async fn single(url: &str) -> Client {
    let opts = ClientOptions::default();
    let b = RedisBackend::connect(url, &opts).await.expect("connect");
    Client::new(Arc::new(b), opts).expect("client")
}

async fn redlock(url: &str) -> Client {
    let opts = ClientOptions::default();
    let b = RedlockBackend::connect(url, &opts).await.expect("connect");
    Client::new(Arc::new(b), opts).expect("client")
}

async fn pair(c: &Client, name: &str) -> Duration {
    let t = Instant::now();
    let g = c
        .lock(name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let _ = g.release().await.expect("release");
    t.elapsed()
}

/// Interleaved acquire+release pairs on `s` (one node) and `r` (5 nodes), printed.
async fn uncontended(label: &str, s: &Client, r: &Client, blocks: usize, per_block: usize) {
    for _ in 0..50 {
        pair(s, "warm").await;
        pair(r, "warm").await;
    }
    let (mut ts, mut tr) = (Vec::new(), Vec::new());
    for _ in 0..blocks {
        for _ in 0..per_block {
            ts.push(pair(s, "uncontended").await);
        }
        for _ in 0..per_block {
            tr.push(pair(r, "uncontended").await);
        }
    }
    let (ms, mr) = (mean(&ts), mean(&tr));
    let (s50, r50) = (pct(&mut ts, 0.5), pct(&mut tr, 0.5));
    let (s99, r99) = (pct(&mut ts, 0.99), pct(&mut tr, 0.99));
    println!(
        "uncontended acquire+release, {label} ({} pairs each, interleaved):",
        blocks * per_block
    );
    println!(
        "  redis (1 node):    p50 {:8.1} us  p99 {:8.1} us  mean {:8.1} us",
        us(s50),
        us(s99),
        us(ms)
    );
    println!(
        "  redlock (5 nodes): p50 {:8.1} us  p99 {:8.1} us  mean {:8.1} us",
        us(r50),
        us(r99),
        us(mr)
    );
    println!(
        "  ratio 5 nodes / 1 node: p50 {:.2}x  mean {:.2}x  (goal: within 1.5x)",
        us(r50) / us(s50),
        us(mr) / us(ms)
    );
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

struct Contended {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    grants: usize,
    min: usize,
    max: usize,
    give_ups: usize,
}

/// `clients` clients (one task each) take `name` for `run`; returns throughput and waits.
async fn contend(clients: Vec<Client>, name: &str, run: Duration) -> Contended {
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(Mutex::new(Vec::new()));
    let give_ups = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let started = Instant::now();
    for c in clients {
        let (stop, inside, waits, name, give_ups) = (
            stop.clone(),
            inside.clone(),
            waits.clone(),
            name.to_owned(),
            give_ups.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let lock = c.lock(&name).expect("lock");
            let mut mine = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let g = match lock.acquire_timeout(Duration::from_secs(10)).await {
                    Ok(g) => g,
                    Err(_) => {
                        give_ups.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let waited = t.elapsed();
                mine += 1;
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(
                    g.release().await.expect("release"),
                    ReleaseOutcome::Released
                );
                waits.lock().expect("waits").push(waited);
            }
            mine
        }));
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_client = Vec::new();
    for t in tasks {
        per_client.push(t.await.expect("task"));
    }
    let elapsed = started.elapsed();
    let mut w = waits.lock().expect("waits").clone();
    Contended {
        per_sec: w.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(&mut w, 0.5),
        p99: pct(&mut w, 0.99),
        grants: w.len(),
        min: per_client.iter().copied().min().unwrap_or(0),
        max: per_client.iter().copied().max().unwrap_or(0),
        give_ups: give_ups.load(Ordering::Relaxed) as usize,
    }
}

/// `cmdstat_evalsha` calls and µs per call, and `total_commands_processed`, of one server.
fn script_stats(s: &RedisServer) -> (u64, f64, u64) {
    let cmd = s.command(&["INFO", "commandstats"]).expect("INFO");
    let field = |line: &str, name: &str| -> Option<String> {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name).map(str::to_owned))
    };
    let line = cmd
        .lines()
        .find_map(|l| l.trim().strip_prefix("cmdstat_evalsha:").map(str::to_owned))
        .unwrap_or_default();
    let calls = field(&line, "calls=")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let per = field(&line, "usec_per_call=")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let stats = s.command(&["INFO", "stats"]).expect("INFO");
    let total = stats
        .lines()
        .find_map(|l| l.trim().strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (calls, per, total)
}

/// CPU time (user + system) of this process so far, from `/proc/self/stat` (clock ticks).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15 of the line (11 and 12 after the state).
    let ticks = f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// `pairs` uncontended acquire+release pairs on the nodes, then the client's CPU per pair
/// and each node's commands (calls, µs per call) over them.
async fn profile(nodes: &[RedisServer], url: &str, pairs: usize) {
    let c = redlock(url).await;
    for _ in 0..100 {
        pair(&c, "profile").await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for s in nodes {
        s.command(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    }
    let (t, cpu) = (Instant::now(), cpu_time());
    for _ in 0..pairs {
        pair(&c, "profile").await;
    }
    let (took, cpu) = (t.elapsed(), cpu_time().saturating_sub(cpu));
    println!(
        "profile: {pairs} pairs, {:.1} us per pair, client CPU {:.1} us per pair",
        us(took) / pairs as f64,
        us(cpu) / pairs as f64
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (i, s) in nodes.iter().enumerate() {
        let stats = s.command(&["INFO", "commandstats"]).expect("INFO");
        let mut line = format!("  node {i}:");
        for l in stats
            .lines()
            .filter_map(|l| l.trim().strip_prefix("cmdstat_"))
        {
            let (name, rest) = l.split_once(':').unwrap_or((l, ""));
            let get = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .unwrap_or("?")
                    .to_owned()
            };
            line += &format!(" {name} {}x{}us", get("calls="), get("usec_per_call="));
        }
        println!("{line}");
    }
}

/// One client holding `n` locks on the nodes with a 3 s watchdog lease: what a tick of
/// renewals costs each node.
async fn renewals(nodes: &[RedisServer], url: &str, n: usize) {
    let lease = Duration::from_secs(3);
    let opts = ClientOptions::default().watchdog_lease(lease);
    let b = RedlockBackend::connect(url, &opts).await.expect("connect");
    let c = Client::new(Arc::new(b), opts).expect("client");
    let t = Instant::now();
    let mut guards = Vec::with_capacity(n);
    for block in (0..n).collect::<Vec<_>>().chunks(64) {
        let got = join_all(block.iter().map(|i| {
            let c = &c;
            async move {
                c.lock(&format!("renew-{i}"))
                    .expect("lock")
                    .acquire()
                    .await
                    .expect("acquire")
            }
        }))
        .await;
        guards.extend(got);
    }
    println!("renewals: {n} locks acquired in {:?}", t.elapsed());
    // Let the acquisitions' last votes land, then count from zero.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for s in nodes {
        s.command(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    }
    let ticks = 6u32;
    let run = lease / 3 * ticks;
    tokio::time::sleep(run).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    println!(
        "  {ticks} ticks ({run:?}), {lost} lost; goal: at most {} scripts per node per tick",
        n.div_ceil(1000)
    );
    for (i, s) in nodes.iter().enumerate() {
        let (calls, per, total) = script_stats(s);
        println!(
            "  node {i}: EVALSHA {:.1}/tick ({calls} in all), {per:.0} us per script, {:.0} commands processed/tick",
            calls as f64 / f64::from(ticks),
            total as f64 / f64::from(ticks)
        );
    }
    drop(guards);
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // Only the contended scenario (`-- --contended`).
    let contended_only = std::env::args().any(|a| a == "--contended");
    let (blocks, per_block, run) = if quick {
        (6, 50, Duration::from_secs(2))
    } else {
        (20, 100, Duration::from_secs(5))
    };
    let nodes: Vec<RedisServer> = (0..5)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    let one = RedisServer::start().expect("redis-server");
    // Fresh servers sit out a restart quarantine; keep it short and let them age past it.
    let hosts: Vec<String> = nodes
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let rl_url = format!("redlock://{}?quarantine=500ms", hosts.join(","));
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--profile") {
        let n = args
            .get(at + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        profile(&nodes, &rl_url, n).await;
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--renew") {
        let n = args
            .get(at + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000);
        renewals(&nodes, &rl_url, n).await;
        return;
    }

    if !contended_only {
        // The fan-out floor.
        let mut pingers = Vec::new();
        for url in nodes.iter().map(|n| n.url()).chain([one.url()]) {
            let b = RedisBackend::connect(&url, &ClientOptions::default())
                .await
                .expect("connect");
            pingers.push(b);
        }
        let (mut p1, mut p5) = (Vec::new(), Vec::new());
        for _ in 0..blocks {
            for _ in 0..per_block {
                let t = Instant::now();
                pingers[5].ping().await.expect("ping");
                p1.push(t.elapsed());
            }
            for _ in 0..per_block {
                let t = Instant::now();
                for r in join_all(pingers[..5].iter().map(|b| b.ping())).await {
                    r.expect("ping");
                }
                p5.push(t.elapsed());
            }
        }
        let (m1, m5) = (mean(&p1), mean(&p5));
        let (a, b) = (pct(&mut p1, 0.5), pct(&mut p5, 0.5));
        println!(
            "fan-out floor on this machine (loopback, {} cores):",
            num_cpus()
        );
        println!(
            "  1 PING p50 {:7.1} us mean {:7.1} us; 5 parallel PINGs p50 {:7.1} us mean {:7.1} us; ratio p50 {:.2}x mean {:.2}x",
            us(a),
            us(m1),
            us(b),
            us(m5),
            us(b) / us(a),
            us(m5) / us(m1)
        );

        let s = single(&one.url()).await;
        let r = redlock(&rl_url).await;
        uncontended("loopback", &s, &r, blocks, per_block).await;

        // The same over links with 1 ms of delay each way.
        let delay = Duration::from_millis(1);
        let proxies: Vec<DelayProxy> = nodes
            .iter()
            .chain([&one])
            .map(|n| DelayProxy::start(n.addr(), delay).expect("proxy"))
            .collect();
        let hosts: Vec<String> = proxies[..5]
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect();
        // A longer node timeout: every answer takes at least 2 ms on these links.
        let slow_url = format!(
            "redlock://{}?quarantine=500ms&node_timeout=25ms",
            hosts.join(",")
        );
        let s2 = single(&format!("redis://127.0.0.1:{}", proxies[5].port())).await;
        let r2 = redlock(&slow_url).await;
        let (b2, pb2) = if quick { (2, 25) } else { (4, 50) };
        uncontended("1 ms links", &s2, &r2, b2, pb2).await;
        drop((s2, r2, proxies));
    }

    let retry_url = format!("{rl_url}&wait=retry");
    let mut single_clients = Vec::new();
    let mut retry_clients = Vec::new();
    let mut queue_clients = Vec::new();
    for _ in 0..32 {
        single_clients.push(single(&one.url()).await);
        retry_clients.push(redlock(&retry_url).await);
        queue_clients.push(redlock(&rl_url).await);
    }
    let cs = contend(single_clients, "contended", run).await;
    let cb = contend(retry_clients, "contended-retry", run).await;
    let cq = contend(queue_clients, "contended-queue", run).await;
    println!("32 contenders on one name for {run:?} (mutual exclusion checked):");
    for (label, c) in [
        ("redis (1 node)", &cs),
        ("redlock, retry (before)", &cb),
        ("redlock, queue (after)", &cq),
    ] {
        println!(
            "  {label:24} {:7.0} grants/s ({} grants)  wait p50 {:9.1} us  p99 {:9.1} us  per-client {}..{} (min/max {:.2})  give-ups {}",
            c.per_sec,
            c.grants,
            us(c.p50),
            us(c.p99),
            c.min,
            c.max,
            c.min as f64 / c.max.max(1) as f64,
            c.give_ups
        );
    }
    println!(
        "  ratio queue / retry: throughput {:.2}x  wait p99 {:.3}x  (same run)",
        cq.per_sec / cb.per_sec,
        us(cq.p99) / us(cb.p99)
    );
    println!(
        "  ratio vs 1 node: retry throughput {:.2}x p99 {:.2}x; queue throughput {:.2}x p99 {:.2}x",
        cb.per_sec / cs.per_sec,
        us(cb.p99) / us(cs.p99),
        cq.per_sec / cs.per_sec,
        us(cq.p99) / us(cs.p99)
    );
}
