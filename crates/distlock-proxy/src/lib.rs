//! A delaying / blackholing / resetting TCP proxy on loopback, for fault tests and for the
//! network nemeses of `dlock torture`. Standard library only.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Result of starting a proxy.
pub type Result<T> = std::io::Result<T>;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest single sleep of a writer, so it notices shutdown promptly.
const SLEEP_SLICE: Duration = Duration::from_millis(50);
const BUF_SIZE: usize = 16 * 1024;
/// How often a writer whose connection is held looks whether it was released.
const HOLD_POLL: Duration = Duration::from_millis(5);

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
/// Each direction can also be controlled on its own, which is what makes the
/// faults a lock must survive: [`set_reply_delay`](Self::set_reply_delay)
/// delays only server → client data (the request executes on the server, the
/// reply arrives after the client's operation timeout: a *late reply*),
/// [`set_drop_replies`](Self::set_drop_replies) discards only replies (the
/// request executes, its answer is *lost*), [`reset_all`](Self::reset_all)
/// shuts every open connection down, and
/// [`reset_after_request_bytes`](Self::reset_after_request_bytes) does so
/// right after a request reached the server, before its reply can come back.
/// [`hold_next_request`](Self::hold_next_request) holds the next request and
/// everything after it on that one connection until
/// [`release_held`](Self::release_held) (a request *still on its way* while
/// the client, past its operation timeout, goes on over a fresh connection).
/// [`stats`](Self::stats) counts what was read and forwarded per direction,
/// so a test can wait until a request has reached the server.
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

/// Traffic counters of one direction (see [`DelayProxy::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectionStats {
    /// Chunks read from the sender (including ones later dropped).
    pub chunks_read: u64,
    /// Bytes read from the sender (including dropped ones).
    pub bytes_read: u64,
    /// Chunks written to the receiver.
    pub chunks_forwarded: u64,
    /// Bytes written to the receiver.
    pub bytes_forwarded: u64,
}

/// Traffic counters of a proxy since it started, over all its connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client → server (requests).
    pub requests: DirectionStats,
    /// Server → client (replies).
    pub replies: DirectionStats,
    /// Connections accepted.
    pub connections: u64,
    /// Connections shut down by [`DelayProxy::reset_all`] or a
    /// [`DelayProxy::reset_after_request_bytes`] trigger.
    pub resets: u64,
}

/// The controls and counters of one direction.
#[derive(Debug, Default)]
struct Direction {
    delay_nanos: AtomicU64,
    drop: AtomicBool,
    chunks_read: AtomicU64,
    bytes_read: AtomicU64,
    chunks_forwarded: AtomicU64,
    bytes_forwarded: AtomicU64,
}

impl Direction {
    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::SeqCst))
    }

    fn dropping(&self) -> bool {
        self.drop.load(Ordering::SeqCst)
    }

    fn stats(&self) -> DirectionStats {
        DirectionStats {
            chunks_read: self.chunks_read.load(Ordering::SeqCst),
            bytes_read: self.bytes_read.load(Ordering::SeqCst),
            chunks_forwarded: self.chunks_forwarded.load(Ordering::SeqCst),
            bytes_forwarded: self.bytes_forwarded.load(Ordering::SeqCst),
        }
    }
}

/// Where a connection caught by [`DelayProxy::hold_next_request`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldState {
    /// Its requests stay in the proxy.
    Held,
    /// Forwarded; no reply read since.
    Released,
    /// A reply was read since the release: the server ran the first held request.
    Answered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client → server.
    Up,
    /// Server → client.
    Down,
}

