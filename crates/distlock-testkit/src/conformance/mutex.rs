//! Mutual exclusion, `try_acquire`, re-entry, ownership, fencing tokens, deadlines and
//! wake-ups of plain mutexes.

use super::prelude::*;

/// ≥32 tasks across 4 clients, each with its own handle, keep a deliberately non-atomic counter
/// exact, and the fencing tokens seen inside the critical section strictly increase; no two
/// believed holders overlap and the fenced register refuses no believed holder's write.
pub async fn mutual_exclusion<H: Harness>(h: &H) {
    let name = unique_name("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let rec = Arc::new(OverlapRecorder::new());
    let reg = Arc::new(FencedRegister::new());
    let (clients, tasks_per, rounds) = (4, 8, 3);
    let mut joins = Vec::new();
    for _ in 0..clients {
        let client = h.client(fast_opts()).await;
        for _ in 0..tasks_per {
            let (client, name, counter, tokens, rec, reg) = (
                client.clone(),
                name.clone(),
                counter.clone(),
                tokens.clone(),
                rec.clone(),
                reg.clone(),
            );
            joins.push(tokio::spawn(async move {
                let lock = client.lock(&name).expect("lock");
                let me = format!("{}/{}", client.id(), lock.owner());
                for _ in 0..rounds {
                    let g = lock
                        .acquire_timeout(Duration::from_secs(60))
                        .await
                        .expect("acquire");
                    let visit = rec.enter(&name, &me, g.fencing_token(), g.is_lost());
                    reg.write(g.fencing_token(), &me, !g.is_lost());
                    let v = counter.load(Ordering::SeqCst);
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    rec.exit(visit, g.is_lost());
                    assert_released(g).await;
                }
            }));
        }
    }
    for j in joins {
        j.await.expect("task");
    }
    rec.assert_no_overlap();
    reg.assert_no_rejected_belief();
    let n = (clients * tasks_per * rounds) as u64;
    assert_eq!(
        counter.load(Ordering::SeqCst),
        n,
        "lost updates: mutual exclusion broken"
    );
    let tokens = tokens.lock().expect("tokens").clone();
    assert_eq!(tokens.len() as u64, n);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {tokens:?}"
    );
}

/// `try_acquire` never waits: `Ok(None)` while another owner holds the lock.
pub async fn try_acquire_contended<H: Harness>(h: &H) {
    let name = unique_name("try");
    let (a, b) = pair(h, fast_opts()).await;
    let g = try_lock(&a, &name).await.expect("free");
    let t = Instant::now();
    assert!(try_lock(&b, &name).await.is_none());
    // Two handles of one client are two owners: they exclude each other too.
    assert!(try_lock(&a, &name).await.is_none());
    assert!(t.elapsed() < Duration::from_secs(2), "try_acquire waited");
    assert_released(g).await;
    let g2 = try_lock(&b, &name).await;
    assert!(g2.is_some(), "free after release");
}

