//! The watchdog scenario of the peer bench: 1,000, 10,000 and 100,000 locks held by one client,
//! measured on the server (INFO sampled every millisecond) and in this process (write syscalls,
//! RSS).

use super::*;

/// This process's resident set (`VmRSS`), in MB.
pub(super) fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// `syscw` (write syscalls) from an `io` file of /proc.
pub(super) fn write_syscalls(path: &str) -> u64 {
    let io = std::fs::read_to_string(path).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("syscw:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `field:value` of an INFO reply, or a `field=value` inside a `cmdstat_NAME:` line.
pub(super) fn info_num(info: &str, line: &str, field: Option<&str>) -> u64 {
    let Some(rest) = info.lines().find_map(|l| l.strip_prefix(line)) else {
        return 0;
    };
    let value = match field {
        None => Some(rest.trim()),
        Some(f) => rest.split(',').find_map(|kv| kv.strip_prefix(f)),
    };
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// One look at the server and at this process.
#[derive(Clone, Copy)]
pub(super) struct Sample {
    at: Instant,
    /// Commands the server ran (including those its scripts called), less the sampler's INFOs.
    commands: u64,
    evalsha: u64,
    /// Write syscalls of this process less the sampler thread's own.
    client_writes: u64,
}

/// Samples the server every millisecond until `stop`, on a blocking thread of its own.
pub(super) fn sample(url: &str, stop: &AtomicBool) -> Res<Vec<Sample>> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .arg("commandstats")
            .query(&mut con)?;
        let infos = info_num(&info, "cmdstat_info:", Some("calls="));
        out.push(Sample {
            at: Instant::now(),
            commands: info_num(&info, "total_commands_processed:", None).saturating_sub(infos),
            evalsha: info_num(&info, "cmdstat_evalsha:", Some("calls=")),
            client_writes: write_syscalls("/proc/self/io")
                .saturating_sub(write_syscalls("/proc/thread-self/io")),
        });
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(out)
}

/// One watchdog tick as the server saw it.
pub(super) struct Tick {
    /// From the last quiet sample before the tick to its last busy one.
    took: Duration,
    /// Runs of busy samples apart from each other by a quiet one: the request flights the
    /// server saw (flights less than a sample apart count as one).
    flights: u64,
    commands: u64,
    pub(super) evalsha: u64,
    client_writes: u64,
}

/// Quiet that separates two ticks.
pub(super) const TICK_GAP: Duration = Duration::from_millis(100);

/// Bursts of server work separated by `TICK_GAP` of quiet; bursts that may be cut by the
/// window's ends (less than that from them) are left out.
pub(super) fn ticks(samples: &[Sample]) -> Vec<Tick> {
    let is_busy = |i: usize| i > 0 && samples[i].commands > samples[i - 1].commands;
    let busy: Vec<usize> = (1..samples.len()).filter(|&i| is_busy(i)).collect();
    let mut bursts: Vec<(usize, usize)> = Vec::new();
    for i in busy {
        match bursts.last_mut() {
            Some((_, b)) if samples[i].at - samples[*b].at < TICK_GAP => *b = i,
            _ => bursts.push((i, i)),
        }
    }
    bursts
        .into_iter()
        .filter(|&(a, b)| {
            let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
                return false;
            };
            a > 1 && samples[a].at - first.at >= TICK_GAP && last.at - samples[b].at >= TICK_GAP
        })
        .map(|(a, b)| {
            let (before, first, last) = (samples[a - 2], samples[a - 1], samples[b]);
            Tick {
                took: last.at - first.at,
                flights: (a..=b).filter(|&i| is_busy(i) && !is_busy(i - 1)).count() as u64,
                commands: last.commands - first.commands,
                evalsha: last.evalsha - first.evalsha,
                // From one sample earlier: a request is written before the server counts it.
                client_writes: last.client_writes - before.client_writes,
            }
        })
        .collect()
}

pub(super) struct Watchdog {
    pub(super) held: usize,
    lost: usize,
    ticks: Vec<Tick>,
    pub(super) rss_before: f64,
    pub(super) rss_held: f64,
}

impl Watchdog {
    pub(super) fn mean(&self, f: impl Fn(&Tick) -> f64) -> f64 {
        self.ticks.iter().map(f).sum::<f64>() / self.ticks.len().max(1) as f64
    }

    /// Round trips per tick: the request flights the server saw apart (1 ms sampling).
    pub(super) fn round_trips(&self) -> f64 {
        self.mean(|t| t.flights as f64)
    }

    pub(super) fn worst_tick(&self) -> Duration {
        self.ticks
            .iter()
            .map(|t| t.took)
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

/// [`watchdog`] on a current-thread runtime of its own, so that the client's write syscalls are
/// its requests (no wake-ups of other worker threads, which also count as writes).
pub(super) async fn watchdog_alone(url: String, observe: Duration, held: usize) -> Res<Watchdog> {
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(watchdog(url, observe, held))
    })
    .await?
}

/// One dlock client holds `held` locks in watchdog mode for `observe`, on a server of its own.
pub(super) async fn watchdog(url: String, observe: Duration, held: usize) -> Res<Watchdog> {
    let rss_before = rss_mb();
    let opts = ClientOptions::default().watchdog_lease(WATCHDOG_LEASE);
    let client = dlock_client(std::slice::from_ref(&url), opts).await?;
    let guards: Vec<LockGuard> = stream::iter(0..held)
        .map(|i| {
            let client = &client;
            async move {
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                    client.lock(&format!("peers-held-{i}"))?.acquire().await?,
                )
            }
        })
        .buffer_unordered(64)
        .try_collect()
        .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let sampler = tokio::task::spawn_blocking(move || sample(&url, &flag));
    tokio::time::sleep(observe).await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await??;
    let rss_held = rss_mb();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    stream::iter(guards)
        .map(|g| async move { g.release().await.map(|_| ()) })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(Watchdog {
        held,
        lost,
        ticks: ticks(&samples),
        rss_before,
        rss_held,
    })
}