#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    up: Direction,
    down: Direction,
    /// While set, replies are discarded: between a reset trigger's forwarding
    /// of a request and the shutdown of the connections, so the reply cannot
    /// slip through.
    resetting: AtomicBool,
    /// Forwarded request bytes at which to reset all connections (0: off).
    reset_at_up_bytes: AtomicU64,
    /// Armed by [`DelayProxy::hold_next_request`]: the connection the next request chunk
    /// holding these bytes is read on is held.
    hold_armed: Mutex<Option<Vec<u8>>>,
    /// Whether `hold_armed` is set (read on every request chunk without the lock).
    hold_pending: AtomicBool,
    /// Every connection held so far: held now (`Held`), or released and waiting for the
    /// server's first answer since (`Released`), or answered.
    held: Mutex<HashMap<u64, HoldState>>,
    connections: AtomicU64,
    resets: AtomicU64,
    shutdown: AtomicBool,
    next_id: AtomicU64,
    /// Open connections (clones of both sockets), for shutdown on drop.
    conns: Mutex<HashMap<u64, [TcpStream; 2]>>,
}

impl Shared {
    fn dir(&self, d: Dir) -> &Direction {
        match d {
            Dir::Up => &self.up,
            Dir::Down => &self.down,
        }
    }

    fn dropping(&self, d: Dir) -> bool {
        self.dir(d).dropping() || (d == Dir::Down && self.resetting.load(Ordering::SeqCst))
    }

