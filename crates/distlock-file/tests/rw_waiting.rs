//! Waiting for a read-write lock of the `file://` backend: the turnstile that holds new
//! readers behind a waiting writer, readers entering together, watches, give-ups and
//! cancellation at any point.

mod common;

use common::*;
use distlock_core::{Backend, Client, LockKind, ReleaseOutcome, RenewOutcome};
use distlock_file::FileBackend;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A writer of another backend waits: new readers of any backend wait behind it, even while
/// the lock is only read; its giving up lets them in again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_writer_holds_back_new_readers_until_it_gives_up() {
    let dir = TempDir::new("turnstile");
    let (a, b, c) = (client(dir.path()), client(dir.path()), client(dir.path()));
    let n = "turnstile";
    let r1_lock = read_side(&a, n);
    let r1 = r1_lock.acquire().await.expect("r1");
    // Another owner of the reader's own backend may join while nobody waits.
    let r1b = read_side(&a, n).try_acquire().await.expect("try");
    assert!(r1b.is_some());
    drop(r1b);
    let writer = write_side(&b, n);
    let w = writer.clone();
    // The checks below must be done before the writer gives up: a wide window, which the test
    // then waits out.
    let writer_wait = Duration::from_secs(3);
    let wait = tokio::spawn(async move { w.acquire_timeout(writer_wait).await });
    until_writer_queued(&read_side(&c, n)).await;
    for cl in [&a, &c] {
        let late = read_side(cl, n);
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
    let g = read_side(&c, n).try_acquire().await.expect("try");
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
    let reader = read_side(&c, n);
    until_reader_passes(
        &reader,
        "the turnstile stayed closed after the writer was cancelled",
    )
    .await;
    released(r1).await;
    // b's write thread wakes, finds no waiter and unlocks.
    acquire_and_release(&writer, WAITER_DEADLINE, "writer after the readers left").await;
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
    let r1 = read_side(&a, n).acquire().await.expect("r1");
    let r2 = read_side(&b, n).try_acquire().await.expect("try");
    let r2 = r2.expect("readers of one backend share");
    let writer = write_side(&a, n);
    let wait = Waiter::spawn(writer);
    // A new reader of the writer's own backend is held back once the writer waits.
    let late = read_side(&b, n);
    until_writer_queued(&late).await;
    let outsider = read_side(&client(dir.path()), n);
    assert!(outsider.try_acquire().await.expect("try").is_none());
    released(r1).await;
    // r2 still reads: the writer cannot get in, however long we look.
    let what = "writer in with a reader left";
    wait.still_waiting(Duration::from_millis(100), what).await;
    let released_at = Instant::now();
    released(r2).await;
    // Woken by the last reader's release.
    let g = wait
        .woken_after(released_at, "the writer after the readers")
        .await;
    assert_eq!(holders(&be, n).await, [hv("write", g.owner(), 1)]);
    released(g).await;
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
    let w = write_side(&a, n).acquire().await.expect("w");
    // A reader that gives up.
    let e = read_side(&c, n)
        .acquire_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(e.is_timeout());
    let waits: Vec<Waiter> = [&b, &b, &c]
        .into_iter()
        .map(|cl| Waiter::spawn(read_side(cl, n)))
        .collect();
    // Time for the readers to start waiting (a slower one just finds the lock free later);
    // none can get in while the writer holds the lock, however slow the machine.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        waits.iter().all(|t| !t.is_finished()),
        "a reader passed the writer"
    );
    let released_at = Instant::now();
    let wt = w.fencing_token();
    released(w).await;
    let mut guards = Vec::new();
    for t in waits {
        // Woken by the writer's release.
        guards.push(
            t.woken_after(released_at, "a reader after the writer")
                .await,
        );
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
        released(g).await;
    }
    let writer = write_side(&a, n);
    acquire_and_release(&writer, WAITER_DEADLINE, "write after the readers").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_releases_of_each_side() {
    let dir = TempDir::new("watch");
    let (a, b) = (backend(dir.path()), backend(dir.path()));
    let n = "watch";
    // A watch of each side, while the other side is held: quiet until the release.
    for (held, watched, what) in [
        (LockKind::Read, LockKind::Write, "read"),
        (LockKind::Write, LockKind::Read, "written"),
    ] {
        let g = rw_granted(&a, n, "holder", held).await;
        let mut w = b
            .watch(&rw_req(n, "watcher", watched))
            .await
            .expect("watch");
        let quiet = tokio::time::timeout(Duration::from_millis(150), w.changed()).await;
        assert!(quiet.is_err(), "watch fired while the lock stayed {what}");
        assert_eq!(release(&a, &g).await, ReleaseOutcome::Released);
        tokio::time::timeout(PATIENCE, w.changed())
            .await
            .expect("no wake-up")
            .expect("watch broke");
    }
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
        let wb = write_side(&b, n).acquire().await.expect("b writes");
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
                released(g).await;
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
        until_locked(&turnstile, "the write waiter never queued").await;
        if !reader_first {
            tasks.push(spawn(false));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            tasks.iter().all(|t| !t.is_finished()),
            "a waiter got in beside b's writer"
        );
        released(wb).await;
        for t in tasks {
            t.await.expect("waiter");
        }
        assert_eq!(a.held_count(), 0);
        // Nothing is left held: a writer of a third client gets in.
        let third = write_side(&client(dir.path()), n);
        acquire_and_release(&third, PROMPT, "the lock stayed held").await;
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
    let gr = rw_granted(&a, n, "reader", LockKind::Read).await;
    let w = rw_req(n, "writer", LockKind::Write);
    let cancel = tokio_util::sync::CancellationToken::new();
    let (b2, w2, c2) = (b.clone(), w.clone(), cancel.clone());
    let wait = tokio::spawn(async move { b2.acquire_wait(&w2, None, &c2).await });
    until_locked(&turnstile, "the write waiter never queued").await;
    cancel.cancel();
    assert_eq!(wait.await.expect("join").expect("wait"), None);
    b.give_up(&w).await.expect("give up");
    b.give_up(&w).await.expect("give up again");
    assert!(!locked(&turnstile), "the turnstile stayed closed");
    // The reader leaves; b's write thread gets the lock for nobody and lets it go.
    assert_eq!(release(&a, &gr).await, ReleaseOutcome::Released);
    // Nobody else wants it now, so b's write thread gets it: it must let it go at once.
    let [main, _, _] = a.rw_lock_files(n);
    stays_free(
        &main,
        "a write thread kept the lock after its waiter gave up",
    )
    .await;
    let never = tokio_util::sync::CancellationToken::new();
    let cq = rw_req(n, "c", LockKind::Write);
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
    let r = rw_req(n, "o", LockKind::Write);
    let g = granted(&b, &r).await;
    b.give_up(&rw_req(n, "o", LockKind::Write))
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
                let g = write_side(&holder, n)
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
                let writer = write_side(&third, n);
                let stayed = format!("{case}: the lock stayed held");
                acquire_and_release(&writer, PROMPT, &stayed).await;
                wait_until(
                    &format!("{case}: the waiter's client keeps a hold"),
                    || async { waiter.held_count() == 0 },
                )
                .await;
            }
        }
    }
}
