//! `cargo bench -p distlock-lab --bench peers [-- --quick] [--svg FILE]`: dlock next to rslock (the
//! Redlock crate on crates.io) and, when installed, node-redlock (`node.rs`), through the same
//! scenarios in one run, on redis-servers this bench starts itself (distlock-testkit). The goals
//! of issue 28 are printed as ratios with "goal met" or "goal not met", then as markdown tables
//! for the README; `--svg FILE` draws the curves (`curves.rs`); `--profile LIB [PAIRS]` runs one
//! library's acquire+release loop alone, for callgrind (`cpu.rs`).
//!
//! Same rules for both libraries: each client has its own connection(s) (its own dlock client,
//! its own rslock `LockManager`, its own connection for the critical section); the critical
//! section is a GET and a SET of a counter on the lock's server (node 0 for Redlock), checked
//! at the end against the number of critical sections (a lost update is printed as MUTUAL
//! EXCLUSION VIOLATED); every scenario runs for the same time (5 s, `--quick`: 1 s); an acquire
//! waits at most 10 s (dlock: `acquire_timeout`; rslock: `lock()` re-called until the deadline,
//! which is what its `acquire()` loops on) and one that does not get the lock by then is a
//! give-up.
//!
//! Scenarios: a PING baseline; uncontended acquire+release on one client (the two libraries
//! alternating in blocks); 32 clients on one name (one library after the other); the same two
//! on Redlock over 5 nodes; and (dlock only) the watchdog holding 10,000 locks with a 3 s
//! lease, on a current-thread runtime of its own, measured on the server (INFO
//! stats/commandstats sampled every millisecond: a tick is a burst of commands, its round
//! trips the request flights the server saw apart, its EVALSHA and command counts) and in this
//! process (write syscalls from `/proc/self/io`, an upper bound of round trips; RSS from
//! `/proc/self/status`).
//!
//! `DLOCK_BENCH_HANDOFF_AFTER=DUR` runs dlock's single-node scenarios with `?handoff_after=DUR`
//! (the plain mutex's contended mode: `0` hands over always, a long one barges always; see
//! docs/redis-lock.md, "Contended mode"), to see the two ends of the trade-off.
//!
//! A bench, not a test: nothing here asserts on speed. Ratios from one run travel; absolute
//! figures on a shared machine do not.

use distlock::redis::RedisBackend;
use distlock::redlock::RedlockBackend;
use distlock::{Backend, Client, ClientOptions, LockGuard, ReleaseOutcome};
use distlock_testkit::RedisServer;
use futures_util::future::join_all;
use futures_util::{stream, StreamExt, TryStreamExt};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod cpu;
mod curves;
mod node;
mod server;
mod svg;
mod watchdog;
use cpu::*;
use curves::*;
use node::*;
use server::*;
use watchdog::*;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Clients of the contended scenarios.
const CLIENTS: usize = 32;
/// Longest wait of one acquire; past it the acquire is a give-up.
const DEADLINE: Duration = Duration::from_secs(10);
/// rslock's key TTL (dlock runs in watchdog mode with its default 30 s lease).
const RSLOCK_TTL: Duration = Duration::from_secs(30);
/// Locks the watchdog scenario holds, and its (short) watchdog lease.
const HELD: usize = 10_000;
const WATCHDOG_LEASE: Duration = Duration::from_secs(3);
/// Acquire+release pairs before a measurement (connections, scripts).
const WARM_UP: usize = 100;
/// Blocks the uncontended runs of the two libraries alternate in.
const BLOCKS: u32 = 10;

// ---------------------------------------------------------------------------------------------
// The libraries: one small trait each implements; every scenario is generic over it.
// ---------------------------------------------------------------------------------------------

/// What an acquire came to.
enum Acquired<H> {
    Held(H),
    /// Not granted within the deadline.
    GaveUp,
    /// An error other than the deadline.
    Failed(String),
}

/// One client of one library, on one lock name.
trait Locker: Send + Sync + 'static {
    type Held: Send;
    /// Waits for the lock for at most `wait`.
    fn acquire(&self, wait: Duration) -> impl Future<Output = Acquired<Self::Held>> + Send;
    /// Gives the lock back.
    fn release(&self, held: Self::Held) -> impl Future<Output = Res<()>> + Send;
}

/// A library under test: how it connects a client to `nodes` (one URL: a single Redis; five:
/// Redlock), and a client's handle on the lock `name`.
trait Peer: Sync {
    const NAME: &'static str;
    /// Commands it sends besides scripts on the acquire/release path (server time per pair).
    const DIRECT: &'static [&'static str] = &[];
    /// One client: its own connection(s), shared by its handles.
    type Client: Send + Sync + 'static;
    type Locker: Locker;
    fn client(&self, nodes: &[String]) -> impl Future<Output = Res<Self::Client>> + Send;
    fn locker(&self, client: &Self::Client, name: &str) -> Res<Self::Locker>;
}

