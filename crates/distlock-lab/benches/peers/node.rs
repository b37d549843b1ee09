//! node-redlock (npm `redlock` 4.2.0, the Redlock of the Node.js world, with ioredis 5.11.1),
//! run by `node` through the same scenarios (`node_redlock.js`), when installed: by
//! `scripts/test` under `target/peers/node`, or in `$DLOCK_PEERS/node`.

use super::*;
use std::path::PathBuf;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/peers/node_redlock.js");

/// The `node_modules` holding redlock, if installed.
pub(super) fn node_modules() -> Option<PathBuf> {
    let peers = std::env::var_os("DLOCK_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/peers"))
        });
    let dir = peers.join("node/node_modules");
    dir.join("redlock/package.json").exists().then_some(dir)
}

async fn run_node(modules: &std::path::Path, cfg: serde_json::Value) -> Res<serde_json::Value> {
    let out = tokio::process::Command::new("node")
        .arg(SCRIPT)
        .arg(cfg.to_string())
        .env("NODE_PATH", modules)
        .kill_on_drop(true)
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!(
            "node-redlock: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn durations(v: &serde_json::Value, field: &str) -> Vec<Duration> {
    v[field]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_f64())
                .map(|u| Duration::from_secs_f64(u.max(0.0) / 1e6))
                .collect()
        })
        .unwrap_or_default()
}

/// One client, acquire + release pairs for `run`.
pub(super) async fn node_uncontended(
    modules: &std::path::Path,
    nodes: &[String],
    run: Duration,
) -> Res<Rate> {
    let v = run_node(
        modules,
        serde_json::json!({
            "scenario": "uncontended", "urls": nodes, "clients": 1,
            "run_ms": run.as_millis() as u64, "name": "peers-node-uncontended", "warm_up": WARM_UP,
        }),
    )
    .await?;
    let samples = durations(&v, "samples_us");
    let us_of = |f: &str| Duration::from_secs_f64(v[f].as_f64().unwrap_or(0.0).max(0.0) / 1e6);
    let t = Timed {
        samples,
        elapsed: us_of("elapsed_us"),
        cpu: us_of("cpu_us"),
    };
    Ok(Rate::of(t))
}

/// `clients` clients on one name for `run`.
pub(super) async fn node_contended(
    modules: &std::path::Path,
    nodes: &[String],
    clients: usize,
    run: Duration,
    tag: &str,
) -> Res<Contended> {
    let v = run_node(
        modules,
        serde_json::json!({
            "scenario": "contended", "urls": nodes, "clients": clients,
            "run_ms": run.as_millis() as u64, "name": format!("peers-node-{tag}"), "warm_up": 0,
        }),
    )
    .await?;
    let n = |f: &str| v[f].as_u64().unwrap_or(0);
    let runs: Vec<ClientRun> = v["per_client"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| ClientRun {
                    in_run: c.as_u64().unwrap_or(0) as usize,
                    ..ClientRun::default()
                })
                .collect()
        })
        .unwrap_or_default();
    let mut c = summarize(runs, run, n("lost"), n("overlaps") as usize);
    let mut waits = durations(&v, "waits_us");
    c.p50 = pct(&mut waits, 0.5);
    c.p99 = pct(&mut waits, 0.99);
    c.worst = waits.iter().copied().max().unwrap_or_default();
    c.give_ups = n("give_ups") as usize;
    c.sections = n("sections") as usize;
    Ok(c)
}
