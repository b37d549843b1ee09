//! `dlock`: run a command under a distributed lock, inspect locks.

/// `eprintln!` that ignores write errors: a closed standard error (a log pipe that went
/// away) must not abort dlock in the middle of holding a lock or supervising a command, as
/// std's `eprintln!` would with a panic. (Standard output going away ends dlock: see
/// [`pipe`].)
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod doctor;
mod elect;
mod hold;
mod holder;
mod inspect;
mod kind;
mod list;
mod log;
mod man;
mod once;
mod pipe;
mod release;
mod report;
mod run;
mod serve;
mod status;
mod top;
mod torture;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// Distributed locks from the command line.
#[derive(Parser, Debug)]
#[command(name = "dlock", version, about, long_about = None)]
struct Cli {
    /// Lock service URL: file://DIR (default, no server), redis://host:port, …
    #[arg(long, global = true, env = "DLOCK_BACKEND", default_value = distlock::DEFAULT_BACKEND)]
    backend: String,

    /// Show what dlock and the library do on stderr: -v info, -vv debug, -vvv trace
    /// (DLOCK_LOG or RUST_LOG: tracing filter directives, e.g. `distlock_redis=debug`).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock; exit with its exit code
    /// (75: not acquired within --wait, 69: server unreachable, 76: lock lost while the
    /// command ran).
    Run(run::RunArgs),
    /// Run a command at most once per interval however many hosts fire it (cron on a fleet):
    /// exit with its exit code, 75 if skipped because it runs elsewhere, 79 if it already ran
    /// this interval.
    Once(once::OnceArgs),
    /// Hold a lock across several commands of a shell script: print its fencing token, hold
    /// it until SIGTERM/SIGINT/SIGHUP or until stdin (a pipe) closes; exit 76 if it is lost.
    Hold(hold::HoldArgs),
    /// Run a command only while this process leads an election (a hot standby); exit with
    /// its exit code (75: not elected within --wait, 76: leadership lost while it ran).
    Elect(elect::ElectArgs),
    /// Show who leads an election, the value it advertises and its fencing token; with
    /// --watch, every change.
    Leader(elect::LeaderArgs),
    /// Show who holds a lock, its remaining lease and its last fencing token.
    Inspect(inspect::InspectArgs),
    /// List every lock the backend has state for: holders, waiters, last fencing token.
    List(list::ListArgs),
    /// Who holds what and who waits, live (a terminal view; --once prints one frame):
    /// holder, host, pid, held for, lease left, token, waiters, oldest wait.
    Top(top::TopArgs),
    /// Serve a JSON API, server-sent events, Prometheus /metrics and a live page of the
    /// locks (loopback by default; read-only unless --allow-release).
    Serve(serve::ServeArgs),
    /// Remove a stuck lock's holder(s) by force (`release --force NAME`) and advance its
    /// fencing token past every token issued; asks for confirmation unless --yes.
    Release(release::ReleaseArgs),
    /// Check the deployment behind the URL for settings that break locks; exits 1 when
    /// anything is unsafe.
    Doctor(doctor::DoctorArgs),
    /// Check the deployment behind the URL for double grants: worker processes take the lock
    /// and update a fenced register while nemeses pause, kill and cut them off; exits 1 on any
    /// violation, 2 on bad input. `--self-test` checks the checker on broken locks.
    Torture(torture::TortureArgs),
    /// One worker process of `dlock torture` (started by it; not for direct use).
    #[command(name = "__torture-worker", hide = true)]
    TortureWorker(torture::WorkerArgs),
    // `seckill`, `bench` and the hidden `__seckill-worker`: crate distlock-lab.
    #[command(flatten)]
    Lab(distlock_lab::Command),
    /// Print a shell completion script to stdout, e.g. `dlock completions bash`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout: `dlock man | man -l -`; `dlock man run` for the
    /// page of one subcommand.
    Man {
        /// A subcommand whose own page to print (e.g. run).
        subcommand: Option<String>,
    },
}

/// Exit code for a command line dlock cannot use (as clap's own usage errors).
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the lock was not acquired within `--wait` (EX_TEMPFAIL).
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code when the lock service could not be reached (EX_UNAVAILABLE): while connecting
/// (within --connect-timeout), or when --wait ran out on a connection error.
pub const EXIT_UNREACHABLE: u8 = 69;
/// Exit code when the lock was lost while the command ran.
pub const EXIT_LOST: u8 = distlock_run::EXIT_LOST;
/// Exit code for other errors (bad input, unreachable server…), the command-line duration
/// parser (a bare number is seconds) and the runtime: every dlock program's
/// (`distlock::program`), the lab subcommands plugged in below included.
pub use distlock::program::{block_on, duration_arg, EXIT_ERROR};

