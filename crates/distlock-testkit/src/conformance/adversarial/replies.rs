//! Late, lost and reset replies: a retried request must have the effect of one.

use super::*;

/// Late replies on release. (1) Two re-entrant guards of one hold: releasing the first while
/// replies are late must not free the lock (the core keeps the count; a backend that counted
/// re-entry itself would see the retried decrement twice). (2) A single guard's release whose
/// reply is late: it executed, so another owner gets in; the release's retries must not touch
/// that owner's grant.
pub async fn late_reply_on_release<H: Harness>(h: &H) {
    let case = "late_reply_on_release";
    let Some((p, proxy)) = h.proxied_client(long_lease_opts()).await else {
        return skip(case, NO_PROXY);
    };
    let b = h.client(fast_opts()).await;
    let name = unique_name("laterel2");
    let lock = p.lock(&name).expect("lock");
    let g1 = lock
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("acquire");
    let g2 = lock
        .try_acquire()
        .await
        .expect("re-enter")
        .expect("re-entry");
    proxy.set_reply_delay(late());
    // Whatever the release sends has reached the server by the time it returns (requests are
    // not delayed), retries included.
    let r1 = g1.release().await;
    proxy.heal();
    // What matters first: the lock is still ours and only ours.
    assert!(!g2.is_lost(), "{case}: the remaining guard was lost");
    assert_excluded(case, &b, &name, &g2, Duration::from_millis(300), true).await;
    assert!(
        matches!(r1, Ok(ReleaseOutcome::StillHeld { remaining: 1 })),
        "{case}: the first of two guards released: {r1:?}"
    );
    let info = b.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{case}: {info:?}");
    assert_eq!(info.holders[0].owner, lock.owner(), "{case}: {info:?}");
    assert_released(g2).await;
    drop(comes_free(case, &b, &name).await);

    // (2) One guard; the release executes, its replies come late.
    let name = unique_name("laterel1");
    let g = hold(&p, &name).await;
    let token = g.fencing_token();
    proxy.set_reply_delay(late());
    let release = tokio::spawn(g.release());
    let gb = comes_free(case, &b, &name).await;
    let r = release.await.expect("join");
    proxy.heal();
    assert!(
        !matches!(r, Ok(ReleaseOutcome::StillHeld { .. })),
        "{case}: a single guard's release said {r:?}"
    );
    eprintln!("{case}: the late release of token {token} returned {r:?}");
    // The release's retries reached the server while `gb` held the lock.
    let c = h.client(fast_opts()).await;
    assert_excluded(case, &c, &name, &gb, Duration::from_millis(300), true).await;
    let info = c.inspect(&name).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{case}: {info:?}");
    assert_eq!(info.holders[0].owner, gb.owner(), "{case}: {info:?}");
    assert_eq!(
        gb.release().await.expect("release"),
        ReleaseOutcome::Released,
        "{case}: a retried release freed the next holder's grant"
    );
}

/// A `try_acquire` or `acquire` whose reply is late, lost, or cut by a reset: the core retries
/// it, and the retried request has the effect of one. The lock holds one grant, and once the
/// single guard is released (or the failed call gave up) another owner takes it at once.
pub async fn retried_acquire_is_one<H: Harness>(h: &H) {
    let case = "retried_acquire_is_one";
    let b = h.client(fast_opts()).await;
    // Where the client talks to several nodes, the fault hits all of them, then only one.
    let nodes = match h.proxied_client(long_lease_opts()).await {
        Some((_, proxy)) => proxy.proxies().len(),
        None => return skip(case, NO_PROXY),
    };
    let focuses: Vec<Option<usize>> = if nodes > 1 {
        vec![None, Some(0)]
    } else {
        vec![None]
    };
    for (wait, focus) in [false, true]
        .into_iter()
        .flat_map(|w| focuses.iter().map(move |f| (w, *f)))
    {
        for fault in [ReplyFault::Late, ReplyFault::Lost, ReplyFault::Reset] {
            // A fresh client each time: no traffic of earlier rounds through its proxy.
            let Some((p, proxy)) = h.proxied_client(long_lease_opts()).await else {
                return skip(case, NO_PROXY);
            };
            // One node: one the client is connected to (a ZooKeeper or etcd client may talk
            // to a single member; faulting an idle one would test nothing).
            let focus = focus.map(|_| {
                proxy
                    .proxies()
                    .iter()
                    .position(|x| x.stats().connections > 0)
                    .unwrap_or(0)
            });
            proxy.focus(focus);
            let name = unique_name(if wait { "retrywait" } else { "retrytry" });
            let lock = p.lock(&name).expect("lock");
            let r = with_reply_fault(&proxy, fault, async {
                if wait {
                    lock.acquire_timeout(Duration::from_secs(10))
                        .await
                        .map(Some)
                } else {
                    lock.try_acquire().await
                }
            })
            .await;
            let what = format!("{case} (wait: {wait}, {fault:?}, node: {focus:?})");
            match r {
                Ok(Some(g)) => {
                    let info = b.inspect(&name).await.expect("inspect");
                    assert_eq!(info.holders.len(), 1, "{what}: {info:?}");
                    assert_eq!(info.holders[0].owner, lock.owner(), "{what}: {info:?}");
                    assert!(
                        info.holders[0].count <= 1,
                        "{what}: a retried acquire counted twice: {info:?}"
                    );
                    assert!(try_lock(&b, &name).await.is_none(), "{what}: not exclusive");
                    assert_eq!(
                        g.release().await.expect("release"),
                        ReleaseOutcome::Released,
                        "{what}"
                    );
                }
                Ok(None) => {
                    panic!("{what}: a try_acquire of a free lock found it held (by its own retry?)")
                }
                Err(e) => eprintln!("{what}: the faulted call failed ({e}); it must have given up"),
            }
            // Free right away: not held by a second grant of the retried request.
            drop(comes_free(&what, &b, &name).await);
        }
    }
}

