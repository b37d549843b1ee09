//! The grant-addressed protocol under Redlock's own faults, on real redis-servers: a node whose
//! replies arrive after the node timeout (a delaying proxy), retried requests driven through
//! the Backend trait, a node restarted or flushed while a lock is held, and fresh clients that
//! start after it. Bounds are generous (a loaded 2-core machine) and states are polled.

mod common;

use common::{acquire_within, acquired, assert_increasing, opts, pttl, wait_counting, Cluster};
use distlock_core::backend::{AcquireReply, AcquireRequest, HoldKey, RenewOutcome};
use distlock_core::{Backend, Client, LockKind, LostSignal, ReleaseOutcome};
use distlock_redlock::RedlockBackend;
use distlock_testkit::DelayProxy;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Polls `f` every 10 ms until it is true; panics with `what` after `within`.
async fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < within, "{what} (waited {within:?})");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A 3-node cluster whose node 2 answers only after `delay` each way (beyond the node
/// timeout, half the delay), and a client to it.
async fn slow_third(delay: Duration, lease_ms: u64) -> (Cluster, DelayProxy, Client) {
    let c = Cluster::start(3);
    c.settle().await;
    let proxy = DelayProxy::start(c.servers[2].addr(), delay).expect("proxy");
    // Not a fixed 50 ms: that flaked under load (the fast nodes late too).
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?quarantine=500ms&node_timeout={}ms",
        c.servers[0].port(),
        c.servers[1].port(),
        proxy.port(),
        delay.as_millis() / 2
    );
    let o = opts(lease_ms);
    let b = RedlockBackend::connect(&url, &o).await.expect("connect");
    wait_counting(&b, 3, Duration::from_secs(10)).await;
    let client = Client::new(Arc::new(b), o).expect("client");
    (c, proxy, client)
}

/// The attempt id stored with node `i`'s hold of `name` (empty if none).
fn attempt_on(c: &Cluster, i: usize, name: &str) -> String {
    let v = c.servers[i]
        .command(&["HGET", &format!("dlock:{{{name}}}"), "attempt"])
        .expect("HGET");
    if v == "(nil)" {
        String::new()
    } else {
        v
    }
}

fn key(name: &str, owner: &str) -> HoldKey {
    HoldKey::new(name, owner, LockKind::Mutex)
}

async fn granted(b: &Arc<dyn Backend>, req: &AcquireRequest) -> u64 {
    match b.acquire(req).await.expect("acquire") {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    }
}