// ---------------------------------------------------------------------------------------------
// Report.
// ---------------------------------------------------------------------------------------------

pub(super) fn print_watchdog(w: &Watchdog) {
    let interval = WATCHDOG_LEASE / 3;
    println!(
        "watchdog, {} locks held by one client (lease {WATCHDOG_LEASE:?}, tick every {interval:?}): {} ticks seen, {} locks lost",
        w.held,
        w.ticks.len(),
        w.lost
    );
    for (i, t) in w.ticks.iter().enumerate() {
        println!(
            "  tick {i}: {:.1} ms, {} request flights seen by the server, {} EVALSHA, {} commands on the server (with script calls), {} client write syscalls (an upper bound of round trips: a large pipeline takes several writes)",
            ms(t.took),
            t.flights,
            t.evalsha,
            t.commands,
            t.client_writes
        );
    }
    println!(
        "  RSS before {:.1} MB, holding {:.1} MB (+{:.1} MB)",
        w.rss_before,
        w.rss_held,
        w.rss_held - w.rss_before
    );
}

pub(super) fn watchdog_row(w: &Watchdog) -> Row {
    let budget = w.held.div_ceil(1000) as f64;
    let share = w.worst_tick().as_secs_f64() / (WATCHDOG_LEASE / 3).as_secs_f64();
    let seen = !w.ticks.is_empty();
    let mut g = Goals::default();
    g.check(
        "watchdog: round trips per tick, request flights the server saw (≤ ceil(N/1000))",
        format!("{:.1} vs {budget}", w.round_trips()),
        seen && w.round_trips() <= budget,
    )
    // What the locks cost, not the bench process (its peers' clients, runtime and buffers are
    // about 90 MB before the first lock).
    .check(
        "watchdog: RSS added by holding 10,000 locks (< 50 MB)",
        format!(
            "+{:.1} MB ({:.1} MB in all)",
            w.rss_held - w.rss_before,
            w.rss_held
        ),
        w.rss_held - w.rss_before < 50.0,
    )
    .check(
        "watchdog: slowest tick vs lease/3 (well inside: ≤ 50%)",
        format!("{:.1} ms = {:.0}%", ms(w.worst_tick()), share * 100.0),
        seen && share <= 0.5,
    )
    .check("watchdog: locks lost (0)", w.lost.to_string(), w.lost == 0);
    let dlock = format!(
        "{:.1} round trips/tick ({:.0} EVALSHA), slowest tick {:.1} ms, RSS +{:.1} MB (to {:.1} MB)",
        w.round_trips(),
        w.mean(|t| t.evalsha as f64),
        ms(w.worst_tick()),
        w.rss_held - w.rss_before,
        w.rss_held
    );
    [
        "watchdog, 10,000 locks, 1 client".into(),
        "— (no watchdog)".into(),
        "— (no watchdog)".into(),
        dlock,
        format!("{:.1} / {budget} round trips", w.round_trips()),
        "≤ ceil(N/1000) round trips, RSS added < 50 MB, tick ≪ lease/3".into(),
        g.verdict(),
    ]
}
