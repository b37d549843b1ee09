//! `dlock top [--once] [--prefix P] [--sort S]`: who holds what and who waits, live.

use clap::Args;
use distlock_observe::{Monitor, Sort, TopOptions};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Print one frame as plain text and exit (for scripts), instead of the live view.
    #[arg(long)]
    once: bool,
    /// Only locks whose name starts with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Order: contention (most waiters and the oldest wait first), name, held (longest held
    /// first), lease (least lease left first) or waiters.
    #[arg(long, default_value = "contention", value_parser = Sort::parse)]
    sort: Sort,
    /// How often the live view looks again (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = crate::duration_arg)]
    refresh: Duration,
    /// With --once: cut lines to this many characters (default: none).
    #[arg(long)]
    width: Option<usize>,
}

pub async fn top(url: &str, args: TopArgs) -> u8 {
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let monitor = Monitor::new(client, args.prefix);
    if args.once {
        return match monitor.refresh(args.sort).await {
            Ok(snap) => {
                let width = args.width.unwrap_or(usize::MAX);
                print!(
                    "{}",
                    distlock_observe::frame_sorted(&snap, args.sort, width)
                );
                0
            }
            Err(e) => {
                eprintln!("dlock: {e}");
                crate::EXIT_ERROR
            }
        };
    }
    let opts = TopOptions {
        sort: args.sort,
        refresh: args.refresh,
        ..TopOptions::default()
    };
    match distlock_observe::term::run(&monitor, opts).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dlock: {e}");
            crate::EXIT_ERROR
        }
    }
}
