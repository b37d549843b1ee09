//! Election cases both SQL backends run in every mode: numbered proclamations through a
//! proxy that holds a reply back, and the operator commands on an election beside the lock of
//! the same name.

use super::{SqlMode, SqlServer};
use crate::conformance::{fast_opts, poll_until, unique_name, EVENTUALLY};
use crate::DelayProxy;
use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, HoldKey, LockKind, LostSignal, ReleaseOutcome,
    RenewOutcome,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A proclamation whose reply comes after the client's operation timeout is retried by the core
/// with the same number: it has the effect of one. On the backend trait, a late duplicate with
/// an older number never overwrites a newer value, a retry of the current number changes
/// nothing, neither touches the lease, and a grant that is not (or no longer) the leader's is
/// `NotHeld`. `stored(name)` reads the election's stored `value#seq` on the server and
/// `lease(name)` where the mode keeps the grant's lease end.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is a whole test.
pub async fn election_proclamations<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    stored: impl Fn(&str) -> String,
    lease: impl Fn(&str) -> String,
) {
    let name = unique_name("el-proclaim");
    let op = Duration::from_millis(500);
    // A long lease: nothing here may be explained by a lease running out or a renewal.
    let long = fast_opts().watchdog_lease(Duration::from_secs(60));
    let opts = long.clone().op_timeout(op);
    let proxy = DelayProxy::start(mode.server.addr(), Duration::ZERO).expect("proxy");
    let backend = mode.backend_via(&proxy.addr().to_string(), &opts).await;
    let a = Client::new(Arc::new(backend), opts.clone()).expect("client");
    let leader = a
        .election(&name)
        .expect("election")
        .campaign("v0")
        .await
        .expect("leads");
    assert_eq!(stored(&name), "v0#0");
    // The next reply through the proxy (the proclamation's) is held back past the timeout.
    let before = proxy.stats().replies.chunks_read;
    proxy.set_reply_delay(Duration::from_millis(750));
    let lift = async {
        let t = Instant::now();
        while proxy.stats().replies.chunks_read == before {
            assert!(t.elapsed() < EVENTUALLY, "no reply came through the proxy");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        proxy.set_reply_delay(Duration::ZERO);
    };
    let t = Instant::now();
    let (out, ()) = tokio::join!(leader.proclaim("v1"), lift);
    assert!(
        t.elapsed() >= op,
        "the reply was not late ({:?})",
        t.elapsed()
    );
    out.expect("proclaim");
    assert_eq!(leader.value(), "v1");
    assert_eq!(stored(&name), "v1#1", "mode {:?}", mode.params);
    leader.proclaim("v2").await.expect("proclaim");
    assert_eq!(stored(&name), "v2#2");
    leader.resign().await.expect("resign");

    // On the trait: numbered proclamations of one grant.
    let b = mode.backend(&long).await;
    let key = HoldKey::new(name.as_str(), "direct", LockKind::Election);
    let mut req = AcquireRequest::new(key, Duration::from_secs(60), LostSignal::new());
    req.value = Some("w0".into());
    let AcquireReply::Granted { token } = b.acquire(&req).await.expect("acquire") else {
        panic!("not granted");
    };
    let grant = req.grant(token);
    let lease_before = lease(&name);
    // New, late (an older number), duplicated (the same number again).
    for (seq, value) in [(2, "w2"), (1, "w1"), (2, "w2-again")] {
        assert_eq!(
            b.proclaim(&grant, seq, value).await.expect("proclaim"),
            RenewOutcome::Renewed,
            "{seq} {value}"
        );
    }
    assert_eq!(stored(&name), "w2#2");
    let info = b.inspect(&name, LockKind::Election).await.expect("inspect");
    assert_eq!(info.holders[0].value.as_deref(), Some("w2"));
    assert_eq!(info.fencing_token, token);
    assert_eq!(lease(&name), lease_before, "a proclamation moved the lease");
    // Another token of the same attempt is not this grant.
    assert_eq!(
        b.proclaim(&req.grant(token + 1), 3, "x")
            .await
            .expect("proclaim"),
        RenewOutcome::NotHeld
    );
    assert_eq!(
        b.release(&grant).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        b.proclaim(&grant, 3, "w3").await.expect("proclaim"),
        RenewOutcome::NotHeld
    );
    assert_eq!(stored(&name), "w2#2");
}

/// A campaign dropped while it waits on the server leaves nothing: no waiting session or
/// connection (`waiting(name)`, the server's count of sessions waiting for the election, reads
/// `0` again), no row of the dropped candidate `b` (`rows_of_b(name)` reads `0`), and the next
/// candidate leads at once, with a higher token, when the leader resigns.
///
/// # Errors
/// None: panics when the case fails.
///
/// # Cancel safety
/// Not meant to be cancelled: it is a whole test.
pub async fn election_cancelled_campaign<S: SqlServer, B: Backend + 'static>(
    mode: &SqlMode<S, B>,
    waiting: impl Fn(&str) -> String,
    rows_of_b: impl Fn(&str) -> String,
) {
    let name = unique_name("el-cancel");
    let until = async |want: &str| {
        let what = format!("{want} sessions waiting for the election");
        poll_until(&what, async || waiting(&name), |v| v == want).await;
    };
    let a = mode.client_with(fast_opts()).await;
    let b = mode.client_with(fast_opts()).await;
    let leader = a
        .election(&name)
        .expect("election")
        .campaign("a")
        .await
        .expect("leads");
    let eb = b
        .election(&name)
        .expect("election")
        .with_owner("b")
        .expect("owner");
    for _ in 0..3 {
        until("0").await;
        let campaign = eb.campaign("b");
        // Dropped once it waits on the server.
        tokio::select! {
            r = campaign => panic!("led while another leads: {:?}", r.map(|l| l.fencing_token())),
            () = until("1") => {}
        }
    }
    until("0").await;
    assert_eq!(rows_of_b(&name), "0", "the dropped candidate left a row");
    let t1 = leader.fencing_token();
    assert_eq!(
        leader.resign().await.expect("resign"),
        ReleaseOutcome::Released
    );
    let c = mode.client_with(fast_opts()).await;
    let next = c
        .election(&name)
        .expect("election")
        .try_campaign("c")
        .await
        .expect("campaign")
        .expect("free at once");
    assert!(next.fencing_token() > t1);
    next.resign().await.expect("resign");
}

