//! The dlock lab: the flash-sale experiment and the lock benchmarks, as clap subcommands.
//!
//! The `dlock` binary (crate `distlock-cli`) flattens [`Command`] into its own subcommands, so
//! `dlock seckill …` and `dlock bench …` run [`run`]; `dlock-lab`, built by this crate, offers
//! the same subcommands alone. Both take the global `--backend URL` (`DLOCK_BACKEND`).
//!
//! - [`seckill`]: buyers in several processes race for a small stock, unprotected and under
//!   four protections; shows who oversells. The parent re-executes its own program as the
//!   hidden `__seckill-worker` subcommand, which therefore has to be reachable from the same
//!   program's command line with `--backend` before it (flattening [`Command`] does that).
//! - [`bench`](mod@bench): lock latency and throughput, uncontended, contended and read-heavy.
//!
//! Each works on the backend's own store (a counter and the sale's rows kept next to the
//! locks: files, Redis keys, etcd keys, znodes, tables) through the drivers of the backends
//! built in (cargo features `etcd`, `zookeeper`, `postgres`, `mysql`).

pub mod bench;
mod progress;
pub mod seckill;
mod stats;
mod store;
mod timeline;

use clap::Subcommand;
// The runtime, the exit code and the duration parser are every dlock program's
// (`distlock::program`); the lab plugs into the `dlock` binary and uses them as it does.
use distlock::program::{duration_arg, EXIT_ERROR};

/// The lab subcommands; flatten them into a program's own (`#[command(flatten)]`).
#[derive(Subcommand, Debug)]
#[non_exhaustive]
pub enum Command {
    /// The flash-sale experiment: buyers in several processes race for a small stock, with
    /// no lock, a local lock, optimistic versions, trylock and lock; shows who oversells.
    Seckill(seckill::SeckillArgs),
    /// Measure lock latency and throughput (uncontended, contended).
    Bench(bench::BenchArgs),
    /// One worker process of `dlock seckill` (started by it; not for direct use).
    #[command(name = "__seckill-worker", hide = true)]
    SeckillWorker(seckill::worker::WorkerArgs),
}

/// Runs a lab subcommand against the lock service at `backend`; returns the exit code.
///
/// # Errors
///
/// None returned: every failure is printed to stderr (`dlock: …`) and makes the exit code
/// non-zero ([`EXIT_ERROR`]).
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future mid-run kills the worker processes it started
/// (`kill_on_drop`) and leaves the run's data in the store and its report unprinted.
pub async fn run(backend: &str, command: Command) -> u8 {
    match command {
        Command::Seckill(args) => seckill::seckill(backend, args).await,
        Command::Bench(args) => bench::bench(backend, args).await,
        Command::SeckillWorker(args) => seckill::worker::worker(backend, args).await,
    }
}