/// Issue 11: with per-node hold counts, a release retried after a late reply decremented the
/// slow node twice, and a retried acquire counted twice. Now every hold is one attempt's, by
/// its id: a retried acquire is the same grant with the same token, a retried release of it is
/// reported (`Expired`) and touches nothing else — not the grant another attempt of the *same
/// owner* (what the second re-entrant guard used to be) took meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_requests_after_a_late_reply_touch_only_their_grant() {
    let (c, _proxy, client) = slow_third(Duration::from_millis(150), 3000).await;
    let b = client.backend().clone();
    let name = "late-retry";
    let req = AcquireRequest::new(
        key(name, "one-owner"),
        Duration::from_secs(3),
        LostSignal::new(),
    );
    let t1 = granted(&b, &req).await;
    // The retry of a request whose reply was lost: same grant, same token, one hold per node.
    let t2 = granted(&b, &req).await;
    assert_eq!(t1, t2, "a retried acquire got a second token");
    eventually(
        Duration::from_secs(5),
        "the slow node never got the hold",
        || (0..3).all(|i| attempt_on(&c, i, name) == req.attempt.as_str()),
    )
    .await;
    let grant = req.grant(t1);
    // Released by the two fast nodes; the slow node's release (and its reply) is still on the
    // wire when this returns.
    assert_eq!(
        b.release(&grant).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Another attempt of the same owner takes the lock at once (the fast majority is free).
    let second = AcquireRequest::new(
        key(name, "one-owner"),
        Duration::from_secs(3),
        LostSignal::new(),
    );
    let t3 = loop {
        match b.acquire(&second).await.expect("second acquire") {
            AcquireReply::Granted { token } => break token,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(t3 > t1, "tokens {t1} then {t3}");
    // The first release is retried (as after a lost reply), twice: reported, not repeated.
    for _ in 0..2 {
        let again = b.release(&grant).await.expect("retried release");
        assert_ne!(
            again,
            ReleaseOutcome::Released,
            "a retried release freed something"
        );
    }
    // The second grant is intact on the majority that granted it, and the slow node ends
    // up with nothing of the first attempt (its vote of the second may have found the first
    // still there: it holds the second or nothing).
    for i in 0..2 {
        assert_eq!(attempt_on(&c, i, name), second.attempt.as_str(), "node {i}");
    }
    eventually(
        Duration::from_secs(5),
        "the first attempt's hold stayed on the slow node",
        || attempt_on(&c, 2, name) != req.attempt.as_str(),
    )
    .await;
    let other = client
        .lock(name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(other.is_none(), "another owner got a held lock");
    let out = b
        .renew(&[(second.grant(t3), Duration::from_secs(3))])
        .await
        .expect("renew");
    assert_eq!(out, vec![RenewOutcome::Renewed]);
    assert_eq!(
        b.release(&second.grant(t3)).await.expect("release"),
        ReleaseOutcome::Released
    );
    eventually(Duration::from_secs(5), "a hold was left behind", || {
        (0..3).all(|i| !c.has_lock(i, name))
    })
    .await;
}

/// The same with guards: two re-entrant guards of one owner share one grant (counted in the
/// client); releasing the first — with the slow node's replies arriving after the node
/// timeout — leaves the lock held for the second on every node until the second goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_reentrant_guard_keeps_the_lock_past_a_late_release() {
    let (c, _proxy, client) = slow_third(Duration::from_millis(150), 1500).await;
    let name = "reentrant-late";
    let lock = client.lock(name).expect("lock");
    let g1 = lock.acquire().await.expect("first guard");
    let g2 = lock.acquire().await.expect("second guard");
    assert_eq!(g1.fencing_token(), g2.fencing_token());
    c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
        .await;
    let attempt = attempt_on(&c, 0, name);
    assert_eq!(
        g1.release().await.expect("release first"),
        ReleaseOutcome::StillHeld { remaining: 1 }
    );
    // Past two watchdog leases: still held by the same grant everywhere, renewed through
    // the slow node's late replies.
    let until = Instant::now() + Duration::from_millis(3200);
    let rival = c.client("quarantine=500ms", opts(1500)).await;
    while Instant::now() < until {
        assert!(!g2.is_lost(), "{:?}", g2.lost_signal().reason());
        assert!(
            rival
                .lock(name)
                .expect("lock")
                .try_acquire()
                .await
                .expect("try")
                .is_none(),
            "the lock was free while the second guard held it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..3 {
        assert_eq!(attempt_on(&c, i, name), attempt, "node {i} lost the grant");
    }
    assert_eq!(
        g2.release().await.expect("release second"),
        ReleaseOutcome::Released
    );
    assert!(acquire_within(&rival, name, 5).await.is_ok());
}

/// Issue 11 (2): an extension shorter than what is left never shortens the lease on any node,
/// including one whose replies arrive late, and a late short renewal arriving after a longer
/// one changes nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_extend_never_shortens_on_any_node() {
    let (c, _proxy, client) = slow_third(Duration::from_millis(150), 3000).await;
    let name = "short-extend";
    // Watchdog guard (3 s lease) extended by 100 ms.
    let g = acquired(&client, name).await;
    c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
        .await;
    g.extend(Duration::from_millis(100)).await.expect("extend");
    for i in 0..2 {
        let left = pttl(&c, i, name);
        assert!(
            left > 1500,
            "node {i}: the lease was shortened to {left} ms"
        );
    }
    // Let the slow node apply it too, then look: nothing below 1.5 s anywhere.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for i in 0..3 {
        let left = pttl(&c, i, name);
        assert!(
            left > 1500,
            "node {i}: the lease was shortened to {left} ms"
        );
    }
    assert!(!g.is_lost());
    g.release().await.expect("release");

    // Fixed 4 s lease, extended by 50 ms: a rival still cannot get it 1 s later.
    let fixed = client
        .lock("short-extend-fixed")
        .expect("lock")
        .lease(Duration::from_secs(4))
        .expect("lease");
    let g = fixed.acquire().await.expect("acquire");
    g.extend(Duration::from_millis(50)).await.expect("extend");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!g.is_lost(), "the guard thinks its lease was shortened");
    for i in 0..3 {
        let left = pttl(&c, i, "short-extend-fixed");
        assert!(
            left > 1500,
            "node {i}: the lease was shortened to {left} ms"
        );
    }
    let rival = c.client("quarantine=500ms", opts(3000)).await;
    assert!(rival
        .lock("short-extend-fixed")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());

    // Through the trait: a long renewal, then a short one (as a late retry would arrive).
    let b = client.backend().clone();
    let req = AcquireRequest::new(
        key("short-renew", "o"),
        Duration::from_secs(1),
        LostSignal::new(),
    );
    let t = granted(&b, &req).await;
    let grant = req.grant(t);
    // The slow node's vote came in after the decision, under its own counter: the grant's
    // token reaches it one round trip later (until then it is not part of the grant, and a
    // renewal naming the grant passes it by).
    eventually(
        Duration::from_secs(5),
        "the slow node never got the token",
        || {
            c.servers[2]
                .command(&["HGET", "dlock:{short-renew}", "token"])
                .is_ok_and(|v| v == t.to_string())
        },
    )
    .await;
    for d in [Duration::from_secs(5), Duration::from_millis(10)] {
        assert_eq!(
            b.renew(&[(grant.clone(), d)]).await.expect("renew"),
            vec![RenewOutcome::Renewed]
        );
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for i in 0..3 {
        let left = pttl(&c, i, "short-renew");
        assert!(
            left > 3500,
            "node {i}: a short renewal shortened it to {left} ms"
        );
    }
    b.release(&grant).await.expect("release");
}

/// A vote that arrives after the attempt was decided can only create that attempt's hold,
/// under its own counter (the quorum's token never reached it): the grant's release removes
/// it, and so does a give-up of an attempt whose vote is still out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_votes_are_released_with_their_attempt() {
    let (c, _proxy, client) = slow_third(Duration::from_millis(300), 3000).await;
    let b = client.backend().clone();
    // Released at once: the slow node's vote and release are both still on the wire.
    let name = "late-vote";
    let req = AcquireRequest::new(key(name, "o"), Duration::from_secs(10), LostSignal::new());
    let t = granted(&b, &req).await;
    assert_eq!(
        b.release(&req.grant(t)).await.expect("release"),
        ReleaseOutcome::Released
    );
    // Given up at once (as after a lost reply).
    let name2 = "late-vote-give-up";
    let req2 = AcquireRequest::new(key(name2, "o"), Duration::from_secs(10), LostSignal::new());
    granted(&b, &req2).await;
    b.give_up(&req2).await.expect("give up");
    // Well within the 10 s lease: nothing left on the slow node.
    eventually(
        Duration::from_secs(4),
        "a late vote's hold was left",
        || !c.has_lock(2, name) && !c.has_lock(2, name2),
    )
    .await;
    // And it stays gone (the late raise, if any, came after and found nothing).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!c.has_lock(2, name) && !c.has_lock(2, name2));
}

