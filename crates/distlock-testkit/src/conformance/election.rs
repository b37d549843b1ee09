//! Leader elections ([`Client::election`]): one leader at a time, fencing tokens, values,
//! numbered proclamations, observers, resignation, crashed and partitioned leaders, and
//! elections kept apart from the lock of the same name. Every case is skipped (saying so) on a
//! backend that answers [`Error::Unsupported`] for elections.

use super::prelude::*;
use distlock_core::{Election, Leader, Leadership, Observer};

const KIND: LockKind = LockKind::Election;

/// `campaign_timeout(10 s)` on `e` advertising `value`.
async fn lead(e: &Election, value: &str) -> Leadership {
    e.campaign_timeout(value, Duration::from_secs(10))
        .await
        .unwrap_or_else(|err| panic!("campaign on `{}`: {err}", e.name()))
}

/// The first `try_campaign` of the case: `None` (and the case skipped) if the backend has no
/// elections.
async fn first_leader(case: &str, e: &Election, value: &str) -> Option<Leadership> {
    let l = supported(case, e.try_campaign(value).await).await?;
    Some(l.unwrap_or_else(|| panic!("{case}: a fresh election `{}` has a leader", e.name())))
}

/// The next [`Observer::next`] within [`EVENTUALLY`].
async fn next_change(case: &str, o: &mut Observer) -> Option<Leader> {
    tokio::time::timeout(EVENTUALLY, o.next())
        .await
        .unwrap_or_else(|_| panic!("{case}: no change observed within {EVENTUALLY:?}"))
        .unwrap_or_else(|e| panic!("{case}: observe: {e}"))
}

fn election(c: &Client, name: &str) -> Election {
    c.election(name).expect("election")
}

