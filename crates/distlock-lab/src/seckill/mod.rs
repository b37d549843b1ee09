//! `dlock seckill`: the flash-sale (秒杀) experiment of the seeds, across real OS processes.
//!
//! The parent re-executes its own binary as `--processes` worker processes (the hidden
//! `__seckill-worker` subcommand, see [`worker`]), each running its share of the buyers as
//! concurrent tokio tasks. Workers connect, say `ready`, and all start at one instant the
//! parent sends them, so the race shows on every run. Every buyer does the deliberately
//! non-atomic sale — read the stock, if it is above zero work for `--work-ms`, write
//! stock − 1, create an order — on the backend's own store (the stock and orders kept next to the locks), protected by one
//! of the strategies:
//!
//! | strategy | protection | across processes |
//! |---|---|---|
//! | `none` | nothing | oversells |
//! | `local` | an in-process tokio mutex | oversells (each process sells the whole stock) |
//! | `optimistic` | version compare-and-set, retried from the read (at most [`worker::MAX_CAS_ATTEMPTS`] attempts) | never oversells, may undersell |
//! | `trylock` | `try_acquire` of the lock `seckill:<run>`; a buyer who misses gives up | never oversells, undersells |
//! | `lock` | `acquire_timeout(--wait)` of the same lock | never oversells, sells out — unless a holder stalls past its lease (`--pause`) |
//! | `fenced` | the lock, and the stock read and written through the store's fence with the grant's fencing token (crate distlock-fence) | never oversells, even with `--pause` |
//!
//! sold = orders created; oversold = max(0, orders − stock, −final stock); lost updates =
//! decrements overwritten (final stock − (stock − orders), when above zero); failed = buyers
//! without an order; late writes = writes of the stock by a buyer whose lease had ended;
//! rejected = buyers whose read or write the store's fence rejected.
//!
//! `--pause D` stops (SIGSTOP) the process of one buyer of `trylock`, `lock` and `fenced` for
//! `D` while that buyer holds the lock, after it read the stock and before it writes: with `D`
//! above the lease (`--lease`), the lock service hands the lock on meanwhile, and the buyer
//! writes after its lease ended (`late_writes`). `lock` lets that write land (a lost update and
//! an oversell); `fenced` rejects it (`fenced_rejections`). A `file://` lock has no lease (the
//! kernel keeps a stopped process's `flock`): at the lease end the lab takes the lock away from
//! the stopped process (`pidfd_getfd(2)` and `LOCK_UN`, Linux), as a lease server would.

mod protocol;
pub mod worker;

use crate::progress::Progress;
use crate::store::{self, Store};
use crate::timeline;
use clap::Args;
use protocol::{BuyerReport, Outcome, PausePoint, SpanKind, Strategies, Strategy, WorkerMsg};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;

/// Name of the hidden worker subcommand.
pub const WORKER_COMMAND: &str = "__seckill-worker";

/// How far ahead of "all workers are ready" the common start instant lies.
const START_MARGIN: Duration = Duration::from_millis(25);
/// Longest wait for the workers to connect and say `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for a worker to exit after its last report.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// `dlock seckill` arguments.
#[derive(Args, Debug)]
pub struct SeckillArgs {
    /// Initial stock (0 is allowed: nothing can be sold).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    stock: u32,
    /// Buyers in all, spread evenly over the processes.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    buyers: u32,
    /// Worker processes (at most one per buyer is started).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    processes: u32,
    /// Simulated work between reading and writing the stock, in milliseconds.
    #[arg(long = "work-ms", default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    work_ms: u64,
    /// Strategies to run, comma-separated: none, local, optimistic, trylock, lock, fenced, or
    /// all.
    #[arg(long, default_value = "all", value_parser = protocol::parse_strategies)]
    strategy: Strategies,
    /// Print one JSON object per strategy and line instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw the runs as an SVG timeline into this file.
    #[arg(long, value_name = "FILE.svg")]
    timeline: Option<PathBuf>,
    /// `lock` strategy: how long a buyer waits for the lock, e.g. 500ms, 30s.
    #[arg(long, value_parser = crate::duration_arg, default_value = "30s")]
    wait: Duration,
    /// Lease of the lock (`trylock`, `lock`, `fenced`), renewed by the watchdog while the buyer
    /// runs, e.g. 1s (default: the client's, 30 s).
    #[arg(long, value_parser = crate::duration_arg)]
    lease: Option<Duration>,
    /// Stop one buyer's process (SIGSTOP) for this long while it holds the lock, after it read
    /// the stock and before it writes (`trylock`, `lock`, `fenced`); longer than `--lease`, the
    /// lock is handed on meanwhile, e.g. `--pause 2s --lease 1s`.
    #[arg(long, value_parser = crate::duration_arg)]
    pause: Option<Duration>,
}