/// A client of its own with one handle on `name`.
async fn connect<P: Peer>(peer: &P, nodes: &[String], name: &str) -> Res<P::Locker> {
    let client = peer.client(nodes).await?;
    peer.locker(&client, name)
}

struct Dlock;

impl Peer for Dlock {
    const NAME: &'static str = "dlock";
    type Client = Client;
    type Locker = distlock::Lock;

    async fn client(&self, nodes: &[String]) -> Res<Client> {
        dlock_client(nodes, ClientOptions::default()).await
    }

    fn locker(&self, client: &Client, name: &str) -> Res<distlock::Lock> {
        Ok(client.lock(name)?)
    }
}

/// dlock's `fair` kind: strict FIFO, reported beside the plain mutex.
struct DlockFair;

impl Peer for DlockFair {
    const NAME: &'static str = "dlock fair";
    type Client = Client;
    type Locker = distlock::Lock;

    async fn client(&self, nodes: &[String]) -> Res<Client> {
        dlock_client(nodes, ClientOptions::default()).await
    }

    fn locker(&self, client: &Client, name: &str) -> Res<distlock::Lock> {
        Ok(client.fair_lock(name)?)
    }
}

/// A dlock client of its own: the Redis backend on one node, Redlock on several.
async fn dlock_client(nodes: &[String], opts: ClientOptions) -> Res<Client> {
    let backend: Arc<dyn Backend> = match nodes {
        [one] => {
            let url = match std::env::var("DLOCK_BENCH_HANDOFF_AFTER") {
                Ok(after) => format!("{one}?handoff_after={after}"),
                Err(_) => one.clone(),
            };
            Arc::new(RedisBackend::connect(&url, &opts).await?)
        }
        many => {
            let hosts: Vec<&str> = many
                .iter()
                .map(|u| u.trim_start_matches("redis://"))
                .collect();
            // Fresh servers sit out a restart quarantine: keep it short (main waits it out).
            let url = format!("redlock://{}?quarantine=500ms", hosts.join(","));
            Arc::new(RedlockBackend::connect(&url, &opts).await?)
        }
    };
    Ok(Client::new(backend, opts)?)
}

impl Locker for distlock::Lock {
    type Held = LockGuard;

    async fn acquire(&self, wait: Duration) -> Acquired<LockGuard> {
        match self.acquire_timeout(wait).await {
            Ok(g) => Acquired::Held(g),
            Err(e) if e.is_timeout() => Acquired::GaveUp,
            Err(e) => Acquired::Failed(e.to_string()),
        }
    }

    async fn release(&self, held: LockGuard) -> Res<()> {
        match held.release().await? {
            ReleaseOutcome::Released => Ok(()),
            other => Err(format!("release: {other:?}").into()),
        }
    }
}

struct Rslock;

/// An rslock client: its own `LockManager` (a connection per node) and the lock's name.
struct RsLocker {
    manager: rslock::LockManager,
    name: String,
}

impl Peer for Rslock {
    const NAME: &'static str = "rslock";
    const DIRECT: &'static [&'static str] = &["set"];
    type Client = rslock::LockManager;
    type Locker = RsLocker;

    async fn client(&self, nodes: &[String]) -> Res<rslock::LockManager> {
        let clients = nodes
            .iter()
            .map(|u| redis::Client::open(u.as_str()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rslock::LockManager::from_clients(clients))
    }

    fn locker(&self, manager: &rslock::LockManager, name: &str) -> Res<RsLocker> {
        Ok(RsLocker {
            manager: manager.clone(),
            name: name.to_owned(),
        })
    }
}

impl Locker for RsLocker {
    type Held = rslock::Lock;

    /// `lock()` (its 3 tries with a random delay) re-called until the deadline, as rslock's
    /// `acquire()` does without one.
    async fn acquire(&self, wait: Duration) -> Acquired<rslock::Lock> {
        let deadline = Instant::now() + wait;
        loop {
            match self.manager.lock(self.name.as_bytes(), RSLOCK_TTL).await {
                Ok(lock) => return Acquired::Held(lock),
                Err(rslock::LockError::TtlTooLarge) => {
                    return Acquired::Failed("TTL too large".into())
                }
                Err(_) if Instant::now() >= deadline => return Acquired::GaveUp,
                Err(_) => {}
            }
        }
    }