    /// Shuts every open connection down (both sockets, both directions).
    fn reset_all(&self) {
        let conns = self.conns();
        for [a, b] in conns.values() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
            self.resets.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, [TcpStream; 2]>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, HoldState>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Request chunk `data` was read on connection `id`: held from now on if a hold is armed
    /// for bytes it holds.
    fn maybe_hold(&self, id: u64, data: &[u8]) {
        if !self.hold_pending.load(Ordering::SeqCst) {
            return;
        }
        let mut armed = self
            .hold_armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let hit = armed.as_deref().is_some_and(|needle| {
            needle.is_empty() || data.windows(needle.len()).any(|w| w == needle)
        });
        if hit {
            *armed = None;
            self.hold_pending.store(false, Ordering::SeqCst);
            self.held().insert(id, HoldState::Held);
        }
    }

    fn is_held(&self, id: u64) -> bool {
        self.held().get(&id) == Some(&HoldState::Held)
    }

    /// A reply chunk was read on connection `id`.
    fn replied(&self, id: u64) {
        if let Some(s) = self.held().get_mut(&id) {
            if *s == HoldState::Released {
                *s = HoldState::Answered;
            }
        }
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
            up: Direction::default(),
            down: Direction::default(),
            resetting: AtomicBool::new(false),
            reset_at_up_bytes: AtomicU64::new(0),
            hold_armed: Mutex::new(None),
            hold_pending: AtomicBool::new(false),
            held: Mutex::new(HashMap::new()),
            connections: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        shared
            .up
            .delay_nanos
            .store(duration_nanos(delay), Ordering::SeqCst);
        shared
            .down
            .delay_nanos
            .store(duration_nanos(delay), Ordering::SeqCst);
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

    /// Changes the delay of both directions; applies to chunks read from now on.
    pub fn set_delay(&self, d: Duration) {
        self.set_request_delay(d);
        self.set_reply_delay(d);
    }

    /// Changes the delay of client → server data only (chunks read from now on).
    pub fn set_request_delay(&self, d: Duration) {
        self.shared
            .up
            .delay_nanos
            .store(duration_nanos(d), Ordering::SeqCst);
    }

    /// Changes the delay of server → client data only (chunks read from now on):
    /// requests reach the server at once and execute, their replies come late.
    /// A chunk is never passed by a later one, so replies read after this is
    /// set back to zero still wait behind a delayed one.
    pub fn set_reply_delay(&self, d: Duration) {
        self.shared
            .down
            .delay_nanos
            .store(duration_nanos(d), Ordering::SeqCst);
    }

    /// Turns blackhole mode on or off: while on, data in both directions is
    /// read and discarded (connections stay open and are still accepted).
    pub fn set_blackhole(&self, on: bool) {
        self.set_drop_requests(on);
        self.set_drop_replies(on);
    }

    /// While on, client → server data is read and discarded.
    pub fn set_drop_requests(&self, on: bool) {
        self.shared.up.drop.store(on, Ordering::SeqCst);
    }

    /// While on, server → client data is read and discarded: requests execute
    /// on the server, their replies never arrive (on a live connection the
    /// client then sees silence; pair it with [`reset_all`](Self::reset_all)
    /// for the realistic "reply lost with the connection").
    pub fn set_drop_replies(&self, on: bool) {
        self.shared.down.drop.store(on, Ordering::SeqCst);
    }

    /// Shuts every open connection down now (peers see EOF / a broken pipe);
    /// new connections are accepted as before.
    pub fn reset_all(&self) {
        self.shared.reset_all();
    }

    /// Arms a one-shot trigger: once `n` more request bytes (at least 1) have
    /// been forwarded to the server, the chunk that crossed the mark is
    /// forwarded in full, then every connection is shut down before any reply
    /// to it can reach the client. The request thus executes, and its reply is
    /// lost with the connection.
    pub fn reset_after_request_bytes(&self, n: u64) {
        let now = self.shared.up.bytes_forwarded.load(Ordering::SeqCst);
        self.shared
            .reset_at_up_bytes
            .store(now.saturating_add(n.max(1)), Ordering::SeqCst);
    }

    /// Whether a [`reset_after_request_bytes`](Self::reset_after_request_bytes)
    /// trigger is still armed.
    pub fn reset_pending(&self) -> bool {
        self.shared.reset_at_up_bytes.load(Ordering::SeqCst) != 0
    }

    /// Arms a one-shot hold: the connection the next request chunk is read on (whichever
    /// it is) is held — that chunk and every later request on it stay in the proxy, in
    /// order, until [`release_held`](Self::release_held) — while every other connection,
    /// and every new one, passes as before. So a client whose request is held goes past its
    /// operation timeout, moves to a fresh connection and retries there, and the first
    /// request is *still on its way*: released, it reaches the server after everything the
    /// client did meanwhile (and after the client closed that connection: its end of
    /// stream follows the held data). Replies are not held.
    pub fn hold_next_request(&self) {
        self.hold_next_request_with(b"");
    }

    /// [`hold_next_request`](Self::hold_next_request) for the next request chunk that
    /// contains `needle` (e.g. a lock's name: the client's other traffic, a health check or a
    /// subscription, passes); an empty `needle` matches any chunk.
    pub fn hold_next_request_with(&self, needle: &[u8]) {
        *self
            .shared
            .hold_armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(needle.to_vec());
        self.shared.hold_pending.store(true, Ordering::SeqCst);
    }

    /// Forwards what [`hold_next_request`](Self::hold_next_request) held, in order, and
    /// holds nothing more (an armed hold that caught nothing is disarmed).
    pub fn release_held(&self) {
        *self
            .shared
            .hold_armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.shared.hold_pending.store(false, Ordering::SeqCst);
        for s in self.shared.held().values_mut() {
            if *s == HoldState::Held {
                *s = HoldState::Released;
            }
        }
    }

    /// Connections held since the proxy started (held now or released).
    pub fn held_connections(&self) -> u64 {
        self.shared.held().len() as u64
    }

    /// Whether every connection held so far was released and the server answered on it
    /// since (a reply chunk was read: the server ran the first held request). Replies are
    /// never held, so replies to requests sent before the hold arrived long before.
    pub fn held_requests_answered(&self) -> bool {
        self.shared
            .held()
            .values()
            .all(|s| *s == HoldState::Answered)
    }

    /// Turns every fault off: no delay, no dropping, no armed reset, nothing held.
    pub fn heal(&self) {
        self.release_held();
        self.shared.reset_at_up_bytes.store(0, Ordering::SeqCst);
        self.set_blackhole(false);
        self.set_delay(Duration::ZERO);
    }

    /// Traffic counters since the proxy started.
    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            requests: self.shared.up.stats(),
            replies: self.shared.down.stats(),
            connections: self.shared.connections.load(Ordering::SeqCst),
            resets: self.shared.resets.load(Ordering::SeqCst),
        }
    }
}