/// Issue 12: the restart quarantine lives on the node. A node restarts without its data while
/// A holds a lock; A's client initialises it again (quarantine: A's lease). A *fresh* client
/// that starts afterwards — a short-lived CLI whose own quarantine would be 200 ms — must not
/// count the node before the node's own clock passes the end A stored: otherwise the restarted
/// node plus the one node where A's hold is gone are a majority while A's lease still runs on
/// the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_client_honours_the_quarantine_of_a_restarted_node() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let name = "restart-fresh";
    let (a, ab) = c
        .client_and_backend("check_interval=100ms", opts(3000))
        .await;
    wait_counting(&ab, 3, Duration::from_secs(10)).await;
    let ga = acquired(&a, name).await;
    c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
        .await;
    // Node 2 loses A's hold (as if it had expired there), and node 0 crashes at once and comes
    // back empty. A's last renewal a majority confirmed was sent before the crash (after it,
    // only node 1 has the hold), so A's lease ends at most 3 s after `crashed`.
    c.break_lock_on(2, name);
    let crashed = Instant::now();
    c.servers[0].restart().expect("restart");
    // A notices and initialises node 0 again, storing the quarantine on it.
    eventually(
        Duration::from_secs(10),
        "node 0 was never initialised again",
        || {
            c.servers[0]
                .command(&["EXISTS", "dlock:redlock:epoch"])
                .is_ok_and(|v| v == "1")
        },
    )
    .await;
    let seeded = Instant::now();
    // The fresh client, created after the restart and the seeding.
    let (f, fb) = c.client_and_backend("quarantine=200ms", opts(600)).await;
    let st = fb.node_status();
    assert!(
        st[0]
            .quarantined_for
            .is_some_and(|q| q > Duration::from_millis(1500))
            && !st[0].counts,
        "the fresh client counts the restarted node: {st:#?}"
    );
    // It must not get the lock while A's hold lives on node 1.
    let lock = f.lock(name).expect("lock");
    let got = loop {
        match lock.try_acquire().await {
            Ok(Some(g)) => {
                // Nodes 0 and 2 granted it: not before A's lease may have ended.
                assert!(
                    crashed.elapsed() > Duration::from_secs(3),
                    "granted while A's lease may still run: {:?} after the crash",
                    crashed.elapsed()
                );
                break g;
            }
            Ok(None) => {}
            Err(e) => assert!(e.is_connection(), "{e}"),
        }
        assert!(
            seeded.elapsed() < Duration::from_secs(15),
            "the fresh client never got the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Not before the quarantine A stored (3 s + drift from the seeding) ran out.
    assert!(
        seeded.elapsed() > Duration::from_millis(2900),
        "granted {:?} after the seeding",
        seeded.elapsed()
    );
    assert!(got.fencing_token() > ga.fencing_token());
    assert!(
        ga.is_lost()
            || tokio::time::timeout(Duration::from_secs(5), ga.lost())
                .await
                .is_ok()
    );
    got.release().await.expect("release");
}

/// Fencing tokens after a node loses its data without restarting (FLUSHALL: same process,
/// same uptime, so nothing but the node's own record can tell a client that starts later):
/// a fresh client honours the stored quarantine, and with the node that never lost anything
/// gone, the two flushed nodes alone (their counters gone, their votes floored by their
/// clocks) still hand out larger tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_after_a_node_flushall() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let name = "flushed";
    let p = "check_interval=100ms";
    let (a, ab) = c.client_and_backend(p, opts(1000)).await;
    wait_counting(&ab, 3, Duration::from_secs(10)).await;
    let mut tokens = Vec::new();
    let grab = |cl: Client| async move {
        let g = acquire_within(&cl, name, 10).await.expect("acquire");
        let t = g.fencing_token();
        g.release().await.expect("release");
        t
    };
    for _ in 0..5 {
        tokens.push(grab(a.clone()).await);
    }
    for node in [0, 1] {
        assert_eq!(
            c.servers[node].command(&["FLUSHALL"]).expect("FLUSHALL"),
            "OK"
        );
        // Grants go on with the other two meanwhile.
        tokens.push(grab(a.clone()).await);
        eventually(Duration::from_secs(10), "never initialised again", || {
            c.servers[node]
                .command(&["EXISTS", "dlock:redlock:epoch"])
                .is_ok_and(|v| v == "1")
        })
        .await;
        // A client that starts now, with a quarantine of its own far shorter than A's lease,
        // still sees the node quarantined.
        let (f, fb) = c.client_and_backend("quarantine=50ms", opts(300)).await;
        let st = fb.node_status();
        assert!(
            st[node].quarantined_for.is_some() && !st[node].counts,
            "a fresh client counts the flushed node: {st:#?}"
        );
        tokens.push(grab(f.clone()).await);
        // Both clients count it again once its quarantine is over.
        wait_counting(&ab, 3, Duration::from_secs(10)).await;
        wait_counting(&fb, 3, Duration::from_secs(10)).await;
        tokens.push(grab(f).await);
    }
    // Only the two flushed nodes remain.
    c.servers[2].kill();
    for _ in 0..3 {
        tokens.push(grab(a.clone()).await);
    }
    assert_increasing(&tokens);
}

