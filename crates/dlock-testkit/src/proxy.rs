//! A delaying / blackholing TCP proxy for fault tests.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::Result;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest single sleep of a writer, so it notices shutdown promptly.
const SLEEP_SLICE: Duration = Duration::from_millis(50);
const BUF_SIZE: usize = 16 * 1024;

/// A TCP proxy on a free loopback port forwarding to `target`, adding a
/// delay before forwarding each chunk in both directions; for fault tests
/// ("a node behind a slow link").
///
/// Order is preserved per direction: each direction of each connection has a
/// reader thread that timestamps chunks and a writer thread that forwards
/// each chunk at `read time + delay` (the delay in effect when the chunk was
/// read). A request/response round trip through the proxy thus takes at
/// least twice the delay.
///
/// In blackhole mode ([`set_blackhole`](Self::set_blackhole)) connections are
/// still accepted (and opened upstream), but all data read in either
/// direction is **discarded** (not buffered), so peers see silence.
///
/// Dropping the proxy stops accepting (the port is closed when `drop`
/// returns) and shuts down all open connections; its threads then exit on
/// their own.
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    delay_nanos: AtomicU64,
    blackhole: AtomicBool,
    shutdown: AtomicBool,
    next_id: AtomicU64,
    /// Open connections (clones of both sockets), for shutdown on drop.
    conns: Mutex<HashMap<u64, [TcpStream; 2]>>,
}

impl Shared {
    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }

    fn blackholed(&self) -> bool {
        self.blackhole.load(Ordering::Relaxed)
    }

    fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, [TcpStream; 2]>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl DelayProxy {
    /// Starts a proxy on a free `127.0.0.1` port forwarding to `target`
    /// with the given per-chunk `delay` (may be zero).
    pub fn start(target: SocketAddr, delay: Duration) -> Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            delay_nanos: AtomicU64::new(duration_nanos(delay)),
            blackhole: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let s = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name(format!("dlock-proxy-accept-{}", addr.port()))
            .spawn(move || accept_loop(listener, s))?;
        Ok(DelayProxy {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The proxy's listening address (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address traffic is forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// Changes the delay; applies to chunks read from now on.
    pub fn set_delay(&self, d: Duration) {
        self.shared
            .delay_nanos
            .store(duration_nanos(d), Ordering::Relaxed);
    }

    /// Turns blackhole mode on or off: while on, data in both directions is
    /// read and discarded (connections stay open and are still accepted).
    pub fn set_blackhole(&self, on: bool) {
        self.shared.blackhole.store(on, Ordering::Relaxed);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        // Wake the blocking accept() with a self-connect; only join when that
        // worked, so drop can never hang.
        let woke = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let Some(handle) = self.accept_thread.take() {
            if woke {
                let _ = handle.join();
            }
        }
        for (_, [a, b]) in self.shared.conns().drain() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopping() {
            break;
        }
        match incoming {
            Ok(client) => {
                let s = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name("dlock-proxy-conn".into())
                    .spawn(move || handle_conn(client, s));
                if spawned.is_err() {
                    // Out of threads: the client is dropped (closed).
                    thread::sleep(Duration::from_millis(10));
                }
            }
            // E.g. EMFILE: back off instead of spinning.
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Tracks the two directions of one connection; the last to finish
/// unregisters it.
struct ConnGuard {
    id: u64,
    remaining: AtomicUsize,
    shared: Arc<Shared>,
}

impl ConnGuard {
    fn direction_done(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.conns().remove(&self.id);
        }
    }
}

fn handle_conn(client: TcpStream, shared: Arc<Shared>) {
    let Ok(upstream) = TcpStream::connect_timeout(&shared.target, CONNECT_TIMEOUT) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut conns = shared.conns();
        // Checked under the lock: Drop sets the flag before draining.
        if shared.stopping() {
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
            return;
        }
        let (Ok(c), Ok(u)) = (client.try_clone(), upstream.try_clone()) else {
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
            return;
        };
        conns.insert(id, [c, u]);
    }
    let guard = Arc::new(ConnGuard {
        id,
        remaining: AtomicUsize::new(2),
        shared: Arc::clone(&shared),
    });
    let up = (client.try_clone(), upstream.try_clone());
    let down = (upstream.try_clone(), client.try_clone());
    let (Ok(src_up), Ok(dst_up)) = up else {
        abort(&client, &upstream, &guard);
        return;
    };
    let (Ok(src_down), Ok(dst_down)) = down else {
        abort(&client, &upstream, &guard);
        return;
    };
    let g = Arc::clone(&guard);
    let s = Arc::clone(&shared);
    if thread::Builder::new()
        .name("dlock-proxy-up".into())
        .spawn(move || pump(src_up, dst_up, s, g))
        .is_err()
    {
        abort(&client, &upstream, &guard);
        return;
    }
    // This thread serves the downstream direction itself.
    pump(src_down, dst_down, shared, guard);
}

fn abort(a: &TcpStream, b: &TcpStream, guard: &ConnGuard) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
    guard.shared.conns().remove(&guard.id);
}

enum Chunk {
    Data(Instant, Vec<u8>),
    Eof,
}

/// Forwards `src` → `dst`: reads here, writes on a separate thread at
/// `read time + delay`, preserving order.
fn pump(mut src: TcpStream, dst: TcpStream, shared: Arc<Shared>, guard: Arc<ConnGuard>) {
    let (tx, rx) = mpsc::channel::<Chunk>();
    let writer_src = src.try_clone();
    let s = Arc::clone(&shared);
    let writer = thread::Builder::new()
        .name("dlock-proxy-writer".into())
        .spawn(move || {
            write_loop(rx, dst, writer_src.ok(), &s);
            guard.direction_done();
        });
    if writer.is_err() {
        let _ = src.shutdown(Shutdown::Both);
        return;
    }
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        match src.read(&mut buf) {
            Ok(0) => {
                let _ = tx.send(Chunk::Eof);
                break;
            }
            Ok(n) => {
                if shared.blackholed() {
                    continue;
                }
                let due = Instant::now() + shared.delay();
                if tx.send(Chunk::Data(due, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Dropping `tx` ends the writer, which closes both sockets.
            Err(_) => break,
        }
    }
}

fn write_loop(
    rx: mpsc::Receiver<Chunk>,
    mut dst: TcpStream,
    src: Option<TcpStream>,
    shared: &Shared,
) {
    let close_all = |dst: &TcpStream| {
        let _ = dst.shutdown(Shutdown::Both);
        if let Some(src) = &src {
            let _ = src.shutdown(Shutdown::Both);
        }
    };
    loop {
        match rx.recv() {
            Ok(Chunk::Data(due, data)) => {
                loop {
                    if shared.stopping() {
                        close_all(&dst);
                        return;
                    }
                    let now = Instant::now();
                    if now >= due {
                        break;
                    }
                    thread::sleep((due - now).min(SLEEP_SLICE));
                }
                if shared.blackholed() {
                    continue;
                }
                if dst.write_all(&data).is_err() {
                    close_all(&dst);
                    return;
                }
            }
            Ok(Chunk::Eof) => {
                // Propagate the half-close after all earlier data.
                let _ = dst.shutdown(Shutdown::Write);
                return;
            }
            Err(_) => {
                // The reader failed: tear the connection down.
                close_all(&dst);
                return;
            }
        }
    }
}
