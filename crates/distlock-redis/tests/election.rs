//! Leader elections on a real redis-server: the layout (apart from the lock of the same name),
//! numbered proclamations under late and duplicated replies, a blackholed, paused or
//! restarted leader, cancelled campaigns, and observers woken by the server.

mod common;

use common::client_for;
use distlock_core::backend::{GrantRef, HoldKey};
use distlock_core::{
    Backend, Client, ClientOptions, Error, Leadership, LockKind, LostReason, RenewOutcome,
};
use distlock_testkit::conformance::{fast_opts, poll_until, unique_name, EVENTUALLY};
use distlock_testkit::{DelayProxy, RedisServer};
use std::time::{Duration, Instant};

/// A reply delay past the operation timeout of `fast_opts` (500 ms): the core gives the
/// request up and retries it while it has already run on the server.
const LATE: Duration = Duration::from_millis(800);

/// A lease long enough that no lease end wakes anybody during a case (wake-ups come from
/// the server).
fn long_opts() -> ClientOptions {
    fast_opts().watchdog_lease(Duration::from_secs(30))
}

fn proxied(proxy: &DelayProxy) -> String {
    format!("redis://127.0.0.1:{}", proxy.port())
}

fn key(name: &str, suffix: &str) -> String {
    format!("dlock:{{{name}}}:election{suffix}")
}

fn hget(server: &RedisServer, name: &str, field: &str) -> String {
    server
        .command(&["HGET", &key(name, ""), field])
        .expect("HGET")
}

async fn campaign(c: &Client, name: &str, value: &str) -> Leadership {
    c.election(name)
        .expect("election")
        .campaign(value)
        .await
        .expect("campaign")
}

/// The grant behind `l`, as the server stores it (to replay a request by hand).
fn grant_of(server: &RedisServer, name: &str, l: &Leadership) -> GrantRef {
    GrantRef {
        key: HoldKey::new(name, l.owner(), LockKind::Election),
        attempt: distlock_core::backend::AttemptId::from_server(hget(server, name, "attempt")),
        token: l.fencing_token(),
    }
}

/// The election lives under its own keys: the lock of the same name is free, the value is
/// stored with the grant, a waiting candidate is not a leader, and a resignation hands the
/// election to it with a higher token and its own value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_keys_value_and_handoff() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), long_opts()).await;
    let (b, _) = client_for(&server.url(), long_opts()).await;
    let name = unique_name("el-layout");
    let la = campaign(&a, &name, "10.0.0.1:80").await;
    assert_eq!(hget(&server, &name, "value"), "10.0.0.1:80");
    assert_eq!(hget(&server, &name, "seq"), "0");
    // The lock of the same name is another thing.
    let g = b
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try_acquire")
        .expect("the lock of the election's name is free");
    assert!(g.fencing_token() > 0);
    g.release().await.expect("release");
    assert_eq!(
        server
            .command(&["EXISTS", &format!("dlock:{{{name}}}")])
            .expect("EXISTS"),
        "0"
    );
    let eb = b
        .election(&name)
        .expect("election")
        .with_owner("b")
        .expect("owner");
    let waiter = tokio::spawn(async move { eb.campaign("10.0.0.2:80").await });
    poll_until(
        "the candidate queued",
        async || {
            server
                .command(&["ZCARD", &key(&name, ":queue")])
                .expect("ZCARD")
        },
        |n| n == "1",
    )
    .await;
    let leader = b
        .election(&name)
        .expect("election")
        .leader()
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(leader.value, "10.0.0.1:80");
    assert_eq!(leader.fencing_token, la.fencing_token());
    let info = a
        .inspect_kind(&name, LockKind::Election)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1, "only the leader: {info:?}");
    assert_eq!(info.waiters, Some(1));
    let token_a = la.fencing_token();
    la.resign().await.expect("resign");
    let lb = tokio::time::timeout(EVENTUALLY, waiter)
        .await
        .expect("handed over")
        .expect("join")
        .expect("campaign");
    assert!(lb.fencing_token() > token_a);
    assert_eq!(hget(&server, &name, "value"), "10.0.0.2:80");
    assert_eq!(hget(&server, &name, "owner"), "b");
    let leader = a
        .election(&name)
        .expect("election")
        .leader()
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(
        (leader.owner.as_str(), leader.value.as_str()),
        ("b", "10.0.0.2:80")
    );
    lb.resign().await.expect("resign");
    let none = a
        .election(&name)
        .expect("e")
        .leader()
        .await
        .expect("leader");
    assert_eq!(none, None);
}