/// A waiter queues on every node while it waits; when its deadline passes it leaves every
/// queue (the give-up runs before the acquire returns), so nothing it left makes the free lock
/// refuse the next `try_acquire` (a free lock goes to the first live waiter only). A give-up
/// repeated through the trait changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_stops_leaves_every_queue() {
    let c = Cluster::start(3);
    c.settle().await;
    let p = "quarantine=500ms";
    let (a, ab) = c.client_and_backend(p, opts(1000)).await;
    let b = c.client(p, opts(1000)).await;
    let name = "leaves";
    let g = acquired(&a, name).await;
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { acquire_within(&b, name, 1).await }
    });
    eventually(
        Duration::from_secs(5),
        "the waiter never queued on every node",
        || (0..3).all(|i| c.queued_on(i, name) == 1),
    )
    .await;
    let r = waiter.await.expect("waiter");
    assert!(matches!(&r, Err(e) if e.is_timeout()), "{r:?}");
    for i in 0..3 {
        assert_eq!(c.queued_on(i, name), 0, "node {i} kept the waiter");
    }
    let bk: Arc<dyn Backend> = ab;
    let req = AcquireRequest::new(key(name, "x"), Duration::from_secs(1), LostSignal::new());
    bk.give_up(&req).await.expect("give up");
    bk.give_up(&req).await.expect("give up again");
    assert!(a.inspect(name).await.expect("inspect").held());
    assert_eq!(g.release().await.expect("r"), ReleaseOutcome::Released);
    let t = Instant::now();
    loop {
        if let Some(g) = b
            .lock(name)
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
        {
            assert_eq!(g.release().await.expect("r"), ReleaseOutcome::Released);
            break;
        }
        // Only the release landing on the slower nodes can be in the way, not a queue entry.
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the free lock was refused"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Calls of `command` on node `i` since the last `CONFIG RESETSTAT`.
fn calls(c: &Cluster, i: usize, command: &str) -> u64 {
    c.servers[i].calls(command).expect("INFO commandstats")
}

/// Where no waiter queues, a node's vote and release skip the queue work: one `EXISTS` of the
/// queue instead of the dead-waiter scan, the look at its head and (on release) leaving it; a
/// grant moves the counter on with one `GET` and one `SET` (scripts/fence.lua). (Before: a
/// `ZRANGEBYSCORE` and a `ZRANGE` per vote, two `ZREM`s, a `TIME`, a `ZRANGEBYSCORE` and a
/// `ZRANGE` per release.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_votes_and_releases_skip_the_queue_work() {
    let c = Cluster::start(3);
    c.settle().await;
    let (client, b) = c.client_and_backend("", opts(5000)).await;
    wait_counting(&b, 3, Duration::from_secs(10)).await;
    let name = "no-queue-work";
    let lock = client.lock(name).expect("lock");
    lock.try_acquire()
        .await
        .expect("try")
        .expect("free")
        .release()
        .await
        .expect("release");
    // Every node has its hold and release of the warm-up (late votes finish in the background).
    eventually(Duration::from_secs(5), "the warm-up release", || {
        (0..3).all(|i| !c.has_lock(i, name))
    })
    .await;
    for s in &c.servers {
        s.command(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
    }
    let rounds = 5;
    for _ in 0..rounds {
        let g = lock.try_acquire().await.expect("try").expect("free");
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
    }
    eventually(Duration::from_secs(5), "every node's release", || {
        (0..3).all(|i| !c.has_lock(i, name))
    })
    .await;
    for i in 0..3 {
        for command in ["zrangebyscore", "zrange", "zrem"] {
            assert_eq!(calls(&c, i, command), 0, "node {i}: {command}");
        }
        assert!(calls(&c, i, "set") >= 1, "node {i} granted nothing");
    }
    // A name in use gets its token without a raise round: the nodes floor their votes by the
    // same 100 ms step of their clocks, so their counters agree. A vote writes the hold (one
    // `HSET` per node and grant), a raise writes its token again; allowed: two votes that
    // straddle a step. (With the µs clock as the floor: a raise on 2 of 3 nodes per grant.)
    let hsets: u64 = (0..3).map(|i| calls(&c, i, "hset")).sum();
    let grants = rounds as u64;
    assert!(
        hsets <= 3 * grants + 4,
        "{hsets} HSETs for {grants} grants on 3 nodes: raise rounds"
    );
}

/// A queued waiter arms its watch before its first vote, on its client's wake channel on each
/// node (subscribed once per subscriber connection and kept), and its entries name that
/// channel: its very first vote queues it (every vote of it while the lock is held enqueues:
/// two `ZADD`s per vote on each node), a release tells it its turn there, and waits after
/// the first make no `SUBSCRIBE` or `UNSUBSCRIBE` on any node. (Before: each wait voted once
/// unqueued, then subscribed the lock's channel and the attempt's own on every node, voted
/// again to queue, and unsubscribed both when it ended: node 0 counted 1 vote more than its
/// `ZADD`s / 2, and a `SUBSCRIBE` and an `UNSUBSCRIBE` per wait on every node.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_is_armed_before_its_first_vote_and_never_subscribes_per_wait() {
    let c = Cluster::start(3);
    c.settle().await;
    let p = "quarantine=500ms";
    // Long leases: neither the holder's lease end nor a lease-bound retry hides a missed
    // wake-up (the waiter's heartbeat still refreshes its entries every second).
    let (a, ab) = c.client_and_backend(p, opts(60_000)).await;
    let (b, bb) = c.client_and_backend(p, opts(60_000)).await;
    wait_counting(&ab, 3, Duration::from_secs(10)).await;
    wait_counting(&bb, 3, Duration::from_secs(10)).await;
    let name = "woken-by-nodes";
    // A first wait connects b's subscribers (one SUBSCRIBE of its wake channel per node).
    for round in 0..3 {
        let g = acquired(&a, name).await;
        c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
            .await;
        // The holder's late votes and raises, if any, are over: the counts start on quiet nodes.
        let t = Instant::now();
        loop {
            for s in &c.servers {
                s.command(&["CONFIG", "RESETSTAT"]).expect("RESETSTAT");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            if (0..3).all(|i| calls(&c, i, "evalsha") == 0) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the nodes never went quiet"
            );
        }
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { acquire_within(&b, name, 20).await }
        });
        eventually(
            Duration::from_secs(5),
            "the waiter never queued on every node",
            || (0..3).all(|i| c.queued_on(i, name) == 1),
        )
        .await;
        // Each vote looks for its own hold once (`HGET`; a give-back of a round that lost uses
        // `HMGET`, the clients' node checks neither), and each vote that queues runs two
        // `ZADD`s.
        let (votes, zadds) = (calls(&c, 0, "hget"), calls(&c, 0, "zadd"));
        assert_eq!(
            2 * votes,
            zadds,
            "round {round}: node 0 ran {votes} votes of the waiter and {zadds} ZADDs: a vote \
             that did not queue"
        );
        let wake = c.servers[0]
            .command(&["HVALS", &format!("dlock:{{{name}}}:waiters")])
            .expect("HVALS");
        assert!(
            wake.starts_with("dlock:wake:"),
            "round {round}: the entry names no wake channel: {wake:?}"
        );
        assert_eq!(
            g.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        let got = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was not granted")
            .expect("join")
            .expect("acquired");
        assert_eq!(
            got.release().await.expect("release"),
            ReleaseOutcome::Released
        );
        if round == 0 {
            continue;
        }
        for i in 0..3 {
            for command in ["subscribe", "unsubscribe"] {
                assert_eq!(
                    calls(&c, i, command),
                    0,
                    "round {round}: node {i} ran {command} for one wait"
                );
            }
        }
    }
}

