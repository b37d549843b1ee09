//! The read-write lock on a real ensemble, beyond the conformance cases: counters that prove
//! readers overlap and writers are alone, and the downgrade with a writer already queued.

use distlock_core::LockKind;
use distlock_testkit::conformance::{fast_opts, unique_name, wait_for_waiters};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{released, shared_client as client};

/// Readers and writers from three clients take turns for a while. Counters kept inside the
/// critical sections prove the rules: a writer never overlaps anyone, and readers do overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_prove_readers_share_and_writers_exclude() {
    let name = unique_name("rw-counters");
    let readers_in = Arc::new(AtomicU64::new(0));
    let writers_in = Arc::new(AtomicU64::new(0));
    let max_readers = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let write_tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..3 {
        let client = client(fast_opts()).await;
        for t in 0..3 {
            let writer = t == 0;
            let (client, name) = (client.clone(), name.clone());
            let (readers_in, writers_in, max_readers, violations, write_tokens) = (
                readers_in.clone(),
                writers_in.clone(),
                max_readers.clone(),
                violations.clone(),
                write_tokens.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let rw = client.rw_lock(&name).expect("rw");
                for round in 0..4 {
                    if writer {
                        let g = rw
                            .write()
                            .acquire_timeout(Duration::from_secs(30))
                            .await
                            .expect("write");
                        if writers_in.fetch_add(1, Ordering::SeqCst) != 0
                            || readers_in.load(Ordering::SeqCst) != 0
                        {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        write_tokens.lock().expect("tokens").push(g.fencing_token());
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        writers_in.fetch_sub(1, Ordering::SeqCst);
                        g.release().await.expect("release");
                    } else {
                        let g = rw
                            .read()
                            .acquire_timeout(Duration::from_secs(30))
                            .await
                            .expect("read");
                        let now = readers_in.fetch_add(1, Ordering::SeqCst) + 1;
                        max_readers.fetch_max(now, Ordering::SeqCst);
                        if writers_in.load(Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        // Stay long enough for the other readers to come in. Until readers
                        // have been seen together, wait for one to join (a loaded machine can
                        // spread out grants that come together), but not for long: the next
                        // in line may be a writer, who waits for us.
                        tokio::time::sleep(Duration::from_millis(40)).await;
                        let t = Instant::now();
                        while max_readers.load(Ordering::SeqCst) < 2
                            && t.elapsed() < Duration::from_secs(1)
                        {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        readers_in.fetch_sub(1, Ordering::SeqCst);
                        g.release().await.expect("release");
                    }
                    tokio::time::sleep(Duration::from_millis(3 * (c + round) as u64)).await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0, "a writer overlapped");
    assert!(
        max_readers.load(Ordering::SeqCst) >= 2,
        "readers never overlapped"
    );
    let tokens = write_tokens.lock().expect("tokens").clone();
    assert_eq!(tokens.len(), 12);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "write tokens not increasing in grant order: {tokens:?}"
    );
}

/// The downgrade when a writer already waits: the old writer keeps reading, the waiting
/// writer still waits for it, and a reader arriving after the waiting writer queues behind it
/// (writers are not starved). Then the waiting writer gets the lock when the reading stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_with_a_writer_queued() {
    let name = unique_name("rw-downgrade");
    let a = client(fast_opts()).await;
    let b = client(fast_opts()).await;
    let c = client(fast_opts()).await;
    let rw = a.rw_lock(&name).expect("rw");
    let w = rw
        .write()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("write");
    let r = rw
        .read()
        .try_acquire()
        .await
        .expect("read")
        .expect("downgrade");
    assert_eq!(r.fencing_token(), w.fencing_token(), "one node, one token");
    let t1 = w.fencing_token();

    let queued = b.rw_lock(&name).expect("rw").write();
    let writer = tokio::spawn(async move { queued.acquire_timeout(Duration::from_secs(20)).await });
    // The writer queues (its node exists) before the write side goes.
    wait_for_waiters(&c, &name, LockKind::Write, 1).await;

    released(w).await;
    let info = c
        .inspect_kind(&name, LockKind::Read)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].side, Some(LockKind::Read));
    assert_eq!(info.holders[0].owner, rw.read().owner());
    assert_eq!(info.waiters, Some(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "a writer passed a reader");
    let late = c
        .rw_lock(&name)
        .expect("rw")
        .read()
        .try_acquire()
        .await
        .expect("try");
    assert!(late.is_none(), "a new reader passed a waiting writer");

    released(r).await;
    let w2 = writer.await.expect("join").expect("the queued writer");
    let t2 = w2.fencing_token();
    assert!(t2 > t1);
    let info = c
        .inspect_kind(&name, LockKind::Write)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].side, Some(LockKind::Write));
    assert_eq!(info.fencing_token, t2);
    released(w2).await;
    let info = c
        .inspect_kind(&name, LockKind::Read)
        .await
        .expect("inspect");
    assert!(!info.held());
    assert_eq!(info.fencing_token, t2, "last token recorded");
}
