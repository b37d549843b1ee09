//! `dlock once --every DUR [--at-least DUR] [--at-most DUR] NAME -- CMD`: run a command at
//! most once per interval, however many hosts fire it.
//!
//! Intervals are `every`-long slices of Unix time ([k·every, (k+1)·every)), read on the lock
//! service's clock where the backend has one (`Client::server_time`: Redis, PostgreSQL,
//! MySQL), so that hosts whose clocks disagree still agree on the interval; on this host's
//! clock otherwise (file://, etcd, ZooKeeper, Redlock). Two locks make the promise:
//! - `NAME@k%2`, the interval's lock: one try; the run that gets it keeps it until its
//!   interval ends, and at least `--at-least` after it started, never longer than `--at-most`
//!   ([`distlock::LockGuard::release_after`]), so any later firing of the same interval finds it
//!   taken and skips (exit 79). Consecutive intervals use the two names in turn, so a hold
//!   that outlasts its interval a little never blocks the next one.
//! - `NAME`, held while the command runs (with `dlock run`'s supervision): a run whose
//!   interval came while the previous run still goes on skips (exit 75), and so does any
//!   firing that finds it held.

use crate::run::{fit_grace, obtain, supervise, Held, Job, Wanted};
use clap::Args;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Exit code of a run skipped because the job ran in this interval already.
pub const EXIT_ALREADY_RAN: u8 = 79;

#[derive(Args, Debug)]
#[command(after_long_help = ONCE_HELP)]
pub struct OnceArgs {
    /// The interval: the command runs at most once per interval (slices of Unix time, so
    /// `1h` intervals start on the hour, UTC).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg)]
    every: Duration,
    /// Keep NAME locked at least this long after a run started, even past its interval's end
    /// [default: a tenth of --every]: a host whose clock is up to this much fast or slow
    /// does not run the job again.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg)]
    at_least: Option<Duration>,
    /// Never keep NAME locked longer than this after a run started (also caps --lease, so
    /// the lock of a crashed host frees within it). The command itself is not stopped then.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg)]
    at_most: Option<Duration>,
    /// Watchdog lease while the command runs (see `dlock run --help`).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "30s")]
    lease: Duration,
    /// How long the command gets between SIGTERM and SIGKILL when it has to be stopped.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg)]
    grace: Option<Duration>,
    /// How long to try to reach the lock service (exit 69 after).
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "10s")]
    connect_timeout: Duration,
    #[command(flatten)]
    job: crate::run::JobArgs,
}

const ONCE_HELP: &str = "\
Fire it from cron or a timer on every host; the job runs once per interval:

  */15 * * * *  dlock once --every 15m --at-least 1m nightly-sync -- /usr/local/bin/sync

Intervals are slices of Unix time (--every 1h: each hour, UTC) on the lock service's clock
where it has one (Redis, PostgreSQL, MySQL), so hosts whose clocks are off still agree on the
interval; on this host's clock otherwise (file://, etcd, ZooKeeper, Redlock). One try at
the interval's lock (NAME@0 and NAME@1 in turn): the host that gets it runs the command (with
dlock run's supervision) and keeps the interval's lock until the interval ends, and at least
--at-least after the run started, so hosts firing late (a delayed cron) or early for the
next interval (within --at-least of the boundary) skip. --at-most caps all of it. While the
command runs, lock NAME is held too (it tells skipped hosts why they skipped).

