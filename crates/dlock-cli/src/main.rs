//! `dlock`: run a command under a distributed lock, inspect locks.

mod bench;
mod inspect;
mod kind;
mod progress;
mod run;
mod seckill;
mod stats;
mod store;
mod timeline;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Distributed locks from the command line.
#[derive(Parser, Debug)]
#[command(name = "dlock", version, about, long_about = None)]
struct Cli {
    /// Lock service URL: file://DIR (default, no server), redis://host:port, …
    #[arg(long, global = true, env = "DLOCK_BACKEND", default_value = dlock::DEFAULT_BACKEND)]
    backend: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock; exit with its exit code
    /// (75: not acquired within --wait, 76: lock lost while the command ran).
    Run(run::RunArgs),
    /// Show who holds a lock, its remaining lease and its last fencing token.
    Inspect(inspect::InspectArgs),
    /// The flash-sale experiment: buyers in several processes race for a small stock, with
    /// no lock, a local lock, optimistic versions, trylock and lock; shows who oversells.
    Seckill(seckill::SeckillArgs),
    /// Measure lock latency and throughput (uncontended, contended).
    Bench(bench::BenchArgs),
    /// One worker process of `dlock seckill` (started by it; not for direct use).
    #[command(name = "__seckill-worker", hide = true)]
    SeckillWorker(seckill::worker::WorkerArgs),
}

/// Exit code when the lock was not acquired within `--wait` (EX_TEMPFAIL).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code when the lock was lost while the command ran.
pub const EXIT_LOST: u8 = 76;
/// Exit code for other errors (bad input, unreachable server…).
pub const EXIT_ERROR: u8 = 1;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let code = rt.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&cli.backend, args).await,
            Command::Inspect(args) => inspect::inspect(&cli.backend, args).await,
            Command::Seckill(args) => seckill::seckill(&cli.backend, args).await,
            Command::Bench(args) => bench::bench(&cli.backend, args).await,
            Command::SeckillWorker(args) => seckill::worker::worker(&cli.backend, args).await,
        }
    });
    // Give background releases (dropped guards) a moment to finish.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    ExitCode::from(code)
}

/// Parses `500ms`, `10s`, `2m` for clap.
pub fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    dlock::parse_duration(s).map_err(|e| e.to_string())
}

/// Connects, printing a clear error on failure.
pub async fn connect(url: &str, opts: dlock::ClientOptions) -> Result<dlock::Client, u8> {
    match dlock::connect_with(url, opts).await {
        Ok(c) => Ok(c),
        Err(e) => {
            eprintln!("dlock: {e}");
            Err(EXIT_ERROR)
        }
    }
}
