//! `cargo bench -p distlock-redis`: dlock on one real redis-server, against a plain PING round
//! trip measured in the same run (the machine is shared and noisy; ratios travel, absolute
//! figures do not).
//!
//! - uncontended: one client, acquire + release in a loop;
//! - handoff: a waiter subscribed on the lock, time from the holder's release call to the
//!   waiter's grant;
//! - contended: 32 clients on one name, critical sections per second, acquire wait p50/p99.
//!
//! Each phase also prints the server time per operation (`INFO commandstats` after a
//! `CONFIG RESETSTAT`: the time of the commands the client sends, EVALSHA including the calls
//! of its script; the count includes those calls) and this process's CPU time per operation
//! (user and system, from `/proc/self/stat`; the server is another process). For syscalls
//! per operation run the binary under `strace -c -f` with `--uncontended` (only the
//! uncontended phases) or `--pairs` (only acquire+release through the client, after the
//! warm-up: compare two runs with `--quick` and without, 300 and 3000 pairs). `--in-task` runs
//! everything from a spawned task instead of the main thread (see `main`).

use distlock_core::{Client, ClientOptions};
use distlock_redis::RedisBackend;
use distlock_testkit::RedisServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// This process's user and system CPU time so far, in microseconds (`/proc/self/stat`, clock
/// ticks of 10 ms: phases run long enough for that to be fine-grained).
fn cpu_us() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the `(comm)`, which may hold spaces: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let tick = 1e6 / 100.0;
    (
        f.get(11).copied().unwrap_or(0.0) * tick,
        f.get(12).copied().unwrap_or(0.0) * tick,
    )
}

/// Server and client cost of one phase of the bench.
struct Phase<'a> {
    server: &'a RedisServer,
    cpu: (f64, f64),
}

impl<'a> Phase<'a> {
    fn start(server: &'a RedisServer) -> Self {
        server.command(&["CONFIG", "RESETSTAT"]).expect("resetstat");
        Phase {
            server,
            cpu: cpu_us(),
        }
    }

    /// Prints server µs, commands and client CPU per operation for `ops` operations.
    fn end(self, what: &str, ops: usize) -> (f64, f64) {
        let (u, s) = cpu_us();
        let (user, sys) = (u - self.cpu.0, s - self.cpu.1);
        let info = self
            .server
            .command(&["INFO", "commandstats"])
            .expect("commandstats");
        let (mut usec, mut calls) = (0.0, 0.0);
        let mut detail = Vec::new();
        for line in info.lines() {
            // cmdstat_evalsha:calls=2,usec=18,usec_per_call=9.00,...
            let Some((name, fields)) = line.trim().split_once(':') else {
                continue;
            };
            let Some(name) = name.strip_prefix("cmdstat_") else {
                continue;
            };
            if matches!(name, "config" | "info") {
                continue;
            }
            let field = |k: &str| -> f64 {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            if name == "evalsha" {
                detail.push(format!("evalsha {:.1} us/call", field("usec_per_call")));
            }
            // Commands the scripts call are counted both on their own and inside EVALSHA's
            // time: sum the client's own commands only.
            if matches!(
                name,
                "evalsha" | "ping" | "subscribe" | "unsubscribe" | "wait"
            ) {
                usec += field("usec");
            }
            calls += field("calls");
            detail.push(format!("{name} {:.2}", field("calls") / ops as f64));
        }
        let n = ops as f64;
        println!(
            "  {what}: server {:.1} us/op ({:.2} commands/op: {}), client cpu {:.1} us/op (user {:.1}, sys {:.1})",
            usec / n,
            calls / n,
            detail.join(", "),
            (user + sys) / n,
            user / n,
            sys / n
        );
        (usec / n, (user + sys) / n)
    }
}

async fn client(url: &str) -> (Client, Arc<RedisBackend>) {
    let opts = ClientOptions::default();
    let b = Arc::new(RedisBackend::connect(url, &opts).await.expect("connect"));
    (Client::new(b.clone(), opts).expect("client"), b)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `--in-task`: every phase from a spawned task (a worker thread, where redis-rs's
    // connection task runs too), as an application's tasks run, instead of the main thread's
    // `block_on`, where every request wakes a worker thread and the reply wakes the main one
    // (about 8 futex calls per acquire+release, more than half of the client's syscalls).
    if std::env::args().any(|a| a == "--in-task") {
        tokio::spawn(run()).await.expect("bench task");
    } else {
        run().await;
    }
}

async fn run() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 300 } else { 3000 };
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let (c, backend) = client(&url).await;

