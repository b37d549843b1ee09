//! The hidden `dlock __seckill-worker` subcommand: one worker process of a `seckill` run.
//!
//! It opens the run's store (and, for `trylock`/`lock`, one `distlock::Client`), says `ready`,
//! waits for the parent's `go <unix µs>` line on stdin, sleeps until that instant and then runs
//! all its buyers concurrently as tokio tasks, reporting each on stdout (see
//! `protocol.rs`).

use super::protocol::{BuyerReport, Outcome, PausePoint, Span, SpanKind, Strategy, WorkerMsg};
use crate::store::{self, Fenced, Store};
use clap::Args;
use distlock::LockGuard;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::task::JoinSet;

/// Most compare-and-set attempts an `optimistic` buyer makes before it gives up.
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Arguments of one worker (set by the parent; not meant to be typed).
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Run id: names the store data and the lock `seckill:<run>`.
    #[arg(long)]
    run: String,
    /// Strategy.
    #[arg(long, value_parser = super::protocol::parse_strategy)]
    strategy: Strategy,
    /// Buyers of this process.
    #[arg(long)]
    buyers: u64,
    /// Id of this process's first buyer.
    #[arg(long)]
    first_buyer: u64,
    /// Simulated work between reading and writing the stock, ms.
    #[arg(long)]
    work_ms: u64,
    /// Longest wait for the lock (`lock` strategy), µs.
    #[arg(long)]
    wait_us: u64,
    /// Watchdog lease of the lock client, µs (default: the client's).
    #[arg(long)]
    lease_us: Option<u64>,
    /// The first buyer that holds the lock and read a stock above zero reports the pause point
    /// and waits for `continue` on stdin (`seckill --pause`).
    #[arg(long)]
    pause: bool,
}