    async fn release(&self, held: rslock::Lock) -> Res<()> {
        held.release().await;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements.
// ---------------------------------------------------------------------------------------------

fn pct(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Operations per second, p50 of each, and this process's CPU time per operation; for
/// acquire+release pairs, what they cost the server(s).
struct Rate {
    per_sec: f64,
    p50: Duration,
    cpu: Duration,
    /// µs of command time per pair (commandstats), and of server main-thread CPU.
    server_us: f64,
    server_cpu_us: f64,
}

impl Rate {
    fn of(mut t: Timed) -> Rate {
        let n = t.samples.len().max(1) as u32;
        Rate {
            per_sec: t.samples.len() as f64 / t.elapsed.as_secs_f64().max(f64::MIN_POSITIVE),
            p50: pct(&mut t.samples, 0.5),
            cpu: t.cpu / n,
            server_us: 0.0,
            server_cpu_us: 0.0,
        }
    }

    fn cell(&self) -> String {
        format!(
            "{:.0}/s, p50 {:.0} µs, client CPU {:.1} µs",
            self.per_sec,
            us(self.p50),
            us(self.cpu)
        )
    }
}

/// The time of each call, and of them all; the process's CPU time over them all.
#[derive(Default)]
struct Timed {
    samples: Vec<Duration>,
    elapsed: Duration,
    cpu: Duration,
}

/// Runs `op` back to back for `run`, adding to `into`.
async fn time_loop<F, Fut>(run: Duration, into: &mut Timed, mut op: F) -> Res<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<()>>,
{
    let (start, cpu) = (Instant::now(), cpu_time());
    while start.elapsed() < run {
        let t = Instant::now();
        op().await?;
        into.samples.push(t.elapsed());
    }
    into.elapsed += start.elapsed();
    into.cpu += cpu_time().saturating_sub(cpu);
    Ok(())
}

/// The baseline: PING on each of `nodes` in parallel (one node: a plain round trip; five: the
/// fan-out floor of Redlock on this machine), one connection per node.
async fn ping_rate(nodes: &[String], run: Duration) -> Res<Rate> {
    let mut cons = Vec::new();
    for url in nodes {
        cons.push(connection(url).await?);
    }
    let ping = |mut c: redis::aio::MultiplexedConnection| async move {
        redis::cmd("PING").query_async::<String>(&mut c).await
    };
    for _ in 0..WARM_UP {
        for r in join_all(cons.iter().cloned().map(ping)).await {
            r?;
        }
    }
    // In a spawned task, as the libraries' loops run (see `pairs_in_task`).
    tokio::spawn(async move {
        let mut t = Timed::default();
        time_loop(run, &mut t, || {
            let all = join_all(cons.iter().cloned().map(ping));
            async move {
                for r in all.await {
                    r?;
                }
                Ok(())
            }
        })
        .await?;
        Res::Ok(Rate::of(t))
    })
    .await?
}

/// A connection of the bench's own (baselines, counters, INFO), with a 30 s reply timeout: a
/// thousand tasks share a client's counter connection on a loaded machine.
async fn connection(url: &str) -> Res<redis::aio::MultiplexedConnection> {
    let mut con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    con.set_response_timeout(Duration::from_secs(30));
    Ok(con)
}

async fn pair<L: Locker>(l: &L) -> Res<()> {
    match l.acquire(DEADLINE).await {
        Acquired::Held(h) => l.release(h).await,
        Acquired::GaveUp => Err("uncontended acquire gave up".into()),
        Acquired::Failed(e) => Err(e.into()),
    }
}

/// Acquire + release pairs of `l` for `run`, in a spawned task on the runtime's workers, as an
/// application runs them (the benchmark's main future is polled by `block_on` on its own thread:
/// every reply there costs a wake-up across threads, for both libraries alike).
async fn pairs_in_task<L: Locker>(l: L, run: Duration, mut t: Timed) -> Res<(L, Timed)> {
    tokio::spawn(async move {
        time_loop(run, &mut t, || pair(&l)).await?;
        Res::Ok((l, t))
    })
    .await?
}

/// A warmed-up client of `peer` for the uncontended runs.
async fn solo<P: Peer>(peer: &P, nodes: &[String]) -> Res<P::Locker> {
    let l = connect(peer, nodes, "peers-uncontended").await?;
    for _ in 0..WARM_UP {
        pair(&l).await?;
    }
    Ok(l)
}

/// The critical section: GET + SET of a counter, on a connection of the client's own.
struct Counter {
    con: redis::aio::MultiplexedConnection,
    key: String,
}

impl Counter {
    async fn read(&mut self) -> Res<u64> {
        let v: Option<u64> = redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut self.con)
            .await?;
        Ok(v.unwrap_or(0))
    }

    async fn bump(&mut self) -> Res<()> {
        let v = self.read().await?;
        redis::cmd("SET")
            .arg(&self.key)
            .arg(v + 1)
            .query_async::<()>(&mut self.con)
            .await?;
        Ok(())
    }
}

/// What one contending client did.
#[derive(Default)]
struct ClientRun {
    waits: Vec<Duration>,
    /// Critical sections finished within the run (throughput, fairness).
    in_run: usize,
    /// All critical sections (the counter's expected value).
    sections: usize,
    give_ups: usize,
    failures: usize,
    last_error: Option<String>,
}

/// The figures of one contended scenario.
struct Contended {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// The longest wait.
    worst: Duration,
    min: usize,
    max: usize,
    give_ups: usize,
    failures: usize,
    last_error: Option<String>,
    sections: usize,
    /// Critical sections the counters miss (lost updates), summed over the names.
    lost: u64,
    /// Times a client entered while another was inside.
    overlaps: usize,
}

impl Contended {
    fn fairness(&self) -> f64 {
        self.min as f64 / self.max.max(1) as f64
    }

    fn exclusive(&self) -> bool {
        self.overlaps == 0 && self.lost == 0
    }

    fn cell(&self) -> String {
        format!(
            "{:.0}/s, wait p99 {:.1} ms (max {:.0} ms), per-client {}–{} ({:.2}), give-ups {}{}",
            self.per_sec,
            ms(self.p99),
            ms(self.worst),
            self.min,
            self.max,
            self.fairness(),
            self.give_ups,
            if self.exclusive() {
                ""
            } else {
                ", MUTUAL EXCLUSION VIOLATED"
            }
        )
    }
}

/// What the clients share: the end of the run, and per name the mutual-exclusion probe and the
/// critical sections done.
struct Arena {
    start: Instant,
    end: Instant,
    inside: Vec<AtomicUsize>,
    sections: Vec<AtomicUsize>,
    /// Critical sections whose SET failed without an answer (applied or not).
    uncertain: Vec<AtomicUsize>,
    overlaps: AtomicUsize,
}

/// A crowd: `names` lock names, and `clients` clients of `peer` taking part on every one of
/// them (a task per client and name, the client's handles sharing its connection(s); a
/// connection of its own per client for the critical sections): acquire, critical section,
/// release, until the run ends (an acquire started before the end still completes). One name:
/// `clients` clients contend for it; `names` names: each sees `clients` contenders.
async fn crowd<P: Peer>(
    peer: &P,
    nodes: &[String],
    names: usize,
    clients: usize,
    run: Duration,
    tag: &str,
) -> Res<Contended> {
    let name = |i: usize| format!("peers-{tag}-{i}");
    let key = |i: usize| format!("peers-counter-{tag}-{i}");
    let mut lockers = Vec::new();
    for _ in 0..clients {
        let client = peer.client(nodes).await?;
        let con = connection(&nodes[0]).await?;
        for i in 0..names {
            let l = peer.locker(&client, &name(i))?;
            if names == 1 {
                // Connections and scripts warmed up (many names: the first pairs do it).
                pair(&l).await?;
            }
            let counter = Counter {
                con: con.clone(),
                key: key(i),
            };
            lockers.push((i, l, counter));
        }
        // The handles keep what they need of the client (dlock: a clone; rslock: its manager).
        drop(client);
    }
    let start = Instant::now() + Duration::from_millis(100 + names as u64 / 10);
    let arena = Arc::new(Arena {
        start,
        end: start + run,
        inside: (0..names).map(|_| AtomicUsize::new(0)).collect(),
        sections: (0..names).map(|_| AtomicUsize::new(0)).collect(),
        uncertain: (0..names).map(|_| AtomicUsize::new(0)).collect(),
        overlaps: AtomicUsize::new(0),
    });
    let tasks: Vec<_> = lockers
        .into_iter()
        .map(|(i, l, c)| tokio::spawn(contend(i, l, c, arena.clone())))
        .collect();
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await??);
    }
    let mut reader = connection(&nodes[0]).await?;
    let mut lost = 0;
    for i in 0..names {
        let v: Option<u64> = redis::cmd("GET")
            .arg(key(i))
            .query_async(&mut reader)
            .await?;
        let done = arena.sections[i].load(Ordering::SeqCst) as u64;
        let doubt = arena.uncertain[i].load(Ordering::SeqCst) as u64;
        // A failed SET may have landed: the counter may be ahead by up to `doubt`.
        let v = v.unwrap_or(0);
        lost += if v >= done {
            (v - done).saturating_sub(doubt)
        } else {
            done - v
        };
    }
    Ok(summarize(
        runs,
        run,
        lost,
        arena.overlaps.load(Ordering::SeqCst),
    ))
}