/// A proclamation whose reply is late is retried with the same number: one effect (the
/// stored number is 1, not 2). A late duplicate of an older proclamation arriving after a
/// newer one is answered Renewed and changes nothing. Neither touches the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_and_late_proclamations_have_the_effect_of_one() {
    let server = RedisServer::start().expect("redis");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let (p, backend) = client_for(&proxied(&proxy), long_opts()).await;
    let name = unique_name("el-proclaim");
    let l = campaign(&p, &name, "v0").await;
    let before = proxy.stats();
    proxy.set_reply_delay(LATE);
    let heal = async {
        let t = Instant::now();
        while proxy.stats().replies.chunks_read == before.replies.chunks_read {
            assert!(t.elapsed() < EVENTUALLY, "no reply");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The first request ran (its reply is on its way, late): let the retry through.
        proxy.heal();
    };
    let (out, ()) = tokio::join!(l.proclaim("v1"), heal);
    out.expect("proclaim after a late reply");
    assert_eq!(hget(&server, &name, "value"), "v1");
    assert_eq!(hget(&server, &name, "seq"), "1", "counted twice");
    assert_eq!(l.value(), "v1");
    l.proclaim("v2").await.expect("proclaim");
    assert_eq!(hget(&server, &name, "seq"), "2");
    let pttl_before: i64 = server
        .command(&["PTTL", &key(&name, "")])
        .expect("PTTL")
        .parse()
        .expect("number");
    // A duplicate of proclamation 1, late: the leader still leads, nothing changes.
    let grant = grant_of(&server, &name, &l);
    let late = backend.proclaim(&grant, 1, "v1").await.expect("late");
    assert_eq!(late, RenewOutcome::Renewed);
    assert_eq!(hget(&server, &name, "value"), "v2");
    assert_eq!(hget(&server, &name, "seq"), "2");
    let pttl_after: i64 = server
        .command(&["PTTL", &key(&name, "")])
        .expect("PTTL")
        .parse()
        .expect("number");
    assert!(
        pttl_after <= pttl_before,
        "proclaim touched the lease: {pttl_before} -> {pttl_after}"
    );
    // Another grant's proclamation (a stale token) is refused and changes nothing.
    let stale = GrantRef {
        token: grant.token - 1,
        ..grant.clone()
    };
    let out = backend
        .proclaim(&stale, 9, "intruder")
        .await
        .expect("stale");
    assert_eq!(out, RenewOutcome::NotHeld);
    assert_eq!(hget(&server, &name, "value"), "v2");
    let leader = p
        .election(&name)
        .expect("e")
        .leader()
        .await
        .expect("leader")
        .expect("leads");
    assert_eq!(leader.value, "v2");
    // After resigning, the grant's proclamations are refused.
    l.resign().await.expect("resign");
    let out = backend.proclaim(&grant, 3, "after").await.expect("gone");
    assert_eq!(out, RenewOutcome::NotHeld);
}

/// A proclamation through a handle whose leadership is gone answers NotOwner and fires the
/// lost signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_after_losing_is_not_owner() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), long_opts()).await;
    let name = unique_name("el-gone");
    let l = campaign(&a, &name, "v").await;
    assert_eq!(server.command(&["DEL", &key(&name, "")]).expect("DEL"), "1");
    let err = l.proclaim("w").await.expect_err("gone");
    assert!(matches!(err, Error::NotOwner { .. }), "{err:?}");
    assert!(l.is_lost());
}

/// The leader's connection is blackholed: it cannot renew, its lost signal fires at its lease
/// end (before anybody else leads: the local deadline is measured from before the renewal was
/// sent), and a waiting candidate leads after the server's lease end, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_leader_is_replaced_after_its_lease() {
    let server = RedisServer::start().expect("redis");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let (a, _) = client_for(&proxied(&proxy), fast_opts()).await;
    let (b, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("el-blackhole");
    let la = campaign(&a, &name, "a").await;
    let eb = b.election(&name).expect("election");
    let waiter = tokio::spawn(async move {
        let l = eb.campaign("b").await;
        (l, Instant::now())
    });
    poll_until(
        "the candidate queued",
        async || {
            server
                .command(&["ZCARD", &key(&name, ":queue")])
                .expect("ZCARD")
        },
        |n| n == "1",
    )
    .await;
    let t = Instant::now();
    proxy.set_blackhole(true);
    let reason = tokio::time::timeout(EVENTUALLY, la.lost())
        .await
        .expect("the lost signal did not fire");
    assert_eq!(reason, LostReason::LeaseExpired);
    let (lb, elected_at) = tokio::time::timeout(EVENTUALLY, waiter)
        .await
        .expect("no new leader")
        .expect("join");
    let lb = lb.expect("campaign");
    assert!(
        la.is_lost(),
        "a new leader was elected while the old one did not know it was lost"
    );
    assert!(lb.fencing_token() > la.fencing_token());
    // Within the 1 s lease plus a renewal interval and the waiter's wake-up.
    let took = elected_at - t;
    assert!(took < Duration::from_secs(4), "took {took:?}");
    eprintln!("new leader after {took:?}");
    proxy.heal();
    lb.resign().await.expect("resign");
}