/// What happened to the buyer stopped by `--pause`; times in µs since the common start.
#[derive(Debug, Clone)]
struct PauseRecord {
    /// Its worker process (0-based).
    process: usize,
    buyer: u64,
    stopped_us: u64,
    /// When its lease ended (as its client computed it), if before the resume.
    lease_end_us: Option<u64>,
    resumed_us: u64,
}

/// The result of one strategy.
#[derive(Debug, Clone)]
struct Row {
    strategy: Strategy,
    stock: u64,
    buyers: u64,
    processes: u64,
    sold: u64,
    oversold: u64,
    failed: u64,
    elapsed_us: u64,
    p50_wait_us: Option<u64>,
    p99_wait_us: Option<u64>,
    final_stock: i64,
    late_writes: u64,
    fenced_rejections: u64,
    pause: Option<PauseRecord>,
    errors: Vec<String>,
    tracks: Vec<timeline::Track>,
}

impl Row {
    fn throughput(&self) -> f64 {
        if self.elapsed_us == 0 {
            0.0
        } else {
            self.sold as f64 / (self.elapsed_us as f64 / 1e6)
        }
    }

    fn verdict(&self) -> &'static str {
        if self.oversold > 0 {
            "OVERSOLD"
        } else if self.lost_updates() > 0 {
            "LOST UPDATE"
        } else if self.sold == self.stock {
            "sold out"
        } else {
            "undersold"
        }
    }

    /// Decrements of the stock that a later write overwrote: the final stock above what the
    /// orders left (stock − sold).
    fn lost_updates(&self) -> u64 {
        let left = i128::from(self.stock) - i128::from(self.sold);
        u64::try_from(i128::from(self.final_stock) - left).unwrap_or(0)
    }

    fn json(&self, backend: &str) -> serde_json::Value {
        serde_json::json!({
            "strategy": self.strategy.as_str(),
            "backend": backend,
            "stock": self.stock,
            "buyers": self.buyers,
            "processes": self.processes,
            "sold": self.sold,
            "oversold": self.oversold,
            "failed": self.failed,
            "elapsed_ms": self.elapsed_us as f64 / 1000.0,
            "p50_wait_us": self.p50_wait_us,
            "p99_wait_us": self.p99_wait_us,
            "lost_updates": self.lost_updates(),
            "late_writes": self.late_writes,
            "fenced_rejections": self.fenced_rejections,
            "paused_buyer": self.pause.as_ref().map(|p| p.buyer),
        })
    }
}

