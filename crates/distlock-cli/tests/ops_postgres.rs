//! `dlock list`, `dlock release --force` and `dlock doctor` as real processes against a real
//! PostgreSQL server, both modes (needs `--features postgres`), holders in other clients.
#![cfg(feature = "postgres")]

mod ops_common;
use distlock_testkit::PostgresServer;
use ops_common::*;
use std::time::Duration;

fn urls(pg: &PostgresServer) -> [String; 2] {
    [pg.url(), format!("{}?mode=lease", pg.url())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_list_shows_held_locks() {
    let pg = PostgresServer::start().expect("postgres");
    for (i, url) in urls(&pg).iter().enumerate() {
        let name = format!("pg-held-{i}");
        let (_a, g) = hold(url, &name, Duration::from_secs(5)).await;
        let locks = list_json(url, &name);
        let l = locks
            .iter()
            .find(|l| l["name"] == name.as_str() && l["kind"] == "mutex")
            .expect("listed");
        assert_eq!(l["holders"][0]["owner"], g.owner(), "{url}: {l}");
        assert_eq!(l["fencing_token"], g.fencing_token(), "{url}: {l}");
        g.release().await.expect("release");
        let locks = list_json(url, &name);
        assert_eq!(
            locks[0]["holders"].as_array().map(Vec::len),
            Some(0),
            "{url}: {locks:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_force_release_fences_the_old_holder() {
    let pg = PostgresServer::start().expect("postgres");
    for (i, url) in urls(&pg).iter().enumerate() {
        let name = format!("pg-stuck-{i}");
        let (_old, guard) = hold(url, &name, Duration::from_secs(1)).await;
        let next = async {
            let next = client(url, Duration::from_secs(5)).await;
            next.lock(&name)
                .expect("lock")
                .acquire_timeout(Duration::from_secs(10))
                .await
                .expect("the next holder acquires")
        };
        force_release_fences(url, &name, &guard, Duration::from_secs(5), next).await;
    }
}

#[test]
fn postgres_doctor_passes_a_plain_server() {
    let pg = PostgresServer::start().expect("postgres");
    for url in urls(&pg) {
        let checks = [
            "version",
            "pooler",
            "session-timeout",
            "replication",
            "clock",
        ];
        doctor_passes(&url, &checks);
    }
}