/// Late replies on renewal. A watchdog tick (and an `extend`) whose reply is late but comes:
/// no loss. One whose confirmation never comes (requests lost, or only replies lost): the guard
/// learns it is lost before another owner can get the lock.
pub async fn late_reply_on_renew<H: Harness>(h: &H) {
    let case = "late_reply_on_renew";
    // A 3 s watchdog renews every second: a tick retried after a late reply is still
    // confirmed well inside the lease.
    let opts = fast_opts().watchdog_lease(Duration::from_secs(3));
    let Some((p, proxy)) = h.proxied_client(opts.clone()).await else {
        return skip(case, NO_PROXY);
    };
    let b = h.client(fast_opts()).await;
    let name = unique_name("laterenew");
    let g = hold(&p, &name).await;
    for _ in 0..2 {
        let before = proxy.stats();
        proxy.set_reply_delay(late());
        wait_proxy("a renewal's reply", &proxy, |s| {
            s.replies.chunks_read > before.replies.chunks_read
        })
        .await;
        proxy.heal();
        // Let the next renewal (the retry, or the next tick) be confirmed before faulting
        // again: two faulted ticks in a row may rightly cost a lease renewed at a third of it.
        let healed = proxy.stats();
        let what = format!("{case}: a renewal after a late reply");
        poll_until(
            &what,
            async || (proxy.stats(), g.lost_signal().reason()),
            |(s, lost)| {
                assert!(
                    lost.is_none(),
                    "{case}: lost on a late renewal reply: {lost:?}, {s:?}"
                );
                s.replies.chunks_read > healed.replies.chunks_read
            },
        )
        .await;
        let read = proxy.stats().replies.chunks_read;
        wait_proxy("the renewal replies delivered", &proxy, |s| {
            s.replies.chunks_forwarded >= read
        })
        .await;
        assert!(!g.is_lost(), "{case}: lost on a late renewal reply");
    }
    assert_excluded(case, &b, &name, &g, Duration::from_millis(1500), true).await;

    // extend with a late reply: retried, confirmed.
    let before = proxy.stats();
    proxy.set_reply_delay(late());
    let (r, ()) = tokio::join!(g.extend(Duration::from_secs(6)), async {
        wait_proxy("an extend's reply", &proxy, |s| {
            s.replies.chunks_read > before.replies.chunks_read
        })
        .await;
        proxy.heal();
    });
    let confirmed = r.is_ok();
    match r {
        Ok(()) => assert!(!g.is_lost(), "{case}: lost after a confirmed extend"),
        Err(e) => eprintln!("{case}: the late extend failed ({e})"),
    }
    assert_excluded(case, &b, &name, &g, Duration::from_millis(500), confirmed).await;
    assert_released(g).await;

    if !h.caps().lease_expiry {
        return skip(
            &format!("{case} (unconfirmed renewals)"),
            "locks of this backend do not end with a lease",
        );
    }
    // Renewals never confirmed: requests lost (blackhole), or executed with replies lost.
    for requests_lost in [true, false] {
        let Some((p, proxy)) = h.proxied_client(fast_opts()).await else {
            return skip(case, NO_PROXY);
        };
        let name = unique_name("unconfirmed");
        let g = hold(&p, &name).await;
        if requests_lost {
            proxy.set_blackhole(true);
        } else {
            proxy.set_drop_replies(true);
        }
        let what = format!("{case} (requests lost: {requests_lost})");
        let taken = taken_only_after_loss(&what, &b, &name, &g, Duration::from_secs(20)).await;
        proxy.heal();
        drop(taken);
        drop(g);
    }

    // extend never confirmed, on a fixed lease.
    for requests_lost in [true, false] {
        let Some((p, proxy)) = h.proxied_client(fast_opts()).await else {
            return skip(case, NO_PROXY);
        };
        let name = unique_name("unconfext");
        let g = p
            .lock(&name)
            .expect("lock")
            .lease(Duration::from_millis(1500))
            .expect("lease")
            .acquire_timeout(Duration::from_secs(5))
            .await
            .expect("acquire");
        if requests_lost {
            proxy.set_blackhole(true);
        } else {
            proxy.set_drop_replies(true);
        }
        let r = g.extend(Duration::from_secs(4)).await;
        assert!(r.is_err(), "{case}: an extend nobody answered succeeded");
        let what = format!("{case} (extend, requests lost: {requests_lost})");
        let taken = taken_only_after_loss(&what, &b, &name, &g, Duration::from_secs(20)).await;
        proxy.heal();
        drop(taken);
        drop(g);
    }
}
