//! Holds that mix: short extends of watchdog guards, fixed and watchdog guards of one
//! owner, sibling waiters around a handoff, and cancellation at every await.

use super::*;

/// `extend(lease / 10)` on a watchdog guard never shortens its lease: for more than two
/// watchdog leases, while the guard lives and is not lost, nobody else gets the lock.
pub async fn extend_shorter_than_watchdog<H: Harness>(h: &H) {
    let case = "extend_shorter_than_watchdog";
    let (a, b) = pair(h, fast_opts()).await;
    let name = unique_name("shortext");
    let g = hold(&a, &name).await;
    let lease = fast_opts().get_watchdog_lease();
    g.extend(lease / 10).await.expect("extend");
    assert_excluded(case, &b, &name, &g, lease * 2 + lease / 2, true).await;
    assert_released(g).await;
}

/// A fixed-lease guard and a watchdog guard of one hold (the same lock, `.lease(long)` and the
/// default), dropped in both orders: while either lives, no other owner gets in, and the
/// remaining guard's `is_lost()` is truthful (not lost ⇒ the other owner is refused).
pub async fn fixed_and_watchdog_guards<H: Harness>(h: &H) {
    let case = "fixed_and_watchdog_guards";
    let (a, b) = pair(h, fast_opts()).await;
    let long = Duration::from_secs(3);
    for watchdog_first in [true, false] {
        for fixed_first in [true, false] {
            let what = format!("{case} (fixed taken first: {fixed_first}, watchdog dropped first: {watchdog_first})");
            let name = unique_name("mixed");
            let lock = a.lock(&name).expect("lock");
            let fixed = lock.clone().lease(long).expect("lease");
            let (gw, gf) = if fixed_first {
                let gf = fixed
                    .acquire_timeout(Duration::from_secs(5))
                    .await
                    .expect("fixed");
                let gw = lock.try_acquire().await.expect("try").expect("re-entry");
                (gw, gf)
            } else {
                let gw = lock
                    .acquire_timeout(Duration::from_secs(5))
                    .await
                    .expect("watchdog");
                let gf = fixed.try_acquire().await.expect("try").expect("re-entry");
                (gw, gf)
            };
            assert!(gw.is_watchdog() && !gf.is_watchdog());
            assert_excluded(&what, &b, &name, &gf, Duration::from_millis(300), true).await;
            if watchdog_first {
                drop(gw);
                // The fixed guard's lease runs `long` from its grant or re-entry: it holds
                // until then, and the lock frees itself after (where leases end).
                assert_excluded(&what, &b, &name, &gf, long / 2, true).await;
                if h.caps().lease_expiry {
                    let taken =
                        taken_only_after_loss(&what, &b, &name, &gf, long + EVENTUALLY).await;
                    drop(taken);
                }
                drop(gf);
            } else {
                drop(gf);
                // The watchdog guard keeps renewing beyond the fixed lease.
                assert_excluded(&what, &b, &name, &gw, long + Duration::from_secs(1), true).await;
                assert_eq!(
                    gw.release().await.expect("release"),
                    ReleaseOutcome::Released,
                    "{what}"
                );
            }
            drop(comes_free(&what, &b, &name).await);
        }
    }
}