async fn contend<L: Locker>(
    i: usize,
    l: L,
    mut counter: Counter,
    arena: Arc<Arena>,
) -> Res<ClientRun> {
    tokio::time::sleep_until(arena.start.into()).await;
    let mut me = ClientRun::default();
    while Instant::now() < arena.end {
        let t = Instant::now();
        let held = match l.acquire(DEADLINE).await {
            Acquired::Held(h) => h,
            Acquired::GaveUp => {
                me.give_ups += 1;
                continue;
            }
            Acquired::Failed(e) => {
                me.failures += 1;
                me.last_error = Some(e);
                continue;
            }
        };
        me.waits.push(t.elapsed());
        if arena.inside[i].fetch_add(1, Ordering::SeqCst) != 0 {
            arena.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let section = counter.bump().await;
        arena.inside[i].fetch_sub(1, Ordering::SeqCst);
        match section {
            Ok(()) => {
                arena.sections[i].fetch_add(1, Ordering::SeqCst);
                me.sections += 1;
                if Instant::now() <= arena.end {
                    me.in_run += 1;
                }
            }
            Err(e) => {
                // The SET may or may not have landed: this name's count is in doubt by one.
                arena.uncertain[i].fetch_add(1, Ordering::SeqCst);
                me.failures += 1;
                me.last_error = Some(format!("critical section: {e}"));
            }
        }
        if let Err(e) = l.release(held).await {
            me.failures += 1;
            me.last_error = Some(e.to_string());
        }
    }
    Ok(me)
}

fn summarize(runs: Vec<ClientRun>, run: Duration, lost: u64, overlaps: usize) -> Contended {
    let per_client: Vec<usize> = runs.iter().map(|r| r.in_run).collect();
    let mut waits: Vec<Duration> = runs.iter().flat_map(|r| r.waits.iter().copied()).collect();
    Contended {
        per_sec: per_client.iter().sum::<usize>() as f64 / run.as_secs_f64(),
        p50: pct(&mut waits, 0.5),
        p99: pct(&mut waits, 0.99),
        worst: waits.iter().copied().max().unwrap_or(Duration::ZERO),
        min: per_client.iter().copied().min().unwrap_or(0),
        max: per_client.iter().copied().max().unwrap_or(0),
        give_ups: runs.iter().map(|r| r.give_ups).sum(),
        failures: runs.iter().map(|r| r.failures).sum(),
        last_error: runs.iter().find_map(|r| r.last_error.clone()),
        sections: runs.iter().map(|r| r.sections).sum(),
        lost,
        overlaps,
    }
}

// ---------------------------------------------------------------------------------------------
// The watchdog at scale (dlock only: rslock has no watchdog).
// ---------------------------------------------------------------------------------------------

/// The goals of one table row: each printed as it is judged.
#[derive(Default)]
struct Goals {
    all_met: bool,
    judged: usize,
}

impl Goals {
    fn check(&mut self, what: &str, value: String, met: bool) -> &mut Self {
        let verdict = if met { "goal met" } else { "goal not met" };
        println!("  {what}: {value} — {verdict}");
        self.all_met = met && (self.all_met || self.judged == 0);
        self.judged += 1;
        self
    }

    fn verdict(&self) -> String {
        if self.all_met {
            "goal met"
        } else {
            "goal not met"
        }
        .into()
    }
}

/// `a / b`, without dividing by zero.
fn x(a: f64, b: f64) -> f64 {
    a / b.max(f64::MIN_POSITIVE)
}

fn print_contended(label: &str, lib: &str, c: &Contended) {
    println!(
        "{label} {lib:6}: {:.0} critical sections/s, wait p50 {:.0} µs p99 {:.1} ms max {:.1} ms, per-client ops {}–{} (min/max {:.2}), give-ups {}, errors {}, {} sections, {} missing from the counters",
        c.per_sec,
        us(c.p50),
        ms(c.p99),
        ms(c.worst),
        c.min,
        c.max,
        c.fairness(),
        c.give_ups,
        c.failures,
        c.sections,
        c.lost
    );
    if let Some(e) = &c.last_error {
        println!("  {lib} last error: {e}");
    }
    if !c.exclusive() {
        println!(
            "!!! MUTUAL EXCLUSION VIOLATED ({lib}, {label}): {} overlapping entries, {} lost updates",
            c.overlaps, c.lost
        );
    }
}

/// Both libraries through the contended scenario, printed.
async fn contended_pair(
    label: &str,
    nodes: &[String],
    run: Duration,
    tag: &str,
) -> Res<(Contended, Contended)> {
    let d = crowd(&Dlock, nodes, 1, CLIENTS, run, &format!("{tag}-dlock")).await?;
    print_contended(label, Dlock::NAME, &d);
    let r = crowd(&Rslock, nodes, 1, CLIENTS, run, &format!("{tag}-rslock")).await?;
    print_contended(label, Rslock::NAME, &r);
    Ok((d, r))
}

/// One client of each library, acquire + release in a loop, the two runs interleaved in
/// blocks (so that both see the same machine) adding up to `run` each; the servers' counters
/// read around each block.
async fn uncontended_pair(label: &str, nodes: &[String], run: Duration) -> Res<(Rate, Rate)> {
    let (mut dl, mut rl) = (solo(&Dlock, nodes).await?, solo(&Rslock, nodes).await?);
    let (mut td, mut tr) = (Timed::default(), Timed::default());
    let (mut sd, mut sr) = (ServerCost::default(), ServerCost::default());
    let mut cons = Vec::new();
    for url in nodes {
        cons.push(connection(url).await?);
    }
    for _ in 0..BLOCKS {
        let before = all_stats(&mut cons).await?;
        (dl, td) = pairs_in_task(dl, run / BLOCKS, td).await?;
        let after = all_stats(&mut cons).await?;
        for (b, a) in before.iter().zip(&after) {
            sd.add(b, a);
        }
        (rl, tr) = pairs_in_task(rl, run / BLOCKS, tr).await?;
        let last = all_stats(&mut cons).await?;
        for (b, a) in after.iter().zip(&last) {
            sr.add(b, a);
        }
    }
    let (nd, nr) = (td.samples.len(), tr.samples.len());
    let (mut d, mut r) = (Rate::of(td), Rate::of(tr));
    (d.server_us, d.server_cpu_us) = (sd.usec_per_pair(nd, Dlock::DIRECT), sd.cpu_per_pair(nd));
    (r.server_us, r.server_cpu_us) = (sr.usec_per_pair(nr, Rslock::DIRECT), sr.cpu_per_pair(nr));
    for (lib, x, cost, n) in [(Dlock::NAME, &d, &sd, nd), (Rslock::NAME, &r, &sr, nr)] {
        println!(
            "{label} {lib:6}: {}; server time per pair {:.1} µs (commandstats), server CPU per pair {:.1} µs; {}",
            x.cell(),
            x.server_us,
            x.server_cpu_us,
            cost.detail(n)
        );
    }
    Ok((d, r))
}

async fn all_stats(cons: &mut [redis::aio::MultiplexedConnection]) -> Res<Vec<ServerStats>> {
    let mut out = Vec::new();
    for c in cons {
        out.push(server_stats(c).await?);
    }
    Ok(out)
}

/// A table row: scenario, rslock, node-redlock, dlock, ratio, goal, verdict.
type Row = [String; 7];

/// The command line: `[--quick] [--svg FILE] | --profile dlock|rslock [PAIRS]` (cargo's own
/// `--bench` is ignored).
#[derive(Default)]
struct Args {
    quick: bool,
    svg: Option<std::path::PathBuf>,
    profile: Option<(String, usize)>,
}

impl Args {
    fn parse() -> Res<Args> {
        let mut args = Args::default();
        let mut it = std::env::args().skip(1).peekable();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--quick" => args.quick = true,
                "--svg" => args.svg = Some(it.next().ok_or("--svg FILE")?.into()),
                "--profile" => {
                    let lib = it.next().ok_or("--profile dlock|rslock [PAIRS]")?;
                    let pairs = match it.peek().map(|n| n.parse::<usize>()) {
                        Some(Ok(n)) => {
                            it.next();
                            n
                        }
                        _ => 1000,
                    };
                    args.profile = Some((lib, pairs));
                }
                "--bench" => {}
                other => return Err(format!("unknown argument {other:?}").into()),
            }
        }
        Ok(args)
    }
}

