//! Integration tests against a real `redis-server`.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use distlock_testkit::{Error, RedisOptions, RedisServer, Reply};

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// Raw connect + PING with a read timeout; returns the raw reply bytes.
fn raw_ping(server: &RedisServer, timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&server.addr(), Duration::from_secs(1))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(PING)?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    Ok(buf[..n].to_vec())
}

#[test]
fn start_ping_set_get() {
    let s = RedisServer::start().expect("start");
    assert!(s.is_running());
    assert!(s.pid().is_some());
    assert_ne!(s.port(), 6379);
    assert_eq!(s.addr().to_string(), format!("127.0.0.1:{}", s.port()));
    assert_eq!(s.url(), format!("redis://127.0.0.1:{}", s.port()));
    assert!(s.dir().join("redis.log").exists());

    assert_eq!(
        raw_ping(&s, Duration::from_secs(2)).expect("ping"),
        b"+PONG\r\n"
    );
    assert_eq!(s.command(&["PING"]).expect("ping"), "PONG");
    assert_eq!(s.command(&["SET", "k", "v"]).expect("set"), "OK");
    assert_eq!(s.command(&["GET", "k"]).expect("get"), "v");
    assert_eq!(s.command(&["GET", "missing"]).expect("get"), "(nil)");
    assert_eq!(s.command(&["INCR", "n"]).expect("incr"), "1");
    assert_eq!(s.command(&["DEL", "k", "n"]).expect("del"), "2");
    assert_eq!(
        s.command_reply(&["GET", "k"]).expect("get"),
        Reply::Bulk(None)
    );
    // Wrong type → error reply rendered with a leading '-'.
    s.command(&["LPUSH", "list", "x"]).expect("lpush");
    let wrong = s.command(&["GET", "list"]).expect("get");
    assert!(wrong.starts_with("-WRONGTYPE"), "{wrong}");
    assert_eq!(s.command(&["RPUSH", "l2", "a", "b"]).expect("rpush"), "2");
    assert_eq!(
        s.command(&["LRANGE", "l2", "0", "-1"]).expect("lrange"),
        "a\nb"
    );
    assert!(!s.run_id().expect("run_id").is_empty());
}

#[test]
fn kill_refuses_connections_and_is_idempotent() {
    let mut s = RedisServer::start().expect("start");
    s.kill();
    assert!(!s.is_running());
    assert_eq!(s.pid(), None);
    let err = TcpStream::connect(s.addr()).expect_err("should be refused");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(matches!(s.command(&["PING"]), Err(Error::Io(_))));
    s.kill();
}

#[test]
fn restart_same_port_empty_data_new_run_id() {
    let mut s = RedisServer::start().expect("start");
    let port = s.port();
    let run_id = s.run_id().expect("run_id");
    let pid = s.pid();
    s.command(&["SET", "k", "v"]).expect("set");

    s.restart().expect("restart");
    assert_eq!(s.port(), port);
    assert!(s.is_running());
    assert_ne!(s.pid(), pid);
    assert_eq!(s.command(&["GET", "k"]).expect("get"), "(nil)");
    assert_eq!(s.command(&["DBSIZE"]).expect("dbsize"), "0");
    assert_ne!(s.run_id().expect("run_id"), run_id);

    // Restart after an explicit kill works too.
    s.kill();
    s.restart().expect("restart after kill");
    assert_eq!(s.port(), port);
    assert_eq!(s.command(&["PING"]).expect("ping"), "PONG");
}

#[test]
fn pause_and_resume() {
    let mut s = RedisServer::start().expect("start");
    s.pause();
    assert!(s.is_running(), "a paused server still counts as running");
    let err = raw_ping(&s, Duration::from_millis(200)).expect_err("paused server must not answer");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    s.resume();
    assert_eq!(
        raw_ping(&s, Duration::from_secs(2)).expect("ping"),
        b"+PONG\r\n"
    );
    assert_eq!(s.command(&["PING"]).expect("ping"), "PONG");
}

#[test]
fn drop_kills_a_paused_server() {
    let mut s = RedisServer::start().expect("start");
    let addr = s.addr();
    let pid = s.pid().expect("pid");
    let dir = s.dir().to_path_buf();
    s.pause();
    drop(s);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(!dir.exists());
    let err = TcpStream::connect(addr).expect_err("should be refused");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
}

