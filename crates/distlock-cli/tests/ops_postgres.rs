//! `dlock list`, `dlock release --force` and `dlock doctor` as real processes against a real
//! PostgreSQL server, both modes (needs `--features postgres`), holders in other clients.
#![cfg(feature = "postgres")]

mod ops_common;
use distlock_testkit::{FencedRegister, PostgresServer};
use ops_common::*;
use std::time::{Duration, Instant};

fn urls(pg: &PostgresServer) -> [String; 2] {
    [pg.url(), format!("{}?mode=lease", pg.url())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_list_shows_held_locks() {
    let pg = PostgresServer::start().expect("postgres");
    for (i, url) in urls(&pg).iter().enumerate() {
        let name = format!("pg-held-{i}");
        let a = client(url, Duration::from_secs(5)).await;
        let g = a
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
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
        let old = client(url, Duration::from_secs(1)).await;
        let guard = old
            .lock(&name)
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        let register = FencedRegister::new();
        assert!(register.write(guard.fencing_token(), "old", true));
        let t = Instant::now();
        let out = dlock(url, &["release", "--force", &name, "--yes"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(text(&out.stdout).contains(guard.owner()), "{out:?}");
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the old holder's lost signal fires");
        eprintln!("{url}: lost signal {:?} after the release", t.elapsed());
        let next = client(url, Duration::from_secs(5)).await;
        let g2 = next
            .lock(&name)
            .expect("lock")
            .acquire_timeout(Duration::from_secs(10))
            .await
            .expect("the next holder acquires");
        assert!(g2.fencing_token() > guard.fencing_token());
        assert!(register.write(g2.fencing_token(), "next", true));
        assert!(
            !register.write(guard.fencing_token(), "old", !guard.is_lost()),
            "the old holder's write must be rejected"
        );
        register.assert_no_rejected_belief();
        g2.release().await.expect("release");
    }
}

#[test]
fn postgres_doctor_passes_a_plain_server() {
    let pg = PostgresServer::start().expect("postgres");
    for url in urls(&pg) {
        let out = dlock(&url, &["doctor"]);
        let report = text(&out.stdout) + &text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{url}: {report}");
        for check in [
            "version",
            "pooler",
            "session-timeout",
            "replication",
            "clock",
        ] {
            let line = report
                .lines()
                .find(|l| l.split_whitespace().nth(1) == Some(&format!("{check}:")))
                .unwrap_or_else(|| panic!("no `{check}` line in {report}"));
            assert!(line.starts_with("OK"), "{check}: {report}");
        }
    }
}