Where holds are kept by their lease on the server (Redis, Redlock, etcd, PostgreSQL's lease
mode, MySQL's table mode), dlock once exits when the command ends: the server keeps the
interval's lock for the rest of the time. Where a lock lasts as long as its holder (file://,
zk://, the session modes of PostgreSQL and MySQL), it stays (sleeping, holding it) until
that time is over.

Exit status: the command's when it ran (76 if the lock was lost meanwhile); 75 skipped, it is
running elsewhere; 79 skipped, it ran in this interval already (or less than --at-least ago);
69 the lock service could not be reached; 1 other errors. (systemd: SuccessExitStatus=75 79.)";

/// The shortest hold of an interval's lock (a fixed lease must be longer than zero).
const MIN_HOLD: Duration = Duration::from_millis(100);

/// What the attempt of [`once`] found.
#[derive(Default)]
enum Attempt {
    #[default]
    Nothing,
    /// Both locks: the interval's (kept after the command, for the given time since the run
    /// started) and the running one (returned).
    Got(distlock::LockGuard, Duration),
    /// Skipped; `running`: because a run holds the running lock.
    Skipped { running: bool },
}

/// The index of the interval containing Unix time `now`.
fn interval_index(now: Duration, every: Duration) -> u128 {
    now.as_nanos() / every.as_nanos().max(1)
}

/// The part of the interval containing Unix time `now` still to come.
fn left_in_interval(now: Duration, every: Duration) -> Duration {
    let (now, every) = (now.as_nanos(), every.as_nanos().max(1));
    let end = (now / every + 1) * every;
    Duration::from_nanos(u64::try_from(end - now).unwrap_or(u64::MAX))
}

/// The test hook `DLOCK_TEST_CLOCK_SKEW_MS`: milliseconds (negative: behind) added to this
/// host's clock where `dlock once` reads it, to test a host whose clock is off.
const CLOCK_SKEW_ENV: &str = "DLOCK_TEST_CLOCK_SKEW_MS";

/// The skew [`CLOCK_SKEW_ENV`] asks for (none when unset).
fn clock_skew() -> Result<i64, String> {
    match std::env::var(CLOCK_SKEW_ENV) {
        Err(_) => Ok(0),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{CLOCK_SKEW_ENV}=`{v}` is not a number of milliseconds")),
    }
}

/// Unix time now on the lock service's clock, where the backend has one (so that hosts whose
/// clocks disagree agree on the interval); else on this host's clock, shifted by `skew_ms`.
async fn unix_now(client: &distlock::Client, skew_ms: i64) -> distlock::Result<Duration> {
    let now = match client.server_time().await? {
        Some(t) => t,
        None => {
            let local = SystemTime::now();
            let skew = Duration::from_millis(skew_ms.unsigned_abs());
            if skew_ms >= 0 {
                local + skew
            } else {
                local - skew
            }
        }
    };
    Ok(now.duration_since(UNIX_EPOCH).unwrap_or_default())
}

/// How long NAME stays locked after a run starts, given the time left in its interval.
fn hold_for(
    left: Duration,
    every: Duration,
    at_least: Option<Duration>,
    at_most: Option<Duration>,
) -> Duration {
    let at_least = at_least.unwrap_or(every / 10);
    let wanted = left.max(at_least);
    at_most.map_or(wanted, |m| wanted.min(m))
}

pub async fn once(url: &str, args: OnceArgs) -> u8 {
    let command = args.job.argv();
    if args.every.is_zero() {
        eprintln!("dlock: --every must be longer than 0s");
        return crate::EXIT_USAGE;
    }
    if args.at_least.is_some_and(|l| l > args.every) {
        eprintln!(
            "dlock: --at-least may be at most --every (the next interval but one reuses its lock)"
        );
        return crate::EXIT_USAGE;
    }
    if let (Some(least), Some(most)) = (args.at_least, args.at_most) {
        if least > most {
            eprintln!(
                "dlock: --at-least {} is longer than --at-most {}",
                crate::run::human(least),
                crate::run::human(most)
            );
            return crate::EXIT_USAGE;
        }
    }
    let lease = args.at_most.map_or(args.lease, |m| m.min(args.lease));
    if let Err(e) = distlock::check_watchdog_lease(lease) {
        eprintln!("dlock: {e}");
        return crate::EXIT_USAGE;
    }
    let grace = fit_grace(args.grace, lease);
    let skew = match clock_skew() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dlock: {e}");
            return crate::EXIT_USAGE;
        }
    };
    let wanted = Wanted {
        what: format!("job `{}`", args.job.name),
        lease,
        wait: Some(Duration::ZERO),
        connect_timeout: args.connect_timeout,
        others: "",
        busy: "",
        conflict_exit: crate::EXIT_NOT_ACQUIRED,
        say_not_acquired: false,
        target: None,
    };
    // Filled by the attempt: the interval's lock, or which lock was taken.
    let state = Arc::new(Mutex::new(Attempt::default()));
    let (every, at_least, at_most) = (args.every, args.at_least, args.at_most);
    let got = obtain(url, &wanted, |c, _| {
        let (name, state) = (args.job.name.clone(), state.clone());
        Box::pin(async move {
            let now = unix_now(&c, skew).await?;
            let hold = hold_for(left_in_interval(now, every), every, at_least, at_most);
            let slot = format!("{name}@{}", interval_index(now, every) % 2);
            tracing::debug!(interval = %slot, hold = %crate::run::human(hold), "interval");
            // A fixed lease to the end of the hold: nothing renews it, and it ends then even
            // if this process dies.
            let interval = c.lock(&slot)?.lease(hold.max(MIN_HOLD))?;
            let interval = match interval.acquire_timeout(Duration::ZERO).await {
                Ok(g) => g,
                Err(e) => {
                    if e.is_timeout() {
                        // Already ran, or running (a run holds both): ask the running lock.
                        let running = c.inspect(&name).await.is_ok_and(|i| i.held());
                        if let Ok(mut st) = state.lock() {
                            *st = Attempt::Skipped { running };
                        }
                    }
                    return Err(e);
                }
            };
            match c.lock(&name)?.acquire_timeout(Duration::ZERO).await {
                Ok(g) => {
                    if let Ok(mut st) = state.lock() {
                        *st = Attempt::Got(interval, hold);
                    }
                    Ok(Held::Lock(g))
                }
                Err(e) => {
                    // The previous interval's run goes on: this interval's lock is given back
                    // (a firing once it has ended may still run the job).
                    let _ = interval.release().await;
                    if e.is_timeout() {
                        if let Ok(mut st) = state.lock() {
                            *st = Attempt::Skipped { running: true };
                        }
                    }
                    Err(e)
                }
            }
        })
    })
    .await;
    let state = match state.lock() {
        Ok(mut st) => std::mem::take(&mut *st),
        Err(_) => Attempt::default(),
    };
    let (got, interval, hold) = match (got, state) {
        (Ok(g), Attempt::Got(interval, hold)) => (g, interval, hold),
        (Err(crate::EXIT_NOT_ACQUIRED), Attempt::Skipped { running: true }) => {
            eprintln!(
                "dlock: job `{}` skipped: it is running elsewhere",
                args.job.name
            );
            return crate::EXIT_NOT_ACQUIRED;
        }
        (Err(crate::EXIT_NOT_ACQUIRED), _) => {
            eprintln!(
                "dlock: job `{}` skipped: it ran in this interval already (--every {})",
                args.job.name,
                crate::run::human(args.every)
            );
            return EXIT_ALREADY_RAN;
        }
        (Err(code), _) => return code,
        (Ok(_), _) => {
            eprintln!(
                "dlock: job `{}`: the interval's lock went missing",
                args.job.name
            );
            return crate::EXIT_ERROR;
        }
    };
    tracing::info!(hold = %crate::run::human(hold), "job `{}` runs", args.job.name);
    let job = Job {
        what: format!("job `{}`", args.job.name),
        name: args.job.name.clone(),
        lease,
        grace,
        command: &command,
        env: Vec::new(),
        lock_file: got.lock_file(distlock::LockKind::Mutex),
        keep: Some((interval, hold)),
    };
    supervise(got.held, got.attempt_sent, job).await.code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_and_holds() {
        let s = Duration::from_secs;
        assert_eq!(left_in_interval(s(3600 * 5 + 600), s(3600)), s(3000));
        // On a boundary: a whole interval ahead.
        assert_eq!(left_in_interval(s(7200), s(3600)), s(3600));
        // The rest of the interval, at least --at-least (default every/10), at most --at-most.
        assert_eq!(hold_for(s(3000), s(3600), None, None), s(3000));
        assert_eq!(hold_for(s(10), s(3600), None, None), s(360));
        assert_eq!(hold_for(s(10), s(3600), Some(s(60)), None), s(60));
        assert_eq!(hold_for(s(3000), s(3600), None, Some(s(1800))), s(1800));
    }
}
