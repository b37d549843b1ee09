//! End-to-end tests of the `file://` backend through the public `Client`/`Lock`/`LockGuard` API,
//! with real files, real `flock`s and a real second process.

use distlock_core::{
    AcquireReply, AcquireRequest, AttemptId, Backend, Client, ClientOptions, Error, GrantRef,
    HoldKey, LockKind, LostSignal, ReleaseOutcome, RenewOutcome,
};
use distlock_file::FileBackend;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// How long a test waits for something that must happen (a wake-up, a child process, a
/// background clean-up) before it fails. Far above what it takes even on a loaded CI machine;
/// it only costs time when the test fails anyway.
const PATIENCE: Duration = Duration::from_secs(10);

/// Upper bound on the latency of a wake-up that must come from a release or a holder's death
/// (the kernel or in-process notification). This backend has no polling and no lease, so a
/// waiter that missed that wake-up would only end at its deadline (`WAITER_DEADLINE`, far
/// longer) and fail; the bound is generous so that a loaded machine cannot miss it.
const PROMPT: Duration = Duration::from_secs(5);

/// Deadline of waiters that must be woken by a release: clearly longer than `PROMPT`.
const WAITER_DEADLINE: Duration = Duration::from_secs(30);

/// Polls `cond` every 10 ms until it holds; fails with `what` after `PATIENCE`.
async fn wait_until<F, Fut>(what: &str, mut cond: F)
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
fn locked(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock only reads the descriptor number, which `f` keeps open.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    r != 0
}