/// 3 clients × 3 candidates each campaign 3 times for one election: no two believed leaders
/// overlap, the fenced register refuses no believed leader's write, tokens strictly increase,
/// and every leader reads itself (owner, value) from `leader()` while it leads.
pub async fn one_leader_at_a_time<H: Harness>(h: &H) {
    let case = "one_leader_at_a_time";
    let name = unique_name("elect");
    let probe = h.client(fast_opts()).await;
    let Some(l) = first_leader(case, &election(&probe, &name), "probe").await else {
        return;
    };
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    let rec = Arc::new(OverlapRecorder::new());
    let reg = Arc::new(FencedRegister::new());
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut joins = Vec::new();
    for c in 0..3 {
        let client = h.client(fast_opts()).await;
        for t in 0..3 {
            let (client, name, rec, reg, tokens) = (
                client.clone(),
                name.clone(),
                rec.clone(),
                reg.clone(),
                tokens.clone(),
            );
            joins.push(tokio::spawn(async move {
                let me = format!("candidate-{c}-{t}");
                let e = election(&client, &name)
                    .with_owner(me.clone())
                    .expect("owner");
                for round in 0..3 {
                    let value = format!("{me} round {round}");
                    let l = e
                        .campaign_timeout(value.clone(), Duration::from_secs(60))
                        .await
                        .expect("campaign");
                    let visit = rec.enter(&name, &me, l.fencing_token(), l.is_lost());
                    reg.write(l.fencing_token(), &me, !l.is_lost());
                    tokens.lock().expect("tokens").push(l.fencing_token());
                    let seen = e.leader().await.expect("leader").expect("a leader");
                    if !l.is_lost() {
                        assert_eq!(
                            (seen.owner.as_str(), seen.value.as_str(), seen.fencing_token),
                            (me.as_str(), value.as_str(), l.fencing_token()),
                            "leader() does not show the leader"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    rec.exit(visit, l.is_lost());
                    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
                }
            }));
        }
    }
    for j in joins {
        j.await.expect("candidate task");
    }
    rec.assert_no_overlap();
    reg.assert_no_rejected_belief();
    let mut tokens = tokens.lock().expect("tokens").clone();
    assert_eq!(tokens.len(), 27);
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 27, "two leaderships shared a fencing token");
    assert_eq!(
        election(&probe, &name).leader().await.expect("leader"),
        None,
        "every candidate resigned, yet someone leads"
    );
}

/// `try_campaign` leads a free election and answers `None` while another candidate leads;
/// `leader()` tells who leads with which value and token; after a resignation the next leader
/// has a greater token. Campaigning again through the leading handle is the same leadership.
pub async fn try_campaign_and_leader<H: Harness>(h: &H) {
    let case = "try_campaign_and_leader";
    let name = unique_name("trycamp");
    let (a, b) = pair(h, fast_opts()).await;
    let ea = election(&a, &name).with_owner("alpha").expect("owner");
    let eb = election(&b, &name).with_owner("beta").expect("owner");
    let Some(la) = first_leader(case, &ea, "alpha:1").await else {
        return;
    };
    let seen = eb.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (seen.owner.as_str(), seen.value.as_str(), seen.fencing_token),
        ("alpha", "alpha:1", la.fencing_token())
    );
    assert_eq!(la.value(), "alpha:1");
    assert!(
        eb.try_campaign("beta:1").await.expect("try").is_none(),
        "two leaders"
    );
    // The same handle again: the same leadership, not a second one.
    let again = ea
        .try_campaign("ignored")
        .await
        .expect("try")
        .expect("the leader campaigning again leads");
    assert_eq!(again.fencing_token(), la.fencing_token());
    // Resigned explicitly: a dropped guard is released by the client's keeper task in the
    // background, which may not have run yet when `la` resigns below (on a backend whose
    // calls do not yield, e.g. file://, it had not: `la` then answered StillHeld).
    assert_eq!(
        again.resign().await.expect("resign the second handle"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    let info = a.inspect_kind(&name, KIND).await.expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert!(eb.try_campaign("beta:1").await.expect("try").is_none());
    assert_eq!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
    assert_eq!(eb.leader().await.expect("leader"), None);
    let lb = eb
        .try_campaign("beta:1")
        .await
        .expect("try")
        .expect("a free election");
    let first = seen.fencing_token;
    assert!(
        lb.fencing_token() > first,
        "token {} after {first}",
        lb.fencing_token()
    );
    assert_eq!(
        ea.leader().await.expect("leader").map(|l| l.owner),
        Some("beta".to_owned())
    );
    assert_eq!(lb.resign().await.expect("resign"), ReleaseOutcome::Released);
}

/// A candidate waiting in `campaign` is woken by the leader's resignation and leads, and
/// `campaign_timeout` answers `Timeout` while another candidate leads.
pub async fn resign_wakes_candidate<H: Harness>(h: &H) {
    let case = "resign_wakes_candidate";
    let name = unique_name("resign");
    let (a, b) = pair(h, fast_opts()).await;
    let Some(la) = first_leader(case, &election(&a, &name), "a").await else {
        return;
    };
    let eb = election(&b, &name);
    let e = eb
        .campaign_timeout("b", Duration::from_millis(300))
        .await
        .expect_err("led while another candidate led");
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    let waiting = tokio::spawn(async move {
        let l = lead(&eb, "b").await;
        (l, Instant::now())
    });
    wait_for_waiters(&a, &name, KIND, 1).await;
    assert!(!waiting.is_finished(), "led while another candidate led");
    let resigned = Instant::now();
    let token_a = la.fencing_token();
    assert_eq!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
    let (lb, at) = tokio::time::timeout(EVENTUALLY, waiting)
        .await
        .expect("the waiting candidate was not woken")
        .expect("task");
    assert!(at >= resigned);
    assert!(lb.fencing_token() > token_a);
    assert_eq!(lb.value(), "b");
    assert_eq!(lb.resign().await.expect("resign"), ReleaseOutcome::Released);
}

/// `proclaim` changes the advertised value (the leader and other clients read it); a
/// resigned leadership cannot proclaim; bad values are refused before reaching the server.
pub async fn proclaim_changes_value<H: Harness>(h: &H) {
    let case = "proclaim_changes_value";
    let name = unique_name("proclaim");
    let (a, b) = pair(h, fast_opts()).await;
    let Some(la) = first_leader(case, &election(&a, &name), "v0").await else {
        return;
    };
    let eb = election(&b, &name);
    for v in ["v1", "", "v3 with spaces, {braces} and ünïcode"] {
        la.proclaim(v).await.expect("proclaim");
        assert_eq!(la.value(), v);
        let seen = eb.leader().await.expect("leader").expect("a leader");
        assert_eq!(seen.value, v);
        assert_eq!(
            seen.fencing_token,
            la.fencing_token(),
            "proclaim changed the token"
        );
    }
    let long = "x".repeat(distlock_core::MAX_VALUE_LEN + 1);
    assert!(matches!(
        la.proclaim(long).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        la.proclaim("nul\0").await,
        Err(Error::InvalidArgument(_))
    ));
    // The longest value round-trips.
    let longest = "y".repeat(distlock_core::MAX_VALUE_LEN);
    la.proclaim(longest.clone()).await.expect("proclaim");
    assert_eq!(
        eb.leader().await.expect("leader").map(|l| l.value),
        Some(longest)
    );
    assert!(!la.is_lost());
    let token = la.fencing_token();
    assert_eq!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
    let lb = lead(&election(&b, &name), "b").await;
    assert!(lb.fencing_token() > token);
    assert_eq!(
        lb.value(),
        "b",
        "the next leader inherited a proclaimed value"
    );
    assert_eq!(lb.resign().await.expect("resign"), ReleaseOutcome::Released);
}

/// The backend's `proclaim` spoken directly: numbered proclamations apply once, a late one with
/// a lower number never overwrites a newer value, a duplicate is answered `Renewed` and changes
/// nothing, proclaim never changes the token, and a grant that no longer leads is `NotHeld`.
pub async fn stale_proclaim_is_ignored<H: Harness>(h: &H) {
    let case = "stale_proclaim_is_ignored";
    let name = unique_name("staleproclaim");
    let a = h.client(fast_opts()).await;
    let b = a.backend();
    let key = HoldKey::new(name.as_str(), "raw-candidate", KIND);
    let mut req = AcquireRequest::new(key, Duration::from_secs(10), LostSignal::new());
    req.value = Some("v0".into());
    let token = match supported(case, b.acquire(&req).await).await {
        None => return,
        Some(AcquireReply::Granted { token }) => token,
        Some(other) => panic!("{case}: a fresh election was not granted: {other:?}"),
    };
    let grant = req.grant(token);
    let value = async || {
        let info = a.inspect_kind(&name, KIND).await.expect("inspect");
        assert_eq!(info.holders.len(), 1, "{info:?}");
        assert_eq!(info.fencing_token, token, "{info:?}");
        info.holders[0].value.clone().unwrap_or_default()
    };
    assert_eq!(value().await, "v0");
    let proclaim = async |seq: u64, v: &str| b.proclaim(&grant, seq, v).await.expect("proclaim");
    assert_eq!(proclaim(2, "v2").await, RenewOutcome::Renewed);
    assert_eq!(value().await, "v2");
    // Late: a proclamation numbered before the current one.
    assert_eq!(proclaim(1, "v1 (late)").await, RenewOutcome::Renewed);
    assert_eq!(
        value().await,
        "v2",
        "a late proclamation overwrote a newer value"
    );
    // Duplicate: the same number again, as a retry after a lost reply.
    assert_eq!(proclaim(2, "v2 (retry)").await, RenewOutcome::Renewed);
    assert_eq!(
        value().await,
        "v2",
        "a duplicate proclamation applied twice"
    );
    assert_eq!(proclaim(3, "v3").await, RenewOutcome::Renewed);
    assert_eq!(value().await, "v3");
    // A stale address (right attempt, wrong token) touches nothing.
    let stale = GrantRef {
        token: token.saturating_sub(1),
        ..grant.clone()
    };
    assert_eq!(
        b.proclaim(&stale, 9, "stale").await.expect("proclaim"),
        RenewOutcome::NotHeld
    );
    assert_eq!(value().await, "v3");
    // A retried acquire of the same attempt keeps the proclaimed value and the token.
    assert_eq!(
        b.acquire(&req).await.expect("retried acquire"),
        AcquireReply::Granted { token }
    );
    assert_eq!(value().await, "v3", "a retried acquire reset the value");
    assert_eq!(
        b.release(&grant).await.expect("r"),
        ReleaseOutcome::Released
    );
    assert_eq!(proclaim(4, "gone").await, RenewOutcome::NotHeld);
    let info = a.inspect_kind(&name, KIND).await.expect("inspect");
    assert!(info.holders.is_empty(), "{info:?}");
}

/// An observer answers the current state first, then each change: a new leader, a new value,
/// a resignation (nobody, or the next leader).
pub async fn observe_changes<H: Harness>(h: &H) {
    let case = "observe_changes";
    let name = unique_name("observe");
    let (a, b) = pair(h, fast_opts()).await;
    let ea = election(&a, &name).with_owner("alpha").expect("owner");
    let mut o = election(&b, &name).observe();
    match supported(
        case,
        tokio::time::timeout(EVENTUALLY, o.next())
            .await
            .expect("first next"),
    )
    .await
    {
        None => return,
        Some(None) => {}
        Some(Some(l)) => panic!("{case}: a fresh election has a leader: {l:?}"),
    }
    let la = lead(&ea, "one").await;
    let seen = next_change(case, &mut o).await.expect("a leader");
    assert_eq!(
        (seen.owner.as_str(), seen.value.as_str(), seen.fencing_token),
        ("alpha", "one", la.fencing_token())
    );
    la.proclaim("two").await.expect("proclaim");
    let seen = next_change(case, &mut o).await.expect("a leader");
    assert_eq!(
        (seen.value.as_str(), seen.fencing_token),
        ("two", la.fencing_token())
    );
    let token = la.fencing_token();
    assert_eq!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
    assert_eq!(
        next_change(case, &mut o).await,
        None,
        "the resignation was not observed"
    );
    // A new leader after nobody.
    let lb = lead(
        &election(&a, &name).with_owner("gamma").expect("owner"),
        "three",
    )
    .await;
    let seen = next_change(case, &mut o).await.expect("a leader");
    assert_eq!(seen.owner, "gamma");
    assert!(seen.fencing_token > token);
    // A second observer starts from the current state.
    let mut o2 = election(&a, &name).observe();
    assert_eq!(
        next_change(case, &mut o2).await.map(|l| l.value),
        Some("three".to_owned())
    );
    assert_eq!(lb.resign().await.expect("resign"), ReleaseOutcome::Released);
    assert_eq!(next_change(case, &mut o2).await, None);
}

/// A leader whose connections are cut (every request and reply lost) loses its leadership:
/// its lost signal fires before another candidate leads, and the new leader's token is
/// greater. Backends without a network connection or without leases skip it.
pub async fn partitioned_leader_replaced<H: Harness>(h: &H) {
    let case = "partitioned_leader_replaced";
    if !h.caps().lease_expiry {
        return skip(case, "leadership lasts as long as the leader process here");
    }
    let name = unique_name("partition");
    let Some((p, proxy)) = h.proxied_client(fast_opts()).await else {
        return skip(case, "the harness has no proxied client");
    };
    let b = h.client(fast_opts()).await;
    let Some(la) = first_leader(case, &election(&p, &name), "cut off").await else {
        return;
    };
    let waiting = {
        let eb = election(&b, &name);
        tokio::spawn(async move {
            let l = eb
                .campaign_timeout("successor", Duration::from_secs(30))
                .await
                .expect("the successor never led");
            (l, Instant::now())
        })
    };
    wait_for_waiters(&b, &name, KIND, 1).await;
    let lost_at = {
        let lost = la.lost_signal();
        tokio::spawn(async move {
            lost.lost_owned().await;
            Instant::now()
        })
    };
    proxy.set_blackhole(true);
    let (lb, led_at) = tokio::time::timeout(Duration::from_secs(40), waiting)
        .await
        .expect("no new leader")
        .expect("task");
    let lost_at = tokio::time::timeout(EVENTUALLY, lost_at)
        .await
        .expect("the cut-off leader's lost signal never fired")
        .expect("task");
    assert!(
        lost_at <= led_at,
        "a new leader was elected {:?} before the old one learned it had lost",
        lost_at - led_at
    );
    assert!(la.is_lost());
    assert!(lb.fencing_token() > la.fencing_token());
    proxy.heal();
    assert_ne!(
        la.resign().await.expect("resign"),
        ReleaseOutcome::Released,
        "the old leadership was still held"
    );
    let seen = election(&b, &name).leader().await.expect("leader");
    assert_eq!(seen.map(|l| l.value), Some("successor".to_owned()));
    assert_eq!(lb.resign().await.expect("resign"), ReleaseOutcome::Released);
}

/// A campaign dropped while it waits leaves no candidate behind: after the leader resigns the
/// election comes free (a grant that raced with the drop is resigned in the background), and
/// a new candidate leads at once.
pub async fn cancelled_campaign_leaves_nothing<H: Harness>(h: &H) {
    let case = "cancelled_campaign_leaves_nothing";
    let name = unique_name("cancelcamp");
    let (a, b) = pair(h, fast_opts()).await;
    let Some(la) = first_leader(case, &election(&a, &name), "a").await else {
        return;
    };
    let eb = election(&b, &name);
    for _ in 0..3 {
        let fut = eb.campaign("dropped");
        let stopped = tokio::time::timeout(Duration::from_millis(200), fut).await;
        assert!(stopped.is_err(), "led while another candidate led");
    }
    // And one dropped after it is known to wait on the server.
    let waiting = {
        let eb = eb.clone();
        tokio::spawn(async move { eb.campaign("dropped later").await })
    };
    wait_for_waiters(&a, &name, KIND, 1).await;
    waiting.abort();
    assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
    // The dropped wait may have been granted on the server as it was being stopped (the
    // resignation freed the election at that moment); such a leadership is resigned in the
    // background, so the election must come free, not necessarily at once.
    let info = poll_until(
        "a dropped candidate still leads or waits",
        async || a.inspect_kind(&name, KIND).await.expect("inspect"),
        |i| i.holders.is_empty() && i.waiters.is_none_or(|w| w == 0),
    )
    .await;
    assert_eq!(Leader::of(&info), None);
    let c = h.client(fast_opts()).await;
    let lc = election(&c, &name)
        .try_campaign("c")
        .await
        .expect("try")
        .expect("a dropped candidate still leads or blocks the election");
    assert_eq!(lc.resign().await.expect("resign"), ReleaseOutcome::Released);
}

/// An election and a lock of the same name are independent: holding one never blocks the
/// other, and each one's inspect shows only its own holder.
pub async fn election_apart_from_lock<H: Harness>(h: &H) {
    let case = "election_apart_from_lock";
    let name = unique_name("apart");
    let (a, b) = pair(h, fast_opts()).await;
    let g = hold(&a, &name).await;
    let Some(l) = first_leader(
        case,
        &election(&b, &name).with_owner("leader").expect("owner"),
        "v",
    )
    .await
    else {
        drop(g);
        return;
    };
    let lock_info = a.inspect(&name).await.expect("inspect");
    assert_eq!(lock_info.holders.len(), 1, "{lock_info:?}");
    assert_eq!(lock_info.holders[0].owner, g.owner(), "{lock_info:?}");
    assert_eq!(lock_info.holders[0].value, None, "{lock_info:?}");
    // The last token issued for the lock (Redlock reports its nodes' highest counter, which
    // may run ahead of the grant's token; never behind it).
    assert!(
        lock_info.fencing_token >= g.fencing_token(),
        "{lock_info:?}"
    );
    let e_info = a.inspect_kind(&name, KIND).await.expect("inspect");
    assert_eq!(e_info.holders.len(), 1, "{e_info:?}");
    assert_eq!(e_info.holders[0].owner, "leader", "{e_info:?}");
    assert_eq!(e_info.holders[0].value.as_deref(), Some("v"));
    assert_eq!(e_info.fencing_token, l.fencing_token(), "{e_info:?}");
    // Leading the election gives no share of the lock: another owner still finds it held.
    assert!(
        try_lock(&b, &name).await.is_none(),
        "the election's leader got the lock of the same name"
    );
    assert_released(g).await;
    // The lock is free although the election has a leader, and the other way round.
    let g2 = try_lock(&a, &name)
        .await
        .expect("the lock is blocked by the election of the same name");
    assert!(!l.is_lost());
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    let l2 = election(&b, &name)
        .try_campaign("v2")
        .await
        .expect("try")
        .expect("the election is blocked by the lock of the same name");
    assert_released(g2).await;
    assert_eq!(l2.resign().await.expect("resign"), ReleaseOutcome::Released);
}

/// Bad election input: typed errors with a message, before any server round trip.
pub async fn election_invalid_input<H: Harness>(h: &H) {
    let a = h.client(fast_opts()).await;
    let msg = |e: Error| {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        e.to_string()
    };
    assert!(msg(a.election("").unwrap_err()).contains("empty"));
    assert!(msg(a
        .election(&"n".repeat(distlock_core::MAX_NAME_LEN + 1))
        .unwrap_err())
    .contains("limit"));
    let e = election(&a, &unique_name("badvalue"));
    assert!(msg(e.clone().with_owner("").unwrap_err()).contains("empty"));
    let long = "x".repeat(distlock_core::MAX_VALUE_LEN + 1);
    assert!(msg(e.try_campaign(long.clone()).await.unwrap_err()).contains("limit"));
    assert!(msg(e.campaign(long).await.unwrap_err()).contains("limit"));
    assert!(msg(e.try_campaign("a\0b").await.unwrap_err()).contains("NUL"));
    assert_eq!(e.leader().await.ok().flatten(), None);
}
