//! `?dialect=redisson` and `?dialect=python-redis-lock` against the real peer libraries, run
//! as child processes on the test kit's redis-server: npm's `node-redisson` (Redisson's RLock
//! layout in Node.js, over `ioredis`) and PyPI's `python-redis-lock` (over `redis`), both
//! installed by `scripts/test` under `target/peers` (or the directory `DLOCK_PEERS` names).
//! The peers' programs are `tests/peers/redisson.js` and `tests/peers/pyrl.py`. Each test runs
//! for both peers: who holds excludes the other, in both directions; a release by either side
//! wakes the other's waiter (the holder's lease is 30 s, so a waiter woken within seconds was
//! woken by the release, not by the lease's end); re-entry; the peer's lease expiry; dlock's
//! watchdog; a mixed fleet incrementing one counter.

use distlock::{Client, ClientOptions};
use distlock_testkit::RedisServer;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// A waiter woken within this after the release was woken by it: the holder's lease (30 s)
/// had far to run, and the peers' own waits last as long (or for ever).
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Peer {
    Redisson,
    PythonRedisLock,
}

impl Peer {
    fn dialect(self) -> &'static str {
        match self {
            Peer::Redisson => "redisson",
            Peer::PythonRedisLock => "python-redis-lock",
        }
    }

    /// What `dlock inspect` appends to a holder of this library.
    fn foreign(self) -> String {
        format!("({})", self.dialect())
    }
}

/// Where `scripts/test` installs the peers.
fn peers_dir() -> PathBuf {
    match std::env::var_os("DLOCK_PEERS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peers"),
    }
}

fn program(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(file)
}

/// The command that starts `peer`'s program, or why it cannot run here.
fn peer_command(peer: Peer) -> Result<Command, String> {
    let dir = peers_dir();
    match peer {
        Peer::Redisson => {
            let modules = dir.join("node/node_modules");
            if !modules.join("node-redisson").exists() || !modules.join("ioredis").exists() {
                return Err(format!(
                    "node-redisson and ioredis are not installed under {} (scripts/test installs them)",
                    modules.display()
                ));
            }
            let mut c = Command::new("node");
            c.env("NODE_PATH", modules).arg(program("redisson.js"));
            Ok(c)
        }
        Peer::PythonRedisLock => {
            let python = dir.join("py/bin/python");
            if !python.exists() {
                return Err(format!(
                    "no virtualenv with python-redis-lock at {} (scripts/test makes it)",
                    python.display()
                ));
            }
            let mut c = Command::new(python);
            c.arg(program("pyrl.py"));
            Ok(c)
        }
    }
}

/// One peer process, driven line by line; killed when dropped.
struct PeerProcess {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl PeerProcess {
    /// Starts `peer` on lock `name` of the server on `port`, with `extra` arguments (the
    /// watchdog lease of node-redisson in ms, python-redis-lock's expire in s).
    fn start(peer: Peer, port: u16, name: &str, extra: Option<&str>) -> Option<PeerProcess> {
        let mut cmd = match peer_command(peer) {
            Ok(c) => c,
            Err(why) => {
                distlock_testkit::skip_or_fail(&format!("{peer:?} peer"), &why);
                return None;
            }
        };
        cmd.arg(port.to_string()).arg(name);
        if let Some(e) = extra {
            cmd.arg(e);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the peer");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut p = PeerProcess {
            child,
            stdin,
            lines,
        };
        p.expect("READY", Duration::from_secs(60));
        Some(p)
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .expect("write to the peer");
    }

    /// The next line, within `within`.
    fn next(&mut self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("no line from the peer within {within:?} ({e})"))
    }

    /// Waits for the next line and checks it is `want`; returns how long it took.
    fn expect(&mut self, want: &str, within: Duration) -> Duration {
        let t = Instant::now();
        let got = self.next(within);
        assert_eq!(got, want, "the peer answered `{got}`, not `{want}`");
        t.elapsed()
    }

    /// Sends `cmd` and checks the answer.
    fn ask(&mut self, cmd: &str, want: &str) {
        self.send(cmd);
        self.expect(want, Duration::from_secs(30));
    }

    /// The answer to a try: whether the peer got the lock.
    fn try_lock(&mut self) -> bool {
        self.send("try");
        match self.next(Duration::from_secs(30)).as_str() {
            "TRY true" | "TRY True" => true,
            "TRY false" | "TRY False" => false,
            other => panic!("unexpected answer to try: {other}"),
        }
    }

