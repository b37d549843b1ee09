//! `dlock bench`: lock latency and throughput on any backend.
//!
//! - `uncontended`: one client acquires and releases in a loop over `--keys` names; the
//!   latency is one acquire + release pair.
//! - `contended`: `--clients` clients (each its own `distlock::connect`, as separate processes
//!   would have) take turns on one name; each critical section is a deliberately non-atomic
//!   read + write increment of a counter in the backend's store (a counter next to the locks). Lost mutual
//!   exclusion shows as `violations`: critical sections that overlapped (an in-memory
//!   "inside" counter shared by the clients), plus increments missing from (or extra in) the
//!   final counter, plus releases that found the lock no longer held. The latency is the
//!   acquire wait.
//! - `readheavy`: `--clients` clients on one read-write lock, 90% of the operations reading
//!   the counter under the read side, 10% incrementing it under the write side; the same
//!   load is then run on a plain mutex in the same run, and both are reported (the mutex as
//!   the baseline). A writer overlapping anyone counts as a violation.
//!
//! On `redis://` the run also measures a PING round trip and reports the latency as a
//! multiple of it.
//!
//! Exit code: 0 after a run, also one with errors (they are counted in the report); 1 when
//! mutual exclusion was lost (`violations` > 0) or the run could not be done at all.

use crate::progress::Progress;
use crate::store::{self, Store};
use clap::{Args, ValueEnum};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest wait for one acquisition before it counts as an error.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// PINGs measured on `redis://`.
const PINGS: usize = 200;

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[non_exhaustive]
pub enum Scenario {
    /// One client, acquire + release in a loop over --keys names.
    Uncontended,
    /// --clients clients on one name, a counter increment as the critical section.
    Contended,
    /// --clients clients, 90% reads / 10% writes on a read-write lock, next to a mutex.
    Readheavy,
}

impl Scenario {
    fn as_str(self) -> &'static str {
        match self {
            Scenario::Uncontended => "uncontended",
            Scenario::Contended => "contended",
            Scenario::Readheavy => "readheavy",
        }
    }
}

/// `dlock bench` arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// Clients (contended): each its own connection, taking turns on one lock.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    clients: u32,
    /// How long to measure, e.g. 1s, 10s, 2m.
    #[arg(long, default_value = "5s", value_parser = positive_duration)]
    duration: Duration,
    /// Lock names the uncontended loop cycles through.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    keys: u32,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = crate::duration_arg(s)?;
    if d.is_zero() {
        return Err("the duration must be above zero".into());
    }
    if d > Duration::from_secs(24 * 3600) {
        return Err("the duration must be at most 24h".into());
    }
    Ok(d)
}

/// What one client measured.
#[derive(Default)]
struct ClientResult {
    ops: u64,
    latencies_us: Vec<u64>,
    errors: u64,
    not_held_at_release: u64,
    first_error: Option<String>,
}

impl ClientResult {
    fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        self.first_error.get_or_insert_with(|| e.to_string());
    }
}

/// The whole run.
struct Measured {
    clients: u32,
    elapsed: Duration,
    per_client: Vec<ClientResult>,
    overlaps: u64,
    lost_updates: u64,
    /// Counter increments made (contended and readheavy).
    writes: u64,
}

impl Measured {
    fn ops(&self) -> u64 {
        self.per_client.iter().map(|c| c.ops).sum()
    }

    fn errors(&self) -> u64 {
        self.per_client.iter().map(|c| c.errors).sum()
    }

    fn not_held(&self) -> u64 {
        self.per_client.iter().map(|c| c.not_held_at_release).sum()
    }

    fn violations(&self) -> u64 {
        self.overlaps + self.lost_updates + self.not_held()
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{:x}", std::process::id(), nanos)
}

/// Draws the time-based progress bar until `done` is set.
fn progress_ticker(
    enabled: bool,
    label: &'static str,
    duration: Duration,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut p = Progress::new(enabled, label, micros(duration) / 1000);
        let start = Instant::now();
        while !done.load(Ordering::Relaxed) {
            let ms = micros(start.elapsed().min(duration)) / 1000;
            p.set(ms, "ms");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        p.finish();
    })
}

