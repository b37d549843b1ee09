//! The operator commands against a Redlock cluster of real redis-servers, as real `dlock`
//! processes (each connects afresh, so it reads the nodes' epochs and quarantines from the
//! nodes), with the holder in another client.

mod ops_common;
use distlock_testkit::RedisServer;
use ops_common::*;
use std::time::{Duration, Instant};

/// Three redis-servers that have been up for a second by their own count, so a quarantine
/// of 200 ms does not apply to a cluster that just started; the URL with that quarantine.
async fn cluster() -> (Vec<RedisServer>, String) {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis"))
        .collect();
    let t = Instant::now();
    // `uptime_in_seconds` counts whole seconds from a start time that is itself rounded:
    // wait a whole second by our clock too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for s in &servers {
        loop {
            let info = s.command(&["INFO", "server"]).expect("INFO");
            let up = info
                .lines()
                .find_map(|l| l.trim().strip_prefix("uptime_in_seconds:"))
                .and_then(|u| u.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if up >= 1 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "uptime stuck");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redlock://{}?quarantine=200ms", hosts.join(","));
    (servers, url)
}

/// `list --json` shows the holder with its token, `release --force --yes` removes it and the
/// old holder is fenced, `doctor` passes a safe cluster (exit 0) and fails one node with an
/// evicting policy (exit 1, naming the node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_list_force_release_and_doctor() {
    let (servers, url) = cluster().await;
    let (old, guard) = hold(&url, "ops-rl", Duration::from_secs(1)).await;

    let locks = list_json(&url, "ops-rl");
    let l = locks
        .iter()
        .find(|l| l["name"] == "ops-rl")
        .expect("listed");
    assert_eq!(l["kind"], "mutex", "{l}");
    // The owner is plain when every node has the hold, else it names the agreement.
    let owner = l["holders"][0]["owner"].as_str().unwrap_or_default();
    assert!(owner.starts_with(guard.owner()), "{l}");
    assert_eq!(l["fencing_token"], guard.fencing_token(), "{l}");

    let next = async {
        old.lock("ops-rl")
            .expect("lock")
            .acquire_timeout(Duration::from_secs(10))
            .await
            .expect("the next holder acquires")
    };
    force_release_fences(&url, "ops-rl", &guard, Duration::from_secs(5), next).await;

    let out = dlock(&url, &["doctor"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report = text(&out.stdout);
    assert!(
        report.contains("quarantine") && report.contains("clock spread"),
        "{report}"
    );
    servers[1]
        .command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .expect("CONFIG SET");
    let out = dlock(&url, &["doctor"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report = text(&out.stdout);
    assert!(
        report.contains(&format!("127.0.0.1:{} maxmemory-policy", servers[1].port())),
        "{report}"
    );
    drop(guard);
}