/// Runs `dlock seckill`; the exit code.
///
/// # Errors
///
/// None returned: a backend without a store, workers that cannot start or fail, and an
/// unwritable timeline are printed to stderr and make the exit code
/// [`EXIT_ERROR`](distlock::program::EXIT_ERROR).
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future kills the workers (`kill_on_drop`) and leaves the
/// run's stock and orders in the store.
pub async fn seckill(url: &str, args: SeckillArgs) -> u8 {
    if let Err(e) = store::check_supported(url) {
        eprintln!("dlock: seckill: {e}");
        return crate::EXIT_ERROR;
    }
    let backend = store::scheme(url).unwrap_or_default();
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("dlock: seckill: cannot find this program to start the workers: {e}");
            return crate::EXIT_ERROR;
        }
    };
    if let Some(lease) = args.lease {
        if let Err(e) = distlock::ClientOptions::default()
            .watchdog_lease(lease)
            .validate()
        {
            eprintln!("dlock: seckill: --lease: {e}");
            return crate::EXIT_ERROR;
        }
    }
    if args.pause.is_some_and(|p| p.is_zero()) {
        eprintln!("dlock: seckill: --pause must be above zero, e.g. --pause 2s");
        return crate::EXIT_ERROR;
    }
    let processes = args.processes.min(args.buyers).max(1);
    if !args.json {
        println!(
            "seckill on {url}: stock {}, {} buyers in {processes} processes, {} ms of work per sale",
            args.stock, args.buyers, args.work_ms
        );
        if let Some(pause) = args.pause {
            let lease = args
                .lease
                .unwrap_or(distlock::ClientOptions::default().get_watchdog_lease());
            println!(
                "--pause {pause:?}: one buyer of trylock, lock and fenced is stopped while it holds the lock (lease {lease:?}){}",
                if backend == "file" {
                    "; file:// has no lease, so the lab takes the lock away from it at the lease end"
                } else {
                    ""
                }
            );
        }
        println!();
    }
    let mut code = 0;
    let mut rows = Vec::new();
    for &strategy in &args.strategy.0 {
        match run_one(&exe, url, &args, strategy, processes).await {
            Ok(row) => {
                if !row.errors.is_empty() {
                    eprintln!(
                        "dlock: seckill `{strategy}`: {} error(s); the first: {}",
                        row.errors.len(),
                        row.errors[0]
                    );
                    code = crate::EXIT_ERROR;
                }
                if args.json {
                    println!("{}", row.json(&backend));
                }
                rows.push(row);
            }
            Err(e) => {
                eprintln!("dlock: seckill `{strategy}`: {e}");
                code = crate::EXIT_ERROR;
                break;
            }
        }
    }
    if !args.json && !rows.is_empty() {
        print_table(&rows);
    }
    if let Some(path) = &args.timeline {
        match write_timeline(path, &rows) {
            Ok(()) if !args.json => println!("\ntimeline written to {}", path.display()),
            Ok(()) => {}
            Err(e) => {
                eprintln!("dlock: seckill: {e}");
                code = crate::EXIT_ERROR;
            }
        }
    }
    code
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<11} {:>6} {:>7} {:>6} {:>9} {:>7} {:>5} {:>8} {:>11} {:>9} {:>13} {:>13}  result",
        "strategy",
        "stock",
        "buyers",
        "sold",
        "oversold",
        "failed",
        "late",
        "rejected",
        "elapsed",
        "orders/s",
        "wait p50 µs",
        "wait p99 µs"
    );
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for r in rows {
        println!(
            "{:<11} {:>6} {:>7} {:>6} {:>9} {:>7} {:>5} {:>8} {:>11} {:>9.1} {:>13} {:>13}  {}",
            r.strategy.as_str(),
            r.stock,
            r.buyers,
            r.sold,
            r.oversold,
            r.failed,
            r.late_writes,
            r.fenced_rejections,
            format!("{:.1} ms", r.elapsed_us as f64 / 1000.0),
            r.throughput(),
            opt(r.p50_wait_us),
            opt(r.p99_wait_us),
            r.verdict()
        );
    }
    for r in rows {
        if let Some(p) = &r.pause {
            println!("{}", pause_line(r, p));
        }
    }
}

/// What `--pause` did in one strategy, in a sentence.
fn pause_line(r: &Row, p: &PauseRecord) -> String {
    let ms = |us: u64| format!("{:.1} ms", us as f64 / 1000.0);
    let lease = match p.lease_end_us {
        Some(end) => format!("its lease ended at {}", ms(end)),
        None => "its lease did not end".to_owned(),
    };
    let write = if r.fenced_rejections > 0 {
        "its late write was rejected by the fence"
    } else if r.late_writes > 0 {
        "its late write landed"
    } else {
        "it did not write late"
    };
    format!(
        "{}: buyer {} (process {}) stopped at {} for {}; {lease}; {write}",
        r.strategy,
        p.buyer,
        p.process + 1,
        ms(p.stopped_us),
        ms(p.resumed_us.saturating_sub(p.stopped_us)),
    )
}