/// A retried attempt that finds its own holds of an earlier round on a majority, each under a
/// token of its own node (so no grant stands), and those nodes' counters set back by hand (a
/// floor step before the retry): the fresh token it is given (from the kept holds alone: node 2
/// is down) is still above every token issued before. A kept hold reports its node's counter
/// floored by the node's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_token_from_kept_holds_rises_past_counters_set_back() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let (client, rb) = c.client_and_backend("quarantine=500ms", opts(3000)).await;
    wait_counting(&rb, 3, Duration::from_secs(10)).await;
    let name = "kept-holds";
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let g = acquired(&client, name).await;
        tokens.push(g.fencing_token());
        assert_eq!(g.release().await.expect("r"), ReleaseOutcome::Released);
    }
    // The releases reach every node (the slowest in the background).
    eventually(Duration::from_secs(5), "a release never landed", || {
        (0..3).all(|i| !c.has_lock(i, name))
    })
    .await;
    // An earlier round of attempt X, voted on nodes 0 and 1 only, a floor step apart (each
    // stores its own counter as the hold's token), never raised.
    let req = AcquireRequest::new(key(name, "x"), Duration::from_secs(3), LostSignal::new());
    for i in 0..2 {
        let last = c.fence(0, name).max(c.fence(1, name));
        c.wait_past_floor_step(last).await;
        let node = distlock_redis::RedisNode::connect(&c.servers[i].url(), &opts(3000))
            .await
            .expect("node");
        let epoch = c.servers[i]
            .command(&["GET", "dlock:redlock:epoch"])
            .expect("epoch");
        node.vote(&req.key, &req.attempt, req.lease, &epoch, None, None)
            .await
            .expect("vote");
    }
    let stored: Vec<String> = (0..2)
        .map(|i| {
            c.servers[i]
                .command(&["HGET", "dlock:{kept-holds}", "token"])
                .expect("HGET")
        })
        .collect();
    assert_ne!(stored[0], stored[1], "the two holds share a token");
    for i in 0..2 {
        let fence = "dlock:{kept-holds}:fence";
        let reply = c.servers[i].command(&["SET", fence, &tokens[0].to_string()]);
        assert_eq!(reply.expect("SET"), "OK");
    }
    c.servers[2].kill();
    let last = stored.iter().filter_map(|s| s.parse::<u64>().ok()).max();
    c.wait_past_floor_step(last.expect("tokens")).await;
    let b = client.backend().clone();
    let token = granted(&b, &req).await;
    assert!(
        token > tokens[2],
        "token {token} from the kept holds after {tokens:?} (counters set back to {})",
        tokens[0]
    );
}

