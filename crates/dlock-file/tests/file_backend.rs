//! End-to-end tests of the `file://` backend through the public `Client`/`Lock`/`LockGuard` API,
//! with real files, real `flock`s and a real second process.

use dlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, ClientOptions, Error, HoldKey, LockKind,
    LostSignal, ReleaseOutcome, RenewOutcome,
};
use dlock_file::FileBackend;
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

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        TempDir(std::env::temp_dir().join(format!(
            "dlock-file-test-{tag}-{}-{}-{nanos}",
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
async fn reentrancy_counts_holds() {
    let dir = TempDir::new("reentry");
    let (a, b) = (client(dir.path()), client(dir.path()));
    let lock = a.lock("re/entry").expect("lock");
    let g1 = lock.acquire().await.expect("first");
    let first = g1.fencing_token();
    let g2 = lock.try_acquire().await.expect("try").expect("re-entry");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    let info = a.inspect("re/entry").await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, lock.owner());
    assert_eq!(info.holders[0].count, 2);
    assert_eq!(info.holders[0].lease_left, None);
    // Another backend (process) sees the holder recorded in the file.
    let info_b = b.inspect("re/entry").await.expect("inspect");
    assert_eq!(info_b.holders.len(), 1);
    assert_eq!(info_b.holders[0].owner, lock.owner());
    assert_eq!(info_b.holders[0].count, 2);
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
    assert_eq!(
        b.inspect("re/entry").await.expect("inspect").holders[0].count,
        1
    );
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
    let AcquireReply::Granted { token } = a.acquire(&req(name, "owner")).await.expect("acquire")
    else {
        panic!("not granted")
    };
    assert!(token > 0);
    // Another owner in the same backend, and in another backend.
    assert_eq!(
        a.release(&key(name, "intruder")).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        b.release(&key(name, "owner")).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    let renew = [(key(name, "intruder"), Duration::from_secs(1))];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    let renew = [
        (key(name, "owner"), Duration::from_secs(1)),
        (key("other", "owner"), Duration::from_secs(1)),
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
        a.release(&key(name, "owner")).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Nobody holds it now.
    for be in [&a, &b] {
        assert_eq!(
            be.release(&key(name, "owner")).await.expect("release"),
            ReleaseOutcome::Expired
        );
    }
    assert_eq!(
        a.release(&key("never-used", "x")).await.expect("release"),
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
    assert_eq!(last, 20);
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
    let AcquireReply::Granted { .. } = a.acquire(&req("w", "a")).await.expect("acquire") else {
        panic!("not granted")
    };
    for watcher in [&b, &a] {
        let mut w = watcher.watch(&key("w", "watcher")).await.expect("watch");
        let changed = tokio::time::timeout(Duration::from_millis(150), w.changed()).await;
        assert!(changed.is_err(), "watch fired while the lock stayed held");
        drop(w);
    }
    let mut wb = b.watch(&key("w", "watcher")).await.expect("watch");
    let mut wa = a.watch(&key("w", "watcher")).await.expect("watch");
    let t = Instant::now();
    assert_eq!(
        a.release(&key("w", "a")).await.expect("release"),
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
    let exe = std::env::current_exe().expect("current exe");
    let mut child = KillOnDrop(
        Command::new(exe)
            .args(["--exact", "child_holder", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child"),
    );
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
    let child_token: u64 = parts.next().and_then(|t| t.parse().ok()).expect("token");
    let child_owner = parts.next().expect("owner").to_owned();

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

/// How long the child holds its lock if nobody kills it: far beyond any waiter's deadline.
const CHILD_HOLD: Duration = Duration::from_secs(120);

/// How long to wait for the child process to take its lock.
const CHILD_PATIENCE: Duration = Duration::from_secs(30);

struct KillOnDrop(Child);

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
        let g = c
            .lock("xproc")
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
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
        Some(dlock_file::file_name("a/b c").as_str())
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
        AcquireReply::Granted { token: 1 }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_lock_file_is_detected_at_renewal() {
    let dir = TempDir::new("deleted");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    assert!(matches!(
        a.acquire(&req("del", "a")).await.expect("acquire"),
        AcquireReply::Granted { .. }
    ));
    std::fs::remove_file(a.lock_file("del")).expect("remove");
    // A new file is a new lock: b gets it, so a must learn it lost its own.
    assert!(matches!(
        b.acquire(&req("del", "b")).await.expect("acquire"),
        AcquireReply::Granted { .. }
    ));
    let renew = [(key("del", "a"), Duration::from_secs(1))];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::NotHeld]
    );
    assert_eq!(
        a.release(&key("del", "a")).await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_eq!(
        b.release(&key("del", "b")).await.expect("release"),
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
    assert_eq!(reason, dlock_core::LostReason::NotHeld);
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
        assert!(be.release(&r.key).await.unwrap_err().is_unsupported());
        assert!(be
            .watch(&r.key)
            .await
            .err()
            .expect("watch")
            .is_unsupported());
    }
}