fn write_timeline(path: &Path, rows: &[Row]) -> Result<(), String> {
    let blocks: Vec<timeline::Block> = rows
        .iter()
        .map(|r| timeline::Block {
            strategy: r.strategy.as_str().to_owned(),
            title: format!(
                "{} — sold {} of {}, oversold {}, failed {}, late writes {}, rejected {} ({} processes, {} buyers, {:.1} ms)",
                r.strategy,
                r.sold,
                r.stock,
                r.oversold,
                r.failed,
                r.late_writes,
                r.fenced_rejections,
                r.processes,
                r.buyers,
                r.elapsed_us as f64 / 1000.0
            ),
            processes: usize::try_from(r.processes).unwrap_or(1),
            tracks: r.tracks.clone(),
        })
        .collect();
    std::fs::write(path, timeline::render(&blocks))
        .map_err(|e| format!("cannot write the timeline to {}: {e}", path.display()))
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn new_run_id(strategy: Strategy) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{:x}-{}", std::process::id(), nanos, strategy.as_str())
}

/// Runs one strategy end to end: set up the store, run the workers, count, clean up.
async fn run_one(
    exe: &Path,
    url: &str,
    args: &SeckillArgs,
    strategy: Strategy,
    processes: u32,
) -> Result<Row, String> {
    let run = new_run_id(strategy);
    let store: Arc<dyn Store> = Arc::from(
        store::open(url, "seckill", &run)
            .await
            .map_err(|e| e.to_string())?,
    );
    store
        .setup(i64::from(args.stock))
        .await
        .map_err(|e| e.to_string())?;
    let mut progress = Progress::new(!args.json, strategy.as_str(), u64::from(args.buyers));
    let driven = drive(
        exe,
        url,
        args,
        strategy,
        &run,
        processes,
        &mut progress,
        &store,
    )
    .await;
    progress.finish();
    let row = match driven {
        Ok((reports, pause)) => summarize(&*store, args, strategy, processes, reports, pause).await,
        Err(e) => Err(e),
    };
    let cleaned = store.cleanup().await;
    if strategy.uses_dlock() {
        // Every worker has exited: nobody uses the lock any more.
        let _ = store.forget_lock(&format!("seckill:{run}")).await;
    }
    let row = row?;
    cleaned.map_err(|e| e.to_string())?;
    Ok(row)
}

async fn summarize(
    store: &dyn Store,
    args: &SeckillArgs,
    strategy: Strategy,
    processes: u32,
    reports: Vec<(usize, BuyerReport)>,
    pause: Option<PauseRecord>,
) -> Result<Row, String> {
    // The buyers wrote through other clients: see all of their writes.
    store.sync().await.map_err(|e| e.to_string())?;
    let orders = store.orders().await.map_err(|e| e.to_string())?;
    let (final_stock, _) = store.read().await.map_err(|e| e.to_string())?;
    let stock = u64::from(args.stock);
    let sold = orders.len() as u64;
    let negative = final_stock.min(0).unsigned_abs();
    let oversold = sold.saturating_sub(stock).max(negative);
    // The orders beyond the stock, in the order they were appended (time order).
    let beyond: HashSet<u64> = orders
        .iter()
        .skip(usize::try_from(stock).unwrap_or(usize::MAX))
        .copied()
        .collect();
    let bought = reports
        .iter()
        .filter(|(_, r)| r.outcome == Outcome::Bought)
        .count() as u64;
    let mut waits: Vec<u64> = reports.iter().filter_map(|(_, r)| r.wait_us).collect();
    let (p50, p99) = if strategy.has_lock() {
        crate::stats::p50_p99(&mut waits)
    } else {
        (None, None)
    };
    let mut errors: Vec<String> = reports
        .iter()
        .flat_map(|(_, r)| r.errors.iter().cloned())
        .collect();
    if bought != sold {
        errors.push(format!(
            "buyers reported {bought} purchases but the store holds {sold} orders"
        ));
    }
    let tracks = reports
        .iter()
        .map(|(p, r)| {
            let mut bars: Vec<timeline::Bar> = r
                .spans
                .iter()
                .map(|s| timeline::Bar {
                    kind: match s.kind {
                        SpanKind::Hold => timeline::BarKind::Hold,
                        SpanKind::Window => timeline::BarKind::Window,
                        SpanKind::Attempt => timeline::BarKind::Attempt,
                        SpanKind::Conflict => timeline::BarKind::Conflict,
                        SpanKind::Pause => timeline::BarKind::Pause,
                    },
                    start_us: s.start_us,
                    end_us: s.end_us,
                })
                .collect();
            let mut marks = Vec::new();
            if let Some(pz) = pause.as_ref().filter(|pz| pz.buyer == r.buyer) {
                bars.push(timeline::Bar {
                    kind: timeline::BarKind::Pause,
                    start_us: pz.stopped_us,
                    end_us: pz.resumed_us,
                });
                if let Some(end) = pz.lease_end_us {
                    marks.push((timeline::MarkKind::LeaseLost, end));
                }
            }
            if let Some(at) = r.rejected_us {
                marks.push((timeline::MarkKind::Rejected, at));
            } else if let Some(at) = r.write_us.filter(|_| r.late_write) {
                marks.push((timeline::MarkKind::LateWrite, at));
            }
            timeline::Track {
                process: *p,
                buyer: r.buyer,
                bars,
                marks,
                order: r.order_us.map(|t| (t, beyond.contains(&r.buyer))),
            }
        })
        .collect();
    Ok(Row {
        strategy,
        stock,
        buyers: u64::from(args.buyers),
        processes: u64::from(processes),
        sold,
        oversold,
        failed: u64::from(args.buyers).saturating_sub(bought),
        elapsed_us: reports.iter().map(|(_, r)| r.done_us).max().unwrap_or(0),
        p50_wait_us: p50,
        p99_wait_us: p99,
        final_stock,
        late_writes: reports.iter().filter(|(_, r)| r.late_write).count() as u64,
        fenced_rejections: reports
            .iter()
            .filter(|(_, r)| r.outcome == Outcome::Rejected)
            .count() as u64,
        pause,
        errors,
        tracks,
    })
}