/// redis-server SIGSTOPped with a leader: the leader cannot renew, its lost signal fires at
/// its lease end; once the server runs again the lease it kept there has ended, and the
/// waiting candidate leads with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_with_a_leader() {
    let mut server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), fast_opts()).await;
    let (b, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("el-paused");
    let la = campaign(&a, &name, "a").await;
    let eb = b.election(&name).expect("election");
    let waiter = tokio::spawn(async move { eb.campaign("b").await });
    poll_until(
        "the candidate queued",
        async || {
            server
                .command(&["ZCARD", &key(&name, ":queue")])
                .expect("ZCARD")
        },
        |n| n == "1",
    )
    .await;
    server.pause();
    let reason = tokio::time::timeout(EVENTUALLY, la.lost())
        .await
        .expect("the lost signal did not fire");
    assert_eq!(reason, LostReason::LeaseExpired);
    // Paused past the server-side lease too (1 s).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let resumed = Instant::now();
    server.resume();
    let lb = tokio::time::timeout(EVENTUALLY, waiter)
        .await
        .expect("no new leader after resume")
        .expect("join")
        .expect("campaign");
    eprintln!("new leader {:?} after resume", resumed.elapsed());
    assert!(lb.fencing_token() > la.fencing_token());
    let leader = b
        .election(&name)
        .expect("e")
        .leader()
        .await
        .expect("leader")
        .expect("leads");
    assert_eq!(leader.value, "b");
    lb.resign().await.expect("resign");
}

/// redis-server killed with a leader and restarted without persistence: the leader's lost
/// signal fires at its lease end, and the next leader's token is still higher (the lost
/// counter is overruled by the server clock: every token is at least its TIME in µs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_server_loses_the_leader_and_tokens_still_rise() {
    let mut server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), fast_opts()).await;
    let (b, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("el-restart");
    let la = campaign(&a, &name, "a").await;
    server.restart().expect("restart");
    let reason = tokio::time::timeout(EVENTUALLY, la.lost())
        .await
        .expect("the lost signal did not fire");
    assert!(
        matches!(reason, LostReason::NotHeld | LostReason::LeaseExpired),
        "{reason:?}"
    );
    let lb = tokio::time::timeout(
        EVENTUALLY,
        b.election(&name)
            .expect("e")
            .campaign_timeout("b", Duration::from_secs(8)),
    )
    .await
    .expect("bounded")
    .expect("campaign after restart");
    assert!(lb.fencing_token() > la.fencing_token());
    lb.resign().await.expect("resign");
}

/// Campaigns that stop (a deadline, a dropped future) leave nothing in the queue, and a
/// resignation then finds nobody to hand to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaigns_leave_nothing_behind() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), long_opts()).await;
    let (b, backend_b) = client_for(&server.url(), long_opts()).await;
    let name = unique_name("el-cancel");
    let la = campaign(&a, &name, "a").await;
    let eb = b.election(&name).expect("election");
    let err = eb
        .campaign_timeout("b", Duration::from_millis(300))
        .await
        .expect_err("led by a");
    assert!(err.is_timeout(), "{err:?}");
    let r = tokio::time::timeout(Duration::from_millis(300), eb.campaign("b")).await;
    assert!(r.is_err(), "the campaign should still wait");
    assert_eq!(eb.try_campaign("b").await.expect("try").map(|_| ()), None);
    poll_until(
        "the queue emptied",
        async || {
            (
                server
                    .command(&["ZCARD", &key(&name, ":queue")])
                    .expect("ZCARD"),
                server
                    .command(&["HLEN", &key(&name, ":waiters")])
                    .expect("HLEN"),
            )
        },
        |(q, w)| q == "0" && w == "0",
    )
    .await;
    poll_until(
        "the subscriptions dropped",
        async || backend_b.subscribed_channels().await,
        |n| *n == 0,
    )
    .await;
    la.resign().await.expect("resign");
    assert_eq!(
        a.election(&name)
            .expect("e")
            .leader()
            .await
            .expect("leader"),
        None
    );
    assert_eq!(
        server
            .command(&["EXISTS", &key(&name, "")])
            .expect("EXISTS"),
        "0"
    );
}

