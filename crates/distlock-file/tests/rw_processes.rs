//! Read-write locks of the `file://` backend between real processes: the test binary
//! re-executes itself as a child reader or writer, which is killed.

mod common;

use common::*;
use distlock_core::{Backend, LockKind};
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

const CHILD_DIR: &str = "DLOCK_FILE_RW_CHILD_DIR";
const CHILD_MODE: &str = "DLOCK_FILE_RW_CHILD_MODE";

const NAME: &str = "xproc/rw";

/// Re-executes this test binary as `child_rw` in `mode` (`read`, `write`: take that side,
/// print `HELD <token> <owner>`, then sleep until killed; `tryread`: print `TRY granted` or
/// `TRY held` and exit).
fn spawn(dir: &Path, mode: &str) -> ChildProc {
    let env = [
        (CHILD_DIR, Some(dir.as_os_str())),
        (CHILD_MODE, Some(OsStr::new(mode))),
    ];
    ChildProc::spawn("child_rw", &env)
}

/// Helper of the cross-process tests, run in a child process; does nothing otherwise.
#[test]
fn child_rw() {
    let (Some(dir), Some(mode)) = (std::env::var_os(CHILD_DIR), std::env::var(CHILD_MODE).ok())
    else {
        return;
    };
    child_runtime(async {
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
    let (r1, t1, o1) = spawn(dir.path(), "read").held().await;
    let (mut r2, t2, o2) = spawn(dir.path(), "read").held().await;
    assert_ne!(t1, t2);
    let c = client(dir.path());
    let mine = read_side(&c, NAME)
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

    let writer = write_side(&client(dir.path()), NAME);
    assert!(writer.try_acquire().await.expect("try").is_none());
    released(mine).await;
    assert!(
        writer.try_acquire().await.expect("try").is_none(),
        "child readers ignored"
    );
    let wait = Waiter::spawn(writer.clone());
    // Time for the writer to start waiting (if it is slower, it just finds the lock free
    // later); it cannot get in while a reader process lives, however slow the machine.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Killing one reader is not enough.
    r2.kill();
    let what = "writer in while a reader process lives";
    wait.still_waiting(Duration::from_millis(200), what).await;
    let info = b.inspect(NAME, LockKind::Read).await.expect("inspect");
    let owners: Vec<&str> = info.holders.iter().map(|h| h.owner.as_str()).collect();
    assert_eq!(owners, [o1.as_str()], "a killed reader is still listed");
    let mut r1 = r1;
    let killed_at = Instant::now();
    r1.kill();
    // Freed by the kernel when the last reader died: the children would only release after
    // `CHILD_HOLD`, long after the writer's deadline.
    let what = "the writer after the reader processes died";
    let g = wait.woken_after(killed_at, what).await;
    assert!(g.fencing_token() > t1.max(t2));
    assert_eq!(
        holders(&b, NAME).await,
        [hv("write", g.owner(), 1)],
        "stale lines of killed readers"
    );
    released(g).await;
}

/// A killed reader process frees the lock for a waiting writer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_reader_frees_lock_for_writer() {
    let dir = TempDir::new("xkill");
    let (mut r, token, owner) = spawn(dir.path(), "read").held().await;
    let b = backend(dir.path());
    assert_eq!(holders(&b, NAME).await, [hv("read", &owner, 1)]);
    let writer = write_side(&client(dir.path()), NAME);
    let wait = Waiter::spawn(writer);
    let what = "writer got a read lock";
    wait.still_waiting(Duration::from_millis(200), what).await;
    let killed_at = Instant::now();
    r.kill();
    // Freed by the kernel when the reader died, not at the end of its `CHILD_HOLD`.
    let g = wait
        .woken_after(killed_at, "the writer after the reader's death")
        .await;
    assert!(g.fencing_token() > token);
    released(g).await;
    assert!(holders(&b, NAME).await.is_empty());
}

/// A writer process excludes readers (listed with its side); a writer waiting in this process
/// holds back readers of other processes; a killed writer frees the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_processes_and_cross_process_turnstile() {
    let dir = TempDir::new("xwrite");
    let (mut w, wt, wo) = spawn(dir.path(), "write").held().await;
    let b = backend(dir.path());
    assert_eq!(holders(&b, NAME).await, [hv("write", &wo, 1)]);
    let (_, line) = spawn(dir.path(), "tryread").expect("TRY ").await;
    assert_eq!(line, "TRY held", "a reader process passed a writer process");
    let reader = read_side(&client(dir.path()), NAME);
    assert!(reader.try_acquire().await.expect("try").is_none());
    let wait = Waiter::spawn(reader.clone());
    let what = "a reader got in beside a writer process";
    wait.still_waiting(Duration::from_millis(200), what).await;
    let killed_at = Instant::now();
    w.kill();
    // Freed by the kernel when the writer died, not at the end of its `CHILD_HOLD`.
    let g = wait
        .woken_after(killed_at, "the reader after the writer's death")
        .await;
    assert!(g.fencing_token() > wt);
    assert_eq!(holders(&b, NAME).await, [hv("read", g.owner(), 1)]);

    // Now this process reads and a writer of this process waits: a reader process may not
    // pass it.
    let writer = write_side(&client(dir.path()), NAME);
    let wr = writer.clone();
    // It must still wait when the child process tries, however long that takes to start.
    let writer_wait = PATIENCE + CHILD_PATIENCE + WAITER_DEADLINE;
    let wwait = tokio::spawn(async move { wr.acquire_timeout(writer_wait).await });
    // Once the writer waits, a new reader of another backend that could share the lock with
    // this one is held back.
    until_writer_queued(&read_side(&client(dir.path()), NAME)).await;
    let (_, line) = spawn(dir.path(), "tryread").expect("TRY ").await;
    assert_eq!(line, "TRY held", "a reader process passed a waiting writer");
    released(g).await;
    let wg = wwait.await.expect("join").expect("writer after the reader");
    released(wg).await;
    let (_, line) = spawn(dir.path(), "tryread").expect("TRY ").await;
    assert_eq!(line, "TRY granted");
}