    /// No line within `d` (the peer still waits).
    fn silent_for(&mut self, d: Duration) {
        if let Ok(line) = self.lines.recv_timeout(d) {
            panic!("the peer said `{line}` while it should still wait");
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn url(server: &RedisServer, peer: Peer) -> String {
    format!("{}?dialect={}", server.url(), peer.dialect())
}

fn port(server: &RedisServer) -> u16 {
    server.port()
}

fn dlock(url: &str) -> Command {
    let mut c = Command::new(DLOCK);
    c.env("DLOCK_BACKEND", url);
    c
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether somebody waits for a release of `name` the way `peer`'s layout wakes waiters: a
/// subscriber of Redisson's unlock channel, or a client blocked in BLPOP on the signal list.
fn waiters(server: &RedisServer, peer: Peer, name: &str) -> usize {
    match peer {
        Peer::Redisson => {
            let channel = format!("redisson_lock__channel:{{{name}}}");
            let out = server
                .command(&["PUBSUB", "NUMSUB", &channel])
                .expect("numsub");
            out.lines()
                .last()
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        }
        Peer::PythonRedisLock => server
            .command(&["CLIENT", "LIST"])
            .expect("client list")
            .lines()
            .filter(|l| l.contains("cmd=blpop"))
            .count(),
    }
}

fn wait_for_waiter(server: &RedisServer, peer: Peer, name: &str) {
    wait_until("a waiter on the release", Duration::from_secs(30), || {
        waiters(server, peer, name) >= 1
    });
    if peer == Peer::Redisson {
        // node-redisson attaches its message listener only after its SUBSCRIBE was answered
        // (a later turn of its event loop): a release in between is missed by node-redisson
        // itself, which then sleeps for the holder's PTTL. Let it settle (dlock's own waiters
        // subscribe before their last attempt and need no such pause).
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A `dlock run` process, killed if the test ends (fails) before it does.
struct Running(Child);

impl Running {
    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `dlock run NAME` holding the lock until the file `stop` appears; returns once the
/// command runs (the file `started` appeared).
fn dlock_holds(url: &str, name: &str, dir: &Path, args: &[&str]) -> Running {
    let (started, stop) = (dir.join("started"), dir.join("stop"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
        started.display(),
        stop.display()
    );
    let child = dlock(url)
        .arg("run")
        .args(args)
        .args([name, "--", "sh", "-c", &script])
        .spawn()
        .expect("dlock run");
    let child = Running(child);
    wait_until("dlock run's command", Duration::from_secs(30), || {
        started.exists()
    });
    child
}

fn inspect(url: &str, name: &str) -> String {
    let out = dlock(url)
        .args(["inspect", "--json", name])
        .output()
        .expect("inspect");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn peer_extra(peer: Peer) -> Option<&'static str> {
    match peer {
        // Redisson's default watchdog lease (30 s): the peer's hold outlasts every test step.
        Peer::Redisson => None,
        // Without expire python-redis-lock's lock never expires and its waiters block in
        // BLPOP without a timeout.
        Peer::PythonRedisLock => None,
    }
}

fn peer_holds_and_dlock_times_out(peer: Peer) {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    let Some(mut p) = PeerProcess::start(peer, port(&server), "orders", peer_extra(peer)) else {
        return;
    };
    assert!(p.try_lock(), "a free lock");
    let out = dlock(&url)
        .args(["run", "--wait", "1s", "orders", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let shown = inspect(&url, "orders");
    assert!(shown.contains(&peer.foreign()), "{shown}");
    // `dlock list` finds the peer's lock (and not an unrelated key of the same type);
    // `dlock doctor` says which dialect the URL speaks.
    server
        .command(&["HSET", "user:1", "name", "alice"])
        .expect("hset");
    server.command(&["SET", "lock-free", "x"]).expect("set");
    let out = dlock(&url).args(["list", "--json"]).output().expect("list");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        listed.contains("\"orders\"") && listed.contains(&peer.foreign()),
        "{listed}"
    );
    assert!(
        !listed.contains("user:1") && !listed.contains("lock-free"),
        "{listed}"
    );
    let out = dlock(&url).arg("doctor").output().expect("doctor");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("dialect={}", peer.dialect())),
        "{said}"
    );
    // The lock is the peer's own key, with its value: nothing of dlock's was written there.
    match peer {
        Peer::Redisson => assert_eq!(server.command(&["TYPE", "orders"]).unwrap(), "hash"),
        Peer::PythonRedisLock => {
            assert_eq!(server.command(&["TYPE", "lock:orders"]).unwrap(), "string")
        }
    }
    p.ask("unlock", "UNLOCKED");
    let out = dlock(&url)
        .args(["run", "--wait", "1s", "orders", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn redisson_holds_and_dlock_run_exits_75() {
    peer_holds_and_dlock_times_out(Peer::Redisson);
}

#[test]
fn python_redis_lock_holds_and_dlock_run_exits_75() {
    peer_holds_and_dlock_times_out(Peer::PythonRedisLock);
}

/// dlock holds: the peer's try fails, and its waiter is woken by dlock's release.
fn dlock_holds_and_wakes_the_peer(peer: Peer) {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(mut p) = PeerProcess::start(peer, port(&server), "orders", peer_extra(peer)) else {
        return;
    };
    let mut run = dlock_holds(&url, "orders", dir.path(), &[]);
    assert!(!p.try_lock(), "the peer took a lock dlock holds");
    let shown = inspect(&url, "orders");
    assert!(
        shown.contains("\"held\":true") && !shown.contains(&peer.foreign()),
        "{shown}"
    );
    // The peer waits (no expiry on its wait but the holder's 30 s lease, or none at all).
    p.send("lock");
    wait_for_waiter(&server, peer, "orders");
    let released = Instant::now();
    std::fs::write(dir.path().join("stop"), "").expect("stop");
    let woken = p.expect("LOCKED", Duration::from_secs(60));
    let status = run.wait().expect("run");
    assert!(status.success(), "{status:?}");
    eprintln!(
        "{peer:?} waiter woken {:?} after dlock's command ended",
        released.elapsed()
    );
    assert!(woken < WOKEN_WITHIN, "woken only after {woken:?}");
    p.ask("unlock", "UNLOCKED");
}

#[test]
fn dlock_holds_redisson_fails_and_is_woken_by_the_release() {
    dlock_holds_and_wakes_the_peer(Peer::Redisson);
}

#[test]
fn dlock_holds_python_redis_lock_fails_and_is_woken_by_the_release() {
    dlock_holds_and_wakes_the_peer(Peer::PythonRedisLock);
}

/// The peer holds; `dlock run --wait 60s` waits and is woken by the peer's release.
fn peer_release_wakes_dlock(peer: Peer) {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    let Some(mut p) = PeerProcess::start(peer, port(&server), "orders", peer_extra(peer)) else {
        return;
    };
    p.ask("lock", "LOCKED");
    let mut run = Running(
        dlock(&url)
            .args(["run", "--wait", "60s", "orders", "--", "true"])
            .spawn()
            .expect("run"),
    );
    wait_for_waiter(&server, peer, "orders");
    let released = Instant::now();
    p.ask("unlock", "UNLOCKED");
    let mut status = None;
    wait_until("dlock run to end", Duration::from_secs(60), || {
        status = run.0.try_wait().expect("wait");
        status.is_some()
    });
    let woken = released.elapsed();
    eprintln!("dlock waiter done {woken:?} after the {peer:?} release");
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    assert!(woken < WOKEN_WITHIN, "woken only after {woken:?}");
}

#[test]
fn redisson_release_wakes_the_dlock_waiter() {
    peer_release_wakes_dlock(Peer::Redisson);
}

#[test]
fn python_redis_lock_release_wakes_the_dlock_waiter() {
    peer_release_wakes_dlock(Peer::PythonRedisLock);
}

async fn client(url: &str) -> Client {
    distlock::connect_with(url, ClientOptions::default())
        .await
        .expect("connect")
}

/// Re-entry by one owner on the dlock side while the peer waits: the peer gets the lock only
/// after the last release.
fn dlock_reentry_while_the_peer_waits(peer: Peer) {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    let Some(mut p) = PeerProcess::start(peer, port(&server), "orders", peer_extra(peer)) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let c = client(&url).await;
        let lock = c.lock("orders").expect("lock");
        let outer = lock.try_acquire().await.expect("try").expect("free");
        let inner = lock.try_acquire().await.expect("try").expect("re-entry");
        p.send("lock");
        wait_for_waiter(&server, peer, "orders");
        inner.release().await.expect("inner release");
        p.silent_for(Duration::from_millis(500));
        assert!(c.inspect("orders").await.expect("inspect").held());
        outer.release().await.expect("outer release");
        p.expect("LOCKED", WOKEN_WITHIN);
        // And the peer's own re-entry: held until its last unlock.
        if peer == Peer::Redisson {
            p.ask("lock", "LOCKED");
            p.ask("unlock", "UNLOCKED");
            assert!(lock.try_acquire().await.expect("try").is_none());
        }
        p.ask("unlock", "UNLOCKED");
        let g = lock.try_acquire().await.expect("try").expect("free");
        g.release().await.expect("release");
    });
}

#[test]
fn dlock_reentry_while_redisson_waits() {
    dlock_reentry_while_the_peer_waits(Peer::Redisson);
}

#[test]
fn dlock_reentry_while_python_redis_lock_waits() {
    dlock_reentry_while_the_peer_waits(Peer::PythonRedisLock);
}

/// The peer dies holding a lock with a short lease: dlock gets it when the lease ends.
fn peer_lease_expiry_frees_the_lock(peer: Peer) {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    // node-redisson: a fixed lease of 1.5 s (lock(leaseTime)); python-redis-lock: expire 1 s
    // with its renewal thread, which dies with the process.
    let (extra, lock) = match peer {
        Peer::Redisson => (None, "lock 1500"),
        Peer::PythonRedisLock => (Some("1"), "lock"),
    };
    let Some(mut p) = PeerProcess::start(peer, port(&server), "orders", extra) else {
        return;
    };
    p.ask(lock, "LOCKED");
    p.kill9();
    let t = Instant::now();
    let out = dlock(&url)
        .args(["run", "--wait", "20s", "orders", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    eprintln!(
        "dlock got the lock {:?} after the {peer:?} holder died",
        t.elapsed()
    );
}

#[test]
fn redisson_lease_expiry_frees_the_lock_for_dlock() {
    peer_lease_expiry_frees_the_lock(Peer::Redisson);
}

#[test]
fn python_redis_lock_expiry_frees_the_lock_for_dlock() {
    peer_lease_expiry_frees_the_lock(Peer::PythonRedisLock);
}

/// dlock's watchdog keeps its lock for several leases: the peer never gets it meanwhile. The
/// lease is short (5 s, renewed every 1.7 s) so that "several leases" is seconds; with the
/// default lease the lock has Redisson's own default lease (30 s), checked on the key's PTTL.
fn dlock_watchdog_outlasts_the_lease(peer: Peer) {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(mut p) = PeerProcess::start(peer, port(&server), "orders", peer_extra(peer)) else {
        return;
    };
    let key = match peer {
        Peer::Redisson => "orders",
        Peer::PythonRedisLock => "lock:orders",
    };
    let mut run = dlock_holds(&url, "orders", dir.path(), &["--lease", "5s"]);
    let t = Instant::now();
    let mut tries = 0;
    while t.elapsed() < Duration::from_secs(11) {
        assert!(!p.try_lock(), "the peer got a lock dlock's watchdog keeps");
        tries += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(dir.path().join("stop"), "").expect("stop");
    assert!(run.wait().expect("run").success());
    eprintln!("{tries} tries of the {peer:?} peer refused over 2.2 leases");
    // The default lease is Redisson's default watchdog lease.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut run = dlock_holds(&url, "orders", dir.path(), &[]);
    let pttl: u64 = server
        .command(&["PTTL", key])
        .expect("pttl")
        .parse()
        .expect("number");
    assert!((20_000..=30_000).contains(&pttl), "PTTL {pttl}");
    std::fs::write(dir.path().join("stop"), "").expect("stop");
    assert!(run.wait().expect("run").success());
}

#[test]
fn dlock_watchdog_keeps_the_lock_from_redisson() {
    dlock_watchdog_outlasts_the_lease(Peer::Redisson);
}

#[test]
fn dlock_watchdog_keeps_the_lock_from_python_redis_lock() {
    dlock_watchdog_outlasts_the_lease(Peer::PythonRedisLock);
}

/// Three `dlock run` loops and three peer processes increment one counter file under the
/// lock, each a number of times: no update is lost.
fn mixed_fleet(peer: Peer) {
    const EACH: usize = 8;
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    let dir = tempfile::tempdir().expect("tempdir");
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0").expect("counter");
    // Short leases: a waiter whose wake-up went to another (python-redis-lock's signal is
    // taken by one waiter; node-redisson subscribes after its try) retries at the lease end.
    let extra = match peer {
        Peer::Redisson => Some("3000"),
        Peer::PythonRedisLock => Some("2"),
    };
    let mut peers = Vec::new();
    for _ in 0..3 {
        let Some(p) = PeerProcess::start(peer, port(&server), "counter", extra) else {
            return;
        };
        peers.push(p);
    }
    let incr = format!("n=$(cat {0}); echo $((n + 1)) > {0}", counter.display());
    let loops: Vec<_> = (0..3)
        .map(|_| {
            let (url, incr) = (url.clone(), incr.clone());
            std::thread::spawn(move || {
                for _ in 0..EACH {
                    let out = dlock(&url)
                        .args(["run", "--lease", "3s", "--wait", "120s", "counter", "--"])
                        .args(["sh", "-c", &incr])
                        .output()
                        .expect("run");
                    assert!(out.status.success(), "{out:?}");
                }
            })
        })
        .collect();
    let path = counter.display().to_string();
    for p in &mut peers {
        p.send(&format!("incr {path} {EACH}"));
    }
    for p in &mut peers {
        p.expect("DONE", Duration::from_secs(240));
    }
    for l in loops {
        l.join().expect("dlock loop");
    }
    let total: usize = std::fs::read_to_string(&counter)
        .expect("counter")
        .trim()
        .parse()
        .expect("number");
    assert_eq!(total, 6 * EACH, "lost updates");
}

#[test]
fn mixed_fleet_with_redisson_loses_no_update() {
    mixed_fleet(Peer::Redisson);
}

#[test]
fn mixed_fleet_with_python_redis_lock_loses_no_update() {
    mixed_fleet(Peer::PythonRedisLock);
}

/// With the defaults on both sides (dlock's watchdog lease and Redisson's are both 30 s),
/// a lock `dlock run` holds past that lease stays dlock's: its watchdog renewed it, and a
/// Redisson client still cannot take it. (The one slow test here: it waits out the lease.)
#[test]
fn dlock_keeps_the_lock_past_redissons_default_lease() {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, Peer::Redisson);
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(mut p) = PeerProcess::start(Peer::Redisson, port(&server), "orders", None) else {
        return;
    };
    let mut run = dlock_holds(&url, "orders", dir.path(), &[]);
    std::thread::sleep(Duration::from_secs(31));
    assert!(!p.try_lock(), "the peer got the lock after 31 s");
    let pttl: u64 = server
        .command(&["PTTL", "orders"])
        .expect("pttl")
        .parse()
        .expect("number");
    assert!(pttl > 15_000, "not renewed: PTTL {pttl}");
    std::fs::write(dir.path().join("stop"), "").expect("stop");
    assert!(run.wait().expect("run").success());
}

/// `dlock release --force` removes a peer's hold as the peer's own forced unlock does
/// (Redisson's `forceUnlock`, python-redis-lock's `reset`): dlock gets the lock at once, and
/// the peer's own unlock then finds it is no longer the holder.
fn forced_release_of_a_peer_hold(peer: Peer) {
    let server = RedisServer::start().expect("redis");
    let url = url(&server, peer);
    let Some(mut p) = PeerProcess::start(peer, port(&server), "orders", peer_extra(peer)) else {
        return;
    };
    p.ask("lock", "LOCKED");
    let out = dlock(&url)
        .args(["release", "--force", "--yes", "orders"])
        .output()
        .expect("release");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&peer.foreign()), "{said}");
    let out = dlock(&url)
        .args(["run", "--wait", "1s", "orders", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    p.send("unlock");
    let answer = p.next(Duration::from_secs(30));
    assert!(answer.starts_with("ERROR"), "{answer}");
}

#[test]
fn forced_release_of_a_redisson_hold() {
    forced_release_of_a_peer_hold(Peer::Redisson);
}

#[test]
fn forced_release_of_a_python_redis_lock_hold() {
    forced_release_of_a_peer_hold(Peer::PythonRedisLock);
}
