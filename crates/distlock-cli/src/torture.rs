//! `dlock torture`: the thin command-line front of crate distlock-torture.

use clap::Args;
use distlock_torture::{run, selftest, Config, Nemesis, Target, WorkerCommand, WorkerConfig};
use std::time::Duration;

/// Exit code of a run that found a violation.
const EXIT_VIOLATION: u8 = 1;
/// Exit code for bad input or a run that could not be made.
const EXIT_BAD_INPUT: u8 = 2;
/// The hidden worker subcommand.
pub const WORKER: &str = "__torture-worker";

/// Arguments of `dlock torture`.
#[derive(Args, Debug)]
pub struct TortureArgs {
    /// Run the checker against the deliberately broken locks shipped with dlock instead (each
    /// must be flagged, the correct control must pass).
    #[arg(long)]
    self_test: bool,
    /// Lock kind (only `mutex` in this version).
    #[arg(long, default_value = "mutex", value_parser = crate::kind::parse)]
    kind: crate::kind::Kind,
    /// Worker processes.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(2..=256))]
    clients: u16,
    /// How long the workers run (e.g. 60s, 2m; a bare number is seconds).
    #[arg(long, default_value = "60s", value_parser = crate::duration_arg)]
    duration: Duration,
    /// Lease (the watchdog lease of every worker's client).
    #[arg(long, default_value = "2s", value_parser = crate::duration_arg)]
    lease: Duration,
    /// Lock names (only 1 in this version).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1))]
    names: u16,
    /// Nemeses, comma-separated: pause, kill, delay, drop, reset. Default: pause,kill, plus
    /// delay,drop,reset when the URL has a single host the proxy can stand in front of.
    #[arg(long, value_name = "LIST")]
    nemesis: Option<String>,
    /// Seed of the nemesis schedule and work times (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Also write the whole recorded history (every event, register operation and nemesis)
    /// as JSON to this file.
    #[arg(long, value_name = "FILE")]
    history: Option<std::path::PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of the hidden worker subcommand (set by `dlock torture`).
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// `key=value` settings.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// Runs a worker; its exit code.
pub async fn worker(args: WorkerArgs) -> u8 {
    match WorkerConfig::from_args(&args.args) {
        Ok(cfg) => distlock_torture::worker::run(cfg).await,
        Err(e) => {
            eprintln!("dlock: {e}");
            EXIT_BAD_INPUT
        }
    }
}

fn worker_command() -> Result<WorkerCommand, String> {
    let program = std::env::current_exe().map_err(|e| format!("cannot find dlock itself: {e}"))?;
    Ok(WorkerCommand {
        program,
        args: vec![WORKER.to_string()],
    })
}

fn print(json: Option<serde_json::Result<String>>, human: impl FnOnce()) {
    if let Some(json) = json {
        match json {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("dlock: cannot encode the report: {e}"),
        }
    } else {
        human();
    }
}

/// Runs `dlock torture` (no async runtime needed: the coordinator uses threads); the exit code.
pub fn torture(backend: &str, args: TortureArgs) -> u8 {
    let seed = args.seed.unwrap_or_else(distlock_torture::history::now_us);
    let worker = match worker_command() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("dlock: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    if args.self_test {
        return match selftest::self_test(&worker, seed) {
            Ok(st) => {
                print(args.json.then(|| serde_json::to_string_pretty(&st)), || {
                    for c in &st.cases {
                        let want = c.expected.as_deref().unwrap_or("no violation");
                        let mark = if c.passed { "ok  " } else { "FAIL" };
                        println!(
                            "{mark} {:<15} expected {want:<16} {}",
                            c.lock,
                            c.report.analysis_line()
                        );
                    }
                    println!("{}", st.verdict);
                });
                if st.ok {
                    0
                } else {
                    EXIT_VIOLATION
                }
            }
            Err(e) => {
                eprintln!("dlock: self-test: {e}");
                EXIT_BAD_INPUT
            }
        };
    }
    if args.kind != crate::kind::Kind::Mutex {
        eprintln!("dlock: torture: only --kind mutex is supported in this version");
        return EXIT_BAD_INPUT;
    }
    let target = Target::Url(backend.to_string());
    let nemeses = match args.nemesis.as_deref().map(Nemesis::parse_list) {
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("dlock: {e}");
            return EXIT_BAD_INPUT;
        }
        None => match run::proxyable(&target) {
            Ok(p) => Nemesis::ALL
                .into_iter()
                .filter(|n| p || !n.needs_proxy())
                .collect(),
            Err(e) => {
                eprintln!("dlock: {e}");
                return EXIT_BAD_INPUT;
            }
        },
    };
    let cfg = Config {
        target,
        clients: usize::from(args.clients),
        duration: args.duration,
        lease: args.lease,
        work: args.lease / 5,
        nemeses,
        seed,
        worker,
        name: format!("torture-{seed}"),
        history_out: args.history,
    };
    if !args.json {
        eprintln!(
            "dlock: torture: {} clients for {:?} on {backend}, lease {:?}, seed {seed}",
            cfg.clients, cfg.duration, cfg.lease
        );
    }
    match run::run(&cfg) {
        Ok(report) => {
            print(
                args.json.then(|| serde_json::to_string_pretty(&report)),
                || {
                    for v in &report.analysis.violations {
                        println!("  {v}");
                    }
                    println!("{}", report.analysis_line());
                    println!("{}", report.verdict);
                },
            );
            if report.ok {
                0
            } else {
                EXIT_VIOLATION
            }
        }
        Err(e) => {
            eprintln!("dlock: torture: {e}");
            EXIT_BAD_INPUT
        }
    }
}