/// Re-entry counts guards in the client; only the last release frees the lock; the token stays
/// the same; the server sees one grant.
pub async fn reentrancy<H: Harness>(h: &H) {
    let name = unique_name("reentry");
    let (a, b) = pair(h, fast_opts()).await;
    let lock = a.lock(&name).expect("lock");
    let g1 = lock
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("first");
    let g2 = lock
        .clone()
        .try_acquire()
        .await
        .expect("second")
        .expect("re-entry");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    let info = a.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, lock.owner());
    assert_eq!(
        g2.release().await.expect("release"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert!(try_lock(&b, &name).await.is_none());
    // An explicit shared owner id re-enters across handles too.
    let same_owner = a
        .lock(&name)
        .expect("lock")
        .with_owner(lock.owner())
        .expect("owner");
    let g3 = same_owner
        .try_acquire()
        .await
        .expect("try")
        .expect("re-entry by owner id");
    assert_eq!(g3.fencing_token(), g1.fencing_token());
    assert_eq!(
        g3.release().await.expect("r"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    assert_released(g1).await;
    assert!(!a.inspect(&name).await.expect("inspect").held());
    let g = try_lock(&b, &name).await.expect("free now");
    assert!(g.fencing_token() > 0);
}

/// Only the owner releases: a release by another owner id changes nothing.
pub async fn non_owner_cannot_release<H: Harness>(h: &H) {
    let name = unique_name("nonowner");
    let (a, b) = pair(h, fast_opts()).await;
    let g = acquired(&a, &name).await;
    let intruder = GrantRef {
        key: HoldKey {
            name: name.as_str().into(),
            owner: "intruder".into(),
            kind: LockKind::Mutex,
        },
        attempt: AttemptId::new(),
        token: g.fencing_token(),
    };
    let out = b.backend().release(&intruder).await.expect("release");
    assert_eq!(out, ReleaseOutcome::TakenByOther);
    let info = a.inspect(&name).await.expect("inspect");
    assert!(info.held(), "non-owner release freed the lock");
    assert_eq!(info.holders[0].owner, g.owner());
    assert!(try_lock(&b, &name).await.is_none());
    assert_released(g).await;
    // Releasing a lock nobody holds is reported, not an error.
    assert_eq!(
        b.backend().release(&intruder).await.expect("release"),
        ReleaseOutcome::Expired
    );
}

/// Fencing tokens strictly increase across holders in different clients.
pub async fn fencing_tokens_increase<H: Harness>(h: &H) {
    let name = unique_name("fence");
    let clients = [h.client(fast_opts()).await, h.client(fast_opts()).await];
    let mut last = 0;
    for i in 0..10 {
        let g = clients[i % 2]
            .lock(&name)
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
        assert_released(g).await;
    }
    let info = clients[0].inspect(&name).await.expect("inspect");
    assert_eq!(info.fencing_token, last);
    assert!(!info.held());
}

/// `acquire_timeout` gives up near its deadline with a matchable error.
pub async fn acquire_timeout_deadline<H: Harness>(h: &H) {
    let name = unique_name("deadline");
    let (a, b) = pair(h, fast_opts()).await;
    let _g = acquired(&a, &name).await;
    let wait = Duration::from_millis(400);
    let t = Instant::now();
    let err = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(wait)
        .await
        .unwrap_err();
    let took = t.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(took >= wait, "gave up early: {took:?}");
    // Not held up beyond the deadline by a retry or a slow reply (generous for a loaded machine).
    assert!(
        took < wait + Duration::from_secs(3),
        "gave up late: {took:?}"
    );
    assert!(err.to_string().contains(&name));
    // Zero wait is a single try.
    let err = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.is_timeout());
}

/// A waiter is woken by the release, long before the holder's lease would end.
pub async fn waiter_woken_by_release<H: Harness>(h: &H) {
    let name = unique_name("wake");
    // Long leases: a waiter that only woke at lease end would take 20 s.
    let opts = fast_opts().watchdog_lease(Duration::from_secs(20));
    let (a, b) = pair(h, opts).await;
    let g = acquired(&a, &name).await;
    let lock_b = b.lock(&name).expect("lock");
    let waiter = tokio::spawn(async move {
        let g = lock_b.acquire_timeout(Duration::from_secs(15)).await;
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    assert_released(g).await;
    let (g, got_at) = waiter.await.expect("waiter");
    let g = g.expect("waiter acquired");
    let latency = got_at.saturating_duration_since(released_at);
    // Woken by the release, not by the holder's 20 s lease running out.
    assert!(
        latency < Duration::from_secs(5),
        "waiter woke {latency:?} after release"
    );
    drop(g);
}

/// Dropping a waiting `acquire` leaves nothing behind: the lock is free once the holder releases.
pub async fn cancelled_acquire_leaves_nothing<H: Harness>(h: &H) {
    let name = unique_name("cancel");
    let a = h.client(fast_opts()).await;
    // A long lease for the waiter: a grant leaked to its cancelled acquire would last 20 s,
    // far beyond the 5 s this case waits for the lock to come free.
    let b = h
        .client(fast_opts().watchdog_lease(Duration::from_secs(20)))
        .await;
    let g = acquired(&a, &name).await;
    let lock_b = b.lock(&name).expect("lock");
    let r = tokio::time::timeout(Duration::from_millis(200), lock_b.acquire()).await;
    assert!(r.is_err(), "acquired a held lock");
    assert_released(g).await;
    // The cancelled acquire cleans up in the background (giving up its place, or releasing a
    // grant that raced with the cancellation): promptly, not at a lease end.
    let t = Instant::now();
    loop {
        let info = a.inspect(&name).await.expect("inspect");
        if !info.held() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "cancelled waiter left a hold: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = h.client(fast_opts()).await;
    let g = try_lock(&c, &name).await;
    assert!(g.is_some(), "lock not free after a cancelled waiter");
    assert_eq!(b.held_count(), 0);
}