/// An observer sees the current leader, then each change, woken by the server (the leases
/// are 30 s, so no lease end wakes it): a proclamation, a handoff, a resignation, a forced
/// release. A plain lock publishes nothing when nobody waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_are_woken_by_the_server() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), long_opts()).await;
    let (b, _) = client_for(&server.url(), long_opts()).await;
    let (o, _) = client_for(&server.url(), long_opts()).await;
    let name = unique_name("el-observe");
    let mut changes = o.election(&name).expect("election").observe();
    let next = async |changes: &mut distlock_core::Observer| {
        tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("no change seen within 5 s")
            .expect("observe")
    };
    assert_eq!(next(&mut changes).await, None);
    let la = campaign(&a, &name, "a1").await;
    let seen = next(&mut changes).await.expect("a leads");
    assert_eq!(
        (seen.value.as_str(), seen.fencing_token),
        ("a1", la.fencing_token())
    );
    la.proclaim("a2").await.expect("proclaim");
    assert_eq!(next(&mut changes).await.expect("a leads").value, "a2");
    let eb = b.election(&name).expect("e");
    let waiter = tokio::spawn(async move { eb.campaign("b1").await });
    poll_until(
        "the candidate queued",
        async || {
            server
                .command(&["ZCARD", &key(&name, ":queue")])
                .expect("ZCARD")
        },
        |n| n == "1",
    )
    .await;
    la.resign().await.expect("resign");
    let seen = next(&mut changes).await.expect("b leads");
    assert_eq!(seen.value, "b1");
    let lb = waiter.await.expect("join").expect("campaign");
    assert_eq!(seen.fencing_token, lb.fencing_token());
    // A forced release (the operator's) is seen too, and the removed leader learns it.
    let removed = o
        .force_release(&name, LockKind::Election)
        .await
        .expect("force");
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    assert_eq!(next(&mut changes).await, None);
    lb.resign().await.ok();
    // Listed as an election.
    let listed = o.list(&name).await.expect("list");
    assert!(
        listed.iter().any(|l| l.kind == LockKind::Election),
        "{listed:?}"
    );
    // Plain locks pay nothing for elections: no PUBLISH when nobody waits.
    let publishes = server.command_calls("publish").expect("stats");
    let g = o
        .lock(&name)
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    g.release().await.expect("release");
    assert_eq!(server.command_calls("publish").expect("stats"), publishes);
}

