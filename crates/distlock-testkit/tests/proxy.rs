//! Integration tests of `DelayProxy` in front of a real `redis-server`.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use distlock_testkit::{DelayProxy, RedisServer};

fn connect(proxy: &DelayProxy, read_timeout: Duration) -> TcpStream {
    let s = TcpStream::connect(proxy.addr()).expect("connect");
    s.set_read_timeout(Some(read_timeout)).expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Sends `req` and reads exactly `expected.len()` bytes back.
fn roundtrip(s: &mut TcpStream, req: &[u8], expected: &[u8]) -> Duration {
    let t = Instant::now();
    s.write_all(req).expect("write");
    let mut buf = vec![0u8; expected.len()];
    s.read_exact(&mut buf).expect("read");
    let elapsed = t.elapsed();
    assert_eq!(buf, expected, "{}", String::from_utf8_lossy(&buf));
    elapsed
}

#[test]
fn delays_and_forwards() {
    let server = RedisServer::start().expect("start");
    let delay = Duration::from_millis(100);
    let proxy = DelayProxy::start(server.addr(), delay).expect("proxy");
    assert_eq!(proxy.addr().port(), proxy.port());
    assert_eq!(proxy.target(), server.addr());

    let mut c = connect(&proxy, Duration::from_secs(5));
    let rtt = roundtrip(&mut c, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
    assert!(rtt >= delay, "round trip {rtt:?} < delay {delay:?}");

    // Pipelined commands come back complete and in order.
    roundtrip(
        &mut c,
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
        b"+OK\r\n$5\r\nhello\r\n",
    );
    assert_eq!(server.command(&["GET", "k"]).expect("get"), "hello");

    // Delay can be changed at runtime.
    proxy.set_delay(Duration::ZERO);
    roundtrip(&mut c, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
}

#[test]
fn blackhole_swallows_traffic() {
    let server = RedisServer::start().expect("start");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    proxy.set_blackhole(true);
    let mut c = connect(&proxy, Duration::from_millis(200));
    c.write_all(b"*1\r\n$4\r\nPING\r\n").expect("write");
    let mut buf = [0u8; 16];
    let err = c.read(&mut buf).expect_err("blackholed");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );

    proxy.set_blackhole(false);
    let mut c = connect(&proxy, Duration::from_secs(5));
    roundtrip(&mut c, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
}

#[test]
fn drop_closes_port_and_connections() {
    let server = RedisServer::start().expect("start");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let addr = proxy.addr();
    let mut c = connect(&proxy, Duration::from_secs(5));
    roundtrip(&mut c, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
    drop(proxy);
    let err = TcpStream::connect(addr).expect_err("port closed");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    // The open connection was shut down: EOF or an error, never a hang.
    let mut buf = [0u8; 16];
    match c.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert_ne!(e.kind(), ErrorKind::WouldBlock, "{e:?}"),
    }
}

#[test]
fn client_close_propagates_upstream() {
    let server = RedisServer::start().expect("start");
    let proxy = DelayProxy::start(server.addr(), Duration::from_millis(5)).expect("proxy");
    for _ in 0..3 {
        let mut c = connect(&proxy, Duration::from_secs(5));
        roundtrip(&mut c, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
    }
    // Upstream connections get closed once the clients go away.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let clients = server.command(&["INFO", "clients"]).expect("info");
        if clients.contains("connected_clients:1\r") {
            break;
        }
        assert!(Instant::now() < deadline, "{clients}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `done` holds for the proxy's counters (5 s at most).
fn wait_stats(
    proxy: &DelayProxy,
    what: &str,
    done: impl Fn(&distlock_testkit::ProxyStats) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = proxy.stats();
        if done(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn reply_delay_lets_the_request_execute_first() {
    let server = RedisServer::start().expect("start");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let mut c = connect(&proxy, Duration::from_secs(5));
    roundtrip(&mut c, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
    // Long enough that the checks below run before the reply is due, even on a loaded machine.
    let delay = Duration::from_millis(1500);
    proxy.set_reply_delay(delay);
    let t = Instant::now();
    c.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
        .expect("write");
    // The SET executed on the server long before its reply gets back.
    wait_stats(&proxy, "reply read", |s| s.replies.chunks_read >= 2);
    assert_eq!(
        proxy.stats().replies.chunks_forwarded,
        1,
        "the reply was not held back"
    );
    assert_eq!(server.command(&["GET", "k"]).expect("get"), "v");
    let mut buf = [0u8; 5];
    c.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"+OK\r\n");
    assert!(t.elapsed() >= delay, "reply not delayed: {:?}", t.elapsed());
    // The proxy counts a chunk once its write returned, which may be after the peer read it.
    wait_stats(&proxy, "all forwarded", |s| {
        s.requests.chunks_forwarded == 2 && s.replies.chunks_forwarded == 2
    });
    let s = proxy.stats();
    assert_eq!(s.connections, 1);
}

#[test]
fn dropped_replies_and_reset_after_a_request() {
    let server = RedisServer::start().expect("start");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let mut c = connect(&proxy, Duration::from_millis(300));
    proxy.set_drop_replies(true);
    c.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n")
        .expect("write");
    wait_stats(&proxy, "reply read and dropped", |s| {
        s.replies.chunks_read >= 1
    });
    assert_eq!(server.command(&["GET", "a"]).expect("get"), "1");
    let mut buf = [0u8; 16];
    let err = c.read(&mut buf).expect_err("the reply was dropped");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    proxy.heal();

    // Reset right after the next request reached the server: it executes, its reply is lost.
    let mut c = connect(&proxy, Duration::from_secs(5));
    proxy.reset_after_request_bytes(1);
    assert!(proxy.reset_pending());
    c.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n2\r\n")
        .expect("write");
    match c.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "a reply slipped through: {:?}", &buf[..n]),
        Err(e) => assert_ne!(e.kind(), ErrorKind::WouldBlock, "{e:?}"),
    }
    // The reset and the server's run of the forwarded SET are asynchronous to this thread:
    // wait for both (bounded), then check.
    wait_stats(&proxy, "the reset done", |s| s.resets >= 1);
    assert!(!proxy.reset_pending());
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.command(&["GET", "b"]).expect("get") != "2" {
        assert!(
            Instant::now() < deadline,
            "the forwarded request never executed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // New connections work as before.
    let mut c = connect(&proxy, Duration::from_secs(5));
    roundtrip(&mut c, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
    proxy.reset_all();
    match c.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert_ne!(e.kind(), ErrorKind::WouldBlock, "{e:?}"),
    }
}

/// A held request waits in the proxy, however long, until released, with what follows it on
/// its connection (the client's close included); another connection passes meanwhile.
#[test]
fn held_request_waits_until_released() {
    let server = RedisServer::start().expect("start");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let mut held = connect(&proxy, Duration::from_secs(5));
    roundtrip(&mut held, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
    proxy.hold_next_request();
    held.write_all(b"*3\r\n$3\r\nSET\r\n$4\r\nlate\r\n$1\r\n1\r\n")
        .expect("write");
    let t = Instant::now();
    while proxy.held_requests() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "never held");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The client gives up on it and closes; another connection goes through at once.
    drop(held);
    let mut other = connect(&proxy, Duration::from_secs(5));
    roundtrip(&mut other, b"*1\r\n$4\r\nPING\r\n", b"+PONG\r\n");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.command(&["EXISTS", "late"]).expect("exists"), "0");
    proxy.release_held();
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.command(&["EXISTS", "late"]).expect("exists") != "1" {
        assert!(Instant::now() < deadline, "the held request never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(proxy.held_requests(), 1);
}