/// Polls until nobody holds a `flock` on `path` for `QUIET` in a row; fails with `what` after
/// `PATIENCE`. A waiting thread that wakes after its waiter left takes the lock for an instant
/// (then it is seen held, and the quiet period starts again); one that kept it would be seen
/// held for ever. (On a machine so loaded that the thread does not run within `QUIET`, this
/// passes without having seen it: it can miss a regression, never fail a correct backend.)
async fn stays_free(path: &Path, what: &str) {
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

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
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

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn opts() -> ClientOptions {
    ClientOptions::default().namespace("test")
}

fn backend(dir: &Path) -> Arc<FileBackend> {
    Arc::new(FileBackend::open(dir, &opts()).expect("open backend"))
}

/// A client with its own backend: as a separate process would have.
fn client(dir: &Path) -> Client {
    Client::new(backend(dir), opts()).expect("client")
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
}

fn key(name: &str, owner: &str) -> HoldKey {
    HoldKey {
        name: name.into(),
        owner: owner.into(),
        kind: LockKind::Mutex,
    }
}

fn req(name: &str, owner: &str) -> AcquireRequest {
    AcquireRequest::new(key(name, owner), Duration::from_secs(30), LostSignal::new())
}

/// Acquires with `r` (a new attempt, or a retry of one); the grant it won.
async fn granted(b: &FileBackend, r: &AcquireRequest) -> GrantRef {
    match b.acquire(r).await.expect("acquire") {
        AcquireReply::Granted { token } => r.grant(token),
        AcquireReply::Held { .. } => panic!("{} could not take {}", r.key.owner, r.key.name),
    }
}

/// A grant address nobody was given: another attempt of `owner`, with `token`.
fn foreign(name: &str, owner: &str, token: u64) -> GrantRef {
    GrantRef {
        key: key(name, owner),
        attempt: AttemptId::new(),
        token,
    }
}

/// `tasks` tasks spread over `clients`, each with its own handle, increment a deliberately
/// non-atomic counter `rounds` times under the lock.
async fn hammer(clients: &[Client], tasks: usize, rounds: usize) {
    let name = "counter";
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut joins = Vec::new();
    for i in 0..tasks {
        let client = clients[i % clients.len()].clone();
        let (counter, tokens) = (counter.clone(), tokens.clone());
        joins.push(tokio::spawn(async move {
            let lock = client.lock(name).expect("lock");
            for _ in 0..rounds {
                let g = lock
                    .acquire_timeout(Duration::from_secs(30))
                    .await
                    .expect("acquire");
                let v = counter.load(Ordering::SeqCst);
                tokens.lock().expect("tokens").push(g.fencing_token());
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(v + 1, Ordering::SeqCst);
                assert_eq!(
                    g.release().await.expect("release"),
                    ReleaseOutcome::Released
                );
            }
        }));
    }
    for j in joins {
        j.await.expect("task");
    }
    let n = (tasks * rounds) as u64;
    assert_eq!(
        counter.load(Ordering::SeqCst),
        n,
        "lost updates: mutual exclusion broken"
    );
    let tokens = tokens.lock().expect("tokens").clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {tokens:?}"
    );
    let info = clients[0].inspect(name).await.expect("inspect");
    assert!(!info.held());
    assert_eq!(info.fencing_token, *tokens.last().expect("tokens"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_in_one_backend() {
    let dir = TempDir::new("mutex");
    hammer(&[client(dir.path())], 32, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_backends() {
    let dir = TempDir::new("mutex2");
    // Two backends on one directory: they only exclude each other through the kernel.
    hammer(&[client(dir.path()), client(dir.path())], 32, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_is_one_grant() {
    let dir = TempDir::new("reentry");
    let (a, b) = (client(dir.path()), client(dir.path()));
    let lock = a.lock("re/entry").expect("lock");
    let g1 = lock.acquire().await.expect("first");
    let first = g1.fencing_token();
    let g2 = lock.try_acquire().await.expect("try").expect("re-entry");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    // The client counts the guards: the backend has one grant.
    let info = a.inspect("re/entry").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, lock.owner());
    assert_eq!(info.holders[0].count, 1);
    assert_eq!(info.holders[0].lease_left, None);
    // Another backend (process) sees the holder recorded in the file.
    let info_b = b.inspect("re/entry").await.expect("inspect");
    assert_eq!(info_b.holders.len(), 1);
    assert_eq!(info_b.holders[0].owner, lock.owner());
    assert_eq!(info_b.holders[0].count, 1);
    assert_eq!(info_b.fencing_token, g1.fencing_token());
    // Another owner of the same backend, and another backend, are refused.
    assert!(a
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert!(b
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert!(b.inspect("re/entry").await.expect("inspect").held());
    assert!(b
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert_eq!(
        g1.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(!a.inspect("re/entry").await.expect("inspect").held());
    assert!(!b.inspect("re/entry").await.expect("inspect").held());
    let g = b
        .lock("re/entry")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("free");
    assert!(g.fencing_token() > first);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_owner_release_and_renew() {
    let dir = TempDir::new("nonowner");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let name = "n";
    let g = granted(&a, &req(name, "owner")).await;
    assert!(g.token > 0);
    // Another owner in the same backend, another attempt of the same owner, the right attempt
    // with a wrong token, and the right grant sent to another backend: none is the grant.
    let stale = GrantRef {
        token: g.token - 1,
        ..g.clone()
    };
    for wrong in [
        foreign(name, "intruder", g.token),
        foreign(name, "owner", g.token),
        stale,
    ] {
        assert_eq!(
            a.release(&wrong).await.expect("release"),
            ReleaseOutcome::TakenByOther
        );
        assert_eq!(
            a.renew(&[(wrong, Duration::from_secs(1))])
                .await
                .expect("renew"),
            [RenewOutcome::NotHeld]
        );
    }
    assert_eq!(
        b.release(&g).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    let renew = [
        (g.clone(), Duration::from_secs(1)),
        (foreign("other", "owner", 1), Duration::from_secs(1)),
    ];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::Renewed, RenewOutcome::NotHeld]
    );
    assert_eq!(
        b.renew(&renew[..1]).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    // The lock is untouched.
    assert!(matches!(
        b.acquire(&req(name, "b")).await.expect("acquire"),
        AcquireReply::Held { ttl: None }
    ));
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Nobody holds it now: a repeated release is reported, not repeated.
    for be in [&a, &b] {
        assert_eq!(
            be.release(&g).await.expect("release"),
            ReleaseOutcome::Expired
        );
    }
    assert_eq!(
        a.renew(&renew[..1]).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    assert_eq!(
        a.release(&foreign("never-used", "x", 1))
            .await
            .expect("release"),
        ReleaseOutcome::Expired
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_backends_and_restarts() {
    let dir = TempDir::new("fence");
    let mut last = 0;
    for _restart in 0..2 {
        let clients = [client(dir.path()), client(dir.path())];
        for i in 0..10 {
            let g = clients[i % 2]
                .lock("fence")
                .expect("lock")
                .acquire()
                .await
                .expect("acquire");
            assert!(
                g.fencing_token() > last,
                "token {} after {last}",
                g.fencing_token()
            );
            last = g.fencing_token();
            assert_eq!(
                g.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        let info = clients[1].inspect("fence").await.expect("inspect");
        assert_eq!(info.fencing_token, last);
        assert!(!info.held());
    }
    // Tokens are at least the wall clock in microseconds (so that they go on increasing when
    // the file is lost), and the counter increases by one per grant beyond that.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    assert!(
        last <= now + 20 && last > now - 600_000_000,
        "token {last}, clock {now}"
    );
}

/// Holder on client `a`, waiter on `b` (another backend, or another owner of the same one).
async fn check_wake(a: &Client, b: &Client) {
    let g = a
        .lock("wake")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let first = g.fencing_token();
    let lock_b = b.lock("wake").expect("lock");
    let waiter = tokio::spawn(async move {
        let g = lock_b.acquire_timeout(WAITER_DEADLINE).await;
        (g, Instant::now())
    });
    // Time for the waiter to start waiting (if it is slower, it just finds the lock free after
    // the release); it cannot get the lock while it is held, however slow the machine.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "waiter got a held lock");
    let released_at = Instant::now();
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (g2, got_at) = waiter.await.expect("waiter");
    let g2 = g2.expect("waiter acquired");
    let latency = got_at.saturating_duration_since(released_at);
    // Woken by the release itself, not left waiting until its deadline (see `PROMPT`).
    assert!(latency < PROMPT, "waiter woke {latency:?} after release");
    assert!(g2.fencing_token() > first);
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_woken_promptly_by_release() {
    let dir = TempDir::new("wake");
    let (a, b) = (client(dir.path()), client(dir.path()));
    check_wake(&a, &a).await;
    check_wake(&a, &b).await;
    check_wake(&b, &a).await;
}

async fn check_timeout(a: &Client, b: &Client) {
    let g = a
        .lock("deadline")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let wait = Duration::from_millis(300);
    let t = Instant::now();
    let err = b
        .lock("deadline")
        .expect("lock")
        .acquire_timeout(wait)
        .await
        .unwrap_err();
    let took = t.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(took >= wait, "gave up early: {took:?}");
    // Gave up at its deadline rather than on some later event (the lock stays held, so
    // without the deadline it would wait for ever); generous for a loaded machine.
    assert!(took < wait + PROMPT, "gave up late: {took:?}");
    let err = b
        .lock("deadline")
        .expect("lock")
        .acquire_timeout(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_timeout_gives_up_at_deadline() {
    let dir = TempDir::new("deadline");
    let (a, b) = (client(dir.path()), client(dir.path()));
    check_timeout(&a, &a).await;
    check_timeout(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiter_leaves_lock_acquirable() {
    let dir = TempDir::new("cancel");
    let (a, b) = (client(dir.path()), client(dir.path()));
    let g = a
        .lock("cancel")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    // Waiters of another backend (blocked in the kernel) and of the same backend, cancelled
    // by dropping their futures.
    for waiter in [&b, &a] {
        let lock = waiter.lock("cancel").expect("lock");
        let r = tokio::time::timeout(Duration::from_millis(200), lock.acquire()).await;
        assert!(r.is_err(), "acquired a held lock");
    }
    let lock_b = b.lock("cancel").expect("lock");
    let task = tokio::spawn(async move { lock_b.acquire().await });
    // Time for the task to start waiting; it cannot finish while the lock is held.
    tokio::time::sleep(Duration::from_millis(100)).await;
    task.abort();
    assert!(task.await.is_err(), "aborted waiter finished");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // b's waiting thread wakes, finds no waiter and unlocks at once (it holds the lock for
    // an instant in between, when it gets to run).
    wait_until(
        "the lock stays held after its waiters were cancelled",
        || async {
            !a.inspect("cancel").await.expect("inspect").held()
                && !b.inspect("cancel").await.expect("inspect").held()
        },
    )
    .await;
    let c = client(dir.path());
    let t = Instant::now();
    let g = c
        .lock("cancel")
        .expect("lock")
        .acquire_timeout(WAITER_DEADLINE)
        .await
        .expect("lock not free after cancelled waiters");
    // Free, or held only for the instant b's thread needs: not parked for a waiter that left.
    let took = t.elapsed();
    assert!(took < PROMPT, "took {took:?} to get a free lock");
    assert_eq!(b.held_count(), 0);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // And the backend whose waiters gave up can take it again. Its waiting thread may still
    // be blocked from before (if it had not run yet when `c` took the lock): then it takes the
    // lock for an instant after `c`'s release, and a `try_acquire` in that instant finds it
    // held (documented). So retry, but it must get in.
    let lock_b = b.lock("cancel").expect("lock");
    let t = Instant::now();
    let _g = loop {
        if let Some(g) = lock_b.try_acquire().await.expect("try") {
            break g;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "b cannot take the lock after its waiters gave up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_releases_of_other_backends() {
    let dir = TempDir::new("watch");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let g = granted(&a, &req("w", "a")).await;
    for watcher in [&b, &a] {
        let mut w = watcher.watch(&req("w", "watcher")).await.expect("watch");
        let changed = tokio::time::timeout(Duration::from_millis(150), w.changed()).await;
        assert!(changed.is_err(), "watch fired while the lock stayed held");
        drop(w);
    }
    let mut wb = b.watch(&req("w", "watcher")).await.expect("watch");
    let mut wa = a.watch(&req("w", "watcher")).await.expect("watch");
    let t = Instant::now();
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Released
    );
    for w in [&mut wb, &mut wa] {
        tokio::time::timeout(WAITER_DEADLINE, w.changed())
            .await
            .expect("no wake-up")
            .expect("watch broke");
    }
    // Woken by the release (see `PROMPT`).
    let took = t.elapsed();
    assert!(took < PROMPT, "watches woke {took:?} after the release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_process_releases_lock() {
    let dir = TempDir::new("xproc");
    let (mut child, child_token, child_owner) = spawn_holder(dir.path(), None).await;

    let c = client(dir.path());
    let lock = c.lock("xproc").expect("lock");
    assert!(
        lock.try_acquire().await.expect("try").is_none(),
        "child's lock not exclusive"
    );
    let info = c.inspect("xproc").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, child_owner);
    assert_eq!(info.fencing_token, child_token);

    let waiter = tokio::spawn(async move {
        let g = lock.acquire_timeout(WAITER_DEADLINE).await;
        (g, Instant::now())
    });
    // Time for the waiter to start waiting; it cannot get the lock while the child lives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "waiter got the child's lock");
    let killed_at = Instant::now();
    child.0.kill().expect("SIGKILL child");
    let (g, got_at) = waiter.await.expect("waiter");
    let g = g.expect("lock not freed by the holder's death");
    let latency = got_at.saturating_duration_since(killed_at);
    // Freed by the kernel when the child died: the child would only release after its
    // `CHILD_HOLD`, long after the waiter's deadline (see `PROMPT`).
    assert!(latency < PROMPT, "acquired {latency:?} after the kill");
    assert!(g.fencing_token() > child_token);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let _ = child.0.wait();
}

const CHILD_ENV: &str = "DLOCK_FILE_CHILD";

/// The owner id the child uses, if set (else its handle's own).
const CHILD_OWNER_ENV: &str = "DLOCK_FILE_CHILD_OWNER";

/// How long the child holds its lock if nobody kills it: far beyond any waiter's deadline.
const CHILD_HOLD: Duration = Duration::from_secs(120);

/// How long to wait for the child process to take its lock.
const CHILD_PATIENCE: Duration = Duration::from_secs(30);

struct KillOnDrop(Child);

/// Re-executes this test binary as `child_holder`, which takes lock `xproc` in `dir` (as
/// `owner` if given) and holds it until killed; returns it with its token and owner.
async fn spawn_holder(dir: &Path, owner: Option<&str>) -> (KillOnDrop, u64, String) {
    let exe = std::env::current_exe().expect("current exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_holder", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    match owner {
        Some(o) => cmd.env(CHILD_OWNER_ENV, o),
        None => cmd.env_remove(CHILD_OWNER_ENV),
    };
    let mut child = KillOnDrop(cmd.spawn().expect("spawn child"));
    let stdout = child.0.stdout.take().expect("child stdout");
    // Starting a process is slow on a loaded machine: be patient.
    let line = tokio::time::timeout(
        CHILD_PATIENCE,
        tokio::task::spawn_blocking(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(|l| l.ok())
                // libtest may print `test child_holder ... ` before the line on the same line.
                .find_map(|l| l.find("HELD ").map(|i| l[i..].to_owned()))
        }),
    )
    .await
    .expect("child did not take the lock in time")
    .expect("reader")
    .expect("child exited without taking the lock");
    let mut parts = line.splitn(3, ' ').skip(1);
    let token: u64 = parts.next().and_then(|t| t.parse().ok()).expect("token");
    let owner = parts.next().expect("owner").to_owned();
    (child, token, owner)
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Helper of `crashed_process_releases_lock`, run in a child process; does nothing otherwise.
#[test]
fn child_holder() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = client(Path::new(&dir));
        let mut lock = c.lock("xproc").expect("lock");
        if let Some(owner) = std::env::var_os(CHILD_OWNER_ENV) {
            let owner = owner.into_string().expect("owner is UTF-8");
            lock = lock.with_owner(owner).expect("owner");
        }
        let g = lock.acquire().await.expect("acquire");
        println!("HELD {} {}", g.fencing_token(), g.owner());
        // Killed by the parent long before this ends.
        tokio::time::sleep(CHILD_HOLD).await;
        drop(g);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_namespaces_and_files() {
    let dir = TempDir::new("url");
    let url = format!("file://{}", dir.path().display());
    let be = FileBackend::from_url(&url, &opts()).expect("from_url");
    assert_eq!(be.dir(), dir.path().join("test"));
    assert_eq!(be.endpoint(), format!("{url}/test"));
    assert_eq!(be.kind(), "file");
    let lf = be.lock_file("a/b c");
    assert_eq!(lf.parent(), Some(dir.path().join("test").as_path()));
    assert_eq!(
        lf.file_name().and_then(|f| f.to_str()),
        Some(distlock_file::file_name("a/b c").as_str())
    );
    let mode = mode_of(dir.path()) & 0o777;
    assert_eq!(mode, 0o700);
    assert_eq!(mode_of(&dir.path().join("test")), 0o700);
    // A group-shared base directory gives a group-shared namespace directory, never a public one.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o2777)).expect("chmod");
    let sb = FileBackend::open(&shared, &opts()).expect("open shared");
    assert_eq!(mode_of(sb.dir()), 0o2770);

    let be = Arc::new(be);
    let a = Client::new(be, opts()).expect("client");
    let g = a
        .lock("a/b c")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let text = std::fs::read_to_string(&lf).expect("lock file");
    assert!(text.contains("name a/b c\n"), "{text}");
    assert!(text.contains(&format!("holder {} 1 {}\n", std::process::id(), g.owner())));
    // Another namespace is another set of locks.
    let other = Client::new(
        Arc::new(FileBackend::open(dir.path(), &opts().namespace("other/ns")).expect("open")),
        opts(),
    )
    .expect("client");
    let g2 = other
        .lock("a/b c")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g2.is_some(), "namespaces share locks");
    assert!(dir.path().join("other%2Fns").is_dir());
    drop(g2);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let text = std::fs::read_to_string(&lf).expect("lock file");
    assert!(!text.contains("holder"), "holder line not cleared: {text}");

    for bad in [
        "file://relative/dir",
        "file:/tmp/x",
        "redis://localhost",
        "file:///x?y=1",
    ] {
        match FileBackend::from_url(bad, &opts()) {
            Err(Error::InvalidUrl { url, reason }) => {
                assert_eq!(url, bad);
                assert!(reason.contains("file://"), "{reason}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    let e = FileBackend::open(dir.path(), &opts().namespace("")).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let not_dir = dir.path().join("file");
    std::fs::write(&not_dir, b"x").expect("write");
    let e = FileBackend::open(&not_dir, &opts()).unwrap_err();
    assert!(e.is_connection(), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_lock_file_is_reported() {
    let dir = TempDir::new("corrupt");
    let be = backend(dir.path());
    std::fs::write(be.lock_file("bad"), b"garbage\n").expect("write");
    let e = be.acquire(&req("bad", "o")).await.unwrap_err();
    match &e {
        Error::UnexpectedReply { backend, message } => {
            assert_eq!(*backend, "file");
            assert!(
                message.contains(&be.lock_file("bad").display().to_string()),
                "{message}"
            );
            assert!(message.contains("delete"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(be.inspect("bad", LockKind::Mutex).await.is_err());
    // The failed grant left the lock free: deleting the file as told fixes it.
    std::fs::remove_file(be.lock_file("bad")).expect("remove");
    assert!(matches!(
        be.acquire(&req("bad", "o")).await.expect("acquire"),
        AcquireReply::Granted { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lock_file_is_detected_at_renewal() {
    let dir = TempDir::new("deleted");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let ga = granted(&a, &req("del", "a")).await;
    std::fs::remove_file(a.lock_file("del")).expect("remove");
    // A new file is a new lock: b gets it, so a must learn it lost its own.
    let gb = granted(&b, &req("del", "b")).await;
    let renew = [(ga.clone(), Duration::from_secs(1))];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    assert_eq!(
        a.release(&ga).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        b.release(&gb).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lock_file_fires_lost_signal() {
    let dir = TempDir::new("lost");
    // The lost signal must come from a renewal (every lease/3) finding the file gone
    // (`NotHeld`), not from the client's lease running out unconfirmed (`LeaseExpired`). That
    // takes over 2/3 of the lease without a renewal (e.g. a grant slow to reach the client on
    // a loaded machine): a 3 s lease makes that margin 2 s, and detection takes at most 1 s.
    let opts = opts().watchdog_lease(Duration::from_secs(3));
    let a = Client::new(
        Arc::new(FileBackend::open(dir.path(), &opts).expect("open")),
        opts.clone(),
    )
    .expect("client");
    let be = FileBackend::open(dir.path(), &opts).expect("open");
    let g = a
        .lock("lost")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    std::fs::remove_file(be.lock_file("lost")).expect("remove");
    let reason = tokio::time::timeout(PATIENCE, g.lost())
        .await
        .expect("lost signal never fired");
    assert_eq!(reason, distlock_core::LostReason::NotHeld);
    wait_until("client still tracks a lost hold", || async {
        a.held_count() == 0
    })
    .await;
    assert_eq!(g.release().await.expect("release"), ReleaseOutcome::Expired);
    // The lock works again on a new file.
    let g = a
        .lock("lost")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(g.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_lock_kinds_are_unsupported() {
    let dir = TempDir::new("kinds");
    let be = backend(dir.path());
    for kind in [
        LockKind::Fair,
        LockKind::Semaphore {
            permits: 1,
            limit: 2,
        },
    ] {
        let mut r = req("k", "o");
        r.key.kind = kind;
        let e = be.acquire(&r).await.unwrap_err();
        assert!(e.is_unsupported(), "{e:?}");
        assert!(e.to_string().contains(kind.as_str()), "{e}");
        assert!(be.inspect("k", kind).await.unwrap_err().is_unsupported());
        assert!(be.release(&r.grant(1)).await.unwrap_err().is_unsupported());
        assert!(be.give_up(&r).await.unwrap_err().is_unsupported());
        assert!(be.watch(&r).await.err().expect("watch").is_unsupported());
    }
}

// ---------------------------------------------------------------------------------------------
// The grant-addressed protocol: one grant per attempt, give-ups, cancellation.

/// A retried acquire of one attempt (a caller that did not hear the answer) is the same grant:
/// the same token, the counter not incremented twice, one release frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_acquire_is_one_grant() {
    let dir = TempDir::new("retry");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let r = req("retry", "o");
    let g = granted(&a, &r).await;
    for _ in 0..3 {
        assert_eq!(granted(&a, &r).await, g, "a retry got another grant");
    }
    let info = b.inspect("retry", LockKind::Mutex).await.expect("inspect");
    assert_eq!(
        info.fencing_token, g.token,
        "a retry incremented the counter"
    );
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].count, 1);
    let text = std::fs::read_to_string(a.lock_file("retry")).expect("lock file");
    assert!(
        text.contains(&format!("holder {} 1 o\n", std::process::id())),
        "{text}"
    );
    // The same request sent to another backend (another process) is another attempt there:
    // the kernel keeps it out.
    assert!(matches!(
        b.acquire(&r).await.expect("acquire"),
        AcquireReply::Held { .. }
    ));
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Expired
    );
    // One release was enough: the lock is free, and the next grant's token follows.
    let next = granted(&b, &req("retry", "o")).await;
    assert!(next.token > g.token);
    assert_eq!(
        b.release(&next).await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// Two attempts with one owner id are two holders: in one backend (the table tells them
/// apart by attempt), in two backends of one process, and through the client API with two
/// clients sharing one backend or each with its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_of_one_owner_exclude_each_other_in_one_process() {
    let dir = TempDir::new("sameowner");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let n = "same/owner";
    let first = req(n, "shared-owner");
    let g = granted(&a, &first).await;
    for be in [&a, &b] {
        let second = req(n, "shared-owner");
        assert!(
            matches!(
                be.acquire(&second).await.expect("acquire"),
                AcquireReply::Held { .. }
            ),
            "a second attempt of the same owner id got a held lock"
        );
        // Its giving up leaves the first attempt's grant alone.
        be.give_up(&second).await.expect("give up");
        assert_eq!(
            a.renew(&[(g.clone(), Duration::from_secs(1))])
                .await
                .expect("renew"),
            [RenewOutcome::Renewed]
        );
    }
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Released
    );

    let shared = backend(dir.path());
    let pairs = [
        (
            Client::new(shared.clone(), opts()).expect("client"),
            Client::new(shared.clone(), opts()).expect("client"),
        ),
        (client(dir.path()), client(dir.path())),
    ];
    for (c1, c2) in &pairs {
        let l1 = c1
            .lock(n)
            .expect("lock")
            .with_owner("shared-owner")
            .expect("owner");
        let l2 = c2
            .lock(n)
            .expect("lock")
            .with_owner("shared-owner")
            .expect("owner");
        let g1 = l1.acquire().await.expect("acquire");
        assert!(
            l2.try_acquire().await.expect("try").is_none(),
            "two clients with one owner id held the lock at once"
        );
        let waiter = tokio::spawn(async move {
            let g = l2.acquire_timeout(WAITER_DEADLINE).await;
            (g, Instant::now())
        });
        // Time for the waiter to start waiting; it cannot get in while g1 is held.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiter.is_finished(),
            "the other client's waiter got a held lock"
        );
        let released = Instant::now();
        let t1 = g1.fencing_token();
        assert_eq!(
            g1.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        let (g2, at) = waiter.await.expect("waiter");
        let g2 = g2.expect("waiter after the release");
        assert!(at.saturating_duration_since(released) < PROMPT);
        assert!(g2.fencing_token() > t1);
        assert_eq!(
            g2.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// An owner id used by a process does not let another process in under the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_id_in_two_processes_excludes() {
    let dir = TempDir::new("xowner");
    let owner = "owner shared by two processes";
    let (mut child, child_token, child_owner) = spawn_holder(dir.path(), Some(owner)).await;
    assert_eq!(child_owner, owner);
    let be = backend(dir.path());
    assert!(matches!(
        be.acquire(&req("xproc", owner)).await.expect("acquire"),
        AcquireReply::Held { .. }
    ));
    let c = Client::new(be.clone(), opts()).expect("client");
    let lock = c
        .lock("xproc")
        .expect("lock")
        .with_owner(owner)
        .expect("owner");
    assert!(
        lock.try_acquire().await.expect("try").is_none(),
        "the same owner id in another process got the lock"
    );
    let waiter = tokio::spawn(async move { lock.acquire_timeout(WAITER_DEADLINE).await });
    // Time for the waiter to start waiting; it cannot get in while the child lives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got the child's lock");
    child.0.kill().expect("SIGKILL child");
    let g = waiter
        .await
        .expect("waiter")
        .expect("lock after the child died");
    assert!(g.fencing_token() > child_token);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A caller that stops waiting at any point of a contended acquire — its future dropped after
/// 0, 1, 5 or 20 ms, with the holder releasing just before or at that moment, so that the
/// grant often arrives as the future goes — leaves nothing held: a third party gets the lock
/// at once. The waiter shares the holder's backend (in-process hand-over) or has its own (the
/// kernel-blocked waiting thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquire_at_any_point_leaves_nothing_held() {
    let dir = TempDir::new("cancelpoint");
    let holder_backend = backend(dir.path());
    let holder = Client::new(holder_backend.clone(), opts()).expect("client");
    let third = client(dir.path());
    let n = "cancel/point";
    let mut granted_to_waiter = 0;
    for shared in [true, false] {
        let waiter = if shared {
            Client::new(holder_backend.clone(), opts()).expect("client")
        } else {
            client(dir.path())
        };
        for ms in [0u64, 1, 5, 20] {
            for early in [Duration::from_millis(1), Duration::ZERO] {
                let case = format!("shared={shared} drop after {ms} ms, release {early:?} before");
                let g = holder
                    .lock(n)
                    .expect("lock")
                    .acquire_timeout(WAITER_DEADLINE)
                    .await
                    .unwrap_or_else(|e| panic!("{case}: holder: {e}"));
                let lock = waiter.lock(n).expect("lock");
                let wait = Duration::from_millis(ms);
                let w = tokio::spawn(async move {
                    tokio::time::timeout(wait, lock.acquire())
                        .await
                        .ok()
                        .map(|r| r.map(drop))
                });
                tokio::time::sleep(wait.saturating_sub(early)).await;
                assert_eq!(
                    g.release().await.expect("release"),
                    ReleaseOutcome::Released,
                    "{case}"
                );
                if let Some(r) = w.await.expect("waiter task") {
                    // It won before its deadline (its guard was dropped at once).
                    r.unwrap_or_else(|e| panic!("{case}: waiter: {e}"));
                    granted_to_waiter += 1;
                }
                // Nothing is left held: a third party gets the lock promptly (a grant that
                // reached the dropped future is given back in the background).
                let t = Instant::now();
                let g3 = third
                    .lock(n)
                    .expect("lock")
                    .acquire_timeout(PROMPT)
                    .await
                    .unwrap_or_else(|e| panic!("{case}: the lock stayed held: {e}"));
                assert!(t.elapsed() < PROMPT, "{case}");
                assert_eq!(
                    g3.release().await.expect("release"),
                    ReleaseOutcome::Released,
                    "{case}"
                );
                wait_until(
                    &format!("{case}: the waiter's client still tracks a hold"),
                    || async { waiter.held_count() == 0 },
                )
                .await;
            }
        }
    }
    eprintln!("the waiter won {granted_to_waiter} of 16 races before its future was dropped");
}

/// `give_up` gives back the grant of its own attempt only — a grant whose answer the caller
/// never heard — and is idempotent; a waiting thread whose `flock` completes after its
/// waiter gave up unlocks at once instead of holding the lock for the life of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_up_returns_only_its_own_grant() {
    let dir = TempDir::new("giveup");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let n = "give/up";
    // A grant the caller did not hear of (it stopped after sending): give_up frees it.
    let r = req(n, "o");
    let g = granted(&a, &r).await;
    let sibling = req(n, "o");
    a.give_up(&sibling).await.expect("give up");
    assert!(
        a.inspect(n, LockKind::Mutex).await.expect("inspect").held(),
        "another attempt's give-up freed the lock"
    );
    a.give_up(&r).await.expect("give up");
    a.give_up(&r).await.expect("give up again");
    assert_eq!(
        a.release(&g).await.expect("release"),
        ReleaseOutcome::Expired
    );
    assert_eq!(
        a.renew(&[(g.clone(), Duration::from_secs(1))])
            .await
            .expect("renew"),
        [RenewOutcome::NotHeld]
    );
    let gb = granted(&b, &req(n, "b")).await;
    assert!(gb.token > g.token);

    // A waiter of `a` blocks in the kernel for b's lock, then gives up; b releases after that:
    // a's waiting thread gets the lock with nobody waiting, and must let it go.
    let w = req(n, "w");
    let cancel = tokio_util::sync::CancellationToken::new();
    let (a2, w2, c2) = (a.clone(), w.clone(), cancel.clone());
    let wait = tokio::spawn(async move { a2.acquire_wait(&w2, None, &c2).await });
    // Time for the waiter to start waiting (its waiting thread is started by its first
    // attempt); it cannot get the lock while b holds it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    assert_eq!(wait.await.expect("join").expect("wait"), None);
    a.give_up(&w).await.expect("give up");
    assert_eq!(
        b.release(&gb).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Nobody else wants the lock now, so a's thread gets it: it must let it go at once.
    stays_free(
        &a.lock_file(n),
        "a waiting thread kept the lock after its waiter gave up",
    )
    .await;
    let c = backend(dir.path());
    let never = tokio_util::sync::CancellationToken::new();
    let cq = req(n, "c");
    let got = c
        .acquire_wait(&cq, Some(Instant::now() + PROMPT), &never)
        .await
        .expect("wait")
        .expect("a waiting thread kept the lock after its waiter gave up");
    let gc = cq.grant(got.token);

    // The same wait again, with the holder releasing as the waiter is cancelled, so the grant
    // may land as the caller gives up: whatever the wait returned, give_up leaves it free.
    let w = req(n, "w2");
    let cancel = tokio_util::sync::CancellationToken::new();
    let (a2, w2, c2) = (a.clone(), w.clone(), cancel.clone());
    let wait = tokio::spawn(async move { a2.acquire_wait(&w2, None, &c2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (released, ()) = tokio::join!(c.release(&gc), async { cancel.cancel() });
    assert_eq!(released.expect("release"), ReleaseOutcome::Released);
    let res = wait.await.expect("join").expect("wait");
    a.give_up(&w).await.expect("give up");
    if let Some(gw) = res {
        assert_eq!(
            a.release(&w.grant(gw.token)).await.expect("release"),
            ReleaseOutcome::Expired,
            "give_up left the attempt's grant in place"
        );
    }
    let d = backend(dir.path());
    let dq = req(n, "d");
    let got = d
        .acquire_wait(&dq, Some(Instant::now() + PROMPT), &never)
        .await
        .expect("wait")
        .expect("the lock stayed held after the waiter gave up");
    assert_eq!(
        d.release(&dq.grant(got.token)).await.expect("release"),
        ReleaseOutcome::Released
    );
}
