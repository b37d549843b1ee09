//! What every dlock program shares — the `dlock` binary, and the subcommands plugged into it
//! (the lab's `seckill` and `bench`, also built alone as `dlock-lab`): the runtime it runs on,
//! the exit code of an error, and the command line's duration parser.

use std::future::Future;
use std::time::Duration;

/// Exit code for errors (bad input, unreachable server, a failed run…).
pub const EXIT_ERROR: u8 = 1;

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
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}

/// Parses a duration for clap: a bare number is seconds (as for `flock -w` and `timeout`),
/// or a number with a unit: `500ms`, `10s`, `1.5m`, `2h`, `1h30m`.
///
/// Only the command line reads bare numbers as seconds; [`parse_duration`](crate::parse_duration)
/// (bare number = milliseconds) stays as it is, since backend URL options (`?wait_timeout=`,
/// ZooKeeper and Redlock settings) are parsed with it.
///
/// ```
/// use distlock_core::program::duration_arg;
/// use std::time::Duration;
/// assert_eq!(duration_arg("10"), Ok(Duration::from_secs(10)));
/// assert_eq!(duration_arg("250ms"), Ok(Duration::from_millis(250)));
/// ```
///
/// # Errors
///
/// A message naming the input when it is not a duration.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return crate::parse_duration(&format!("{t}s")).map_err(|_| {
            format!("`{s}` is not a duration; write e.g. `10` (seconds), `500ms`, `2m` or `1h`")
        });
    }
    crate::parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_numbers_are_seconds() {
        assert_eq!(duration_arg("10"), Ok(Duration::from_secs(10)));
        assert_eq!(duration_arg("0"), Ok(Duration::ZERO));
        assert_eq!(duration_arg("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration_arg("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration_arg("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration_arg("1h30m"), Ok(Duration::from_secs(5400)));
        for bad in ["", "soon", "1..2", "-1"] {
            assert!(duration_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn block_on_returns_the_exit_code() {
        assert_eq!(block_on(async { 7 }), 7);
    }
}
