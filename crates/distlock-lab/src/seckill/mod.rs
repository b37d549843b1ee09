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
//! | `lock` | `acquire_timeout(--wait)` of the same lock | never oversells, sells out |
//!
//! sold = orders created; oversold = max(0, orders − stock, −final stock); failed = buyers
//! without an order.

mod protocol;
pub mod worker;

use crate::progress::Progress;
use crate::store::{self, Store};
use crate::timeline;
use clap::Args;
use protocol::{BuyerReport, Outcome, SpanKind, Strategies, Strategy, WorkerMsg};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
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
    /// Strategies to run, comma-separated: none, local, optimistic, trylock, lock, or all.
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
        } else if self.sold == self.stock {
            "sold out"
        } else {
            "undersold"
        }
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
        })
    }
}

/// Runs `dlock seckill`; the exit code.
///
/// # Errors
///
/// None returned: a backend without a store, workers that cannot start or fail, and an
/// unwritable timeline are printed to stderr and make the exit code
/// [`EXIT_ERROR`](crate::EXIT_ERROR).
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
    let processes = args.processes.min(args.buyers).max(1);
    if !args.json {
        println!(
            "seckill on {url}: stock {}, {} buyers in {processes} processes, {} ms of work per sale",
            args.stock, args.buyers, args.work_ms
        );
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
        "{:<11} {:>6} {:>7} {:>6} {:>9} {:>7} {:>11} {:>9} {:>13} {:>13}  result",
        "strategy",
        "stock",
        "buyers",
        "sold",
        "oversold",
        "failed",
        "elapsed",
        "orders/s",
        "wait p50 µs",
        "wait p99 µs"
    );
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for r in rows {
        println!(
            "{:<11} {:>6} {:>7} {:>6} {:>9} {:>7} {:>11} {:>9.1} {:>13} {:>13}  {}",
            r.strategy.as_str(),
            r.stock,
            r.buyers,
            r.sold,
            r.oversold,
            r.failed,
            format!("{:.1} ms", r.elapsed_us as f64 / 1000.0),
            r.throughput(),
            opt(r.p50_wait_us),
            opt(r.p99_wait_us),
            r.verdict()
        );
    }
}

fn write_timeline(path: &Path, rows: &[Row]) -> Result<(), String> {
    let blocks: Vec<timeline::Block> = rows
        .iter()
        .map(|r| timeline::Block {
            strategy: r.strategy.as_str().to_owned(),
            title: format!(
                "{} — sold {} of {}, oversold {}, failed {} ({} processes, {} buyers, {:.1} ms)",
                r.strategy,
                r.sold,
                r.stock,
                r.oversold,
                r.failed,
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
    let store = store::open(url, "seckill", &run)
        .await
        .map_err(|e| e.to_string())?;
    store
        .setup(i64::from(args.stock))
        .await
        .map_err(|e| e.to_string())?;
    let mut progress = Progress::new(!args.json, strategy.as_str(), u64::from(args.buyers));
    let driven = drive(exe, url, args, strategy, &run, processes, &mut progress).await;
    progress.finish();
    let row = match driven {
        Ok(reports) => summarize(&*store, args, strategy, processes, reports).await,
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
        .map(|(p, r)| timeline::Track {
            process: *p,
            buyer: r.buyer,
            bars: r
                .spans
                .iter()
                .map(|s| timeline::Bar {
                    kind: match s.kind {
                        SpanKind::Hold => timeline::BarKind::Hold,
                        SpanKind::Window => timeline::BarKind::Window,
                        SpanKind::Attempt => timeline::BarKind::Attempt,
                        SpanKind::Conflict => timeline::BarKind::Conflict,
                    },
                    start_us: s.start_us,
                    end_us: s.end_us,
                })
                .collect(),
            order: r.order_us.map(|t| (t, beyond.contains(&r.buyer))),
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

/// Starts the workers, waits until all are ready, starts them together, collects the reports.
async fn drive(
    exe: &Path,
    url: &str,
    args: &SeckillArgs,
    strategy: Strategy,
    run: &str,
    processes: u32,
    progress: &mut Progress,
) -> Result<Vec<(usize, BuyerReport)>, String> {
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
        stdins.push(stdin);
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
            Some((i, Event::Msg(WorkerMsg::Buyer(_)))) => {
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
        stdin
            .write_all(go.as_bytes())
            .await
            .map_err(|e| format!("cannot start worker process {}: {e}", i + 1))?;
        stdin
            .flush()
            .await
            .map_err(|e| format!("cannot start worker process {}: {e}", i + 1))?;
    }
    drop(stdins);

    let started = Instant::now();
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
            Event::Msg(WorkerMsg::Error { message }) => {
                fatal.get_or_insert(format!("worker process {}: {message}", i + 1));
            }
            Event::Msg(WorkerMsg::Ready) | Event::Eof => {}
            Event::Bad(line) => {
                fatal.get_or_insert(format!("worker process {} said `{line}`", i + 1));
            }
        }
    }
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
    Ok(reports)
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