fn main() -> Res<()> {
    let args = Args::parse()?;
    if let Some((lib, pairs)) = &args.profile {
        return profile(lib, *pairs);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench(args))
}

async fn bench(args: Args) -> Res<()> {
    if let Some(path) = &args.svg {
        // Checked before the run, not after it: cargo runs a bench in its crate's directory, so
        // a relative FILE is taken from crates/distlock-lab.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                format!(
                    "--svg {}: cannot write it ({e}); a relative path is taken from {} (cargo \
                     runs benches in the crate's directory): give an absolute path",
                    path.display(),
                    std::env::current_dir().unwrap_or_default().display()
                )
            })?;
    }
    let quick = args.quick;
    let run = Duration::from_secs(if quick { 1 } else { 5 });
    let observe = if quick {
        Duration::from_millis(2500)
    } else {
        run
    };
    let single = RedisServer::start()?;
    let nodes: Vec<RedisServer> = (0..5)
        .map(|_| RedisServer::start())
        .collect::<Result<_, _>>()?;
    let held_server = RedisServer::start()?;
    let one = [single.url()];
    let five: Vec<String> = nodes.iter().map(|n| n.url()).collect();
    // Let the Redlock nodes age past dlock's (shortened) restart quarantine.
    tokio::time::sleep(Duration::from_millis(600)).await;
    println!(
        "dlock vs rslock 0.10, {run:?} per scenario, {CLIENTS} contending clients, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let ping = ping_rate(&one, run).await?;
    let fan = ping_rate(&five, run).await?;
    println!("baseline PING, 1 node        : {}", ping.cell());
    println!("baseline PING, 5 in parallel : {}", fan.cell());
    let (u_d, u_r) = uncontended_pair("uncontended, 1 client  ", &one, run).await?;
    let (c_d, c_r) = contended_pair("contended, 32 clients  ", &one, run, "one").await?;
    let c_f = crowd(&DlockFair, &one, 1, CLIENTS, run, "one-fair").await?;
    print_contended("contended, 32 clients  ", DlockFair::NAME, &c_f);
    let (rl_d, rl_r) = uncontended_pair("redlock 5 nodes, 1 client", &five, run).await?;
    let (rc_d, rc_r) = contended_pair("redlock 5 nodes, 32    ", &five, run, "five").await?;
    let node = match node_modules() {
        Some(m) => Some(node_runs(&m, &one, &five, run).await?),
        None => {
            println!("node-redlock: not installed (scripts/test installs it under target/peers, or set DLOCK_PEERS): left out");
            None
        }
    };

    // The curves: one server each, so that one scenario's leftovers cannot slow the next.
    let curve_server = RedisServer::start()?;
    let curve = [curve_server.url()];
    let curve_d = one_name_curve(&Dlock, &curve, run).await?;
    let curve_f = one_name_curve(&DlockFair, &curve, run).await?;
    let curve_r = one_name_curve(&Rslock, &curve, run).await?;
    // A scenario of the curves that fails is reported and left out, not the end of the run.
    let names = match (
        many_names(&Dlock, &curve, run).await,
        many_names(&Rslock, &curve, run).await,
    ) {
        (Ok(d), Ok(r)) => Some((d, r)),
        (d, r) => {
            for e in [d.err(), r.err()].into_iter().flatten() {
                println!("{NAMES} names × {PER_NAME} clients: failed: {e}");
            }
            None
        }
    };
    let queue_server = RedisServer::start()?;
    let mut queues = Vec::new();
    for (kind, q) in [
        ("mutex", queue(&Dlock, &queue_server.url(), "mutex").await),
        ("fair", queue(&DlockFair, &queue_server.url(), "fair").await),
    ] {
        match q {
            Ok(q) => {
                print_queue(&q);
                queues.push(q);
            }
            Err(e) => println!("{WAITERS} waiters on one name, dlock {kind}: failed: {e}"),
        }
    }
    let sizes: &[usize] = if quick {
        &[1_000, HELD]
    } else {
        &[1_000, HELD, 100_000]
    };
    let mut held = Vec::new();
    for &n in sizes {
        match watchdog_alone(held_server.url(), observe, n).await {
            Ok(w) => {
                print_watchdog(&w);
                held.push(w);
            }
            Err(e) => println!("watchdog, {n} locks: failed: {e}"),
        }
    }
    let ping_after = ping_rate(&one, run / 2).await?;
    println!(
        "baseline PING again at the end: {} ({:.2}x the first: the machine's drift)",
        ping_after.cell(),
        ping_after.per_sec / ping.per_sec
    );

    println!("goals (issue 28), ratios of this run:");
    let mut rows = vec![
        solo_row(
            "uncontended acquire+release, 1 client",
            &u_d,
            &u_r,
            1.0,
            "≥ 1.0×, server time ≤ 15 µs/pair, client CPU ≤ rslock's",
            node.as_ref().map(|n| &n.solo),
            false,
            |g, d, r| {
                g.check(
                    "uncontended: dlock server time per pair, commandstats (≤ 15 µs)",
                    format!("{:.1} µs (rslock {:.1} µs)", d.server_us, r.server_us),
                    d.server_us <= 15.0,
                )
                .check(
                    "uncontended: client CPU per pair dlock/rslock (≤ 1.0×)",
                    format!(
                        "{:.2}× ({:.1} µs vs {:.1} µs)",
                        x(us(d.cpu), us(r.cpu)),
                        us(d.cpu),
                        us(r.cpu)
                    ),
                    d.cpu <= r.cpu,
                );
            },
        ),
        crowd_row(
            "contended, 32 clients, one name",
            &c_d,
            &c_r,
            node.as_ref().map(|n| &n.crowd),
            1.2,
            "≥ 1.2× ops, p99 ≤ 0.1×, min/max ≥ 0.5",
            |g, d| {
                g.check(
                    "contended, 32 clients, one name: dlock per-client min/max (≥ 0.5)",
                    format!("{:.2}", d.fairness()),
                    d.fairness() >= 0.5,
                );
            },
        ),
        [
            "contended, 32 clients, one name, dlock `fair` (strict FIFO, no goal)".into(),
            c_r.cell(),
            node.as_ref().map_or("—".into(), |n| n.crowd.cell()),
            c_f.cell(),
            format!(
                "{:.2}× ops, {:.3}× p99",
                x(c_f.per_sec, c_r.per_sec),
                x(us(c_f.p99), us(c_r.p99))
            ),
            "reported".into(),
            String::new(),
        ],
        // node-redlock is not run here (see the README): rslock is the best peer measured.
        solo_row(
            "Redlock 5 nodes, 1 client",
            &rl_d,
            &rl_r,
            1.2,
            "≥ 1.2× best peer",
            node.as_ref().map(|n| &n.redlock_solo),
            true,
            |_, _, _| {},
        ),
        crowd_row(
            "Redlock 5 nodes, 32 clients",
            &rc_d,
            &rc_r,
            node.as_ref().map(|n| &n.redlock_crowd),
            2.0,
            "≥ 2× ops, no give-ups, p99 ≤ 0.1×",
            |g, d| {
                g.check(
                    "Redlock 5 nodes, 32 clients: dlock give-ups (0)",
                    d.give_ups.to_string(),
                    d.give_ups == 0,
                );
            },
        ),
    ];
    if let Some(w) = held.iter().find(|w| w.held == HELD) {
        rows.push(watchdog_row(w));
    }
    print_table(&ping, &fan, &rows, run);
    let curves = Curves {
        dlock: curve_d,
        fair: curve_f,
        rslock: curve_r,
        names,
        queues,
        held,
    };
    print_curves(&curves);
    if let Some(path) = &args.svg {
        std::fs::write(path, curves_svg(&curves, run))?;
        println!("curves drawn in {}", path.display());
    }
    Ok(())
}