fn main() -> ExitCode {
    // `dlock __guard …`: the process that runs the command of `dlock run` (which re-executes
    // this binary for it); not for direct use.
    if let Some(code) = distlock_run::dispatch_guard() {
        return ExitCode::from(code);
    }
    ExitCode::from(pipe::catch(dlock))
}

/// `dlock` itself: parses the command line, runs the subcommand, returns the exit code.
fn dlock() -> u8 {
    let matches = Cli::command().get_matches();
    // Neither --backend nor DLOCK_BACKEND: the per-host file:// default.
    let default_backend =
        matches.value_source("backend") == Some(clap::parser::ValueSource::DefaultValue);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(e) = log::init(cli.verbose) {
        eprintln!("dlock: {e}");
        return EXIT_USAGE;
    }
    if default_backend
        && matches!(
            cli.command,
            Command::Run(_)
                | Command::Elect(_)
                | Command::Hold(_)
                | Command::Once(_)
                | Command::Doctor(_)
        )
    {
        eprintln!(
            "dlock: no --backend or DLOCK_BACKEND: using {} (a lock directory on this host), \
             so the lock covers this host only",
            distlock::DEFAULT_BACKEND
        );
    }
    // Commands that need no lock runtime.
    let cli = match cli.command {
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut visible_command(), "dlock", &mut script);
            return pipe::write_stdout(&script);
        }
        Command::Man { subcommand } => return man(subcommand.as_deref()),
        Command::Torture(args) => return torture::torture(&cli.backend, args),
        command => Cli { command, ..cli },
    };
    let backend = cli.backend;
    block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&backend, args).await,
            Command::Elect(args) => elect::elect(&backend, args).await,
            Command::Hold(args) => hold::hold(&backend, args).await,
            Command::Once(args) => once::once(&backend, args).await,
            Command::Leader(args) => elect::leader(&backend, args).await,
            Command::Inspect(args) => inspect::inspect(&backend, args).await,
            Command::List(args) => list::list(&backend, args).await,
            Command::Release(args) => release::release(&backend, args).await,
            Command::Top(args) => top::top(&backend, args).await,
            Command::Serve(args) => serve::serve(&backend, args).await,
            Command::Doctor(args) => doctor::doctor(&backend, args).await,
            Command::Lab(command) => distlock_lab::run(&backend, command).await,
            Command::TortureWorker(args) => torture::worker(args).await,
            // Handled above, before the runtime.
            Command::Completions { .. } | Command::Man { .. } | Command::Torture(_) => EXIT_ERROR,
        }
    })
}

/// The command-line definition without the hidden subcommands (the seckill
/// worker), which clap_complete would otherwise offer for completion.
fn visible_command() -> clap::Command {
    let full = Cli::command();
    let mut cmd = clap::Command::new("dlock")
        .version(env!("CARGO_PKG_VERSION"))
        .about(full.get_about().cloned().unwrap_or_default());
    for arg in full.get_arguments() {
        cmd = cmd.arg(arg.clone());
    }
    for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
        cmd = cmd.subcommand(sub.clone());
    }
    cmd
}

/// Writes the man page of dlock, or of one of its subcommands, to stdout.
fn man(subcommand: Option<&str>) -> u8 {
    let mut cmd = visible_command();
    // Built, so that a subcommand's page lists the global options too.
    cmd.build();
    if let Some(name) = subcommand.filter(|n| cmd.find_subcommand(n).is_none()) {
        eprintln!("dlock: no subcommand `{name}` (`dlock --help` lists them)");
        return EXIT_USAGE;
    }
    match man::page(&cmd, subcommand) {
        Ok(roff) => pipe::write_stdout(&roff),
        Err(e) => {
            eprintln!("dlock: cannot write the man page: {e}");
            EXIT_ERROR
        }
    }
}

/// Connects, printing a clear error on failure.
pub async fn connect(url: &str, opts: distlock::ClientOptions) -> Result<distlock::Client, u8> {
    match distlock::connect_with(url, opts).await {
        Ok(c) => Ok(c),
        Err(e) => {
            eprintln!("dlock: {e}");
            Err(EXIT_ERROR)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