#[test]
fn password_requires_auth() {
    let s = RedisServer::start_with(RedisOptions {
        password: Some("s3cr3t@x".into()),
        ..RedisOptions::default()
    })
    .expect("start");
    assert_eq!(
        s.url(),
        format!("redis://:s3cr3t%40x@127.0.0.1:{}", s.port())
    );
    let raw = raw_ping(&s, Duration::from_secs(2)).expect("ping");
    assert!(
        raw.starts_with(b"-NOAUTH"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    assert_eq!(s.command(&["SET", "k", "v"]).expect("set"), "OK");
    assert_eq!(s.command(&["GET", "k"]).expect("get"), "v");
}

#[test]
fn acl_user() {
    let s = RedisServer::start_with(RedisOptions {
        acl_user: Some(("alice".into(), "wonder".into())),
        ..RedisOptions::default()
    })
    .expect("start");
    assert_eq!(s.command(&["ACL", "WHOAMI"]).expect("whoami"), "alice");
    assert_eq!(s.command(&["SET", "k", "v"]).expect("set"), "OK");
}

#[test]
fn two_servers_in_parallel() {
    let a = std::thread::spawn(RedisServer::start);
    let b = std::thread::spawn(RedisServer::start);
    let a = a.join().expect("join").expect("start a");
    let b = b.join().expect("join").expect("start b");
    assert_ne!(a.port(), b.port());
    assert_ne!(a.run_id().expect("run_id"), b.run_id().expect("run_id"));
    a.command(&["SET", "k", "a"]).expect("set");
    assert_eq!(b.command(&["GET", "k"]).expect("get"), "(nil)");
}

#[test]
fn server_outlives_the_thread_that_started_it() {
    // Servers are forked from a long-lived thread, so PDEATHSIG does not fire
    // when the starting thread exits.
    let s = std::thread::spawn(RedisServer::start)
        .join()
        .expect("join")
        .expect("start");
    std::thread::sleep(Duration::from_millis(50));
    assert!(s.is_running());
    assert_eq!(s.command(&["PING"]).expect("ping"), "PONG");
}

#[test]
fn missing_binary() {
    let err = RedisServer::start_with_binary("/nonexistent/redis-server", RedisOptions::default())
        .expect_err("must fail");
    match &err {
        Error::BinaryMissing { binary, package } => {
            assert_eq!(binary, "/nonexistent/redis-server");
            assert_eq!(package, "redis-server");
        }
        other => panic!("unexpected error: {other:?}"),
    }
    assert!(err
        .to_string()
        .contains("sudo apt-get install redis-server"));

    let err = RedisServer::start_with_binary("dlock-no-such-redis", RedisOptions::default())
        .expect_err("must fail");
    assert!(matches!(err, Error::BinaryMissing { .. }), "{err:?}");
}

#[test]
fn bad_arguments_report_the_log() {
    let err = RedisServer::start_with(RedisOptions {
        extra_args: vec!["--no-such-directive".into(), "x".into()],
        ..RedisOptions::default()
    })
    .expect_err("must fail");
    match &err {
        Error::Start { what, detail } => {
            assert!(what.starts_with("redis-server on 127.0.0.1:"), "{what}");
            assert!(detail.contains("no-such-directive"), "{detail}");
        }
        other => panic!("unexpected error: {other:?}"),
    }
}

#[test]
fn cluster_starts_and_fails_over() {
    let t = std::time::Instant::now();
    let mut cluster = distlock_testkit::RedisCluster::start().expect("cluster");
    eprintln!("cluster formed in {:?}", t.elapsed());
    let nodes = cluster.nodes().expect("nodes");
    assert_eq!(nodes.len(), 6, "{nodes:?}");
    let masters = cluster.masters().expect("masters");
    assert_eq!(masters.len(), 3, "{nodes:?}");
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    // Keys land on their slot's master.
    let m = cluster.master_of("{a}x").expect("master");
    assert_eq!(
        cluster.servers()[m]
            .command(&["SET", "{a}x", "1"])
            .expect("SET"),
        "OK"
    );
    assert_eq!(
        cluster
            .command_at_key("{a}x", &["GET", "{a}x"])
            .expect("GET"),
        "1"
    );
    let r = cluster.replica_of(m).expect("replica");
    assert_ne!(r, m);
    let t = std::time::Instant::now();
    cluster.kill(m);
    let promoted = cluster
        .wait_failover(m, std::time::Duration::from_secs(30))
        .expect("failover");
    eprintln!("failed over in {:?}", t.elapsed());
    assert_eq!(promoted, r, "its replica took over");
    let now = cluster.master_of("{a}x").expect("master");
    assert_ne!(now, m);
    assert_eq!(cluster.masters().expect("masters").len(), 3);
}