/// One client: dlock's ops/s at least `min` times rslock's (or the best peer's, node-redlock
/// too when it ran), and `extra`.
#[allow(clippy::too_many_arguments)]
fn solo_row(
    scenario: &str,
    d: &Rate,
    r: &Rate,
    min: f64,
    goal: &str,
    node: Option<&Rate>,
    best_peer: bool,
    extra: impl FnOnce(&mut Goals, &Rate, &Rate),
) -> Row {
    let ratio = x(d.per_sec, r.per_sec);
    let best = match node {
        Some(n) if best_peer => r.per_sec.max(n.per_sec),
        _ => r.per_sec,
    };
    let judged = x(d.per_sec, best);
    let mut g = Goals::default();
    let against = if best_peer { "best peer" } else { "rslock" };
    g.check(
        &format!("{scenario}: ops/s dlock/{against} (≥ {min:.1}×)"),
        format!("{judged:.2}×"),
        judged >= min,
    );
    if let Some(n) = node {
        println!(
            "  {scenario}: ops/s dlock/node-redlock {:.2}×, client CPU dlock/node-redlock {:.2}×",
            x(d.per_sec, n.per_sec),
            x(us(d.cpu), us(n.cpu))
        );
    }
    extra(&mut g, d, r);
    let verdict = g.verdict();
    let cell = |x: &Rate| {
        format!(
            "{}, server {:.1} µs/pair (CPU {:.1} µs)",
            x.cell(),
            x.server_us,
            x.server_cpu_us
        )
    };
    [
        scenario.into(),
        cell(r),
        node.map_or("—".into(), |n| n.cell()),
        cell(d),
        format!(
            "{ratio:.2}× ops ({judged:.2}× the best peer), {:.2}× client CPU",
            x(us(d.cpu), us(r.cpu))
        ),
        goal.into(),
        verdict,
    ]
}

