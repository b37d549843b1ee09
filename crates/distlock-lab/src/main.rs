//! `dlock-lab`: the lab subcommands of `dlock` (seckill, bench) alone.

use clap::Parser;
use std::process::ExitCode;

/// The dlock lab: the flash-sale experiment and lock benchmarks.
#[derive(Parser, Debug)]
#[command(name = "dlock-lab", version, about, long_about = None)]
struct Cli {
    /// Lock service URL: file://DIR (default, no server), redis://host:port, …
    #[arg(long, global = true, env = "DLOCK_BACKEND", default_value = distlock::DEFAULT_BACKEND)]
    backend: String,

    #[command(subcommand)]
    command: distlock_lab::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ExitCode::from(distlock::program::block_on(distlock_lab::run(
        &cli.backend,
        cli.command,
    )))
}

#[test]
fn the_cli_definition_is_consistent() {
    <Cli as clap::CommandFactory>::command().debug_assert();
}
