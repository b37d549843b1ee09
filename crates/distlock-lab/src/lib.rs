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
use std::future::Future;

/// Exit code for errors (bad input, unreachable server, a failed run…).
pub const EXIT_ERROR: u8 = 1;

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

/// Runs `main` to completion on the runtime the dlock programs use (two worker threads, I/O
/// and timers), then gives background work (releases of dropped lock guards) up to two
/// seconds to finish; returns `main`'s exit code, or [`EXIT_ERROR`] if no runtime could start.
pub fn block_on(main: impl Future<Output = u8>) -> u8 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start the runtime: {e}");
            return EXIT_ERROR;
        }
    };
    let code = rt.block_on(main);
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    code
}

/// Parses a duration for clap: a bare number is seconds (as for `flock -w` and `timeout`),
/// or a number with a unit: `500ms`, `10s`, `1.5m`, `2h`.
///
/// Only the command line reads bare numbers as seconds; `distlock::parse_duration` (bare number
/// = milliseconds) stays as it is, since backend URL options (`?wait_timeout=`, ZooKeeper
/// and Redlock settings) are parsed with it.
///
/// # Errors
///
/// A message naming the input when it is not a duration.
pub fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return distlock::parse_duration(&format!("{t}s")).map_err(|_| {
            format!("`{s}` is not a duration; write e.g. `10` (seconds), `500ms`, `2m` or `1h`")
        });
    }
    distlock::parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bare_numbers_are_seconds() {
        assert_eq!(duration_arg("10"), Ok(Duration::from_secs(10)));
        assert_eq!(duration_arg("0"), Ok(Duration::ZERO));
        assert_eq!(duration_arg("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration_arg("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration_arg("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration_arg("1h30m"), Ok(Duration::from_secs(5400)));
        for bad in ["", "soon", "1..2", "-1", "1x"] {
            assert!(duration_arg(bad).is_err(), "{bad}");
        }
    }
}
