//! The README's backend table says which lock kinds each backend (and mode) has; this test
//! connects to each one on a real server and compares the table's "lock kinds" column with
//! what the backend declares (`Backend::capabilities`), so the two cannot drift apart.
#![cfg(all(
    feature = "file",
    feature = "redis",
    feature = "redlock",
    feature = "etcd",
    feature = "zookeeper",
    feature = "postgres",
    feature = "mysql"
))]

use distlock::LockKind;
use distlock_testkit::{EtcdCluster, MariaDbServer, PostgresServer, RedisServer, ZkEnsemble};

/// The rows of the backend table in README.md: (first URL of the row, its lock kinds sorted).
fn readme_rows() -> Vec<(String, Vec<String>)> {
    let readme = include_str!("../../../README.md");
    let table = readme
        .split("\n## Backends\n")
        .nth(1)
        .expect("README.md has a `## Backends` section");
    let header = "| URL | service | cargo feature | lock kinds |";
    assert!(
        table.trim_start().starts_with(header),
        "the table's header is `{header}`"
    );
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let url = cells[1].split('`').nth(1).expect("a URL in backticks");
            let mut kinds: Vec<String> = cells[4].split(", ").map(str::to_owned).collect();
            kinds.sort();
            (url.to_owned(), kinds)
        })
        .collect()
}

/// The README's names of the kinds `kinds`, sorted: a read-write lock is one name for both
/// sides.
fn names(kinds: &[LockKind]) -> Vec<String> {
    let mut names: Vec<String> = kinds
        .iter()
        .map(|k| match k {
            LockKind::Read | LockKind::Write => "read-write",
            other => other.as_str(),
        })
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_table_matches_capabilities() {
    let dir = distlock_testkit::TempDir::new().expect("temp dir");
    let redis: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    let redlock = format!(
        "redlock://{}",
        (redis.iter().map(|r| r.addr().to_string()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let etcd = EtcdCluster::start().expect("etcd");
    let pg = PostgresServer::start().expect("postgres");
    let my = MariaDbServer::start().expect("mariadb");
    let urls = [
        ("file://DIR", format!("file://{}", dir.path().display())),
        ("redis://", redis[0].url()),
        ("redlock://h1,h2,h3", redlock),
        ("etcd://", etcd.url()),
        ("zk://", ZkEnsemble::shared().url()),
        ("postgres://", pg.url()),
        (
            "postgres://…?mode=lease",
            format!("{}?mode=lease", pg.url()),
        ),
        ("mysql://", my.url()),
        ("mysql://…?mode=table", format!("{}?mode=table", my.url())),
    ];
    let rows = readme_rows();
    let row_urls: Vec<&str> = rows.iter().map(|(u, _)| u.as_str()).collect();
    let tested: Vec<&str> = urls.iter().map(|(u, _)| *u).collect();
    assert_eq!(
        row_urls, tested,
        "a README row this test does not connect to, or the other way round"
    );
    for ((row, kinds), (_, url)) in rows.iter().zip(&urls) {
        let client = distlock::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect for row `{row}`: {e}"));
        let declared = client.backend().capabilities().supported_kinds();
        assert_eq!(
            kinds,
            &names(&declared),
            "README row `{row}`: the table says {kinds:?}, the {} backend declares {declared:?}",
            client.backend_kind()
        );
    }
}