/// The proxies in front of one client's servers (one for a single server,
/// one per node for Redlock or a cluster), controlled together: each method
/// applies to every proxy, or to one after [`focus`](Self::focus);
/// [`proxies`](Self::proxies) reaches each.
#[derive(Debug)]
pub struct ProxyControl {
    proxies: Vec<DelayProxy>,
    /// The proxy the methods act on ([`focus`](Self::focus)); `usize::MAX`: all of them.
    focus: AtomicUsize,
}

impl ProxyControl {
    /// Controls these proxies (at least one).
    pub fn new(proxies: Vec<DelayProxy>) -> Self {
        ProxyControl {
            proxies,
            focus: AtomicUsize::new(usize::MAX),
        }
    }

    /// Starts one zero-delay proxy in front of each of `targets`.
    pub fn start(targets: &[SocketAddr]) -> Result<Self> {
        let proxies = targets
            .iter()
            .map(|t| DelayProxy::start(*t, Duration::ZERO))
            .collect::<Result<Vec<_>>>()?;
        Ok(ProxyControl::new(proxies))
    }

    /// Makes the fault and counter methods act on proxy `i` only (`None`: on all, the
    /// default), e.g. to fault one Redlock node. Out-of-range indices act on none.
    pub fn focus(&self, i: Option<usize>) {
        self.focus.store(i.unwrap_or(usize::MAX), Ordering::SeqCst);
    }

    /// The proxies the methods act on now.
    fn focused(&self) -> impl Iterator<Item = &DelayProxy> {
        let f = self.focus.load(Ordering::SeqCst);
        self.proxies
            .iter()
            .enumerate()
            .filter(move |(i, _)| f == usize::MAX || *i == f)
            .map(|(_, p)| p)
    }

    /// The proxies, in the order of their targets.
    pub fn proxies(&self) -> &[DelayProxy] {
        &self.proxies
    }