/// Runs `dlock bench`; the exit code.
///
/// # Errors
///
/// None returned: a backend that cannot be reached or a store that cannot be opened is
/// printed to stderr, and so is a run that broke mutual exclusion (violations in the report);
/// the exit code is then [`EXIT_ERROR`](distlock::program::EXIT_ERROR). Operations that failed during the
/// measurement are counted in the report (`errors`).
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future mid-run leaves the run's counter in the store and
/// prints no report; locks held at that moment are released in the background.
pub async fn bench(url: &str, args: BenchArgs) -> u8 {
    let backend = store::scheme(url).unwrap_or_default();
    let ping_us = if backend == "redis" {
        match ping(url).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("dlock: bench: {e}");
                return crate::EXIT_ERROR;
            }
        }
    } else {
        None
    };
    let run = run_id();
    let done = Arc::new(AtomicBool::new(false));
    let ticker = progress_ticker(
        !args.json,
        args.scenario.as_str(),
        args.duration,
        done.clone(),
    );
    let mut baseline = None;
    let measured = match args.scenario {
        Scenario::Uncontended => uncontended(url, &args, &run).await,
        Scenario::Contended => contended(url, &args, &run, Load::Mutex).await,
        Scenario::Readheavy => {
            match contended(url, &args, &run, Load::ReadHeavy { rw: true }).await {
                Ok(m) => {
                    let base = contended(
                        url,
                        &args,
                        &format!("{run}-mutex"),
                        Load::ReadHeavy { rw: false },
                    )
                    .await;
                    match base {
                        Ok(b) => {
                            baseline = Some(b);
                            Ok(m)
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        }
    };
    done.store(true, Ordering::Relaxed);
    let _ = ticker.await;
    let m = match measured {
        Ok(m) => m,
        Err(e) => {
            eprintln!("dlock: bench: {e}");
            return crate::EXIT_ERROR;
        }
    };
    report(url, &backend, &args, ping_us, &m, baseline.as_ref());
    if m.violations() + baseline.as_ref().map_or(0, Measured::violations) > 0 {
        crate::EXIT_ERROR
    } else {
        0
    }
}

fn report(
    url: &str,
    backend: &str,
    args: &BenchArgs,
    ping_us: Option<u64>,
    m: &Measured,
    baseline: Option<&Measured>,
) {
    let summary = |m: &Measured| {
        let mut lat: Vec<u64> = m
            .per_client
            .iter()
            .flat_map(|c| c.latencies_us.iter().copied())
            .collect();
        let (p50, p99) = crate::stats::p50_p99(&mut lat);
        let secs = m.elapsed.as_secs_f64();
        let ops_per_s = if secs > 0.0 {
            m.ops() as f64 / secs
        } else {
            0.0
        };
        (ops_per_s, p50, p99)
    };
    let mut lat: Vec<u64> = m
        .per_client
        .iter()
        .flat_map(|c| c.latencies_us.iter().copied())
        .collect();
    let (p50, p99) = crate::stats::p50_p99(&mut lat);
    let ops = m.ops();
    let secs = m.elapsed.as_secs_f64();
    let ops_per_s = if secs > 0.0 { ops as f64 / secs } else { 0.0 };
    let per_client = m.per_client.iter().map(|c| c.ops);
    let (min, max) = (
        per_client.clone().min().unwrap_or(0),
        per_client.max().unwrap_or(0),
    );
    if args.json {
        let v = serde_json::json!({
            "peer": "dlock",
            "scenario": args.scenario.as_str(),
            "backend": backend,
            "clients": m.clients,
            "nodes": 1,
            "duration_s": (secs * 1000.0).round() / 1000.0,
            "ops": ops,
            "ops_per_s": (ops_per_s * 10.0).round() / 10.0,
            "p50_us": p50,
            "p99_us": p99,
            "violations": m.violations(),
            "overlaps": m.overlaps,
            "lost_updates": m.lost_updates,
            "not_held_at_release": m.not_held(),
            "errors": m.errors(),
            "first_error": m.per_client.iter().find_map(|c| c.first_error.clone()),
            "client_ops_min": min,
            "client_ops_max": max,
            "ping_p50_us": ping_us,
        });
        let mut v = v;
        if let (Some(b), Some(obj)) = (baseline, v.as_object_mut()) {
            let (b_ops, b50, b99) = summary(b);
            obj.insert(
                "baseline".into(),
                serde_json::json!({
                    "lock": "mutex",
                    "ops": b.ops(),
                    "ops_per_s": (b_ops * 10.0).round() / 10.0,
                    "p50_us": b50,
                    "p99_us": b99,
                    "violations": b.violations(),
                    "errors": b.errors(),
                }),
            );
        }
        println!("{v}");
    } else {
        let what = match args.scenario {
            Scenario::Uncontended => format!(
                "1 client over {} lock names; latency = one acquire + release",
                args.keys
            ),
            Scenario::Contended => format!(
                "{} clients on one lock name; latency = acquire wait",
                m.clients
            ),
            Scenario::Readheavy => format!(
                "{} clients, 90% reads / 10% writes on one read-write lock; latency = acquire wait",
                m.clients
            ),
        };
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v} µs"));
        println!(
            "dlock bench {} on {url} ({backend}): {what}",
            args.scenario.as_str()
        );
        println!(
            "  ops          {ops} in {secs:.2} s = {ops_per_s:.1}/s (per client {min}..{max})"
        );
        println!("  latency      p50 {}, p99 {}", opt(p50), opt(p99));
        if let Some(ping) = ping_us.filter(|p| *p > 0) {
            let ratio = |v: Option<u64>| {
                v.map_or_else(
                    || "-".to_owned(),
                    |v| format!("{:.1}×", v as f64 / ping as f64),
                )
            };
            println!(
                "  vs PING      p50 {} PING, p99 {} PING (PING round trip p50 {ping} µs)",
                ratio(p50),
                ratio(p99)
            );
        }
        if args.scenario != Scenario::Uncontended {
            println!(
                "  violations   {} (overlapping critical sections {}, lost or extra increments {}, lock gone at release {})",
                m.violations(),
                m.overlaps,
                m.lost_updates,
                m.not_held()
            );
        } else {
            println!("  violations   {}", m.violations());
        }
        if let Some(b) = baseline {
            let (ops, b50, b99) = summary(b);
            let (rw_ops, _, _) = summary(m);
            println!(
                "  baseline     the same load on a mutex: {ops:.1}/s, wait p50 {}, p99 {} (read-write lock: {:.2}× the mutex's throughput)",
                opt(b50),
                opt(b99),
                if ops > 0.0 { rw_ops / ops } else { 0.0 }
            );
        }
        let first = m.per_client.iter().find_map(|c| c.first_error.as_deref());
        match first {
            Some(e) => println!("  errors       {} (first: {e})", m.errors()),
            None => println!("  errors       0"),
        }
    }
}

/// p50 of PING round trips.
async fn ping(url: &str) -> Result<Option<u64>, String> {
    let backend = distlock::redis::RedisBackend::connect(url, &distlock::ClientOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let t = Instant::now();
        backend
            .ping()
            .await
            .map_err(|e| format!("PING failed: {e}"))?;
        samples.push(micros(t.elapsed()));
    }
    Ok(crate::stats::percentile(&mut samples, 50.0))
}

async fn connect(url: &str) -> Result<distlock::Client, String> {
    distlock::connect(url).await.map_err(|e| e.to_string())
}

/// Removes what the backend keeps forever per lock name (`file://`: the lock file,
/// `redis://`: the fencing counter).
async fn forget_locks(url: &str, run: &str, names: &[String]) {
    if let Ok(s) = store::open(url, "bench", run).await {
        for n in names {
            let _ = s.forget_lock(n).await;
        }
    }
}

async fn uncontended(url: &str, args: &BenchArgs, run: &str) -> Result<Measured, String> {
    let client = connect(url).await?;
    let names: Vec<String> = (0..args.keys).map(|k| format!("bench:{run}:{k}")).collect();
    let locks = names
        .iter()
        .map(|n| client.lock(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let mut r = ClientResult::default();
    let start = Instant::now();
    let mut i = 0usize;
    while start.elapsed() < args.duration {
        let lock = &locks[i % locks.len()];
        i = i.wrapping_add(1);
        let t = Instant::now();
        match lock.acquire_timeout(ACQUIRE_TIMEOUT).await {
            Ok(g) => match g.release().await {
                Ok(o) if o.was_held() => {
                    r.latencies_us.push(micros(t.elapsed()));
                    r.ops += 1;
                }
                Ok(o) => {
                    r.not_held_at_release += 1;
                    r.first_error
                        .get_or_insert_with(|| format!("lock not held at release ({o:?})"));
                }
                Err(e) => r.error(e),
            },
            Err(e) => {
                r.error(e);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    let elapsed = start.elapsed();
    drop(locks);
    drop(client);
    forget_locks(url, run, &names).await;
    Ok(Measured {
        clients: 1,
        elapsed,
        per_client: vec![r],
        overlaps: 0,
        lost_updates: 0,
        writes: 0,
    })
}

/// What each client of a contended run does.
#[derive(Clone, Copy)]
enum Load {
    /// Every operation increments the counter under the mutex.
    Mutex,
    /// 90% read the counter, 10% increment it; under a read-write lock (`rw`) or a mutex.
    ReadHeavy { rw: bool },
}

async fn contended(url: &str, args: &BenchArgs, run: &str, load: Load) -> Result<Measured, String> {
    let counter = store::open(url, "bench", run)
        .await
        .map_err(|e| e.to_string())?;
    counter.setup(0).await.map_err(|e| e.to_string())?;
    let name = format!("bench:{run}");
    let res = contended_inner(url, args, run, &name, load).await;
    let finish = async {
        // The writers were other clients: see all of their writes.
        counter.sync().await.map_err(|e| e.to_string())?;
        let (value, _) = counter.read().await.map_err(|e| e.to_string())?;
        Ok::<i64, String>(value)
    }
    .await;
    let _ = counter.cleanup().await;
    let _ = counter.forget_lock(&name).await;
    let mut m = res?;
    let value = finish?;
    let expected = i64::try_from(m.writes).unwrap_or(i64::MAX);
    m.lost_updates = expected.abs_diff(value);
    Ok(m)
}

async fn contended_inner(
    url: &str,
    args: &BenchArgs,
    run: &str,
    name: &str,
    load: Load,
) -> Result<Measured, String> {
    let mut parts = Vec::with_capacity(args.clients as usize);
    for _ in 0..args.clients {
        let client = connect(url).await?;
        let (read_lock, lock) = match load {
            Load::ReadHeavy { rw: true } => {
                let rw = client.rw_lock(name).map_err(|e| e.to_string())?;
                (rw.read(), rw.write())
            }
            _ => {
                let l = client.lock(name).map_err(|e| e.to_string())?;
                (l.clone(), l)
            }
        };
        let store: Box<dyn Store> = store::open(url, "bench", run)
            .await
            .map_err(|e| e.to_string())?;
        parts.push((client, read_lock, lock, store));
    }
    // A backend without this kind of lock fails the run at once, not once per operation.
    // The probe's guard is released before the clients start: dropped, it would be released
    // in the background, and the first client's write could still find its read side held
    // (an upgrade, refused).
    if let Some((_, read_lock, _, _)) = parts.first() {
        let probe = read_lock.try_acquire().await.map_err(|e| e.to_string())?;
        if let Some(g) = probe {
            g.release().await.map_err(|e| e.to_string())?;
        }
    }
    let inside = Arc::new(AtomicU32::new(0));
    let readers_inside = Arc::new(AtomicU32::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop_at = start + args.duration;
    let mut tasks = Vec::with_capacity(parts.len());
    for (client, read_lock, lock, store) in parts {
        let inside = inside.clone();
        let readers_inside = readers_inside.clone();
        let overlaps = overlaps.clone();
        let writes = writes.clone();
        tasks.push(tokio::spawn(async move {
            let _client = client;
            let mut r = ClientResult::default();
            let mut rng = fastrand::Rng::new();
            while Instant::now() < stop_at {
                let reading = matches!(load, Load::ReadHeavy { .. }) && rng.u8(0..10) != 0;
                let t = Instant::now();
                let target = if reading { &read_lock } else { &lock };
                let guard = match target.acquire_timeout(ACQUIRE_TIMEOUT).await {
                    Ok(g) => g,
                    Err(e) => {
                        r.error(e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                r.latencies_us.push(micros(t.elapsed()));
                let res = if reading {
                    // Readers may share; a writer inside means exclusion was lost.
                    readers_inside.fetch_add(1, Ordering::SeqCst);
                    if inside.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    let res = store.read().await.map(|_| ());
                    readers_inside.fetch_sub(1, Ordering::SeqCst);
                    res
                } else {
                    if inside.fetch_add(1, Ordering::SeqCst) > 0
                        || readers_inside.load(Ordering::SeqCst) > 0
                    {
                        overlaps.fetch_add(1, Ordering::Relaxed);
                    }
                    let inc = async {
                        let (v, _) = store.read().await?;
                        // Widen the read → write window so that lost exclusion shows.
                        tokio::task::yield_now().await;
                        store.write(v + 1).await
                    }
                    .await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    if inc.is_ok() {
                        writes.fetch_add(1, Ordering::SeqCst);
                    }
                    inc
                };
                match res {
                    Ok(()) => r.ops += 1,
                    Err(e) => r.error(e),
                }
                match guard.release().await {
                    Ok(o) if o.was_held() => {}
                    Ok(o) => {
                        r.not_held_at_release += 1;
                        r.first_error
                            .get_or_insert_with(|| format!("lock not held at release ({o:?})"));
                    }
                    Err(e) => r.error(e),
                }
            }
            r
        }));
    }
    let mut per_client = Vec::with_capacity(tasks.len());
    for t in tasks {
        per_client.push(t.await.map_err(|e| format!("a client task failed: {e}"))?);
    }
    Ok(Measured {
        clients: args.clients,
        elapsed: start.elapsed(),
        per_client,
        overlaps: overlaps.load(Ordering::Relaxed),
        lost_updates: 0,
        writes: writes.load(Ordering::SeqCst),
    })
}
