//! Leases: the watchdog renews, drop releases, fixed leases and crashed holders end on the
//! server, `extend`, and a broken lock reported lost.

use super::prelude::*;

/// The watchdog keeps a lock past its lease while the guard lives; it stops after release.
pub async fn watchdog_renews<H: Harness>(h: &H) {
    let name = unique_name("watchdog");
    let (a, b) = pair(h, fast_opts()).await;
    let g = acquired(&a, &name).await;
    // Two and a half leases long.
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!g.is_lost(), "lost while the watchdog should renew");
    }
    assert!(try_lock(&b, &name).await.is_none());
    assert_eq!(a.held_count(), 1);
    assert_released(g).await;
    assert_eq!(a.held_count(), 0, "watchdog still tracks a released lock");
    let g = try_lock(&b, &name).await;
    assert!(g.is_some());
}

/// Dropping a guard releases in the background, promptly.
pub async fn drop_releases<H: Harness>(h: &H) {
    let name = unique_name("drop");
    let opts = fast_opts().watchdog_lease(Duration::from_secs(20));
    let (a, b) = pair(h, opts).await;
    let g = acquired(&a, &name).await;
    let t = Instant::now();
    drop(g);
    let g = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("acquire after drop");
    // Released by the drop, not at the 20 s lease end.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drop did not release: {:?}",
        t.elapsed()
    );
    // The background release finishes its bookkeeping right after the server call.
    let t = Instant::now();
    while a.held_count() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "the dropped hold is still tracked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(g);
}

/// A fixed lease: no renewal; the lost signal fires when it ends, and the lock frees itself
/// (a crashed holder's lock comes back at lease end).
pub async fn fixed_lease_expires<H: Harness>(h: &H) {
    if !h.caps().lease_expiry {
        return skip(
            "fixed_lease_expires",
            "locks of this backend last as long as the holder process",
        );
    }
    let name = unique_name("lease");
    let (a, b) = pair(h, fast_opts()).await;
    let lease = Duration::from_millis(300);
    let t = Instant::now();
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(lease)
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost signal never fired");
    assert_eq!(reason, LostReason::LeaseExpired);
    assert!(
        t.elapsed() >= lease - Duration::from_millis(20),
        "fired early: {:?}",
        t.elapsed()
    );
    // The holder "crashed" (never released); a waiter gets the lock at lease end.
    let g2 = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("lock freed at lease end");
    assert!(g2.fencing_token() > g.fencing_token());
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::TakenByOther
    );
    assert_released(g2).await;
}

/// A crashed holder (guard leaked, never renewed or released) frees the lock at lease end.
pub async fn crashed_holder_frees_at_lease_end<H: Harness>(h: &H) {
    if !h.caps().lease_expiry {
        return skip(
            "crashed_holder",
            "covered by the backend's process-kill test",
        );
    }
    let name = unique_name("crash");
    let (a, b) = pair(h, fast_opts()).await;
    // The lease is counted from the moment the request left, so no waiter can have the lock
    // before 400 ms after this instant, however slow the replies are.
    let t = Instant::now();
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_millis(400))
        .expect("l")
        .acquire()
        .await
        .expect("acquire");
    std::mem::forget(g);
    let g = b
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(8))
        .await
        .expect("acquire");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(380),
        "got a held lock after {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "lease end not noticed: {took:?}"
    );
    drop(g);
}

/// `extend` keeps a fixed-lease lock longer; extending a lost lock fails with NotOwner.
pub async fn extend_lease<H: Harness>(h: &H) {
    if !h.caps().lease_expiry {
        return skip("extend_lease", "no leases on this backend");
    }
    let name = unique_name("extend");
    let (a, b) = pair(h, fast_opts()).await;
    let g = a
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_secs(1))
        .expect("l")
        .acquire()
        .await
        .expect("a");
    g.extend(Duration::from_secs(5)).await.expect("extend");
    // Past the first lease's end.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(!g.is_lost(), "lost despite extend");
    assert!(try_lock(&b, &name).await.is_none());
    assert!(g.extend(Duration::ZERO).await.is_err());
    let info = a.inspect(&name).await.expect("inspect");
    let left = info.holders[0].lease_left.expect("lease");
    assert!(left > Duration::from_secs(2), "lease left {left:?}");
    assert_released(g).await;
}

/// Deleting the lock's state behind the holder's back fires the lost signal at the next renewal.
pub async fn lost_when_broken<H: Harness>(h: &H) {
    if !h.caps().break_lock {
        return skip(
            "lost_when_broken",
            "the harness cannot break locks of this backend",
        );
    }
    let name = unique_name("broken");
    let a = h.client(fast_opts()).await;
    let g = acquired(&a, &name).await;
    assert!(!g.is_lost());
    h.break_lock(&name).await;
    let t = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("not lost");
    assert_eq!(reason, LostReason::NotHeld);
    // At the next renewal (every 333 ms), with room for a loaded machine.
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "noticed after {:?}",
        t.elapsed()
    );
    assert!(g.is_lost());
    assert_eq!(a.held_count(), 0);
    assert_eq!(g.release().await.expect("release"), ReleaseOutcome::Expired);
    // extend on a lost lock is refused.
}
