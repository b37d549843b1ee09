//! `dlock top --once` against real servers: a held lock and two waiters show as the holder
//! (owner, host, pid, token) and the waiters (where the backend counts them); and the live
//! view driven through a pseudo terminal: sort, prefix filter, one lock's detail with its
//! queue in order, quit.

mod ops_common;
use distlock_testkit::RedisServer;
use ops_common::*;
use std::time::{Duration, Instant};

/// The row of lock `name` in a `top --once` frame, split into its columns (NAME KIND
/// HOLDER HOST PID HELD_FOR LEASE_LEFT TOKEN WAITERS OLDEST_WAIT).
fn row(frame: &str, name: &str) -> Option<Vec<String>> {
    frame
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cols| cols.first().map(String::as_str) == Some(name))
}

/// `dlock top --once --prefix name` until `done` holds for the lock's row (within 60 s).
async fn frame_until(
    url: &str,
    name: &str,
    done: impl Fn(&[String]) -> bool,
) -> (String, Vec<String>) {
    let t = Instant::now();
    loop {
        let out = dlock(url, &["top", "--once", "--prefix", name]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let frame = text(&out.stdout);
        if let Some(cols) = row(&frame, name) {
            if done(&cols) {
                return (frame, cols);
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "not in time: {frame}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A lock held by one client and waited for by two others: the frame names the holder with
/// its host and pid, its fencing token, and two waiters (`?` where the backend keeps no
/// queue); when the holder lets go, the first waiter is the holder and one waits.
async fn top_once_shows_holder_and_two_waiters(url: &str, name: &str, queues: bool) {
    let (_a, held) = hold(url, name, Duration::from_secs(5)).await;
    let b = client(url, Duration::from_secs(5)).await;
    let c = client(url, Duration::from_secs(5)).await;
    let first = spawn_waiter(&b, name);
    let second = spawn_waiter(&c, name);
    let want = if queues { "2" } else { "?" };
    let (frame, cols) = frame_until(url, name, |cols| {
        cols.get(8).map(String::as_str) == Some(want)
    })
    .await;
    let (host, pid) = {
        let mut parts = held.owner().rsplitn(4, ':');
        let (_, _, pid) = (parts.next(), parts.next(), parts.next());
        (
            parts.next().expect("host").to_owned(),
            pid.expect("pid").to_owned(),
        )
    };
    assert_eq!(cols[1], "mutex", "{frame}");
    assert_eq!(cols[2], held.owner(), "{frame}");
    assert_eq!(cols[3], host, "{frame}");
    assert_eq!(cols[4], pid, "{frame}");
    assert_eq!(cols[7], held.fencing_token().to_string(), "{frame}");
    assert!(
        frame
            .lines()
            .next()
            .is_some_and(|t| t.starts_with("dlock top:")),
        "{frame}"
    );
    if queues {
        assert!(frame.contains("2 waiting"), "{frame}");
        assert_ne!(cols[9], "-", "the oldest wait is shown: {frame}");
    }
    held.release().await.expect("release");
    // One of the waiters holds now; the other still waits.
    let (frame, cols) = frame_until(url, name, |cols| {
        cols.get(2).is_some_and(|h| h != "-")
            && (!queues || cols.get(8).map(String::as_str) == Some("1"))
    })
    .await;
    assert_ne!(cols[7], "0", "{frame}");
    // Whichever waiter got it (not every backend is first come first served) lets go, then
    // the other.
    let (mut first, mut second) = (first, second);
    let (got, other) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::select! {
            g = &mut first => (g, second),
            g = &mut second => (g, first),
        }
    })
    .await
    .expect("a waiter gets the lock");
    got.expect("join")
        .expect("acquire")
        .release()
        .await
        .expect("release");
    waited(other, Duration::from_secs(60))
        .await
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_top_once_shows_holder_and_waiters() {
    let server = RedisServer::start().expect("redis");
    top_once_shows_holder_and_two_waiters(&server.url(), "top-redis", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_top_once_shows_holder() {
    let dir = distlock_testkit::TempDir::with_prefix("dlock-top").expect("tempdir");
    let url = format!("file://{}", dir.path().display());
    // The file backend has no server queue: waiters are not counted.
    top_once_shows_holder_and_two_waiters(&url, "top-file", false).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_top_once_shows_holder_and_waiters() {
    let pg = distlock_testkit::PostgresServer::start().expect("postgres");
    let queues = {
        let c = client(&pg.url(), Duration::from_secs(5)).await;
        c.inspect("top-pg-probe")
            .await
            .expect("inspect")
            .waiters
            .is_some()
    };
    top_once_shows_holder_and_two_waiters(&pg.url(), "top-pg", queues).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_top_once_shows_holder_and_waiters() {
    let db = distlock_testkit::MariaDbServer::start().expect("mariadb");
    let queues = {
        let c = client(&db.url(), Duration::from_secs(5)).await;
        c.inspect("top-my-probe")
            .await
            .expect("inspect")
            .waiters
            .is_some()
    };
    top_once_shows_holder_and_two_waiters(&db.url(), "top-my", queues).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_top_once_shows_holder_and_waiters() {
    let cluster = distlock_testkit::EtcdCluster::start().expect("etcd");
    top_once_shows_holder_and_two_waiters(&cluster.url(), "top-etcd", true).await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_top_once_shows_holder_and_waiters() {
    let url = distlock_testkit::ZkEnsemble::shared().url();
    let name = format!("top-zk-{}", std::process::id());
    top_once_shows_holder_and_two_waiters(&url, &name, true).await;
}

/// Bad input is a usage error naming the choices, not a panic.
#[test]
fn an_unknown_sort_order_names_the_orders() {
    let out = dlock(
        "file:///nonexistent-dlock-top",
        &["top", "--once", "--sort", "size"],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("contention"), "{out:?}");
}

/// `dlock serve` refuses a short release token before it listens (exit 2, saying why).
#[test]
fn serve_refuses_a_short_release_token() {
    let out = std::process::Command::new(DLOCK)
        .env("DLOCK_BACKEND", "file:///nonexistent-dlock-serve")
        .env("DLOCK_RELEASE_TOKEN", "short")
        .args(["serve", "--listen", "127.0.0.1:0", "--allow-release"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run dlock");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("16 characters"), "{out:?}");
}
