//! Semaphore edges, data loss, and a contended soak watched by a fenced register and an
//! overlap recorder.

use super::*;

/// Semaphore edge cases: a request above the limit is `InvalidArgument`; a client that
/// believes in a larger limit than the semaphore has does not get permits beyond it; after
/// `set_permits` lowers the limit below a queued demand, smaller requests that fit still get
/// permits.
pub async fn semaphore_edges<H: Harness>(h: &H) {
    let case = "semaphore_edges";
    let (a, b) = pair(h, fast_opts()).await;
    let name = unique_name("semedge");
    let sem = a.semaphore(&name, 2).expect("sem");
    let g1 = match sem.try_acquire(1).await {
        Ok(g) => g.expect("permit"),
        Err(e) if e.is_unsupported() => return skip(case, &format!("{e}")),
        Err(e) => panic!("{case}: {e:?}"),
    };
    let e = sem.try_acquire(3).await.expect_err("above the limit");
    assert!(matches!(e, Error::InvalidArgument(_)), "{case}: {e:?}");
    let g2 = sem.try_acquire(1).await.expect("try").expect("permit");
    // The semaphore has the 2 permits of its first use; a client that says 5 gets none now.
    let big = b.semaphore(&name, 5).expect("sem");
    match big.try_acquire(1).await {
        Ok(None) => {}
        Ok(Some(g)) => panic!(
            "{case}: a third permit of a 2-permit semaphore to a client that said 5 (token {})",
            g.fencing_token()
        ),
        Err(e) => assert!(matches!(e, Error::InvalidArgument(_)), "{case}: {e:?}"),
    }
    let info = b
        .inspect_kind(
            &name,
            LockKind::Semaphore {
                permits: 1,
                limit: 5,
            },
        )
        .await
        .expect("inspect");
    assert_eq!(info.permits_in_use(), 2, "{case}: {info:?}");
    drop(g1);
    drop(g2);

    // set_permits below queued demand.
    let name = unique_name("semshrink");
    let mut sem = a.semaphore(&name, 4).expect("sem");
    let h1 = sem.try_acquire(1).await.expect("try").expect("permit");
    let h2 = sem.try_acquire(1).await.expect("try").expect("permit");
    let big_wait = {
        let s = b.semaphore(&name, 4).expect("sem");
        tokio::spawn(async move { s.acquire_timeout(3, Duration::from_secs(3)).await })
    };
    settle_waiters(
        &a,
        &name,
        LockKind::Semaphore {
            permits: 3,
            limit: 4,
        },
        1,
        Duration::from_secs(2),
    )
    .await;
    sem.set_permits(2).await.expect("set_permits");
    let small_wait = {
        let s = b.semaphore(&name, 2).expect("sem");
        tokio::spawn(async move { s.acquire_timeout(1, Duration::from_secs(15)).await })
    };
    settle_waiters(
        &a,
        &name,
        LockKind::Semaphore {
            permits: 1,
            limit: 2,
        },
        2,
        Duration::from_secs(2),
    )
    .await;
    drop(h1);
    let small = small_wait.await.expect("join").unwrap_or_else(|e| {
        panic!("{case}: a request that fits waited behind one that cannot: {e}")
    });
    let big = big_wait.await.expect("join");
    assert!(
        big.is_err(),
        "{case}: 3 permits granted of a semaphore lowered to 2"
    );
    drop(small);
    drop(h2);
}

/// The lock service loses its data (`FLUSHALL` where the harness can, else the lock's state is
/// deleted): fencing tokens still increase, and the old holder learns it lost the lock.
pub async fn data_loss_tokens_increase<H: Harness>(h: &H) {
    let case = "data_loss_tokens_increase";
    let (a, b) = pair(h, fast_opts()).await;
    let name = unique_name("dataloss");
    let g = hold(&a, &name).await;
    let t1 = g.fencing_token();
    let how = if h.lose_data().await {
        "lose_data"
    } else if h.caps().break_lock {
        h.break_lock(&name).await;
        "break_lock"
    } else {
        return skip(case, "the harness can neither lose data nor break locks");
    };
    let g2 = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(EVENTUALLY)
        .await
        .expect("acquire after the loss");
    let t2 = g2.fencing_token();
    assert!(
        t2 > t1,
        "{case} ({how}): token {t2} after {t1}: fencing tokens went back after data loss"
    );
    let reg = FencedRegister::new();
    reg.write(t2, "b", !g2.is_lost());
    // The old holder's write is refused; it learns at its next renewal that it lost the lock.
    reg.write(t1, "a", false);
    let reason = tokio::time::timeout(EVENTUALLY, g.lost())
        .await
        .unwrap_or_else(|_| {
            panic!("{case} ({how}): the old holder never learned it lost the lock")
        });
    eprintln!("{case} ({how}): tokens {t1} -> {t2}, old holder lost: {reason:?}");
    drop(g);
    assert_released(g2).await;
}

/// 3 clients × 4 tasks take one lock with short leases (a 1 s watchdog, and fixed 400 ms
/// leases on every other round), through proxies that inject random small delays; every
/// critical section writes to a fenced register. No two believed holders overlap, and no write
/// of a holder that believed it held the lock is refused.
pub async fn contended_soak<H: Harness>(h: &H) {
    let case = "contended_soak";
    let name = unique_name("soak");
    let rec = Arc::new(OverlapRecorder::new());
    let reg = Arc::new(FencedRegister::new());
    let mut proxies = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        match h.proxied_client(fast_opts()).await {
            Some((c, p)) => {
                clients.push(c);
                proxies.push(p);
            }
            None => clients.push(h.client(fast_opts()).await),
        }
    }
    if proxies.is_empty() {
        skip(
            &format!("{case} (delays)"),
            "no proxied client: soaking without network delays",
        );
    }
    let proxies = Arc::new(proxies);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let jitter = {
        let (proxies, stop) = (proxies.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for p in proxies.iter() {
                    p.set_delay(Duration::from_millis(rand_below(15)));
                }
                tokio::time::sleep(Duration::from_millis(10 + rand_below(50))).await;
            }
            for p in proxies.iter() {
                p.heal();
            }
        })
    };
    let mut tasks = Vec::new();
    let granted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for (ci, c) in clients.iter().enumerate() {
        for ti in 0..4 {
            let (c, name, rec, reg, granted) = (
                c.clone(),
                name.clone(),
                rec.clone(),
                reg.clone(),
                granted.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let me = format!("client{ci}/task{ti}");
                let lock = c.lock(&name).expect("lock");
                for round in 0..4 {
                    let lock = if round % 2 == 1 {
                        lock.clone()
                            .lease(Duration::from_millis(400))
                            .expect("lease")
                    } else {
                        lock.clone()
                    };
                    let g = match lock.acquire_timeout(Duration::from_secs(60)).await {
                        Ok(g) => g,
                        // A faulted connection may fail an attempt; the invariants are about
                        // those who got in.
                        Err(e) if e.is_connection() => continue,
                        Err(e) => panic!("{me}: {e:?}"),
                    };
                    granted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    section(&rec, &reg, &g, &me, Duration::from_millis(rand_below(5))).await;
                    let _ = g.release().await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    jitter.await.expect("jitter");
    let n = granted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(n >= 24, "{case}: only {n} of 48 acquisitions succeeded");
    rec.assert_no_overlap();
    reg.assert_no_rejected_belief();
    eprintln!(
        "{case}: {n} critical sections, {} fenced writes, {} rejected (from holders that knew they had lost)",
        reg.writes().len(),
        reg.rejected().len()
    );
}