/// node-redlock's runs.
struct NodeRuns {
    solo: Rate,
    crowd: Contended,
    redlock_solo: Rate,
    redlock_crowd: Contended,
}

async fn node_runs(
    m: &std::path::Path,
    one: &[String],
    five: &[String],
    run: Duration,
) -> Res<NodeRuns> {
    let solo = node_uncontended(m, one, run).await?;
    println!("uncontended, 1 client   node-redlock: {}", solo.cell());
    let crowd = node_contended(m, one, CLIENTS, run, "one").await?;
    print_contended("contended, 32 clients  ", "node-redlock", &crowd);
    let redlock_solo = node_uncontended(m, five, run).await?;
    println!(
        "redlock 5 nodes, 1 client node-redlock: {}",
        redlock_solo.cell()
    );
    let redlock_crowd = node_contended(m, five, CLIENTS, run, "five").await?;
    print_contended("redlock 5 nodes, 32    ", "node-redlock", &redlock_crowd);
    Ok(NodeRuns {
        solo,
        crowd,
        redlock_solo,
        redlock_crowd,
    })
}

/// 32 clients: dlock's critical sections/s at least `min` times rslock's, wait p99 at most
/// 0.1× rslock's, mutual exclusion kept, and `extra` (fairness or give-ups).
fn crowd_row(
    scenario: &str,
    d: &Contended,
    r: &Contended,
    node: Option<&Contended>,
    min: f64,
    goal: &str,
    extra: impl FnOnce(&mut Goals, &Contended),
) -> Row {
    let (ops, p99) = (x(d.per_sec, r.per_sec), x(us(d.p99), us(r.p99)));
    let mut g = Goals::default();
    g.check(
        &format!("{scenario}: critical sections/s dlock/rslock (≥ {min:.1}×)"),
        format!("{ops:.2}×"),
        ops >= min,
    )
    .check(
        &format!("{scenario}: wait p99 dlock/rslock (≤ 0.1×)"),
        format!("{p99:.3}×"),
        p99 <= 0.1,
    )
    .check(
        &format!("{scenario}: dlock keeps mutual exclusion"),
        d.exclusive().to_string(),
        d.exclusive(),
    );
    extra(&mut g, d);
    if let Some(n) = node {
        println!(
            "  {scenario}: dlock/node-redlock {:.2}× critical sections/s, {:.3}× wait p99",
            x(d.per_sec, n.per_sec),
            x(us(d.p99), us(n.p99))
        );
    }
    let ratio = format!("{ops:.2}× ops, {p99:.3}× p99");
    let verdict = g.verdict();
    [
        scenario.into(),
        r.cell(),
        node.map_or("—".into(), |n| n.cell()),
        d.cell(),
        ratio,
        goal.into(),
        verdict,
    ]
}

fn print_table(ping: &Rate, fan: &Rate, rows: &[Row], run: Duration) {
    println!();
    println!("| scenario | rslock 0.10 | node-redlock 4.2 | dlock | dlock/rslock | goal | |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| baseline, no lock: PING round trip | 1 node {}; 5 nodes in parallel {} | (same servers) | (same servers) | | | |",
        ping.cell(),
        fan.cell()
    );
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
    println!();
    println!(
        "One run, {run:?} per scenario, each client its own connection(s), critical section = GET + SET of a counter on the lock's server; `cargo bench -p distlock-lab --bench peers`."
    );
}
