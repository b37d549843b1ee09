//! Input checks and the [`Backend`](distlock_core::Backend) contract spoken directly.

use super::prelude::*;

/// Bad input gives `InvalidArgument` with a message, never a panic.
pub async fn invalid_input<H: Harness>(h: &H) {
    let a = h.client(fast_opts()).await;
    let msg = |e: Error| {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        e.to_string()
    };
    assert!(msg(a.lock("").unwrap_err()).contains("empty"));
    assert!(msg(a
        .lock(&"n".repeat(distlock_core::MAX_NAME_LEN + 1))
        .unwrap_err())
    .contains("limit"));
    assert!(msg(a.lock("bad\nname").unwrap_err()).contains("control"));
    let lock = a.lock(&unique_name("invalid")).expect("lock");
    assert!(msg(lock.clone().lease(Duration::ZERO).unwrap_err()).contains("too short"));
    assert!(msg(lock.clone().with_owner("").unwrap_err()).contains("empty"));
    let e = ClientOptions::default()
        .watchdog_lease(Duration::from_millis(10))
        .validate()
        .unwrap_err();
    assert!(msg(e).contains("watchdog"));
    // The longest valid name works end to end.
    let long = a
        .lock(&"n".repeat(distlock_core::MAX_NAME_LEN))
        .expect("lock");
    let g = long.try_acquire().await.expect("try").expect("free");
    assert_released(g).await;
    // Names are opaque: braces, slashes, unicode.
    let odd = format!("{}-{{a}}/b:π", unique_name("odd"));
    let g = try_lock(&a, &odd).await.expect("free");
    assert_released(g).await;
}

/// The backend trait directly: a retried acquire of one attempt is one grant with one token and
/// never shortens the lease; another attempt of the same owner is another holder; renewals and
/// releases name the grant, never shorten, and a repeated release is reported, not repeated.
pub async fn backend_contract<H: Harness>(h: &H) {
    let name = unique_name("contract");
    let a = h.client(fast_opts()).await;
    let key = HoldKey {
        name: name.as_str().into(),
        owner: "contract-owner".into(),
        kind: LockKind::Mutex,
    };
    let b = a.backend();
    let mut req = AcquireRequest::new(key.clone(), Duration::from_secs(10), LostSignal::new());
    let t1 = match b.acquire(&req).await.expect("acquire") {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    // The same attempt again (a retry after a lost reply), asking for a shorter lease.
    req.lease = Duration::from_millis(100);
    let t2 = match b.acquire(&req).await.expect("retry") {
        AcquireReply::Granted { token } => token,
        other => panic!("a retried attempt was not granted: {other:?}"),
    };
    assert_eq!(t1, t2, "a retried attempt got a second token");
    let grant = req.grant(t1);
    // Another attempt of the *same owner* is another holder.
    let sibling = AcquireRequest::new(key.clone(), Duration::from_secs(1), LostSignal::new());
    let other = AcquireRequest::new(
        HoldKey {
            owner: "someone-else".into(),
            ..key.clone()
        },
        Duration::from_secs(1),
        LostSignal::new(),
    );
    for r in [&sibling, &other] {
        match b.acquire(r).await.expect("acquire") {
            AcquireReply::Held { ttl } => {
                if h.caps().lease_expiry {
                    let ttl = ttl.expect("ttl");
                    assert!(
                        ttl > Duration::from_secs(5),
                        "a retry shortened the lease: {ttl:?}"
                    );
                }
            }
            g => panic!("granted a held lock to another attempt: {g:?}"),
        }
        b.give_up(r).await.expect("give up");
    }
    // A short renewal never shortens.
    let out = b
        .renew(&[(grant.clone(), Duration::from_millis(100))])
        .await
        .expect("renew");
    assert_eq!(out, vec![RenewOutcome::Renewed]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        matches!(
            b.acquire(&other).await.expect("acquire"),
            AcquireReply::Held { .. }
        ),
        "a short renewal shortened the lease"
    );
    b.give_up(&other).await.expect("give up");
    // A stale address (right attempt, wrong token) touches nothing.
    let stale = GrantRef {
        token: t1.saturating_sub(1),
        ..grant.clone()
    };
    assert_ne!(
        b.release(&stale).await.expect("r"),
        ReleaseOutcome::Released,
        "a release with a stale token freed the lock"
    );
    assert!(a.inspect(&name).await.expect("inspect").held());
    assert_eq!(
        b.release(&grant).await.expect("r"),
        ReleaseOutcome::Released
    );
    assert_eq!(b.release(&grant).await.expect("r"), ReleaseOutcome::Expired);
    assert_eq!(
        b.renew(&[(grant.clone(), Duration::from_secs(1))])
            .await
            .expect("renew"),
        vec![RenewOutcome::NotHeld]
    );
}