/// Two waiters of one owner (clones of one `Lock` in one client, or `with_owner(same)` in two
/// clients) queue behind a holder, with a third owner contending; one of the two is cancelled,
/// or runs out of time, while the handoff may be on its way to it or its sibling. Nobody is
/// inside the critical section while another holder believes it holds the lock.
pub async fn sibling_waiters_handoff<H: Harness>(h: &H) {
    let case = "sibling_waiters_handoff";
    let (holder, p) = pair(h, fast_opts()).await;
    let (q, c) = pair(h, fast_opts()).await;
    let rec = Arc::new(OverlapRecorder::new());
    let offsets = [0u64, 1, 2, 5, 10, 20];
    for (round, &offset) in offsets.iter().enumerate() {
        for same_client in [true, false] {
            let by_deadline = round % 2 == 1;
            let name = unique_name("siblings");
            let reg = Arc::new(FencedRegister::new());
            let gh = holder
                .lock(&name)
                .expect("lock")
                .acquire_timeout(Duration::from_secs(5))
                .await
                .expect("holder");
            let lock1 = p.lock(&name).expect("lock");
            let (lock2, label2) = if same_client {
                (lock1.clone(), "p")
            } else {
                (
                    q.lock(&name)
                        .expect("lock")
                        .with_owner(lock1.owner())
                        .expect("owner"),
                    "q",
                )
            };
            let spawn_section = |lock: distlock_core::Lock, label: &'static str| {
                let (rec, reg, lock_client) = (rec.clone(), reg.clone(), holder.clone());
                tokio::spawn(async move {
                    let name = lock.name().to_owned();
                    let g = match lock.acquire_timeout(Duration::from_secs(30)).await {
                        Ok(g) => g,
                        Err(e) => {
                            let info = lock_client.inspect(&name).await;
                            panic!("{label}: a waiter that never gives up: {e}; the lock: {info:?}")
                        }
                    };
                    section(&rec, &reg, &g, label, Duration::from_millis(20)).await;
                    drop(g);
                })
            };
            let w1 = spawn_section(lock1, "p");
            let third = spawn_section(c.lock(&name).expect("lock"), "c");
            // The sibling waits until it is cancelled, or until its deadline, set to fall
            // `offset` ms after the holder's release starts.
            let cancel = Arc::new(tokio::sync::Notify::new());
            let queued_for = Duration::from_millis(800);
            let wait2 = if by_deadline {
                queued_for + Duration::from_millis(offset)
            } else {
                Duration::from_secs(30)
            };
            let started = Instant::now();
            let w2 = {
                let (rec, reg, cancel) = (rec.clone(), reg.clone(), cancel.clone());
                tokio::spawn(async move {
                    let g = tokio::select! {
                        g = lock2.acquire_timeout(wait2) => g,
                        _ = cancel.notified() => return,
                    };
                    if let Ok(g) = g {
                        section(&rec, &reg, &g, label2, Duration::from_millis(20)).await;
                    }
                })
            };
            settle_waiters(&holder, &name, LockKind::Mutex, 3, queued_for / 2).await;
            tokio::time::sleep_until((started + queued_for).into()).await;
            let release = tokio::spawn(gh.release());
            if !by_deadline {
                tokio::time::sleep(Duration::from_millis(offset)).await;
                cancel.notify_one();
            }
            release.await.expect("join").expect("release");
            for t in [w1, third, w2] {
                t.await.expect("task");
            }
            reg.assert_no_rejected_belief();
            drop(comes_free(case, &holder, &name).await);
        }
    }
    rec.assert_no_overlap();
}