/// One leader at a time among candidates that campaign, lead briefly and resign, each token
/// above the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_with_rising_tokens() {
    let server = RedisServer::start().expect("redis");
    let name = unique_name("el-contend");
    let leading = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tokens = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (c, _) = client_for(&server.url(), fast_opts()).await;
        let (name, leading, tokens) = (name.clone(), leading.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let e = c.election(&name).expect("e");
            for round in 0..3 {
                let l = e.campaign(format!("{i}/{round}")).await.expect("campaign");
                assert_eq!(leading.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                tokens
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(l.fencing_token());
                tokio::time::sleep(Duration::from_millis(20)).await;
                leading.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                l.resign().await.expect("resign");
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("bounded")
            .expect("join");
    }
    let tokens = tokens.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(tokens.len(), 12);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// Foreign data at the election's key is an unexpected reply, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_is_an_unexpected_reply() {
    let server = RedisServer::start().expect("redis");
    let (a, _) = client_for(&server.url(), long_opts()).await;
    let name = unique_name("el-foreign");
    server
        .command(&["SET", &key(&name, ":fence"), "not-a-number"])
        .expect("SET");
    let err = a
        .election(&name)
        .expect("e")
        .try_campaign("v")
        .await
        .expect_err("foreign counter");
    assert!(matches!(err, Error::UnexpectedReply { .. }), "{err:?}");
    let err = a
        .election(&name)
        .expect("e")
        .leader()
        .await
        .expect_err("foreign counter");
    assert!(matches!(err, Error::UnexpectedReply { .. }), "{err:?}");
}

/// A queued candidate's value (here with colons and digits, like the waiter data's own
/// separators, and an owner with colons) travels with the handoff; a candidate that gives up
/// after being handed the election passes it on to the next one, with that one's value; an
/// empty value stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_travel_with_handoffs_and_give_ups() {
    use distlock_core::backend::{AcquireReply, AcquireRequest, LostSignal};
    let server = RedisServer::start().expect("redis");
    let (_, backend) = client_for(&server.url(), long_opts()).await;
    let name = unique_name("el-values");
    let request = |owner: &str, value: &str| {
        let mut r = AcquireRequest::new(
            HoldKey::new(name.as_str(), owner, LockKind::Election),
            Duration::from_secs(30),
            LostSignal::new(),
        );
        r.waiter_ttl = Some(Duration::from_secs(30));
        r.value = Some(value.into());
        r
    };
    let (a, b, c) = (
        request("a", "first"),
        request("b:1:2", "12:34:5:x y"),
        request("c", ""),
    );
    let token_a = match backend.acquire(&a).await.expect("a") {
        AcquireReply::Granted { token } => token,
        other => panic!("{other:?}"),
    };
    for r in [&b, &c] {
        let out = backend.acquire(r).await.expect("queue");
        assert!(matches!(out, AcquireReply::Held { .. }), "{out:?}");
    }
    // A retry of a's grant changes neither its value nor its token.
    let again = backend.acquire(&a).await.expect("retry");
    assert_eq!(again, AcquireReply::Granted { token: token_a });
    assert_eq!(hget(&server, &name, "value"), "first");
    backend.release(&a.grant(token_a)).await.expect("release");
    // Two arrivals in one millisecond are ordered by attempt id: either may be first.
    let value_of = |owner: &str| if owner == "c" { "" } else { "12:34:5:x y" };
    let first = hget(&server, &name, "owner");
    assert!(first == "b:1:2" || first == "c", "{first}");
    assert_eq!(hget(&server, &name, "value"), value_of(&first));
    assert_eq!(hget(&server, &name, "seq"), "0");
    let info = backend
        .inspect(&name, LockKind::Election)
        .await
        .expect("inspect");
    assert_eq!(info.holders[0].value.as_deref(), Some(value_of(&first)));
    assert!(info.fencing_token > token_a);
    let (first_req, second_req) = if first == "c" { (&c, &b) } else { (&b, &c) };
    // The first never heard of its handoff and gives up: the other leads, with its value.
    backend.give_up(first_req).await.expect("give up");
    let second = hget(&server, &name, "owner");
    assert_eq!(second.as_str(), &*second_req.key.owner);
    assert_eq!(hget(&server, &name, "value"), value_of(&second));
    let info = backend
        .inspect(&name, LockKind::Election)
        .await
        .expect("inspect");
    assert_eq!(info.holders[0].value.as_deref(), Some(value_of(&second)));
    assert_eq!(info.waiters, Some(0));
    // The lock of the same name saw none of it.
    let mutex = backend
        .inspect(&name, LockKind::Mutex)
        .await
        .expect("inspect");
    assert!(
        mutex.holders.is_empty() && mutex.fencing_token == 0,
        "{mutex:?}"
    );
    backend.give_up(second_req).await.expect("give up");
    assert_eq!(
        server
            .command(&["EXISTS", &key(&name, "")])
            .expect("EXISTS"),
        "0"
    );
}

/// A campaign whose reply is lost is retried with the same attempt: one grant, one token,
/// the value stored once, and one resignation frees the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_with_a_late_reply_is_one_grant() {
    let server = RedisServer::start().expect("redis");
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let (p, _) = client_for(&proxied(&proxy), long_opts()).await;
    let (r, _) = client_for(&server.url(), fast_opts()).await;
    let name = unique_name("el-retrycamp");
    let before = proxy.stats();
    proxy.set_reply_delay(LATE);
    let e = p.election(&name).expect("e");
    let attempt = tokio::spawn(async move { e.try_campaign("v").await });
    let t = Instant::now();
    while proxy.stats().replies.chunks_read == before.replies.chunks_read {
        assert!(t.elapsed() < EVENTUALLY, "no reply");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.heal();
    let l = attempt
        .await
        .expect("join")
        .expect("try_campaign")
        .expect("leads");
    let info = r
        .inspect_kind(&name, LockKind::Election)
        .await
        .expect("inspect");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.fencing_token, l.fencing_token(), "a second token");
    l.resign().await.expect("resign");
    let again = r
        .election(&name)
        .expect("e")
        .try_campaign("w")
        .await
        .expect("try");
    assert!(
        again.is_some(),
        "one resignation did not free a retried campaign"
    );
}