/// The operator commands tell an election from the lock of the same name: `list` shows both,
/// each with its own holder (and the leader's value), and `force_release(name, Election)`
/// revokes the leader only (its lost signal fires; the counter moves past its token), leaving
/// the lock held.
pub async fn election_operator_commands<S: SqlServer, B: Backend + 'static>(mode: &SqlMode<S, B>) {
    let name = unique_name("el-ops");
    let a = mode.client_with(fast_opts()).await;
    let b = mode.client_with(fast_opts()).await;
    let g = a.lock(&name).expect("lock").acquire().await.expect("lock");
    let l = b
        .election(&name)
        .expect("election")
        .with_owner("leader")
        .expect("owner")
        .campaign("v")
        .await
        .expect("leads");
    let listed = a.list(&name).await.expect("list");
    let mut kinds: Vec<(LockKind, Vec<String>, Option<String>)> = listed
        .iter()
        .map(|l| {
            (
                l.kind,
                l.info.holders.iter().map(|h| h.owner.clone()).collect(),
                l.info.holders.first().and_then(|h| h.value.clone()),
            )
        })
        .collect();
    // Backends list in their own order.
    kinds.sort_by_key(|k| format!("{:?}", k.0));
    assert_eq!(
        kinds,
        vec![
            (
                LockKind::Election,
                vec!["leader".to_owned()],
                Some("v".to_owned())
            ),
            (LockKind::Mutex, vec![g.owner().to_owned()], None),
        ],
        "mode {:?}",
        mode.params
    );
    let forced = a
        .force_release(&name, LockKind::Election)
        .await
        .expect("force");
    assert_eq!(forced.removed.len(), 1, "{forced:?}");
    assert_eq!(forced.removed[0].owner, "leader");
    assert!(forced.fencing_token > l.fencing_token());
    tokio::time::timeout(Duration::from_secs(10), l.lost())
        .await
        .expect("the revoked leader's lost signal");
    assert_eq!(
        a.election(&name)
            .expect("election")
            .leader()
            .await
            .expect("leader"),
        None
    );
    assert!(!g.is_lost());
    let lock = a
        .backend()
        .inspect(&name, LockKind::Mutex)
        .await
        .expect("inspect");
    assert_eq!(lock.holders.len(), 1);
    assert_eq!(
        g.release().await.expect("release"),
        distlock_core::ReleaseOutcome::Released
    );
}