    /// `127.0.0.1:port` of every proxy, comma-separated (for a URL's host list).
    pub fn hosts(&self) -> String {
        self.proxies
            .iter()
            .map(|p| p.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// [`DelayProxy::set_delay`] on every focused proxy.
    pub fn set_delay(&self, d: Duration) {
        self.focused().for_each(|p| p.set_delay(d));
    }

    /// [`DelayProxy::set_reply_delay`] on every focused proxy.
    pub fn set_reply_delay(&self, d: Duration) {
        self.focused().for_each(|p| p.set_reply_delay(d));
    }

    /// [`DelayProxy::set_blackhole`] on every focused proxy.
    pub fn set_blackhole(&self, on: bool) {
        self.focused().for_each(|p| p.set_blackhole(on));
    }

    /// [`DelayProxy::set_drop_replies`] on every focused proxy.
    pub fn set_drop_replies(&self, on: bool) {
        self.focused().for_each(|p| p.set_drop_replies(on));
    }

    /// [`DelayProxy::reset_all`] on every focused proxy.
    pub fn reset_all(&self) {
        self.focused().for_each(DelayProxy::reset_all);
    }

    /// [`DelayProxy::reset_after_request_bytes`] on every focused proxy (each resets
    /// its own connections once it forwarded `n` more request bytes).
    pub fn reset_after_request_bytes(&self, n: u64) {
        self.focused().for_each(|p| p.reset_after_request_bytes(n));
    }

    /// [`DelayProxy::hold_next_request`] on every focused proxy (each holds its own next
    /// request's connection).
    pub fn hold_next_request(&self) {
        self.focused().for_each(DelayProxy::hold_next_request);
    }

    /// [`DelayProxy::hold_next_request_with`] on every focused proxy.
    pub fn hold_next_request_with(&self, needle: &[u8]) {
        self.focused()
            .for_each(|p| p.hold_next_request_with(needle));
    }

    /// [`DelayProxy::release_held`] on every focused proxy.
    pub fn release_held(&self) {
        self.focused().for_each(DelayProxy::release_held);
    }

    /// [`DelayProxy::held_connections`] of the focused proxies added up.
    pub fn held_connections(&self) -> u64 {
        self.focused().map(DelayProxy::held_connections).sum()
    }

    /// [`DelayProxy::held_requests_answered`] on every focused proxy.
    pub fn held_requests_answered(&self) -> bool {
        self.focused().all(DelayProxy::held_requests_answered)
    }

    /// [`DelayProxy::heal`] on every focused proxy.
    pub fn heal(&self) {
        self.focused().for_each(DelayProxy::heal);
    }

    /// The counters of the focused proxies added up.
    pub fn stats(&self) -> ProxyStats {
        let mut t = ProxyStats::default();
        for s in self.focused().map(DelayProxy::stats) {
            for (sum, d) in [(&mut t.requests, s.requests), (&mut t.replies, s.replies)] {
                sum.chunks_read += d.chunks_read;
                sum.bytes_read += d.bytes_read;
                sum.chunks_forwarded += d.chunks_forwarded;
                sum.bytes_forwarded += d.bytes_forwarded;
            }
            t.connections += s.connections;
            t.resets += s.resets;
        }
        t
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
    shared.connections.fetch_add(1, Ordering::SeqCst);
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
        .spawn(move || pump(src_up, dst_up, Dir::Up, s, g))
        .is_err()
    {
        abort(&client, &upstream, &guard);
        return;
    }
    // This thread serves the downstream direction itself.
    pump(src_down, dst_down, Dir::Down, shared, guard);
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
fn pump(mut src: TcpStream, dst: TcpStream, dir: Dir, shared: Arc<Shared>, guard: Arc<ConnGuard>) {
    let (tx, rx) = mpsc::channel::<Chunk>();
    let writer_src = src.try_clone();
    let s = Arc::clone(&shared);
    let id = guard.id;
    let writer = thread::Builder::new()
        .name("dlock-proxy-writer".into())
        .spawn(move || {
            write_loop(rx, dst, writer_src.ok(), (dir, id), &s);
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
                let d = shared.dir(dir);
                // What happens to the chunk is fixed before it is counted: a test that lifts a
                // delay or a drop once it sees the count move (to catch just this chunk) must
                // not change this chunk's fate.
                let due = Instant::now() + d.delay();
                let dropped = shared.dropping(dir);
                d.chunks_read.fetch_add(1, Ordering::SeqCst);
                d.bytes_read.fetch_add(n as u64, Ordering::SeqCst);
                if dir == Dir::Down {
                    shared.replied(id);
                }
                if dropped {
                    continue;
                }
                if dir == Dir::Up {
                    shared.maybe_hold(id, &buf[..n]);
                }
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
    (dir, id): (Dir, u64),
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
                    if now < due {
                        thread::sleep((due - now).min(SLEEP_SLICE));
                    } else if dir == Dir::Up && shared.is_held(id) {
                        thread::sleep(HOLD_POLL);
                    } else {
                        break;
                    }
                }
                if shared.dropping(dir) {
                    continue;
                }
                let d = shared.dir(dir);
                let len = data.len() as u64;
                let trigger = dir == Dir::Up && {
                    let mark = shared.reset_at_up_bytes.load(Ordering::SeqCst);
                    let after = d.bytes_forwarded.load(Ordering::SeqCst) + len;
                    mark != 0
                        && after >= mark
                        && shared
                            .reset_at_up_bytes
                            .compare_exchange(mark, 0, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok()
                };
                if trigger {
                    // Replies are held back from before the request leaves until
                    // the connections are down, so none can slip through.
                    shared.resetting.store(true, Ordering::SeqCst);
                }
                let wrote = dst.write_all(&data);
                if wrote.is_ok() {
                    d.chunks_forwarded.fetch_add(1, Ordering::SeqCst);
                    d.bytes_forwarded.fetch_add(len, Ordering::SeqCst);
                }
                if trigger {
                    shared.reset_all();
                    shared.resetting.store(false, Ordering::SeqCst);
                }
                if wrote.is_err() || trigger {
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