/// The lease horizon (`NS:redlock:horizon`, read by PTTL when another node is initialised)
/// runs at least as long as every lease a vote granted and is never shortened, whatever its
/// value: a vote now writes the end time and reads it with the epoch in one MGET, but an older
/// client's votes and renewals write their lease there, which must not read as "over" (the
/// first version of the lean vote took it so and wrote the horizon anew, shortening a longer
/// one: this test's first step printed "node 0: horizon shortened to 8996 ms"). A vote writes
/// it only when it is too short: the votes of the next eighth of a lease leave it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn votes_keep_the_lease_horizon_and_write_it_only_when_short() {
    let c = Cluster::start(3);
    c.settle().await;
    let lease = 8000;
    let (client, b) = c.client_and_backend("", opts(lease)).await;
    wait_counting(&b, 3, Duration::from_secs(10)).await;
    let horizon = |i: usize| {
        let s = &c.servers[i];
        let v = s.command(&["GET", "dlock:redlock:horizon"]).expect("GET");
        let p: i64 = s
            .command(&["PTTL", "dlock:redlock:horizon"])
            .expect("PTTL")
            .parse()
            .expect("PTTL is a number");
        (v, p)
    };
    let set_all = |value: &str, px: &str| {
        for s in &c.servers {
            s.command(&["SET", "dlock:redlock:horizon", value, "PX", px])
                .expect("SET");
        }
    };
    let name = "horizon";
    let lock = client.lock(name).expect("lock");
    let round = || async {
        let g = lock.try_acquire().await.expect("try").expect("free");
        c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
            .await;
        g.release().await.expect("release");
        eventually(Duration::from_secs(5), "every node's release", || {
            (0..3).all(|i| !c.has_lock(i, name))
        })
        .await;
    };
    // An older client's horizon of a longer lease (100 s), its lease as the value: kept.
    set_all("100000", "100000");
    round().await;
    for i in 0..3 {
        let (_, p) = horizon(i);
        assert!(p > 90_000, "node {i}: horizon shortened to {p} ms");
    }
    // An older client's horizon about to run out: lengthened, to an eighth more than the lease.
    set_all("300", "300");
    round().await;
    let first: Vec<_> = (0..3).map(horizon).collect();
    for (i, (v, p)) in first.iter().enumerate() {
        assert_ne!(v, "300", "node {i}: the older horizon was left");
        assert!(
            *p >= lease as i64 - 1000 && *p <= (lease + lease / 8) as i64,
            "node {i}: horizon {p} ms for a lease of {lease} ms"
        );
    }
    // At once: long enough, the next vote leaves it alone.
    round().await;
    for (i, (v, _)) in first.iter().enumerate() {
        assert_eq!(
            &horizon(i).0,
            v,
            "node {i}: written again while long enough"
        );
    }
    // An eighth of a lease later it is too short for a lease from now: lengthened again.
    tokio::time::sleep(Duration::from_millis(lease / 8 + 100)).await;
    round().await;
    for (i, (v, _)) in first.iter().enumerate() {
        let (now, p) = horizon(i);
        assert_ne!(&now, v, "node {i}: not lengthened");
        assert!(p >= lease as i64 - 1000, "node {i}: horizon {p} ms");
    }
}