/// Read and write waiters of one `RwLock` handle behind another owner's writer: the read grant
/// (which may be granted beside our own write grant) must not make our write waiter believe it
/// holds the write side. While our writer holds, a third owner can neither read nor write.
pub async fn rw_sibling_waiters<H: Harness>(h: &H) {
    let case = "rw_sibling_waiters";
    let (a, p) = pair(h, fast_opts()).await;
    let t = h.client(fast_opts()).await;
    for read_first in [true, false] {
        let name = unique_name("rwsiblings");
        let w = match a.rw_lock(&name).expect("rw").write().try_acquire().await {
            Ok(w) => w.expect("free"),
            Err(e) if e.is_unsupported() => return skip(case, &format!("{e}")),
            Err(e) => panic!("{case}: {e:?}"),
        };
        let rw = p.rw_lock(&name).expect("rw");
        let (read, write) = (rw.read(), rw.write());
        let spawn_read = || {
            let read = read.clone();
            tokio::spawn(async move {
                let g = read.acquire_timeout(Duration::from_secs(20)).await;
                // Hold the read side a moment, then let it go so the writer can get in.
                tokio::time::sleep(Duration::from_millis(300)).await;
                g.map(drop)
            })
        };
        let spawn_write = || {
            let write = write.clone();
            tokio::spawn(async move { write.acquire_timeout(Duration::from_secs(20)).await })
        };
        let (rt, wt) = if read_first {
            let r = spawn_read();
            settle_waiters(&a, &name, LockKind::Read, 1, Duration::from_secs(2)).await;
            (r, spawn_write())
        } else {
            let w = spawn_write();
            settle_waiters(&a, &name, LockKind::Write, 1, Duration::from_secs(2)).await;
            (spawn_read(), w)
        };
        settle_waiters(&a, &name, LockKind::Write, 2, Duration::from_secs(2)).await;
        assert_released(w).await;
        let what = format!("{case} (read waiter first: {read_first})");
        let wr = wt.await.expect("join");
        eprintln!(
            "{what}: the write waiter got {:?}",
            wr.as_ref().map(|g| g.fencing_token())
        );
        match wr {
            Ok(gw) => {
                let other = t.rw_lock(&name).expect("rw");
                for _ in 0..5 {
                    let r = other.read().try_acquire().await.expect("try read");
                    let lost = gw.is_lost();
                    assert!(
                        r.is_none() || lost,
                        "{what}: a third owner read while our writer (token {}) believed it held the write side",
                        gw.fencing_token()
                    );
                    let w2 = other.write().try_acquire().await.expect("try write");
                    assert!(
                        w2.is_none() || gw.is_lost(),
                        "{what}: a third owner wrote while our writer believed it held the write side"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drop(gw);
            }
            Err(e) => assert!(
                matches!(e, Error::InvalidArgument(_)) || e.is_timeout(),
                "{what}: {e:?}"
            ),
        }
        rt.await.expect("join").expect("read side");
        let free = t.rw_lock(&name).expect("rw").write();
        let t0 = Instant::now();
        loop {
            if let Some(g) = free.try_acquire().await.expect("try") {
                drop(g);
                break;
            }
            if t0.elapsed() >= EVENTUALLY {
                let r = t.inspect_kind(&name, LockKind::Read).await;
                let w = t.inspect_kind(&name, LockKind::Write).await;
                panic!("{what}: the rw lock never came free: read side {r:?}, write side {w:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `acquire` dropped at each of its awaits (timeouts of 0 to 50 ms, and a `select!` racing the
/// holder's release) while another owner releases: afterwards the lock is free, or held by a
/// live guard, never by nobody's guard: a third owner gets it long before the cancelled
/// waiter's 20 s lease could end.
pub async fn cancel_at_every_await<H: Harness>(h: &H) {
    let case = "cancel_at_every_await";
    let a = h.client(fast_opts()).await;
    let p = h.client(long_lease_opts()).await;
    let c = h.client(fast_opts()).await;
    let mut steps: Vec<Option<u64>> = [0u64, 1, 2, 5, 10, 20, 50].into_iter().map(Some).collect();
    steps.push(None);
    for step in steps {
        let name = unique_name("cancelawait");
        let what = format!("{case} (timeout {step:?} ms; None: select! with the release)");
        let gh = a
            .lock(&name)
            .expect("lock")
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("holder");
        let lock = p.lock(&name).expect("lock");
        let got = match step {
            Some(ms) => {
                let release = tokio::spawn(gh.release());
                let r = tokio::time::timeout(Duration::from_millis(ms), lock.acquire()).await;
                release.await.expect("join").expect("release");
                r.ok().map(|g| g.expect("acquire"))
            }
            None => {
                let release = gh.release();
                tokio::pin!(release);
                tokio::select! {
                    g = lock.acquire() => {
                        let g = g.expect("acquire");
                        release.await.expect("release");
                        Some(g)
                    }
                    r = &mut release => {
                        r.expect("release");
                        None
                    }
                }
            }
        };
        if let Some(g) = got {
            // It won: a live guard, exclusive.
            assert!(try_lock(&c, &name).await.is_none(), "{what}: not exclusive");
            drop(g);
        }
        drop(comes_free(&what, &c, &name).await);
        poll_until(&what, async || p.held_count(), |n| *n == 0).await;
    }
}