    // Warm up connections and scripts.
    for _ in 0..200 {
        backend.ping().await.expect("ping");
        let g = c
            .lock("warm")
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        let _ = g.release().await.expect("release");
    }

    if std::env::args().any(|a| a == "--pairs") {
        // Only `n` acquire+release pairs through the client (for `strace -c -f`: syscalls of
        // the start-up and the warm-up are the same with and without the lock).
        let lock = c.lock("pairs").expect("lock");
        for _ in 0..n {
            let g = lock.acquire().await.expect("acquire");
            let _ = g.release().await.expect("release");
        }
        return;
    }

    let mut ping = Vec::with_capacity(n);
    let phase = Phase::start(&server);
    for _ in 0..n {
        let t = Instant::now();
        backend.ping().await.expect("ping");
        ping.push(t.elapsed());
    }
    let (ping_srv, ping_cpu) = phase.end("PING", n);
    let lock = c.lock("uncontended").expect("lock");
    let mut pair = Vec::with_capacity(n);
    let phase = Phase::start(&server);
    for _ in 0..n {
        let t = Instant::now();
        let g = lock.acquire().await.expect("acquire");
        let _ = g.release().await.expect("release");
        pair.push(t.elapsed());
    }
    let (pair_srv, pair_cpu) = phase.end("acquire+release", n);
    let try_lock = c.lock("uncontended-try").expect("lock");
    let mut tries = Vec::with_capacity(n);
    let phase = Phase::start(&server);
    for _ in 0..n {
        let t = Instant::now();
        let g = try_lock.try_acquire().await.expect("try").expect("free");
        let _ = g.release().await.expect("release");
        tries.push(t.elapsed());
    }
    phase.end("try_acquire+release", n);
    // The same pair through the backend trait alone (no guard, no watchdog bookkeeping).
    use distlock_core::Backend;
    let key = distlock_core::backend::HoldKey::new("raw", "bench", distlock_core::LockKind::Mutex);
    let mut raw = Vec::with_capacity(n);
    let phase = Phase::start(&server);
    for _ in 0..n {
        // One attempt per acquisition, as the core makes them.
        let req = distlock_core::backend::AcquireRequest::new(
            key.clone(),
            Duration::from_secs(30),
            distlock_core::LostSignal::new(),
        );
        let t = Instant::now();
        let token = match backend.acquire(&req).await.expect("acquire") {
            distlock_core::backend::AcquireReply::Granted { token } => token,
            other => panic!("not granted: {other:?}"),
        };
        let _ = backend.release(&req.grant(token)).await.expect("release");
        raw.push(t.elapsed());
    }
    phase.end("backend acquire+release", n);
    // The floors under it, on a plain redis-rs connection manager of their own: rslock's
    // protocol (SET NX PX, then a compare-and-delete script) and dlock's two scripts sent
    // without any dlock code. Their difference is what the scripts cost on the server; the
    // backend's time over the second is its client code.
    let mut con = redis::Client::open(url.as_str())
        .expect("client")
        .get_connection_manager()
        .await
        .expect("connection manager");
    let unlock = redis::Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    );
    // As src/scripts.rs builds them: the uncontended paths around the fencing-token prelude.
    let margin = format!(
        "local FENCE_MARGIN_MS = {}\n",
        distlock_redis::FENCE_MARGIN.as_millis()
    );
    let acquire_lua = redis::Script::new(
        &[
            margin.as_str(),
            include_str!("../scripts/fence.lua"),
            include_str!("../scripts/acquire.lua"),
            include_str!("../scripts/fence_next.lua"),
            include_str!("../scripts/queue.lua"),
            include_str!("../scripts/acquire_wait.lua"),
        ]
        .concat(),
    );
    let release_lua = redis::Script::new(
        &[
            include_str!("../scripts/release.lua"),
            margin.as_str(),
            include_str!("../scripts/fence.lua"),
            include_str!("../scripts/fence_next.lua"),
            include_str!("../scripts/release_handoff.lua"),
        ]
        .concat(),
    );
    // acquire.lua's keys: the lock and the attempt's end record (one attempt id: never
    // ended); release.lua's: the lock.
    let keys = ["", ":ended:warm"].map(|s| format!("dlock:{{floor}}{s}"));
    for _ in 0..100 {
        let _: () = unlock
            .key("warm")
            .arg("x")
            .invoke_async(&mut con)
            .await
            .map(|_: i64| ())
            .expect("unlock");
        let _: i64 = acquire_lua
            .key(&keys[..])
            .arg(&["warm", "bench", "30000", "2000:0:"])
            .invoke_async(&mut con)
            .await
            .expect("acquire.lua");
        let _: i64 = release_lua
            .key(&keys[0])
            .arg(&["warm", "", "5"])
            .invoke_async(&mut con)
            .await
            .expect("release.lua");
    }
    let mut setnx = Vec::with_capacity(n);
    let phase = Phase::start(&server);
    for i in 0..n {
        let value = format!("v{i}");
        let t = Instant::now();
        let ok: Option<String> = redis::cmd("SET")
            .arg("setnx-floor")
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut con)
            .await
            .expect("SET NX");
        assert!(ok.is_some(), "SET NX refused");
        let deleted: i64 = unlock
            .key("setnx-floor")
            .arg(&value)
            .invoke_async(&mut con)
            .await
            .expect("unlock");
        assert_eq!(deleted, 1);
        setnx.push(t.elapsed());
    }
    phase.end("SET NX PX + compare-and-delete (rslock's protocol)", n);
    let mut scripts = Vec::with_capacity(n);
    let phase = Phase::start(&server);
    for i in 0..n {
        let attempt = format!("{i:032x}");
        let t = Instant::now();
        // acquire.lua answers the token (> 0) of a grant; release.lua 1 for released.
        let token: i64 = acquire_lua
            .key(&keys[..])
            .arg(&[attempt.as_str(), "bench", "30000", "2000:0:"])
            .invoke_async(&mut con)
            .await
            .expect("acquire.lua");
        assert!(token > 0, "not granted: {token}");
        let token = token.to_string();
        let released: i64 = release_lua
            .key(&keys[0])
            .arg(&[attempt.as_str(), token.as_str(), "5"])
            .invoke_async(&mut con)
            .await
            .expect("release.lua");
        assert_eq!(released, 1);
        scripts.push(t.elapsed());
    }
    phase.end("dlock's two scripts, no dlock code", n);
    let setnx50 = pct(&mut setnx, 0.5);
    let scripts50 = pct(&mut scripts, 0.5);
    let raw50 = pct(&mut raw, 0.5);
    let ping50 = pct(&mut ping, 0.5);
    let pair50 = pct(&mut pair, 0.5);
    let try50 = pct(&mut tries, 0.5);
    println!("PING round trip            p50 {:>8.1} us", us(ping50));
    println!(
        "SET NX + compare-and-delete p50 {:>7.1} us  = {:.2} PING round trips (rslock's protocol, plain redis-rs)",
        us(setnx50),
        us(setnx50) / us(ping50)
    );
    println!(
        "dlock's scripts, raw       p50 {:>8.1} us  = {:.2} PING round trips (plain redis-rs)",
        us(scripts50),
        us(scripts50) / us(ping50)
    );
    println!(
        "backend acquire+release    p50 {:>8.1} us  = {:.2} PING round trips (two EVALSHAs)",
        us(raw50),
        us(raw50) / us(ping50)
    );
    println!(
        "acquire+release (1 client) p50 {:>8.1} us  = {:.2} PING round trips (goal <= 2.5)",
        us(pair50),
        us(pair50) / us(ping50)
    );
    println!(
        "try_acquire+release        p50 {:>8.1} us  = {:.2} PING round trips",
        us(try50),
        us(try50) / us(ping50)
    );
    println!(
        "acquire+release cost       server {:.2}x PING's, client cpu {:.2}x PING's",
        pair_srv / ping_srv.max(0.01),
        pair_cpu / ping_cpu.max(0.01)
    );

    if std::env::args().any(|a| a == "--uncontended") {
        // Only the phases above (e.g. for `strace -c -f`).
        return;
    }

    // Handoff: holder releases while a waiter (own client) waits.
    let (w, _) = client(&url).await;
    let rounds = if quick { 50 } else { 300 };
    let mut handoff = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let name = format!("handoff-{i}");
        let g = c
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        let wl = w.lock(&name).expect("lock");
        let waiter = tokio::spawn(async move {
            let g = wl.acquire().await.expect("waiter");
            let at = Instant::now();
            let _ = g.release().await;
            at
        });
        // Let the waiter try once and subscribe. Spin rather than sleep: after an idle sleep
        // the first wake-up of parked threads and of the server costs more than the handoff
        // itself on a VM, which PING in a tight loop does not pay either.
        let until = Instant::now() + Duration::from_millis(2);
        while Instant::now() < until {
            backend.ping().await.expect("ping");
        }
        let t0 = Instant::now();
        let _ = g.release().await.expect("release");
        let got = waiter.await.expect("join");
        handoff.push(got.saturating_duration_since(t0));
    }
    let h50 = pct(&mut handoff, 0.5);
    println!(
        "handoff to a waiter        p50 {:>8.1} us  = {:.2} PING round trips (goal <= 3)",
        us(h50),
        us(h50) / us(ping50)
    );

    // 32 contenders, each its own client.
    let clients = 32;
    let dur = Duration::from_secs(if quick { 1 } else { 5 });
    let mut tasks = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(client(&url).await.0);
    }
    let start = Instant::now() + Duration::from_millis(200);
    for cl in conns {
        tasks.push(tokio::spawn(async move {
            let lock = cl.lock("contended").expect("lock");
            tokio::time::sleep_until(start.into()).await;
            let mut waits = Vec::new();
            while start.elapsed() < dur {
                let t = Instant::now();
                let g = lock.acquire().await.expect("acquire");
                waits.push(t.elapsed());
                let _ = g.release().await.expect("release");
            }
            waits
        }));
    }
    let mut waits = Vec::new();
    let mut per_client = Vec::new();
    tokio::time::sleep_until(start.into()).await;
    let phase = Phase::start(&server);
    for t in tasks {
        let w = t.await.expect("join");
        per_client.push(w.len());
        waits.extend(w);
    }
    let ops = waits.len();
    phase.end("32 contenders", ops);
    let p50 = pct(&mut waits, 0.5);
    let p99 = pct(&mut waits, 0.99);
    println!(
        "32 contenders: {:.0} critical sections/s, wait p50 {:.0} us p99 {:.0} us, per-client ops min {} max {}",
        ops as f64 / dur.as_secs_f64(),
        us(p50),
        us(p99),
        per_client.iter().min().copied().unwrap_or(0),
        per_client.iter().max().copied().unwrap_or(0)
    );
}
