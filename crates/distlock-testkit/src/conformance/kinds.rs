//! The other lock kinds: read-write locks, fair locks, semaphores and multi-locks.

use super::prelude::*;

/// Readers share the lock, a writer excludes everyone: three readers must all be inside at
/// once (a barrier only they can pass together), and no reader is ever inside with a writer.
pub async fn rw_readers_share_writer_excludes<H: Harness>(h: &H) {
    let name = unique_name("rw");
    let a = h.client(fast_opts()).await;
    let Some(g) = supported(
        "rw",
        a.rw_lock(&name).expect("rw").read().try_acquire().await,
    )
    .await
    else {
        return;
    };
    drop(g.expect("free"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let readers_in = Arc::new(AtomicU64::new(0));
    let writers_in = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    // Writers start once every reader holds the lock: a writer queued between two readers
    // would (rightly) make the later reader wait behind it, and the barrier could never open.
    let readers_holding = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let c = h.client(fast_opts()).await;
        let (name, readers_in, writers_in, violations, barrier, holding) = (
            name.clone(),
            readers_in.clone(),
            writers_in.clone(),
            violations.clone(),
            barrier.clone(),
            readers_holding.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let rw = c.rw_lock(&name).expect("rw");
            if i < 3 {
                let g = rw
                    .read()
                    .acquire_timeout(Duration::from_secs(10))
                    .await
                    .expect("read");
                readers_in.fetch_add(1, Ordering::SeqCst);
                holding.fetch_add(1, Ordering::SeqCst);
                if writers_in.load(Ordering::SeqCst) > 0 {
                    violations.fetch_add(1, Ordering::SeqCst);
                }
                // Only possible if all three readers hold the lock at the same time.
                tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                    .await
                    .expect("readers did not share the lock");
                readers_in.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            } else {
                let t = Instant::now();
                while holding.load(Ordering::SeqCst) < 3 {
                    assert!(
                        t.elapsed() < Duration::from_secs(10),
                        "readers never got in"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                for _ in 0..3 {
                    let g = rw
                        .write()
                        .acquire_timeout(Duration::from_secs(20))
                        .await
                        .expect("write");
                    if writers_in.fetch_add(1, Ordering::SeqCst) > 0
                        || readers_in.load(Ordering::SeqCst) > 0
                    {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    writers_in.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.expect("release");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "a writer overlapped another holder"
    );
}

/// A writer may also take the read side (downgrade) without deadlock, and keep reading after
/// it lets the write side go; write grants get strictly increasing fencing tokens.
pub async fn rw_downgrade_and_tokens<H: Harness>(h: &H) {
    let name = unique_name("rwdown");
    let (a, b) = pair(h, fast_opts()).await;
    let rw = a.rw_lock(&name).expect("rw");
    let Some(w) = supported(
        "rw_downgrade",
        rw.write().acquire_timeout(Duration::from_secs(5)).await,
    )
    .await
    else {
        return;
    };
    let r = rw
        .read()
        .try_acquire()
        .await
        .expect("read")
        .expect("downgrade");
    let other = b.rw_lock(&name).expect("rw");
    assert!(
        other.read().try_acquire().await.expect("try").is_none(),
        "reader passed a writer"
    );
    let t1 = w.fencing_token();
    assert_released(w).await;
    // Now only our read hold remains: other readers may join, writers may not.
    let r2 = other
        .read()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("reader after downgrade");
    let third = h.client(fast_opts()).await;
    let third = third.rw_lock(&name).expect("rw");
    assert!(third.write().try_acquire().await.expect("try").is_none());
    // A reader asking for the write side is refused at once (an upgrade could deadlock).
    let err = other.write().try_acquire().await.expect_err("upgrade");
    assert!(
        matches!(err, distlock_core::Error::InvalidArgument(_)),
        "{err:?}"
    );
    assert_released(r).await;
    assert_released(r2).await;
    let w2 = other
        .write()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("write");
    assert!(w2.fencing_token() > t1);
    assert_released(w2).await;
}

/// A stream of readers does not starve a waiting writer: once a writer waits, new readers
/// wait behind it.
pub async fn rw_writer_not_starved<H: Harness>(h: &H) {
    let name = unique_name("rwstarve");
    let (a, b) = pair(h, fast_opts()).await;
    let c = h.client(fast_opts()).await;
    let Some(r1) = supported(
        "rw_writer_not_starved",
        a.rw_lock(&name).expect("rw").read().try_acquire().await,
    )
    .await
    else {
        return;
    };
    let r1 = r1.expect("free");
    let wlock = b.rw_lock(&name).expect("rw").write();
    let writer = tokio::spawn(async move { wlock.acquire_timeout(Duration::from_secs(20)).await });
    // While r1 holds a read lock, the only thing that can turn a new reader away is the
    // waiting writer. A reader that arrives before the writer has queued rightly gets in (it
    // is let go at once); once the writer waits, new readers must be refused.
    let late_rw = c.rw_lock(&name).expect("rw");
    let t = Instant::now();
    loop {
        match late_rw.read().try_acquire().await.expect("try") {
            None => break,
            Some(early) => {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "a new reader passed a waiting writer"
                );
                early.release().await.expect("release");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(!writer.is_finished(), "writer got in with a reader inside");
    assert_released(r1).await;
    let w = writer.await.expect("join").expect("writer got the lock");
    assert_released(w).await;
}

/// A fair lock serves waiters in arrival order.
pub async fn fair_lock_fifo<H: Harness>(h: &H) {
    let name = unique_name("fair");
    let a = h.client(fast_opts()).await;
    let Some(g) = supported(
        "fair",
        a.fair_lock(&name).expect("fair").try_acquire().await,
    )
    .await
    else {
        return;
    };
    let g = g.expect("free");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let c = h.client(fast_opts()).await;
        let (lock_name, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = c
                .fair_lock(&lock_name)
                .expect("fair")
                .acquire_timeout(Duration::from_secs(20))
                .await
                .expect("acquire");
            order.lock().expect("order").push(i);
            g.release().await.expect("release");
        }));
        // Let each waiter queue before the next arrives.
        wait_for_waiters(&a, &name, LockKind::Fair, i + 1).await;
    }
    assert_released(g).await;
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4]);
}

/// A semaphore of 3 permits: a fourth waits; a release lets it in; a crashed holder's permit
/// comes back at its lease end; several permits at once.
pub async fn semaphore_permits<H: Harness>(h: &H) {
    let name = unique_name("sem");
    let (a, b) = pair(h, fast_opts()).await;
    let sem = a.semaphore(&name, 3).expect("sem");
    let Some(g1) = supported("semaphore", sem.try_acquire(1).await).await else {
        return;
    };
    let g1 = g1.expect("permit");
    let g2 = sem.try_acquire(1).await.expect("try").expect("permit");
    // The crashed permit's lease counts from its request: it cannot come back before 400 ms
    // after this instant.
    let t = Instant::now();
    let crashed = sem
        .clone()
        .lease(Duration::from_millis(400))
        .expect("lease")
        .try_acquire(1)
        .await
        .expect("try")
        .expect("permit");
    let other = b.semaphore(&name, 3).expect("sem");
    assert!(
        other.try_acquire(1).await.expect("try").is_none(),
        "a fourth permit"
    );
    let info = b
        .inspect_kind(&name, crashed_kind())
        .await
        .expect("inspect");
    assert_eq!(info.permits_in_use(), 3);
    assert!(g1.fencing_token() < g2.fencing_token());
    // The "crashed" holder never releases: its permit comes back at lease end.
    std::mem::forget(crashed);
    let g4 = other
        .acquire_timeout(1, Duration::from_secs(8))
        .await
        .expect("permit back at lease end");
    assert!(
        t.elapsed() >= Duration::from_millis(380),
        "{:?}",
        t.elapsed()
    );
    // Two permits at once wait for two free ones.
    let two = other.clone();
    let waiter = tokio::spawn(async move { two.acquire_timeout(2, Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "took 2 permits with 0 free");
    assert_released(g1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "took 2 permits with 1 free");
    assert_released(g2).await;
    let pair = waiter.await.expect("join").expect("two permits");
    assert_released(pair).await;
    assert_released(g4).await;
    assert!(
        sem.try_acquire(4).await.is_err(),
        "more permits than the semaphore has"
    );
    assert!(sem.try_acquire(0).await.is_err());
}

/// Two clients taking overlapping sets in opposite orders never deadlock; a multi-lock that
/// cannot get everything keeps nothing.
pub async fn multi_lock_no_deadlock<H: Harness>(h: &H) {
    let (x, y, z) = (unique_name("mx"), unique_name("my"), unique_name("mz"));
    let (a, b) = pair(h, fast_opts()).await;
    let sets = [
        vec![x.clone(), y.clone(), z.clone()],
        vec![z.clone(), y.clone(), x.clone()],
    ];
    let mut tasks = Vec::new();
    for (c, set) in [a.clone(), b.clone()].into_iter().zip(sets) {
        tasks.push(tokio::spawn(async move {
            let names: Vec<&str> = set.iter().map(String::as_str).collect();
            let m = c.multi_lock(&names).expect("multi");
            for _ in 0..10 {
                let g = m
                    .acquire_timeout(Duration::from_secs(20))
                    .await
                    .expect("no deadlock");
                assert_eq!(g.guards().len(), 3);
                tokio::task::yield_now().await;
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    // All or nothing: with y held elsewhere, a multi-lock of x and y keeps neither.
    let gy = b.lock(&y).expect("lock").acquire().await.expect("y");
    let m = a.multi_lock(&[&x, &y]).expect("multi");
    let err = m
        .acquire_timeout(Duration::from_millis(300))
        .await
        .expect_err("y is held");
    assert!(err.is_timeout(), "{err}");
    assert!(m.try_acquire().await.expect("try").is_none());
    assert!(
        !a.inspect(&x).await.expect("inspect").held(),
        "x left locked"
    );
    gy.release().await.expect("release");
    assert!(a.multi_lock(&[]).is_err());
}