/// Runs the worker; the exit code.
///
/// # Errors
///
/// None returned: a failure is sent to the parent as an `error` message on stdout (or
/// printed to stderr if stdout is gone) and makes the exit code
/// [`EXIT_ERROR`](distlock::program::EXIT_ERROR).
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future abandons its buyers mid-sale (their locks are
/// released in the background) and the parent gets no report from this worker.
pub async fn worker(url: &str, args: WorkerArgs) -> u8 {
    match run(url, args).await {
        Ok(()) => 0,
        Err(message) => {
            if emit(&WorkerMsg::Error {
                message: message.clone(),
            })
            .is_err()
            {
                eprintln!("dlock: seckill worker: {message}");
            }
            crate::EXIT_ERROR
        }
    }
}

/// Writes one message line to stdout.
fn emit(msg: &WorkerMsg) -> Result<(), String> {
    let line = serde_json::to_string(msg).map_err(|e| format!("cannot encode a report: {e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to the parent: {e}"))
}

/// Microseconds since the common start.
struct Clock {
    anchor: Instant,
}

impl Clock {
    fn us(&self) -> u64 {
        micros(Instant::now().saturating_duration_since(self.anchor))
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

struct Ctx {
    strategy: Strategy,
    store: Arc<dyn Store>,
    client: Option<distlock::Client>,
    lock_name: String,
    local: tokio::sync::Mutex<()>,
    work: Duration,
    wait: Duration,
    clock: Clock,
    /// With `--pause`: the parent's lines after `go`.
    resume: Option<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>>,
    /// A buyer of this process reached the pause point already.
    pause_asked: AtomicBool,
}

impl Ctx {
    async fn work(&self) {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
    }

    /// `--pause`: the first buyer here to hold the lock with a stock read tells the parent and
    /// waits for its `continue` (the parent may stop this process meanwhile).
    async fn pause_point(&self, buyer: u64, guard: &LockGuard) -> Result<(), String> {
        let Some(resume) = &self.resume else {
            return Ok(());
        };
        if self.pause_asked.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let at_us = self.clock.us();
        emit(&WorkerMsg::PausePoint(PausePoint {
            buyer,
            at_us,
            lease_end_us: at_us.saturating_add(micros(guard.lease_left())),
        }))?;
        match resume.lock().await.recv().await.as_deref().map(str::trim) {
            Some("continue") => Ok(()),
            Some(other) => Err(format!("expected `continue` on stdin, got `{other}`")),
            None => Err("the parent closed stdin at the pause point".into()),
        }
    }
}

/// The lines the parent sends after `go`, read by a thread of their own.
fn read_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

async fn run(url: &str, args: WorkerArgs) -> Result<(), String> {
    let store: Arc<dyn Store> = Arc::from(
        store::open(url, "seckill", &args.run)
            .await
            .map_err(|e| e.to_string())?,
    );
    let client = if args.strategy.uses_dlock() {
        let mut opts = distlock::ClientOptions::default();
        if let Some(us) = args.lease_us {
            opts = opts.watchdog_lease(Duration::from_micros(us));
        }
        Some(
            distlock::connect_with(url, opts)
                .await
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    emit(&WorkerMsg::Ready)?;
    let start_us = read_go().await?;
    let anchor = anchor_for(start_us);
    tokio::time::sleep_until(anchor.into()).await;
    let ctx = Arc::new(Ctx {
        strategy: args.strategy,
        store,
        client,
        lock_name: format!("seckill:{}", args.run),
        local: tokio::sync::Mutex::new(()),
        work: Duration::from_millis(args.work_ms),
        wait: Duration::from_micros(args.wait_us),
        clock: Clock { anchor },
        resume: args.pause.then(|| tokio::sync::Mutex::new(read_lines())),
        pause_asked: AtomicBool::new(false),
    });
    let mut set = JoinSet::new();
    let last = args.first_buyer.saturating_add(args.buyers);
    for buyer in args.first_buyer..last {
        let ctx = ctx.clone();
        set.spawn(async move {
            let report = buy(&ctx, buyer).await;
            emit(&WorkerMsg::Buyer(report))
        });
    }
    while let Some(done) = set.join_next().await {
        done.map_err(|e| format!("a buyer task failed: {e}"))??;
    }
    Ok(())
}

/// Reads `go <unix µs>` from stdin.
async fn read_go() -> Result<u64, String> {
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| format!("cannot read the start line: {e}"))?
    .map_err(|e| format!("cannot read the start line: {e}"))?;
    if line.is_empty() {
        return Err("the parent closed stdin before the start".into());
    }
    line.trim()
        .strip_prefix("go ")
        .and_then(|t| t.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("expected `go <unix µs>` on stdin, got `{}`", line.trim()))
}

/// The local instant of the wall-clock time `start_unix_us` (at most 10 s ahead).
fn anchor_for(start_unix_us: u64) -> Instant {
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(micros)
        .unwrap_or(0);
    let now = Instant::now();
    if start_unix_us >= now_unix {
        let ahead = Duration::from_micros(start_unix_us - now_unix).min(Duration::from_secs(10));
        now + ahead
    } else {
        now.checked_sub(Duration::from_micros(now_unix - start_unix_us))
            .unwrap_or(now)
    }
}

async fn buy(ctx: &Ctx, buyer: u64) -> BuyerReport {
    let mut r = BuyerReport {
        buyer,
        outcome: Outcome::Error,
        wait_us: None,
        spans: Vec::new(),
        order_us: None,
        done_us: 0,
        write_us: None,
        late_write: false,
        rejected_us: None,
        errors: Vec::new(),
    };
    let res = match ctx.strategy {
        Strategy::NoLock => sequence(ctx, buyer, &mut r, Some(SpanKind::Window), None).await,
        Strategy::Local => {
            let t = Instant::now();
            let _held = ctx.local.lock().await;
            r.wait_us = Some(micros(t.elapsed()));
            sequence(ctx, buyer, &mut r, Some(SpanKind::Window), None).await
        }
        Strategy::Optimistic => optimistic(ctx, buyer, &mut r).await,
        Strategy::Trylock | Strategy::Lock | Strategy::Fenced => locked(ctx, buyer, &mut r).await,
    };
    r.outcome = match res {
        Ok(o) => o,
        Err(e) => {
            r.errors.push(e);
            Outcome::Error
        }
    };
    r.done_us = ctx.clock.us();
    r
}

/// The deliberately non-atomic sale: read → check → work → write → order; under `guard`
/// (`trylock`, `lock`), with the pause point after the read.
async fn sequence(
    ctx: &Ctx,
    buyer: u64,
    r: &mut BuyerReport,
    window: Option<SpanKind>,
    guard: Option<&LockGuard>,
) -> Result<Outcome, String> {
    let start = ctx.clock.us();
    let (stock, _) = ctx.store.read().await.map_err(|e| e.to_string())?;
    if stock <= 0 {
        return Ok(Outcome::SoldOut);
    }
    if let Some(guard) = guard {
        ctx.pause_point(buyer, guard).await?;
    }
    ctx.work().await;
    r.write_us = Some(ctx.clock.us());
    r.late_write = guard.is_some_and(LockGuard::is_lost);
    ctx.store
        .write(stock - 1)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(kind) = window {
        r.spans.push(Span {
            kind,
            start_us: start,
            end_us: ctx.clock.us(),
        });
    }
    order(ctx, buyer, r).await
}

async fn optimistic(ctx: &Ctx, buyer: u64, r: &mut BuyerReport) -> Result<Outcome, String> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let start = ctx.clock.us();
        let (stock, version) = ctx.store.read().await.map_err(|e| e.to_string())?;
        if stock <= 0 {
            return Ok(Outcome::SoldOut);
        }
        ctx.work().await;
        let won = ctx
            .store
            .cas(version, stock - 1)
            .await
            .map_err(|e| e.to_string())?;
        r.spans.push(Span {
            kind: if won {
                SpanKind::Attempt
            } else {
                SpanKind::Conflict
            },
            start_us: start,
            end_us: ctx.clock.us(),
        });
        if won {
            return order(ctx, buyer, r).await;
        }
    }
    Ok(Outcome::Conflicts)
}

async fn locked(ctx: &Ctx, buyer: u64, r: &mut BuyerReport) -> Result<Outcome, String> {
    let client = ctx
        .client
        .as_ref()
        .ok_or("this worker has no lock client")?;
    let lock = client.lock(&ctx.lock_name).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let got = if ctx.strategy == Strategy::Trylock {
        lock.try_acquire().await
    } else {
        match lock.acquire_timeout(ctx.wait).await {
            Ok(g) => Ok(Some(g)),
            Err(e) if e.is_timeout() => Ok(None),
            Err(e) => Err(e),
        }
    };
    r.wait_us = Some(micros(t.elapsed()));
    let guard = match got.map_err(|e| e.to_string())? {
        Some(g) => g,
        None if ctx.strategy == Strategy::Trylock => return Ok(Outcome::Missed),
        None => return Ok(Outcome::TimedOut),
    };
    let held = ctx.clock.us();
    let res = if ctx.strategy == Strategy::Fenced {
        fenced_sale(ctx, buyer, r, &guard).await
    } else {
        sequence(ctx, buyer, r, None, Some(&guard)).await
    };
    let lost = guard.is_lost();
    let released = guard.release().await;
    r.spans.push(Span {
        kind: SpanKind::Hold,
        start_us: held,
        end_us: ctx.clock.us(),
    });
    match released {
        Ok(outcome) if outcome.was_held() => {}
        // The lease ran out under the holder (`--pause`) and the lock was handed on, as its
        // lost signal says: what the run shows, not an error of the run.
        Ok(_) if lost => {}
        Ok(outcome) => r.errors.push(format!(
            "the lock was no longer held at release ({outcome:?}): mutual exclusion may have been lost"
        )),
        Err(e) => r.errors.push(format!("release failed: {e}")),
    }
    res
}

/// Creates the buyer's order.
async fn order(ctx: &Ctx, buyer: u64, r: &mut BuyerReport) -> Result<Outcome, String> {
    ctx.store
        .add_order(buyer)
        .await
        .map_err(|e| e.to_string())?;
    r.order_us = Some(ctx.clock.us());
    Ok(Outcome::Bought)
}

/// The `fenced` sale: the stock read and written through the store's fence with the grant's
/// token, so that a holder whose lease ended is rejected once a newer holder used the store.
async fn fenced_sale(
    ctx: &Ctx,
    buyer: u64,
    r: &mut BuyerReport,
    guard: &LockGuard,
) -> Result<Outcome, String> {
    let token = guard.fencing_token();
    let stock = match ctx
        .store
        .fenced_read(&ctx.lock_name, token)
        .await
        .map_err(|e| e.to_string())?
    {
        Fenced::Done(stock) => stock,
        Fenced::Stale { .. } => {
            r.rejected_us = Some(ctx.clock.us());
            return Ok(Outcome::Rejected);
        }
    };
    if stock <= 0 {
        return Ok(Outcome::SoldOut);
    }
    ctx.pause_point(buyer, guard).await?;
    ctx.work().await;
    r.write_us = Some(ctx.clock.us());
    r.late_write = guard.is_lost();
    match ctx
        .store
        .fenced_write(&ctx.lock_name, token, stock - 1)
        .await
        .map_err(|e| e.to_string())?
    {
        Fenced::Done(()) => {}
        Fenced::Stale { .. } => {
            r.rejected_us = Some(ctx.clock.us());
            return Ok(Outcome::Rejected);
        }
    }
    order(ctx, buyer, r).await
}
