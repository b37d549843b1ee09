//! `cargo bench -p distlock-lab --bench peers [-- --quick]`: dlock next to rslock (the Redlock
//! crate on crates.io), through the same scenarios in one run, on redis-servers this bench
//! starts itself (distlock-testkit). The goals of issue 14 are printed as ratios with "goal met"
//! or "goal not met", then as a markdown table for the README.
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

mod watchdog;
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
/// Redlock) for the lock `name`.
trait Peer: Sync {
    const NAME: &'static str;
    type Locker: Locker;
    fn connect(
        &self,
        nodes: &[String],
        name: &str,
    ) -> impl Future<Output = Res<Self::Locker>> + Send;
}

struct Dlock;

impl Peer for Dlock {
    const NAME: &'static str = "dlock";
    type Locker = distlock::Lock;

    async fn connect(&self, nodes: &[String], name: &str) -> Res<distlock::Lock> {
        let client = dlock_client(nodes, ClientOptions::default()).await?;
        Ok(client.lock(name)?)
    }
}

/// A dlock client of its own: the Redis backend on one node, Redlock on several.
async fn dlock_client(nodes: &[String], opts: ClientOptions) -> Res<Client> {
    let backend: Arc<dyn Backend> = match nodes {
        [one] => Arc::new(RedisBackend::connect(one, &opts).await?),
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
    type Locker = RsLocker;

    async fn connect(&self, nodes: &[String], name: &str) -> Res<RsLocker> {
        let clients = nodes
            .iter()
            .map(|u| redis::Client::open(u.as_str()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RsLocker {
            manager: rslock::LockManager::from_clients(clients),
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

/// Operations per second, p50 of each.
struct Rate {
    per_sec: f64,
    p50: Duration,
}

impl Rate {
    fn of(mut t: Timed) -> Rate {
        Rate {
            per_sec: t.samples.len() as f64 / t.elapsed.as_secs_f64().max(f64::MIN_POSITIVE),
            p50: pct(&mut t.samples, 0.5),
        }
    }

    fn cell(&self) -> String {
        format!("{:.0}/s, p50 {:.0} µs", self.per_sec, us(self.p50))
    }
}

/// The time of each call, and of them all.
#[derive(Default)]
struct Timed {
    samples: Vec<Duration>,
    elapsed: Duration,
}

/// Runs `op` back to back for `run`, adding to `into`.
async fn time_loop<F, Fut>(run: Duration, into: &mut Timed, mut op: F) -> Res<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<()>>,
{
    let start = Instant::now();
    while start.elapsed() < run {
        let t = Instant::now();
        op().await?;
        into.samples.push(t.elapsed());
    }
    into.elapsed += start.elapsed();
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

async fn connection(url: &str) -> Res<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
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
    let l = peer.connect(nodes, "peers-uncontended").await?;
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
    async fn open(url: &str, key: &str) -> Res<Counter> {
        Ok(Counter {
            con: connection(url).await?,
            key: key.to_owned(),
        })
    }

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
    counter: u64,
    /// Times a client entered while another was inside.
    overlaps: usize,
}

impl Contended {
    fn fairness(&self) -> f64 {
        self.min as f64 / self.max.max(1) as f64
    }

    fn exclusive(&self) -> bool {
        self.overlaps == 0 && self.counter == self.sections as u64
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

/// What the clients share: the end of the run and the mutual-exclusion probe.
struct Arena {
    start: Instant,
    end: Instant,
    inside: AtomicUsize,
    overlaps: AtomicUsize,
}

/// `CLIENTS` clients of `peer` on one name: acquire, critical section, release, until the run
/// ends (an acquire started before the end still completes).
async fn contended<P: Peer>(
    peer: &P,
    nodes: &[String],
    run: Duration,
    tag: &str,
) -> Res<Contended> {
    let (name, key) = (format!("peers-{tag}"), format!("peers-counter-{tag}"));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let l = peer.connect(nodes, &name).await?;
        pair(&l).await?;
        clients.push((l, Counter::open(&nodes[0], &key).await?));
    }
    let start = Instant::now() + Duration::from_millis(100);
    let arena = Arc::new(Arena {
        start,
        end: start + run,
        inside: AtomicUsize::new(0),
        overlaps: AtomicUsize::new(0),
    });
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(l, c)| tokio::spawn(contend(l, c, arena.clone())))
        .collect();
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await??);
    }
    let counter = Counter::open(&nodes[0], &key).await?.read().await?;
    Ok(summarize(
        runs,
        run,
        counter,
        arena.overlaps.load(Ordering::SeqCst),
    ))
}

async fn contend<L: Locker>(l: L, mut counter: Counter, arena: Arc<Arena>) -> Res<ClientRun> {
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
        if arena.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            arena.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let section = counter.bump().await;
        arena.inside.fetch_sub(1, Ordering::SeqCst);
        section?;
        me.sections += 1;
        if Instant::now() <= arena.end {
            me.in_run += 1;
        }
        if let Err(e) = l.release(held).await {
            me.failures += 1;
            me.last_error = Some(e.to_string());
        }
    }
    Ok(me)
}

fn summarize(runs: Vec<ClientRun>, run: Duration, counter: u64, overlaps: usize) -> Contended {
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
        counter,
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
        "{label} {lib:6}: {:.0} critical sections/s, wait p50 {:.0} µs p99 {:.1} ms max {:.1} ms, per-client ops {}–{} (min/max {:.2}), give-ups {}, errors {}, counter {} of {} sections",
        c.per_sec,
        us(c.p50),
        ms(c.p99),
        ms(c.worst),
        c.min,
        c.max,
        c.fairness(),
        c.give_ups,
        c.failures,
        c.counter,
        c.sections
    );
    if let Some(e) = &c.last_error {
        println!("  {lib} last error: {e}");
    }
    if !c.exclusive() {
        println!(
            "!!! MUTUAL EXCLUSION VIOLATED ({lib}, {label}): {} overlapping entries, {} lost updates",
            c.overlaps,
            c.sections as u64 - c.counter.min(c.sections as u64)
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
    let d = contended(&Dlock, nodes, run, &format!("{tag}-dlock")).await?;
    print_contended(label, Dlock::NAME, &d);
    let r = contended(&Rslock, nodes, run, &format!("{tag}-rslock")).await?;
    print_contended(label, Rslock::NAME, &r);
    Ok((d, r))
}

/// One client of each library, acquire + release in a loop, the two runs interleaved in
/// blocks (so that both see the same machine) adding up to `run` each.
async fn uncontended_pair(label: &str, nodes: &[String], run: Duration) -> Res<(Rate, Rate)> {
    let (mut dl, mut rl) = (solo(&Dlock, nodes).await?, solo(&Rslock, nodes).await?);
    let (mut td, mut tr) = (Timed::default(), Timed::default());
    for _ in 0..BLOCKS {
        (dl, td) = pairs_in_task(dl, run / BLOCKS, td).await?;
        (rl, tr) = pairs_in_task(rl, run / BLOCKS, tr).await?;
    }
    let (d, r) = (Rate::of(td), Rate::of(tr));
    for (lib, x) in [(Dlock::NAME, &d), (Rslock::NAME, &r)] {
        println!("{label} {lib:6}: {}", x.cell());
    }
    Ok((d, r))
}

/// A table row: scenario, rslock, dlock, ratio, goal, verdict.
type Row = [String; 6];

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Res<()> {
    let quick = std::env::args().any(|a| a == "--quick");
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
    let (rl_d, rl_r) = uncontended_pair("redlock 5 nodes, 1 client", &five, run).await?;
    let (rc_d, rc_r) = contended_pair("redlock 5 nodes, 32    ", &five, run, "five").await?;
    let w = watchdog_alone(held_server.url(), observe).await?;
    let ping_after = ping_rate(&one, run / 2).await?;
    println!(
        "baseline PING again at the end: {} ({:.2}x the first: the machine's drift)",
        ping_after.cell(),
        ping_after.per_sec / ping.per_sec
    );
    print_watchdog(&w);

    println!("goals (issue 14), ratios of this run:");
    let rows = [
        solo_row(
            "uncontended acquire+release, 1 client",
            &u_d,
            &u_r,
            1.0,
            "≥ 1.0×",
        ),
        crowd_row(
            "contended, 32 clients, one name",
            &c_d,
            &c_r,
            1.0,
            "≥ 1.0× ops, p99 ≤ 0.1×, min/max ≥ 0.5",
            |g, d| {
                g.check(
                    "contended, 32 clients, one name: dlock per-client min/max (≥ 0.5)",
                    format!("{:.2}", d.fairness()),
                    d.fairness() >= 0.5,
                );
            },
        ),
        // node-redlock, the other peer of the issue, is not run here: rslock is the best peer.
        solo_row(
            "Redlock 5 nodes, 1 client",
            &rl_d,
            &rl_r,
            1.2,
            "≥ 1.2× best peer",
        ),
        crowd_row(
            "Redlock 5 nodes, 32 clients",
            &rc_d,
            &rc_r,
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
        watchdog_row(&w),
    ];
    print_table(&ping, &fan, &rows, run);
    Ok(())
}

/// One client: dlock's ops/s at least `min` times rslock's.
fn solo_row(scenario: &str, d: &Rate, r: &Rate, min: f64, goal: &str) -> Row {
    let ratio = x(d.per_sec, r.per_sec);
    let mut g = Goals::default();
    g.check(
        &format!("{scenario}: ops/s dlock/rslock ({goal})"),
        format!("{ratio:.2}×"),
        ratio >= min,
    );
    let verdict = g.verdict();
    [
        scenario.into(),
        r.cell(),
        d.cell(),
        format!("{ratio:.2}×"),
        goal.into(),
        verdict,
    ]
}

/// 32 clients: dlock's critical sections/s at least `min` times rslock's, wait p99 at most
/// 0.1× rslock's, mutual exclusion kept, and `extra` (fairness or give-ups).
fn crowd_row(
    scenario: &str,
    d: &Contended,
    r: &Contended,
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
    let ratio = format!("{ops:.2}× ops, {p99:.3}× p99");
    let verdict = g.verdict();
    [
        scenario.into(),
        r.cell(),
        d.cell(),
        ratio,
        goal.into(),
        verdict,
    ]
}

fn print_table(ping: &Rate, fan: &Rate, rows: &[Row], run: Duration) {
    println!();
    println!("| scenario | rslock 0.10 | dlock | dlock/rslock | goal | |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| baseline, no lock: PING round trip | 1 node {}; 5 nodes in parallel {} | (same servers) | | | |",
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
