//! Read-write locks of the `file://` backend: in one backend, between backends, and between
//! real processes (the test binary re-executes itself as a child holder).

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, ClientOptions, Error, GrantRef, HoldKey, Lock,
    LockKind, LostSignal, ReleaseOutcome, RenewOutcome,
};
use distlock_file::FileBackend;
use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// How long a test waits for something that must happen (a waiter queueing, a wake-up, a
/// child process) before it fails. Far above what it takes even on a loaded CI machine; it
/// only costs time when the test fails anyway.
const PATIENCE: Duration = Duration::from_secs(10);

/// Upper bound on the latency of a wake-up that must come from a release or a holder's death
/// (the kernel or in-process notification). This backend has no polling and no lease, so a
/// waiter that missed that wake-up would only end at its deadline (`WAITER_DEADLINE`, far
/// longer) and fail; the bound is generous so that a loaded machine cannot miss it.
const PROMPT: Duration = Duration::from_secs(5);

/// Deadline of waiters that must be woken by a release: clearly longer than `PROMPT`.
const WAITER_DEADLINE: Duration = Duration::from_secs(30);

/// Waits until a writer waits for `reader`'s lock (it holds the turnstile), as seen by
/// `reader`, a new reader that could share the lock with its current holders: polls
/// `try_acquire` until it is refused, giving back what it got meanwhile. Fails after
/// `PATIENCE`.
async fn until_writer_queued(reader: &Lock) {
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
async fn until_reader_passes(reader: &Lock, what: &str) {
    let start = Instant::now();
    while reader.try_acquire().await.expect("try").is_none() {
        assert!(start.elapsed() < PATIENCE, "{what} ({PATIENCE:?})");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        TempDir(std::env::temp_dir().join(format!(
            "distlock-file-rw-{tag}-{}-{}",
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
    ClientOptions::default().namespace("rw")
}

fn backend(dir: &Path) -> Arc<FileBackend> {
    Arc::new(FileBackend::open(dir, &opts()).expect("open backend"))
}

/// A client with its own backend: as a separate process would have.
fn client(dir: &Path) -> Client {
    Client::new(backend(dir), opts()).expect("client")
}

fn key(name: &str, owner: &str, kind: LockKind) -> HoldKey {
    HoldKey {
        name: name.into(),
        owner: owner.into(),
        kind,
    }
}

fn req(name: &str, owner: &str, kind: LockKind) -> AcquireRequest {
    AcquireRequest::new(
        key(name, owner, kind),
        Duration::from_secs(30),
        LostSignal::new(),
    )
}

/// Acquires with `r` (a new attempt, or a retry of one); the grant it won.
async fn granted_to(b: &FileBackend, r: &AcquireRequest) -> GrantRef {
    match b.acquire(r).await.expect("acquire") {
        AcquireReply::Granted { token } => r.grant(token),
        AcquireReply::Held { .. } => {
            panic!("{} could not take the {:?} side", r.key.owner, r.key.kind)
        }
    }
}

/// A new attempt of `owner` on `kind`; the grant it won.
async fn granted(b: &FileBackend, name: &str, owner: &str, kind: LockKind) -> GrantRef {
    granted_to(b, &req(name, owner, kind)).await
}

async fn held_to(b: &FileBackend, r: &AcquireRequest) {
    match b.acquire(r).await.expect("acquire") {
        AcquireReply::Held { ttl: None } => {}
        other => panic!(
            "{} asking for the {:?} side: {other:?}",
            r.key.owner, r.key.kind
        ),
    }
}

/// A new attempt of `owner` on `kind` is refused.
async fn held(b: &FileBackend, name: &str, owner: &str, kind: LockKind) {
    held_to(b, &req(name, owner, kind)).await
}

async fn release(b: &FileBackend, grant: &GrantRef) -> ReleaseOutcome {
    b.release(grant).await.expect("release")
}

/// The holders `inspect` reports, as sorted `(side, owner, count)`.
async fn holders(b: &FileBackend, name: &str) -> Vec<(String, String, u32)> {
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

fn hv(side: &str, owner: &str, count: u32) -> (String, String, u32) {
    (side.to_owned(), owner.to_owned(), count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_backend_grants_share_exclude_retry_downgrade() {
    let dir = TempDir::new("one");
    let b = backend(dir.path());
    let n = "one/backend";
    use LockKind::{Read, Write};
    // Readers of one backend share; each grant has a new token; a retry of an attempt is the
    // same grant, never a second one.
    let r1 = req(n, "r1", Read);
    let g1 = granted_to(&b, &r1).await;
    let g2 = granted(&b, n, "r2", Read).await;
    assert!(g2.token > g1.token);
    assert_eq!(granted_to(&b, &r1).await, g1, "a retry got another grant");
    // Another attempt of the same owner id is another holder (re-entry is the client's).
    let g1b = granted(&b, n, "r1", Read).await;
    assert!(g1b.token > g2.token);
    held(&b, n, "w", Write).await;
    assert_eq!(
        holders(&b, n).await,
        [
            hv("read", "r1", 1),
            hv("read", "r1", 1),
            hv("read", "r2", 1)
        ]
    );
    // An upgrade is refused at once.
    let e = b.acquire(&req(n, "r2", Write)).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("upgrade"), "{e}");
    // Each release frees its own grant only; a repeated release is reported, not repeated.
    assert_eq!(release(&b, &g1).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &g1).await, ReleaseOutcome::Expired);
    assert_eq!(
        holders(&b, n).await,
        [hv("read", "r1", 1), hv("read", "r2", 1)]
    );
    assert_eq!(release(&b, &g1b).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &g2).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &g2).await, ReleaseOutcome::Expired);
    // A writer excludes the other attempts of its backend, on both sides, its own owner id's
    // included.
    let wq = req(n, "w", Write);
    let gw = granted_to(&b, &wq).await;
    assert!(gw.token > g2.token);
    held(&b, n, "r1", Read).await;
    held(&b, n, "w2", Write).await;
    held(&b, n, "w", Write).await;
    assert_eq!(release(&b, &g1).await, ReleaseOutcome::TakenByOther);
    // The read side beside the write grant only for a request that names that grant: not
    // for the owner id alone, nor for a wrong token or attempt.
    held(&b, n, "w", Read).await;
    for wrong in [
        GrantRef {
            token: gw.token + 1,
            ..gw.clone()
        },
        GrantRef {
            attempt: distlock_core::AttemptId::new(),
            ..gw.clone()
        },
    ] {
        let mut r = req(n, "w", Read);
        r.write_grant = Some(wrong);
        held_to(&b, &r).await;
    }
    // Downgrade: the writer reads too (new token), and keeps reading without the write side.
    let mut dq = req(n, "w", Read);
    dq.write_grant = Some(gw.clone());
    let gr = granted_to(&b, &dq).await;
    assert!(gr.token > gw.token);
    assert_eq!(granted_to(&b, &wq).await, gw, "write retry");
    assert_eq!(granted_to(&b, &dq).await, gr, "read retry");
    assert_eq!(
        holders(&b, n).await,
        [hv("read", "w", 1), hv("write", "w", 1)]
    );
    assert_eq!(release(&b, &gw).await, ReleaseOutcome::Released);
    assert_eq!(release(&b, &gw).await, ReleaseOutcome::Expired);
    assert_eq!(holders(&b, n).await, [hv("read", "w", 1)]);
    // Now other readers may join, writers may not.
    let g1 = granted(&b, n, "r1", Read).await;
    held(&b, n, "w2", Write).await;
    let other = backend(dir.path());
    held(&other, n, "x", Write).await;
    let gy = granted(&other, n, "y", Read).await;
    assert_eq!(
        holders(&other, n).await,
        [hv("read", "r1", 1), hv("read", "w", 1), hv("read", "y", 1)]
    );
    // Renewals: only the backend's own live grants.
    let renew = [
        (gr.clone(), Duration::from_secs(1)),
        (gw.clone(), Duration::from_secs(1)),
        (gy.clone(), Duration::from_secs(1)),
    ];
    assert_eq!(
        b.renew(&renew).await.expect("renew"),
        [
            RenewOutcome::Renewed,
            RenewOutcome::NotHeld,
            RenewOutcome::NotHeld
        ]
    );
    for (be, g) in [(&b, &gr), (&b, &g1), (&other, &gy)] {
        assert_eq!(release(be, g).await, ReleaseOutcome::Released);
    }
    assert!(holders(&b, n).await.is_empty());
    let info = other.inspect(n, LockKind::Write).await.expect("inspect");
    assert!(!info.held());
    assert!(info.fencing_token > gr.token);
    let gx = granted(&other, n, "x", Write).await;
    assert!(gx.token > info.fencing_token);
    assert_eq!(release(&other, &gx).await, ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_record() {
    let dir = TempDir::new("files");
    let b = backend(dir.path());
    let n = "files";
    let [main, turnstile, record] = b.rw_lock_files(n);
    let hash = format!("{:032x}", distlock_file::fnv1a_128(n.as_bytes()));
    assert_eq!(main, b.dir().join(format!("{hash}.rw")));
    assert_eq!(turnstile, b.dir().join(format!("{hash}.rw-turnstile")));
    assert_eq!(record, b.dir().join(format!("{hash}.rw-record")));
    let g = granted(&b, n, "reader one", LockKind::Read).await;
    let t = g.token;
    let text = std::fs::read_to_string(&record).expect("record");
    let pid = std::process::id();
    assert!(text.starts_with("distlock-file 1\n"), "{text}");
    assert!(text.contains(&format!("token {t}\n")), "{text}");
    assert!(text.contains(&format!("name {n}\n")), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("hold "))
        .expect("hold line");
    let parts: Vec<&str> = line.splitn(6, ' ').collect();
    assert_eq!(parts[1..3], ["r", pid.to_string().as_str()], "{line}");
    assert_eq!(parts[4..], ["1", "reader one"], "{line}");
    // The mutex of the same name is another lock, with its own file and counter.
    assert!(!b.lock_file(n).exists());
    assert_eq!(release(&b, &g).await, ReleaseOutcome::Released);
    let text = std::fs::read_to_string(&record).expect("record");
    assert!(!text.contains("hold "), "{text}");
    // A record naming another lock (an FNV collision, or a foreign file) is refused.
    std::fs::write(&record, "distlock-file 1\ntoken 3\nname other\nend\n").expect("write");
    let e = b.acquire(&req(n, "o", LockKind::Write)).await.unwrap_err();
    assert!(matches!(e, Error::UnexpectedReply { .. }), "{e:?}");
    assert!(e.to_string().contains("same FNV-1a-128 hash"), "{e}");
    // ... and left the lock free.
    // (A counter ahead of the clock floor: the next token is the counter's next.)
    let ahead = u64::MAX / 2;
    std::fs::write(
        &record,
        format!("distlock-file 1\ntoken {ahead}\nname files\nend\n"),
    )
    .expect("write");
    let g = granted(&b, n, "o", LockKind::Write).await;
    assert_eq!(g.token, ahead + 1);
    assert_eq!(release(&b, &g).await, ReleaseOutcome::Released);
}

/// A writer of another backend waits: new readers of any backend wait behind it, even while
/// the lock is only read; its giving up lets them in again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_writer_holds_back_new_readers_until_it_gives_up() {
    let dir = TempDir::new("turnstile");
    let (a, b, c) = (client(dir.path()), client(dir.path()), client(dir.path()));
    let n = "turnstile";
    let r1_lock = a.rw_lock(n).expect("rw").read();
    let r1 = r1_lock.acquire().await.expect("r1");
    // Another owner of the reader's own backend may join while nobody waits.
    let r1b = a
        .rw_lock(n)
        .expect("rw")
        .read()
        .try_acquire()
        .await
        .expect("try");
    assert!(r1b.is_some());
    drop(r1b);
    let writer = b.rw_lock(n).expect("rw").write();
    let w = writer.clone();
    // The checks below must be done before the writer gives up: a wide window, which the test
    // then waits out.
    let writer_wait = Duration::from_secs(3);
    let wait = tokio::spawn(async move { w.acquire_timeout(writer_wait).await });
    until_writer_queued(&c.rw_lock(n).expect("rw").read()).await;
    for cl in [&a, &c] {
        let late = cl.rw_lock(n).expect("rw").read();
        assert!(
            late.try_acquire().await.expect("try").is_none(),
            "a new reader passed a waiting writer (writer gave up already: {})",
            wait.is_finished()
        );
    }
    // The read holder itself re-enters (it would deadlock the writer otherwise).
    let r1_again = r1_lock.try_acquire().await.expect("try").expect("re-entry");
    assert_eq!(r1_again.fencing_token(), r1.fencing_token());
    let e = wait.await.expect("join").unwrap_err();
    assert!(e.is_timeout(), "{e}");
    // The writer gave up: readers pass again, at once.
    let g = c
        .rw_lock(n)
        .expect("rw")
        .read()
        .try_acquire()
        .await
        .expect("try");
    assert!(
        g.is_some(),
        "the turnstile stayed closed after the writer gave up"
    );
    drop(g);
    drop(r1_again);
    // A writer that waits, and is cancelled by dropping its future: the acquisition runs in
    // a task of its own, which notices the cancellation (and leaves the queue) a moment later.
    let r = tokio::time::timeout(Duration::from_millis(150), writer.acquire()).await;
    assert!(r.is_err(), "got the write side while read");
    let reader = c.rw_lock(n).expect("rw").read();
    until_reader_passes(
        &reader,
        "the turnstile stayed closed after the writer was cancelled",
    )
    .await;
    assert_eq!(
        r1.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // b's write thread wakes, finds no waiter and unlocks.
    let g = writer
        .acquire_timeout(WAITER_DEADLINE)
        .await
        .expect("writer after the readers left");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// The same inside one backend (clients sharing it, as the tasks of one process do): a
/// waiting writer holds back new readers of its own backend, and gets the lock the moment the
/// last reader leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_writer_holds_back_readers_of_its_own_backend() {
    let dir = TempDir::new("own");
    let be = backend(dir.path());
    let (a, b) = (
        Client::new(be.clone(), opts()).expect("client"),
        Client::new(be.clone(), opts()).expect("client"),
    );
    let n = "own";
    let r1 = a
        .rw_lock(n)
        .expect("rw")
        .read()
        .acquire()
        .await
        .expect("r1");
    let r2 = b
        .rw_lock(n)
        .expect("rw")
        .read()
        .try_acquire()
        .await
        .expect("try");
    let r2 = r2.expect("readers of one backend share");
    let writer = a.rw_lock(n).expect("rw").write();
    let wait = tokio::spawn(async move {
        let g = writer.acquire_timeout(WAITER_DEADLINE).await;
        (g, Instant::now())
    });
    // A new reader of the writer's own backend is held back once the writer waits.
    let late = b.rw_lock(n).expect("rw").read();
    until_writer_queued(&late).await;
    let outsider = client(dir.path()).rw_lock(n).expect("rw").read();
    assert!(outsider.try_acquire().await.expect("try").is_none());
    assert_eq!(
        r1.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // r2 still reads: the writer cannot get in, however long we look.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!wait.is_finished(), "writer in with a reader left");
    let released = Instant::now();
    assert_eq!(
        r2.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (g, at) = wait.await.expect("join");
    let g = g.expect("writer after the readers");
    // Woken by the last reader's release (see `PROMPT`).
    let latency = at.saturating_duration_since(released);
    assert!(
        latency < PROMPT,
        "writer got in {latency:?} after the release"
    );
    assert_eq!(holders(&be, n).await, [hv("write", g.owner(), 1)]);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // The turnstile was given back. (The backend's write thread, if the writer got in before
    // it, may hold the lock for an instant after this release before it unlocks: retry.)
    until_reader_passes(&late, "a new reader is kept out after the writer left").await;
}

/// Readers waiting on a writer get in together when it releases; a reader that gave up leaves
/// nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_wait_for_writer_and_enter_together() {
    let dir = TempDir::new("rwait");
    let (a, b, c) = (client(dir.path()), client(dir.path()), client(dir.path()));
    let n = "rwait";
    let w = a
        .rw_lock(n)
        .expect("rw")
        .write()
        .acquire()
        .await
        .expect("w");
    // A reader that gives up.
    let e = c
        .rw_lock(n)
        .expect("rw")
        .read()
        .acquire_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(e.is_timeout());
    let mut waits = Vec::new();
    for cl in [&b, &b, &c] {
        let lock = cl.rw_lock(n).expect("rw").read();
        waits.push(tokio::spawn(async move {
            let g = lock.acquire_timeout(WAITER_DEADLINE).await;
            (g, Instant::now())
        }));
    }
    // Time for the readers to start waiting (a slower one just finds the lock free later);
    // none can get in while the writer holds the lock, however slow the machine.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        waits.iter().all(|t| !t.is_finished()),
        "a reader passed the writer"
    );
    let released = Instant::now();
    let wt = w.fencing_token();
    assert_eq!(
        w.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let mut guards = Vec::new();
    for t in waits {
        let (g, at) = t.await.expect("join");
        guards.push(g.expect("reader after the writer"));
        let latency = at.saturating_duration_since(released);
        // Woken by the writer's release (see `PROMPT`).
        assert!(latency < PROMPT, "reader woke {latency:?} late");
    }
    // All three hold the read side at once.
    assert_eq!(
        holders(&FileBackend::open(dir.path(), &opts()).expect("open"), n)
            .await
            .len(),
        3
    );
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    assert!(tokens.iter().all(|&t| t > wt), "{tokens:?}");
    for g in guards {
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    let g = a
        .rw_lock(n)
        .expect("rw")
        .write()
        .acquire_timeout(WAITER_DEADLINE)
        .await
        .expect("write after the readers");
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_releases_of_each_side() {
    let dir = TempDir::new("watch");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let n = "watch";
    let g = granted(&a, n, "r", LockKind::Read).await;
    let mut ww = b.watch(&req(n, "w", LockKind::Write)).await.expect("watch");
    let quiet = tokio::time::timeout(Duration::from_millis(150), ww.changed()).await;
    assert!(quiet.is_err(), "watch fired while the lock stayed read");
    assert_eq!(release(&a, &g).await, ReleaseOutcome::Released);
    tokio::time::timeout(PATIENCE, ww.changed())
        .await
        .expect("no wake-up")
        .expect("watch broke");
    drop(ww);
    let g = granted(&a, n, "w", LockKind::Write).await;
    let mut wr = b.watch(&req(n, "r", LockKind::Read)).await.expect("watch");
    let quiet = tokio::time::timeout(Duration::from_millis(150), wr.changed()).await;
    assert!(quiet.is_err(), "watch fired while the lock stayed written");
    assert_eq!(release(&a, &g).await, ReleaseOutcome::Released);
    tokio::time::timeout(PATIENCE, wr.changed())
        .await
        .expect("no wake-up")
        .expect("watch broke");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_rw_file_is_detected_at_renewal() {
    let dir = TempDir::new("deleted");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let n = "deleted";
    let gw = granted(&a, n, "w", LockKind::Write).await;
    let mut dq = req(n, "w", LockKind::Read);
    dq.write_grant = Some(gw.clone());
    let gr = granted_to(&a, &dq).await;
    let [main, _, _] = a.rw_lock_files(n);
    std::fs::remove_file(&main).expect("remove");
    // A new file is a new lock: b gets it, so a must learn that it lost both sides.
    let gx = granted(&b, n, "x", LockKind::Write).await;
    let renew = [
        (gw.clone(), Duration::from_secs(1)),
        (gr.clone(), Duration::from_secs(1)),
    ];
    assert_eq!(
        a.renew(&renew).await.expect("renew"),
        [RenewOutcome::NotHeld, RenewOutcome::NotHeld]
    );
    assert_eq!(release(&a, &gw).await, ReleaseOutcome::TakenByOther);
    assert_eq!(release(&b, &gx).await, ReleaseOutcome::Released);
    assert_eq!(release(&a, &gr).await, ReleaseOutcome::Expired);
}

/// Writers of several backends and processes-in-spirit never overlap anything; readers do
/// overlap; every grant's token is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hammer_readers_and_writers() {
    let dir = TempDir::new("hammer");
    let clients: Vec<Client> = (0..3).map(|_| client(dir.path())).collect();
    let n = "hammer";
    let readers = Arc::new(AtomicU64::new(0));
    let writers = Arc::new(AtomicU64::new(0));
    let max_readers = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let rw = clients[i % 3].rw_lock(n).expect("rw");
        let (readers, writers, max_readers, tokens) = (
            readers.clone(),
            writers.clone(),
            max_readers.clone(),
            tokens.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..6 {
                if (i + round) % 4 == 0 {
                    let g = rw
                        .write()
                        .acquire_timeout(Duration::from_secs(30))
                        .await
                        .expect("w");
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "writer with readers");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                } else {
                    let g = rw
                        .read()
                        .acquire_timeout(Duration::from_secs(30))
                        .await
                        .expect("r");
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    max_readers.fetch_max(now, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "reader with a writer");
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    readers.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let mut tokens = tokens.lock().expect("tokens").clone();
    let total = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), total, "a token was granted twice");
    assert!(
        max_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared"
    );
    assert!(holders(&backend(dir.path()), n).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Across processes.

const CHILD_DIR: &str = "DLOCK_FILE_RW_CHILD_DIR";
const CHILD_MODE: &str = "DLOCK_FILE_RW_CHILD_MODE";
const NAME: &str = "xproc/rw";

/// How long a child holds its lock if nobody kills it: far beyond any waiter's deadline.
const CHILD_HOLD: Duration = Duration::from_secs(120);

/// How long to wait for a child process to answer: starting one is slow on a loaded machine.
const CHILD_PATIENCE: Duration = Duration::from_secs(30);

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct ChildProc {
    child: KillOnDrop,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ChildProc {
    /// Re-executes this test binary as `child_rw` in `mode` (`read`, `write`: take that side,
    /// print `HELD <token> <owner>`, then sleep until killed; `tryread`: print `TRY granted`
    /// or `TRY held` and exit).
    fn spawn(dir: &Path, mode: &str) -> ChildProc {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = KillOnDrop(
            Command::new(exe)
                .args(["--exact", "child_rw", "--nocapture", "--test-threads=1"])
                .env(CHILD_DIR, dir)
                .env(CHILD_MODE, mode)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn child"),
        );
        let stdout = child.0.stdout.take().expect("child stdout");
        ChildProc {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next line the child prints that starts with `prefix` (libtest may print `test
    /// child_rw ... ` before it on the same line), within `CHILD_PATIENCE`.
    async fn expect(mut self, prefix: &'static str) -> (ChildProc, String) {
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
    async fn held(self) -> (ChildProc, u64, String) {
        let (me, line) = self.expect("HELD ").await;
        let mut parts = line.splitn(3, ' ').skip(1);
        let token = parts.next().and_then(|t| t.parse().ok()).expect("token");
        let owner = parts.next().expect("owner").to_owned();
        (me, token, owner)
    }

    fn kill(&mut self) {
        self.child.0.kill().expect("SIGKILL child");
        let _ = self.child.0.wait();
    }
}

/// Helper of the cross-process tests, run in a child process; does nothing otherwise.
#[test]
fn child_rw() {
    let (Some(dir), Some(mode)) = (std::env::var_os(CHILD_DIR), std::env::var(CHILD_MODE).ok())
    else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = client(Path::new(&dir));
        let rw = c.rw_lock(NAME).expect("rw");
        let lock = match mode.as_str() {
            "read" => rw.read(),
            "write" => rw.write(),
            "tryread" => {
                let g = rw.read().try_acquire().await.expect("try");
                println!("TRY {}", if g.is_some() { "granted" } else { "held" });
                return;
            }
            other => panic!("unknown child mode {other}"),
        };
        let g = lock.acquire().await.expect("acquire");
        println!("HELD {} {}", g.fencing_token(), g.owner());
        // Killed by the parent long before this ends.
        tokio::time::sleep(CHILD_HOLD).await;
        drop(g);
    });
}

/// Two reader processes share the lock with this one; a writer is kept out until the last
/// reader dies; `inspect` lists every reader with its side, and forgets killed ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_processes_share_and_exclude_a_writer() {
    let dir = TempDir::new("xshare");
    let (r1, t1, o1) = ChildProc::spawn(dir.path(), "read").held().await;
    let (mut r2, t2, o2) = ChildProc::spawn(dir.path(), "read").held().await;
    assert_ne!(t1, t2);
    let c = client(dir.path());
    let mine = c
        .rw_lock(NAME)
        .expect("rw")
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("readers of three processes share");
    let b = backend(dir.path());
    let info = b.inspect(NAME, LockKind::Write).await.expect("inspect");
    let mut got: Vec<(Option<LockKind>, String, u32)> = info
        .holders
        .iter()
        .map(|h| (h.side, h.owner.clone(), h.count))
        .collect();
    got.sort_by(|a, b| a.1.cmp(&b.1));
    let mut want = vec![
        (Some(LockKind::Read), o1.clone(), 1),
        (Some(LockKind::Read), o2.clone(), 1),
        (Some(LockKind::Read), mine.owner().to_owned(), 1),
    ];
    want.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got, want);
    assert_eq!(info.fencing_token, mine.fencing_token());

    let writer = client(dir.path()).rw_lock(NAME).expect("rw").write();
    assert!(writer.try_acquire().await.expect("try").is_none());
    assert_eq!(
        mine.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(
        writer.try_acquire().await.expect("try").is_none(),
        "child readers ignored"
    );
    let w = writer.clone();
    let wait = tokio::spawn(async move {
        let g = w.acquire_timeout(WAITER_DEADLINE).await;
        (g, Instant::now())
    });
    // Time for the writer to start waiting (if it is slower, it just finds the lock free
    // later); it cannot get in while a reader process lives, however slow the machine.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Killing one reader is not enough.
    r2.kill();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !wait.is_finished(),
        "writer in while a reader process lives"
    );
    let info = b.inspect(NAME, LockKind::Read).await.expect("inspect");
    let owners: Vec<&str> = info.holders.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(owners, [o1.as_str()], "a killed reader is still listed");
    let mut r1 = r1;
    let killed_at = Instant::now();
    r1.kill();
    let (g, got_at) = wait.await.expect("join");
    let g = g.expect("writer after the reader processes died");
    let latency = got_at.saturating_duration_since(killed_at);
    // Freed by the kernel when the last reader died: the children would only release after
    // `CHILD_HOLD`, long after the writer's deadline (see `PROMPT`).
    assert!(latency < PROMPT, "writer got in {latency:?} after the kill");
    assert!(g.fencing_token() > t1.max(t2));
    assert_eq!(
        holders(&b, NAME).await,
        [hv("write", g.owner(), 1)],
        "stale lines of killed readers"
    );
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

/// A killed reader process frees the lock for a waiting writer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_reader_frees_lock_for_writer() {
    let dir = TempDir::new("xkill");
    let (mut r, token, owner) = ChildProc::spawn(dir.path(), "read").held().await;
    let b = backend(dir.path());
    assert_eq!(holders(&b, NAME).await, [hv("read", &owner, 1)]);
    let writer = client(dir.path()).rw_lock(NAME).expect("rw").write();
    let wait = tokio::spawn(async move {
        let g = writer.acquire_timeout(WAITER_DEADLINE).await;
        (g, Instant::now())
    });
    // Time for the writer to start waiting; it cannot get in while the reader lives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!wait.is_finished(), "writer got a read lock");
    let killed_at = Instant::now();
    r.kill();
    let (g, got_at) = wait.await.expect("join");
    let g = g.expect("lock not freed by the reader's death");
    let latency = got_at.saturating_duration_since(killed_at);
    // Freed by the kernel when the reader died, not at the end of its `CHILD_HOLD` (see
    // `PROMPT`).
    assert!(latency < PROMPT, "acquired {latency:?} after the kill");
    assert!(g.fencing_token() > token);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert!(holders(&b, NAME).await.is_empty());
}

/// A writer process excludes readers (listed with its side); a writer waiting in this process
/// holds back readers of other processes; a killed writer frees the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_processes_and_cross_process_turnstile() {
    let dir = TempDir::new("xwrite");
    let (mut w, wt, wo) = ChildProc::spawn(dir.path(), "write").held().await;
    let b = backend(dir.path());
    assert_eq!(holders(&b, NAME).await, [hv("write", &wo, 1)]);
    let (_, line) = ChildProc::spawn(dir.path(), "tryread").expect("TRY ").await;
    assert_eq!(line, "TRY held", "a reader process passed a writer process");
    let reader = client(dir.path()).rw_lock(NAME).expect("rw").read();
    assert!(reader.try_acquire().await.expect("try").is_none());
    let r = reader.clone();
    let wait = tokio::spawn(async move {
        let g = r.acquire_timeout(WAITER_DEADLINE).await;
        (g, Instant::now())
    });
    // Time for the reader to start waiting; it cannot get in while the writer lives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!wait.is_finished());
    let killed_at = Instant::now();
    w.kill();
    let (g, got_at) = wait.await.expect("join");
    let g = g.expect("lock not freed by the writer's death");
    // Freed by the kernel when the writer died, not at the end of its `CHILD_HOLD` (see
    // `PROMPT`).
    let latency = got_at.saturating_duration_since(killed_at);
    assert!(latency < PROMPT, "acquired {latency:?} after the kill");
    assert!(g.fencing_token() > wt);
    assert_eq!(holders(&b, NAME).await, [hv("read", g.owner(), 1)]);

    // Now this process reads and a writer of this process waits: a reader process may not
    // pass it.
    let writer = client(dir.path()).rw_lock(NAME).expect("rw").write();
    let wr = writer.clone();
    // It must still wait when the child process tries, however long that takes to start.
    let writer_wait = PATIENCE + CHILD_PATIENCE + WAITER_DEADLINE;
    let wwait = tokio::spawn(async move { wr.acquire_timeout(writer_wait).await });
    // Once the writer waits, a new reader of another backend that could share the lock with
    // this one is held back.
    until_writer_queued(&client(dir.path()).rw_lock(NAME).expect("rw").read()).await;
    let (_, line) = ChildProc::spawn(dir.path(), "tryread").expect("TRY ").await;
    assert_eq!(line, "TRY held", "a reader process passed a waiting writer");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let wg = wwait.await.expect("join").expect("writer after the reader");
    assert_eq!(
        wg.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (_, line) = ChildProc::spawn(dir.path(), "tryread").expect("TRY ").await;
    assert_eq!(line, "TRY granted");
}

// ---------------------------------------------------------------------------------------------
// The grant-addressed protocol.

/// True if someone holds a lock on `path` that keeps a shared `flock` out (probed with
/// `LOCK_SH | LOCK_NB` on a descriptor of our own, unlocked again at once).
fn locked_exclusively(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock only reads the descriptor number, which `f` keeps open.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    r != 0
}

/// A read waiter and a write waiter of one `RwLock` handle (one owner id, two attempts) wait
/// for another client's writer together: both get in, one after the other (the read side is
/// never granted beside a write grant the request does not name), and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_and_write_waiters_of_one_handle() {
    let dir = TempDir::new("onehandle");
    let (a, b) = (client(dir.path()), client(dir.path()));
    let n = "one/handle";
    let [_, turnstile, _] = backend(dir.path()).rw_lock_files(n);
    for reader_first in [true, false] {
        let wb = b
            .rw_lock(n)
            .expect("rw")
            .write()
            .acquire()
            .await
            .expect("b writes");
        let rw = a.rw_lock(n).expect("rw");
        let reading = Arc::new(AtomicU64::new(0));
        let writing = Arc::new(AtomicU64::new(0));
        let spawn = |write: bool| {
            let lock = if write { rw.write() } else { rw.read() };
            let (reading, writing) = (reading.clone(), writing.clone());
            tokio::spawn(async move {
                let g = lock
                    .acquire_timeout(WAITER_DEADLINE)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("{} waiter: {e}", if write { "write" } else { "read" })
                    });
                let (mine, theirs) = if write {
                    (&writing, &reading)
                } else {
                    (&reading, &writing)
                };
                mine.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    theirs.load(Ordering::SeqCst),
                    0,
                    "read and write held at once"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert_eq!(
                    theirs.load(Ordering::SeqCst),
                    0,
                    "read and write held at once"
                );
                mine.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(
                    g.release().await.expect("release"),
                    ReleaseOutcome::Released
                );
            })
        };
        let mut tasks = Vec::new();
        if reader_first {
            tasks.push(spawn(false));
            // Time for the reader to start waiting (if it is slower, it waits behind the
            // writer instead); it cannot get in while b writes.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tasks.push(spawn(true));
        // The writer waits once it holds the turnstile (b got the lock without waiting).
        let t = Instant::now();
        while !locked_exclusively(&turnstile) {
            assert!(t.elapsed() < PATIENCE, "the write waiter never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !reader_first {
            tasks.push(spawn(false));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            tasks.iter().all(|t| !t.is_finished()),
            "a waiter got in beside b's writer"
        );
        assert_eq!(
            wb.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        for t in tasks {
            t.await.expect("waiter");
        }
        assert_eq!(a.held_count(), 0);
        // Nothing is left held: a writer of a third client gets in.
        let g = client(dir.path())
            .rw_lock(n)
            .expect("rw")
            .write()
            .acquire_timeout(PROMPT)
            .await
            .expect("the lock stayed held");
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// Two clients with one owner id sharing one backend are two holders of a read-write lock:
/// the writer's owner id does not let the other client read beside it (no downgrade without
/// the write grant), nor write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_id_in_two_clients_is_two_holders() {
    let dir = TempDir::new("rwowner");
    let be = backend(dir.path());
    let (c1, c2) = (
        Client::new(be.clone(), opts()).expect("client"),
        Client::new(be.clone(), opts()).expect("client"),
    );
    let n = "rw/owner";
    let rw1 = c1
        .rw_lock(n)
        .expect("rw")
        .with_owner("same")
        .expect("owner");
    let rw2 = c2
        .rw_lock(n)
        .expect("rw")
        .with_owner("same")
        .expect("owner");
    let w = rw1.write().acquire().await.expect("write");
    assert!(
        rw2.read().try_acquire().await.expect("try").is_none(),
        "read beside another client's write"
    );
    assert!(
        rw2.write().try_acquire().await.expect("try").is_none(),
        "two writers"
    );
    // The writer's own client downgrades (it names its grant).
    let r = rw1
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("downgrade");
    assert!(r.fencing_token() > w.fencing_token());
    assert_eq!(
        w.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    // Now only read: the other client reads too.
    let r2 = rw2
        .read()
        .try_acquire()
        .await
        .expect("try")
        .expect("readers share");
    for g in [r, r2] {
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
}

/// A write waiter that gives up while its backend's write thread is blocked in the kernel:
/// when the lock frees after that, the thread's lock is let go at once, and the turnstile it
/// held for the waiter was given back when the waiter left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_waiter_gave_up_before_its_flock_completed() {
    let dir = TempDir::new("rwgiveup");
    let (a, b, c) = (
        backend(dir.path()),
        backend(dir.path()),
        backend(dir.path()),
    );
    let n = "rw/giveup";
    let [_, turnstile, _] = a.rw_lock_files(n);
    let gr = granted(&a, n, "reader", LockKind::Read).await;
    let w = req(n, "writer", LockKind::Write);
    let cancel = tokio_util::sync::CancellationToken::new();
    let (b2, w2, c2) = (b.clone(), w.clone(), cancel.clone());
    let wait = tokio::spawn(async move { b2.acquire_wait(&w2, None, &c2).await });
    let t = Instant::now();
    while !locked_exclusively(&turnstile) {
        assert!(t.elapsed() < PATIENCE, "the write waiter never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    assert_eq!(wait.await.expect("join").expect("wait"), None);
    b.give_up(&w).await.expect("give up");
    b.give_up(&w).await.expect("give up again");
    assert!(
        !locked_exclusively(&turnstile),
        "the turnstile stayed closed"
    );
    // The reader leaves; b's write thread gets the lock for nobody and lets it go.
    assert_eq!(release(&a, &gr).await, ReleaseOutcome::Released);
    // Nobody else wants it now, so b's write thread gets it: it must let it go at once. It
    // takes it for an instant (seen held, the quiet period starts again); one that kept it
    // would be seen held for ever. (If the thread does not run within `QUIET` on a loaded
    // machine, this passes without having seen it: it can miss a regression, never fail a
    // correct backend.)
    const QUIET: Duration = Duration::from_millis(300);
    let [main, _, _] = a.rw_lock_files(n);
    let t = Instant::now();
    let mut free_since = Instant::now();
    loop {
        if locked_exclusively(&main) {
            free_since = Instant::now();
        } else if free_since.elapsed() >= QUIET {
            break;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "a write thread kept the lock after its waiter gave up"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let never = tokio_util::sync::CancellationToken::new();
    let cq = req(n, "c", LockKind::Write);
    let got = c
        .acquire_wait(&cq, Some(Instant::now() + PROMPT), &never)
        .await
        .expect("wait")
        .expect("the lock stayed held after the waiter gave up");
    assert_eq!(
        release(&c, &cq.grant(got.token)).await,
        ReleaseOutcome::Released
    );
    // A grant the caller never heard of is given back by its give_up, and only its own.
    let r = req(n, "o", LockKind::Write);
    let g = granted_to(&b, &r).await;
    b.give_up(&req(n, "o", LockKind::Write))
        .await
        .expect("other attempt");
    assert_eq!(
        b.renew(&[(g.clone(), Duration::from_secs(1))])
            .await
            .expect("renew"),
        [RenewOutcome::Renewed]
    );
    b.give_up(&r).await.expect("give up");
    assert_eq!(release(&b, &g).await, ReleaseOutcome::Expired);
    assert!(!b.inspect(n, LockKind::Write).await.expect("inspect").held());
}

/// A read or write waiter whose future is dropped after 0, 1, 5 or 20 ms of waiting for a
/// writer that releases at that very moment (so the grant often lands as the future goes)
/// leaves nothing held: a writer of a third client — which needs every side free — gets in at
/// once. The waiter shares the holder's backend, or has its own (kernel-blocked threads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_rw_acquire_at_any_point_leaves_nothing_held() {
    let dir = TempDir::new("rwcancel");
    let holder_backend = backend(dir.path());
    let holder = Client::new(holder_backend.clone(), opts()).expect("client");
    let third = client(dir.path());
    let n = "rw/cancel/point";
    for shared in [true, false] {
        let waiter = if shared {
            Client::new(holder_backend.clone(), opts()).expect("client")
        } else {
            client(dir.path())
        };
        for write in [false, true] {
            for ms in [0u64, 1, 5, 20] {
                let case = format!("shared={shared} write={write} drop after {ms} ms");
                let g = holder
                    .rw_lock(n)
                    .expect("rw")
                    .write()
                    .acquire_timeout(WAITER_DEADLINE)
                    .await
                    .unwrap_or_else(|e| panic!("{case}: holder: {e}"));
                let rw = waiter.rw_lock(n).expect("rw");
                let lock = if write { rw.write() } else { rw.read() };
                let wait = Duration::from_millis(ms);
                let w = tokio::spawn(async move {
                    tokio::time::timeout(wait, lock.acquire())
                        .await
                        .ok()
                        .map(|r| r.map(drop))
                });
                tokio::time::sleep(wait).await;
                assert_eq!(
                    g.release().await.expect("release"),
                    ReleaseOutcome::Released,
                    "{case}"
                );
                if let Some(r) = w.await.expect("waiter task") {
                    r.unwrap_or_else(|e| panic!("{case}: waiter: {e}"));
                }
                let g3 = third
                    .rw_lock(n)
                    .expect("rw")
                    .write()
                    .acquire_timeout(PROMPT)
                    .await
                    .unwrap_or_else(|e| panic!("{case}: the lock stayed held: {e}"));
                assert_eq!(
                    g3.release().await.expect("release"),
                    ReleaseOutcome::Released,
                    "{case}"
                );
                let t = Instant::now();
                while waiter.held_count() != 0 {
                    assert!(
                        t.elapsed() < PATIENCE,
                        "{case}: the waiter's client keeps a hold"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}
