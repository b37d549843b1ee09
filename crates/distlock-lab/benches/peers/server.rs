//! Server time per pair: the time Redis spent in the commands a library sent (INFO
//! commandstats: its scripts, timed with the commands they call, and the commands it sends
//! directly), and the server's main-thread CPU (INFO cpu: also the network reads and writes).

use super::*;
use std::collections::BTreeMap;

/// Script calls: their `usec` covers the commands the script runs (counted again under their
/// own names, so those are not added).
const SCRIPTS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// One look at a server's counters.
#[derive(Default, Clone)]
pub(super) struct ServerStats {
    /// Per command: calls, usec.
    commands: BTreeMap<String, (u64, u64)>,
    /// Main-thread CPU, µs.
    cpu_us: f64,
}

pub(super) async fn server_stats(con: &mut redis::aio::MultiplexedConnection) -> Res<ServerStats> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("cpu")
        .query_async(con)
        .await?;
    let mut s = ServerStats::default();
    for line in info.lines() {
        if let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        {
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            s.commands
                .insert(name.to_owned(), (field("calls="), field("usec=")));
        }
    }
    let cpu = |f: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(f))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    s.cpu_us = (cpu("used_cpu_user_main_thread:") + cpu("used_cpu_sys_main_thread:")) * 1e6;
    Ok(s)
}

/// What a library cost the server over some pairs: summed over blocks.
#[derive(Default)]
pub(super) struct ServerCost {
    commands: BTreeMap<String, (u64, u64)>,
    cpu_us: f64,
}

impl ServerCost {
    pub(super) fn add(&mut self, before: &ServerStats, after: &ServerStats) {
        for (name, &(calls, usec)) in &after.commands {
            let (c0, u0) = before.commands.get(name).copied().unwrap_or((0, 0));
            let e = self.commands.entry(name.clone()).or_default();
            e.0 += calls.saturating_sub(c0);
            e.1 += usec.saturating_sub(u0);
        }
        self.cpu_us += (after.cpu_us - before.cpu_us).max(0.0);
    }

    /// µs of command time per pair: the scripts, and the commands in `direct` (what the library
    /// sends itself besides scripts), less the INFO of the measurement.
    pub(super) fn usec_per_pair(&self, pairs: usize, direct: &[&str]) -> f64 {
        let usec: u64 = self
            .commands
            .iter()
            .filter(|(n, _)| SCRIPTS.contains(&n.as_str()) || direct.contains(&n.as_str()))
            .map(|(_, &(_, u))| u)
            .sum();
        usec as f64 / pairs.max(1) as f64
    }

    pub(super) fn cpu_per_pair(&self, pairs: usize) -> f64 {
        self.cpu_us / pairs.max(1) as f64
    }

    /// Every command the server ran, per pair: `name calls/pair usec/call`.
    pub(super) fn detail(&self, pairs: usize) -> String {
        self.commands
            .iter()
            .filter(|(n, &(c, _))| c > 0 && n.as_str() != "info")
            .map(|(n, &(c, u))| {
                format!(
                    "{n} {:.2}/pair {:.1} µs/call",
                    c as f64 / pairs.max(1) as f64,
                    u as f64 / c.max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