enum Event {
    Msg(WorkerMsg),
    Bad(String),
    Eof,
}

async fn read_worker(i: usize, out: ChildStdout, tx: mpsc::UnboundedSender<(usize, Event)>) {
    let mut lines = BufReader::new(out).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                let ev = match serde_json::from_str::<WorkerMsg>(&line) {
                    Ok(m) => Event::Msg(m),
                    Err(_) => Event::Bad(line),
                };
                if tx.send((i, ev)).is_err() {
                    return;
                }
            }
            Ok(None) | Err(_) => {
                let _ = tx.send((i, Event::Eof));
                return;
            }
        }
    }
}

/// Buyers of worker `i` of `n`.
fn share(buyers: u32, n: u32, i: u32) -> u32 {
    buyers / n + u32::from(i < buyers % n)
}

async fn exit_status(i: usize, child: &mut Child) -> String {
    match tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await {
        Ok(Ok(st)) => format!("worker process {} exited early ({st})", i + 1),
        Ok(Err(e)) => format!("worker process {} failed: {e}", i + 1),
        Err(_) => format!("worker process {} stopped talking", i + 1),
    }
}

/// Starts the workers, waits until all are ready, starts them together, collects the reports
/// (and, with `--pause`, stops the first buyer that reaches the pause point).
#[allow(clippy::too_many_arguments)]
async fn drive(
    exe: &Path,
    url: &str,
    args: &SeckillArgs,
    strategy: Strategy,
    run: &str,
    processes: u32,
    progress: &mut Progress,
    store: &Arc<dyn Store>,
) -> Result<(Vec<(usize, BuyerReport)>, Option<PauseRecord>), String> {
    let pause = args.pause.filter(|_| strategy.uses_dlock());
    progress.set(0, "starting the workers");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut children = Vec::new();
    let mut stdins = Vec::new();
    let mut first = 0u64;
    for i in 0..processes {
        let n = share(args.buyers, processes, i);
        let mut child = Command::new(exe)
            .arg("--backend")
            .arg(url)
            .arg(WORKER_COMMAND)
            .args(["--run", run, "--strategy", strategy.as_str()])
            .arg("--buyers")
            .arg(n.to_string())
            .arg("--first-buyer")
            .arg(first.to_string())
            .arg("--work-ms")
            .arg(args.work_ms.to_string())
            .arg("--wait-us")
            .arg(args.wait.as_micros().to_string())
            .args(
                args.lease
                    .into_iter()
                    .flat_map(|l| ["--lease-us".to_owned(), l.as_micros().to_string()]),
            )
            .args(pause.map(|_| "--pause"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start a worker process ({}): {e}", exe.display()))?;
        let (Some(out), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("a worker process has no stdin or stdout pipe".into());
        };
        tokio::spawn(read_worker(children.len(), out, tx.clone()));
        stdins.push(Some(stdin));
        children.push(child);
        first += u64::from(n);
    }
    drop(tx);

    // Everyone connects first …
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let mut ready = 0;
    while ready < children.len() {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| format!("the workers were not ready within {READY_TIMEOUT:?}"))?;
        match ev {
            Some((_, Event::Msg(WorkerMsg::Ready))) => ready += 1,
            Some((i, Event::Msg(WorkerMsg::Error { message }))) => {
                return Err(format!("worker process {}: {message}", i + 1))
            }
            Some((i, Event::Msg(WorkerMsg::Buyer(_) | WorkerMsg::PausePoint(_)))) => {
                return Err(format!(
                    "worker process {} started before the signal",
                    i + 1
                ))
            }
            Some((i, Event::Bad(line))) => {
                return Err(format!("worker process {} said `{line}`", i + 1))
            }
            Some((i, Event::Eof)) => {
                let msg = match children.get_mut(i) {
                    Some(c) => exit_status(i, c).await,
                    None => format!("worker process {} exited early", i + 1),
                };
                return Err(msg);
            }
            None => return Err("every worker process exited before it was ready".into()),
        }
    }

    // … then all start at one instant.
    let start = unix_us() + u64::try_from(START_MARGIN.as_micros()).unwrap_or(0);
    let go = format!("go {start}\n");
    for (i, stdin) in stdins.iter_mut().enumerate() {
        if let Some(stdin) = stdin {
            say(stdin, &go)
                .await
                .map_err(|e| format!("cannot start worker process {}: {e}", i + 1))?;
        }
    }
    if pause.is_none() {
        stdins.clear();
    }

    let started = Instant::now();
    let mut pausing: Option<tokio::task::JoinHandle<Result<PauseRecord, String>>> = None;
    let mut reports = Vec::with_capacity(args.buyers as usize);
    let mut fatal: Option<String> = None;
    while let Some((i, ev)) = rx.recv().await {
        match ev {
            Event::Msg(WorkerMsg::Buyer(r)) => {
                reports.push((i, r));
                progress.set(
                    reports.len() as u64,
                    &format!("{:.1} s", started.elapsed().as_secs_f64()),
                );
            }
            Event::Msg(WorkerMsg::PausePoint(point)) => {
                let stdin = stdins.get_mut(i).and_then(Option::take);
                let pid = children.get(i).and_then(Child::id);
                match (stdin, pid, pause) {
                    (Some(stdin), Some(pid), Some(pause)) if pausing.is_none() => {
                        let stop = Stop {
                            process: i,
                            pid,
                            point,
                            pause,
                            start,
                            store: store.clone(),
                            lock_name: format!("seckill:{run}"),
                        };
                        pausing = Some(tokio::spawn(stop.run(stdin)));
                    }
                    // Another process's buyer: it goes on at once.
                    (Some(mut stdin), _, _) => {
                        if let Err(e) = say(&mut stdin, "continue\n").await {
                            fatal.get_or_insert(format!("worker process {}: {e}", i + 1));
                        }
                    }
                    (None, _, _) => {
                        fatal.get_or_insert(format!(
                            "worker process {} reached the pause point twice",
                            i + 1
                        ));
                    }
                }
            }
            Event::Msg(WorkerMsg::Error { message }) => {
                fatal.get_or_insert(format!("worker process {}: {message}", i + 1));
            }
            Event::Msg(WorkerMsg::Ready) | Event::Eof => {}
            Event::Bad(line) => {
                fatal.get_or_insert(format!("worker process {} said `{line}`", i + 1));
            }
        }
    }
    let paused = match pausing {
        Some(task) => match task.await {
            Ok(Ok(record)) => Some(record),
            Ok(Err(e)) => {
                fatal.get_or_insert(e);
                None
            }
            Err(e) => {
                fatal.get_or_insert(format!("the pause task failed: {e}"));
                None
            }
        },
        None => None,
    };
    drop(stdins);
    for (i, child) in children.iter_mut().enumerate() {
        match tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await {
            Ok(Ok(st)) if st.success() => {}
            Ok(Ok(st)) => {
                fatal.get_or_insert(format!("worker process {} exited with {st}", i + 1));
            }
            Ok(Err(e)) => {
                fatal.get_or_insert(format!("worker process {} failed: {e}", i + 1));
            }
            Err(_) => {
                let _ = child.kill().await;
                fatal.get_or_insert(format!("worker process {} did not exit", i + 1));
            }
        }
    }
    if let Some(f) = fatal {
        return Err(f);
    }
    if reports.len() != args.buyers as usize {
        return Err(format!(
            "only {} of {} buyers reported",
            reports.len(),
            args.buyers
        ));
    }
    Ok((reports, paused))
}

/// Writes `line` to a worker's stdin.
async fn say(stdin: &mut ChildStdin, line: &str) -> std::io::Result<()> {
    stdin.write_all(line.as_bytes()).await?;
    stdin.flush().await
}

/// `--pause`: stopping the worker process of the buyer at the pause point.
struct Stop {
    process: usize,
    pid: u32,
    point: PausePoint,
    pause: Duration,
    /// The common start, µs since the Unix epoch.
    start: u64,
    store: Arc<dyn Store>,
    lock_name: String,
}

impl Stop {
    /// µs since the common start.
    fn now_us(&self) -> u64 {
        unix_us().saturating_sub(self.start)
    }

    /// SIGSTOP, the lease end (on `file://` the lock taken away then), SIGCONT after the pause,
    /// and `continue` to the buyer. The process is continued whatever fails.
    async fn run(self, mut stdin: ChildStdin) -> Result<PauseRecord, String> {
        signal(self.pid, libc::SIGSTOP)?;
        let stopped = self.stopped().await;
        let resumed_at = tokio::time::Instant::now() + self.pause;
        let stopped_us = self.now_us();
        let lease_end = match stopped {
            Ok(()) => self.at_lease_end(resumed_at).await,
            Err(e) => Err(e),
        };
        tokio::time::sleep_until(resumed_at).await;
        let continued = signal(self.pid, libc::SIGCONT);
        let resumed_us = self.now_us();
        let lease_end_us = lease_end?;
        continued?;
        say(&mut stdin, "continue\n")
            .await
            .map_err(|e| format!("worker process {}: {e}", self.process + 1))?;
        Ok(PauseRecord {
            process: self.process,
            buyer: self.point.buyer,
            stopped_us,
            lease_end_us,
            resumed_us,
        })
    }

    /// Waits until the process is stopped (`T` in `/proc/PID/stat`).
    async fn stopped(&self) -> Result<(), String> {
        let path = format!("/proc/{}/stat", self.pid);
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let stat =
                std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.trim_start().chars().next());
            if matches!(state, Some('T' | 't')) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("worker process {} did not stop", self.process + 1));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Sleeps until the stopped buyer's lease ends, if that is before `resumed_at`, and has the
    /// store do what the lock service does then; the lease end, µs.
    async fn at_lease_end(&self, resumed_at: tokio::time::Instant) -> Result<Option<u64>, String> {
        let left = Duration::from_micros(self.point.lease_end_us.saturating_sub(self.now_us()));
        let at = tokio::time::Instant::now() + left;
        if at >= resumed_at {
            return Ok(None);
        }
        tokio::time::sleep_until(at).await;
        self.store
            .expire_stopped_holder(self.pid, &self.lock_name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Some(self.point.lease_end_us))
    }
}

/// `kill(2)`.
fn signal(pid: u32, sig: libc::c_int) -> Result<(), String> {
    let p = libc::pid_t::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    // SAFETY: kill(2) on a child process of ours; no memory is passed.
    if unsafe { libc::kill(p, sig) } != 0 {
        return Err(format!(
            "cannot signal worker process {pid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        for (buyers, n) in [(30, 3), (31, 3), (1, 1), (7, 4), (100, 64)] {
            let total: u32 = (0..n).map(|i| share(buyers, n, i)).sum();
            assert_eq!(total, buyers);
        }
        assert_eq!(share(31, 3, 0), 11);
        assert_eq!(share(31, 3, 2), 10);
    }
}
