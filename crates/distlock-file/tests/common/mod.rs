//! Helpers shared by the tests of the `file://` backend: temporary lock directories, backends
//! and clients on them, requests and grants, waiting with patience, probing `flock`s, and
//! child processes (the test binary re-executed as a holder).
// Each test binary uses its own part of these helpers.
#![allow(dead_code)]

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, ClientOptions, GrantRef, HoldKey, Lock,
    LockGuard, LockKind, LostSignal, ReleaseOutcome,
};
use distlock_file::FileBackend;
use std::ffi::OsStr;
use std::future::Future;
use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a test waits for something that must happen (a waiter queueing, a wake-up, a
/// child process, a background clean-up) before it fails. Far above what it takes even on a
/// loaded CI machine; it only costs time when the test fails anyway.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Upper bound on the latency of a wake-up that must come from a release or a holder's death
/// (the kernel or in-process notification). This backend has no polling and no lease, so a
/// waiter that missed that wake-up would only end at its deadline (`WAITER_DEADLINE`, far
/// longer) and fail; the bound is generous so that a loaded machine cannot miss it.
pub const PROMPT: Duration = Duration::from_secs(5);

/// Deadline of waiters that must be woken by a release: clearly longer than `PROMPT`.
pub const WAITER_DEADLINE: Duration = Duration::from_secs(30);

/// How long a child holds its lock if nobody kills it: far beyond any waiter's deadline.
pub const CHILD_HOLD: Duration = Duration::from_secs(120);

/// How long to wait for a child process to answer: starting one is slow on a loaded machine.
pub const CHILD_PATIENCE: Duration = Duration::from_secs(30);

/// Polls `cond` every 10 ms until it holds; fails with `what` after `PATIENCE`.
pub async fn wait_until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < PATIENCE,
            "{what}: still not the case after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// True if someone holds a `flock` on `path` that keeps a shared one out (probed with
/// `LOCK_SH | LOCK_NB` on a descriptor of our own, which closing unlocks again).
pub fn locked(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock only reads the descriptor number, which `f` keeps open.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    r != 0
}

/// Polls until someone holds a `flock` on `path` that keeps a shared one out (a waiting
/// writer on the turnstile); fails with `what` after `PATIENCE`.
pub async fn until_locked(path: &Path, what: &str) {
    wait_until(what, || async { locked(path) }).await;
}

/// Polls until nobody holds a `flock` on `path` for `QUIET` in a row; fails with `what` after
/// `PATIENCE`. A waiting thread that wakes after its waiter left takes the lock for an instant
/// (then it is seen held, and the quiet period starts again); one that kept it would be seen
/// held for ever. (On a machine so loaded that the thread does not run within `QUIET`, this
/// passes without having seen it: it can miss a regression, never fail a correct backend.)
pub async fn stays_free(path: &Path, what: &str) {
    const QUIET: Duration = Duration::from_millis(300);
    let start = Instant::now();
    let mut free_since = Instant::now();
    loop {
        if locked(path) {
            free_since = Instant::now();
        } else if free_since.elapsed() >= QUIET {
            return;
        }
        assert!(start.elapsed() < PATIENCE, "{what} ({PATIENCE:?})");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A unique directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        TempDir(std::env::temp_dir().join(format!(
            "distlock-file-test-{tag}-{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn opts() -> ClientOptions {
    ClientOptions::default().namespace("test")
}

pub fn backend(dir: &Path) -> Arc<FileBackend> {
    Arc::new(FileBackend::open(dir, &opts()).expect("open backend"))
}

/// A client with its own backend: as a separate process would have.
pub fn client(dir: &Path) -> Client {
    Client::new(backend(dir), opts()).expect("client")
}

pub fn key(name: &str, owner: &str, kind: LockKind) -> HoldKey {
    HoldKey::new(name, owner, kind)
}

/// A new attempt of `owner` on side `kind` of read-write lock `name` (or on any `kind`).
pub fn rw_req(name: &str, owner: &str, kind: LockKind) -> AcquireRequest {
    AcquireRequest::new(
        key(name, owner, kind),
        Duration::from_secs(30),
        LostSignal::new(),
    )
}

/// A new attempt of `owner` on mutex `name`.
pub fn req(name: &str, owner: &str) -> AcquireRequest {
    rw_req(name, owner, LockKind::Mutex)
}

/// Acquires with `r` (a new attempt, or a retry of one); the grant it won.
pub async fn granted(b: &FileBackend, r: &AcquireRequest) -> GrantRef {
    match b.acquire(r).await.expect("acquire") {
        AcquireReply::Granted { token } => r.grant(token),
        AcquireReply::Held { .. } => panic!(
            "{} could not take {} ({:?})",
            r.key.owner, r.key.name, r.key.kind
        ),
    }
}

/// A new attempt of `owner` on side `kind` of `name`; the grant it won.
pub async fn rw_granted(b: &FileBackend, name: &str, owner: &str, kind: LockKind) -> GrantRef {
    granted(b, &rw_req(name, owner, kind)).await
}

/// `r` is refused: someone else holds the lock.
pub async fn held_to(b: &FileBackend, r: &AcquireRequest) {
    match b.acquire(r).await.expect("acquire") {
        AcquireReply::Held { ttl: None } => {}
        other => panic!(
            "{} asking for the {:?} side: {other:?}",
            r.key.owner, r.key.kind
        ),
    }
}

/// A new attempt of `owner` on `kind` is refused.
pub async fn held(b: &FileBackend, name: &str, owner: &str, kind: LockKind) {
    held_to(b, &rw_req(name, owner, kind)).await
}

pub async fn release(b: &FileBackend, grant: &GrantRef) -> ReleaseOutcome {
    b.release(grant).await.expect("release")
}

/// Releases `g`, which must still be the lock's holder.
pub async fn released(g: LockGuard) {
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A task waiting (up to `WAITER_DEADLINE`) for a lock that someone else holds, which notes
/// when it got it.
pub struct Waiter(tokio::task::JoinHandle<(distlock_core::Result<LockGuard>, Instant)>);

impl Waiter {
    pub fn spawn(lock: Lock) -> Waiter {
        Waiter(tokio::spawn(async move {
            let g = lock.acquire_timeout(WAITER_DEADLINE).await;
            (g, Instant::now())
        }))
    }

    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Gives the waiter `settle` to start waiting (a slower one just finds the lock free
    /// later), then checks that it still waits: it cannot get the lock while it is held,
    /// however slow the machine. `what` names the failure.
    pub async fn still_waiting(&self, settle: Duration, what: &str) {
        tokio::time::sleep(settle).await;
        assert!(!self.is_finished(), "{what}");
    }

    /// The guard the waiter got, which must have come within `PROMPT` of `since` (the release
    /// or the holder's death that should wake it; a waiter that missed that wake-up would only
    /// end at its deadline). `what` names the waiter in failures.
    pub async fn woken_after(self, since: Instant, what: &str) -> LockGuard {
        let (g, at) = self.0.await.expect("waiter task");
        let g = g.unwrap_or_else(|e| panic!("{what}: {e}"));
        let latency = at.saturating_duration_since(since);
        assert!(latency < PROMPT, "{what}: got the lock {latency:?} after");
        g
    }
}

/// Acquires `lock` within `within` (failing with `what`), releases it at once; its token.
pub async fn acquire_and_release(lock: &Lock, within: Duration, what: &str) -> u64 {
    let g = lock
        .acquire_timeout(within)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let token = g.fencing_token();
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released,
        "{what}"
    );
    token
}

/// The read side of read-write lock `name` of client `c`, for a new handle (owner).
pub fn read_side(c: &Client, name: &str) -> Lock {
    c.rw_lock(name).expect("rw").read()
}

/// The write side of read-write lock `name` of client `c`, for a new handle (owner).
pub fn write_side(c: &Client, name: &str) -> Lock {
    c.rw_lock(name).expect("rw").write()
}

/// The holders `inspect` reports for read-write lock `name`, as sorted `(side, owner, count)`.
pub async fn holders(b: &FileBackend, name: &str) -> Vec<(String, String, u32)> {
    let info = b.inspect(name, LockKind::Read).await.expect("inspect");
    let mut v: Vec<_> = info
        .holders
        .iter()
        .map(|h| {
            assert_eq!(h.lease_left, None);
            let side = h.side.expect("side").as_str().to_owned();
            (side, h.owner.clone(), h.count)
        })
        .collect();
    v.sort();
    v
}

pub fn hv(side: &str, owner: &str, count: u32) -> (String, String, u32) {
    (side.to_owned(), owner.to_owned(), count)
}

/// Waits until a writer waits for `reader`'s lock (it holds the turnstile), as seen by
/// `reader`, a new reader that could share the lock with its current holders: polls
/// `try_acquire` until it is refused, giving back what it got meanwhile. Fails after
/// `PATIENCE`.
pub async fn until_writer_queued(reader: &Lock) {
    let start = Instant::now();
    while let Some(g) = reader.try_acquire().await.expect("try") {
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        assert!(
            start.elapsed() < PATIENCE,
            "new readers still pass {PATIENCE:?} after a writer started waiting"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `reader.try_acquire` until it is granted (the guard is dropped); fails with `what`
/// after `PATIENCE`.
pub async fn until_reader_passes(reader: &Lock, what: &str) {
    let start = Instant::now();
    while reader.try_acquire().await.expect("try").is_none() {
        assert!(start.elapsed() < PATIENCE, "{what} ({PATIENCE:?})");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A child process, killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This test binary re-executed to run one child helper test, and what it prints.
pub struct ChildProc {
    pub child: KillOnDrop,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ChildProc {
    /// Re-executes this test binary to run only test `helper` (which does nothing unless its
    /// environment is set), with `env`: `Some` sets a variable, `None` removes it.
    pub fn spawn(helper: &str, env: &[(&str, Option<&OsStr>)]) -> ChildProc {
        let exe = std::env::current_exe().expect("current exe");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", helper, "--nocapture", "--test-threads=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let mut child = KillOnDrop(cmd.spawn().expect("spawn child"));
        let stdout = child.0.stdout.take().expect("child stdout");
        ChildProc {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next line the child prints that starts with `prefix` (libtest may print `test
    /// <helper> ... ` before it on the same line), within `CHILD_PATIENCE`.
    pub async fn expect(mut self, prefix: &'static str) -> (ChildProc, String) {
        let res = tokio::time::timeout(
            CHILD_PATIENCE,
            tokio::task::spawn_blocking(move || {
                let found = self
                    .lines
                    .by_ref()
                    .map_while(|l| l.ok())
                    .find_map(|l| l.find(prefix).map(|i| l[i..].to_owned()));
                (self, found)
            }),
        )
        .await
        .expect("the child did not answer in time")
        .expect("reader thread");
        let (me, found) = res;
        (
            me,
            found.unwrap_or_else(|| panic!("the child exited without printing `{prefix}`")),
        )
    }

    /// Waits for `HELD <token> <owner>`.
    pub async fn held(self) -> (ChildProc, u64, String) {
        let (me, line) = self.expect("HELD ").await;
        let mut parts = line.splitn(3, ' ').skip(1);
        let token = parts.next().and_then(|t| t.parse().ok()).expect("token");
        let owner = parts.next().expect("owner").to_owned();
        (me, token, owner)
    }

    /// `SIGKILL`s the child and reaps it.
    pub fn kill(&mut self) {
        self.child.0.kill().expect("SIGKILL child");
        let _ = self.child.0.wait();
    }
}

/// Runs `body` on a new current-thread runtime: the body of a child helper test, which
/// prints `HELD <token> <owner>` once it holds its lock and is killed by the parent.
pub fn child_runtime(body: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(body)
}
