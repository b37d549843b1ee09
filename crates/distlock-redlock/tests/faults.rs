//! Redlock under node failures, on real redis-server processes: killed, paused, restarted
//! without persistence, behind a slow link, while waiters queue. Timing bounds are generous (a loaded 2-core
//! machine): they tell "bounded by the node timeout" from "bounded by the 3 s call timeout",
//! nothing finer.

mod common;

use common::{
    acquire_within, acquired, assert_increasing, opts, wait_counting, wait_recounted, Cluster,
};
use distlock_core::{Client, LostReason, ReleaseOutcome};
use distlock_redlock::RedlockBackend;
use distlock_testkit::{DelayProxy, OverlapRecorder, RedisOptions, RedisServer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `tasks` tasks per client take `name` `rounds` times each, keeping a deliberately
/// non-atomic counter exact; returns the fencing tokens in grant order.
async fn contend(clients: &[Client], name: &str, tasks: usize, rounds: usize) -> Vec<u64> {
    let counter = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut joins = Vec::new();
    for c in clients {
        for _ in 0..tasks {
            let (lock, counter, tokens) =
                (c.lock(name).expect("lock"), counter.clone(), tokens.clone());
            joins.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let g = lock
                        .acquire_timeout(Duration::from_secs(10))
                        .await
                        .expect("acquire");
                    let v = counter.load(Ordering::SeqCst);
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    assert_eq!(
                        g.release().await.expect("release"),
                        ReleaseOutcome::Released
                    );
                }
            }));
        }
    }
    for j in joins {
        j.await.expect("task");
    }
    let n = (clients.len() * tasks * rounds) as u64;
    assert_eq!(counter.load(Ordering::SeqCst), n, "mutual exclusion broken");
    let t = tokens.lock().expect("tokens").clone();
    assert_increasing(&t);
    t
}

/// One uncontended grant; its token.
async fn grab(c: &Client, name: &str) -> u64 {
    let g = acquire_within(c, name, 10).await.expect("acquire");
    let t = g.fencing_token();
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_down_still_grants_and_excludes() {
    let mut c = Cluster::start(5);
    c.settle().await;
    let p = "quarantine=500ms";
    let a = c.client(p, opts(1000)).await;
    let b = c.client(p, opts(1000)).await;
    let held = acquired(&a, "kept").await;
    c.servers[0].kill();
    c.servers[3].kill();
    let killed = Instant::now();
    contend(&[a.clone(), b.clone()], "two-down", 4, 3).await;
    // The lock held across the kills is still renewed by the three survivors.
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(killed.elapsed())).await;
    assert!(!held.is_lost(), "{:?}", held.lost_signal().reason());
    assert!(b
        .lock("kept")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    assert_eq!(held.release().await.expect("r"), ReleaseOutcome::Released);
    // A client that starts now, with two nodes down, works too.
    let late = c.client(p, opts(1000)).await;
    assert!(late
        .lock("kept")
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_down_is_a_clear_error() {
    let mut c = Cluster::start(5);
    c.settle().await;
    let p = "quarantine=500ms";
    let a = c.client(p, opts(1000)).await;
    let g = acquired(&a, "gone").await;
    for i in 0..3 {
        c.servers[i].kill();
    }
    // The holder learns it lost the lock when its lease runs out unconfirmed.
    let reason = tokio::time::timeout(Duration::from_secs(6), g.lost())
        .await
        .expect("holder never learned");
    assert_eq!(reason, LostReason::LeaseExpired);

    let t = Instant::now();
    let err = acquire_within(&a, "gone", 1)
        .await
        .expect_err("no majority");
    let took = t.elapsed();
    let msg = err.to_string();
    assert!(err.is_connection(), "{err:?}");
    assert!(
        msg.contains("only 2 of 5 redlock nodes answered (need 3)"),
        "{msg}"
    );
    assert!(!msg.contains("held"), "{msg}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "gave up after {took:?}"
    );
    let err = a
        .lock("gone")
        .expect("lock")
        .try_acquire()
        .await
        .expect_err("no majority");
    assert!(err.is_connection(), "{err}");
    let err = RedlockBackend::connect(&c.url(p), &opts(1000))
        .await
        .err()
        .expect("connect with 2 of 5");
    assert!(
        err.to_string()
            .contains("only 2 of 5 redlock nodes could be reached (need 3)"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_cannot_help_during_quarantine() {
    let mut c = Cluster::start(3);
    let p = "quarantine=3s";
    let name = "restart";
    let (a, ab) = c.client_and_backend(p, opts(3000)).await;
    let (b, bb) = c.client_and_backend(p, opts(3000)).await;
    // Fresh servers are in quarantine until they are 3 s old.
    wait_counting(&ab, 3, Duration::from_secs(6)).await;
    wait_counting(&bb, 3, Duration::from_secs(6)).await;
    let first = grab(&b, name).await;
    // B's release returns at a majority; let it reach every node, so that A's grant (which
    // the test needs on all three) does not find node 2 still held by B.
    let t = Instant::now();
    while (0..3).any(|i| c.has_lock(i, name)) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "B's release never landed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let g = acquired(&a, name).await;
    assert!(g.fencing_token() > first);
    c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
        .await;
    // Node 0 crashes and comes back empty; node 2 loses A's lock (as if it had expired there).
    c.servers[0].restart().expect("restart");
    assert_eq!(
        c.servers[2]
            .command(&["DEL", &format!("dlock:{{{name}}}")])
            .expect("DEL"),
        "1"
    );
    // Nodes 0 and 2 are free: a majority for B — but only with the restarted node's vote.
    assert!(!c.has_lock(0, name) && !c.has_lock(2, name) && c.has_lock(1, name));
    let t = Instant::now();
    let r = acquire_within(&b, name, 1).await;
    assert!(
        matches!(&r, Err(e) if e.is_timeout()),
        "B got past the quarantine: {r:?} after {:?}",
        t.elapsed()
    );
    let st = bb.node_status();
    assert!(
        st[0].quarantined_for.is_some() || !st[0].counts,
        "restarted node counts: {st:#?}"
    );
    // A learns its lock is gone (renewal: held by one node of three).
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("A never learned");
    // After the quarantine (and A's lease on node 1), B gets it, with a larger token: node 0
    // came back without its counter, and its vote is floored by its clock.
    let gb = acquire_within(&b, name, 8)
        .await
        .expect("B after the quarantine");
    assert!(gb.fencing_token() > g.fencing_token());
    assert_eq!(gb.release().await.expect("r"), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_node_costs_only_the_node_timeout() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let p = "quarantine=500ms&node_timeout=50ms";
    // The per-call timeout stays at its 3 s default: an unbounded call would show.
    let a = c.client(p, opts(1000)).await;
    let mut tokens = vec![grab(&a, "paused").await];
    c.servers[2].pause();
    for _ in 0..5 {
        let t = Instant::now();
        let g = acquired(&a, "paused").await;
        let took = t.elapsed();
        // Bounded by the 50 ms node timeout, not the 3 s call timeout (wide margin for a
        // loaded machine).
        assert!(took < Duration::from_secs(2), "acquire took {took:?}");
        tokens.push(g.fencing_token());
        assert_eq!(g.release().await.expect("r"), ReleaseOutcome::Released);
    }
    // A hold lives on through renewals with one node silent.
    let g = a.lock("paused").expect("lock").acquire().await.expect("a");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!g.is_lost());
    tokens.push(g.fencing_token());
    drop(g);
    c.servers[2].resume();
    tokens.push(grab(&a, "paused").await);
    assert_increasing(&tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_node_behind_proxy_is_tolerated() {
    let c = Cluster::start(3);
    c.settle().await;
    // Node 2 is reached through a proxy adding 100 ms each way: never within 50 ms.
    let proxy = DelayProxy::start(c.servers[2].addr(), Duration::from_millis(100)).expect("proxy");
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}?quarantine=500ms&node_timeout=50ms",
        c.servers[0].port(),
        c.servers[1].port(),
        proxy.port()
    );
    let client = || async {
        let o = opts(1000);
        let b = RedlockBackend::connect(&url, &o).await.expect("connect");
        Client::new(Arc::new(b), o).expect("client")
    };
    let (a, b) = (client().await, client().await);
    let t = Instant::now();
    let first = grab(&a, "slow").await;
    // The quorum of fast nodes decides; waiting on the slow one would cost the 3 s call timeout.
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let tokens = contend(&[a, b], "slow", 3, 3).await;
    assert!(tokens[0] > first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_faults() {
    let mut c = Cluster::start(5);
    c.settle().await;
    let p = "quarantine=500ms&check_interval=100ms";
    let (a, ab) = c.client_and_backend(p, opts(1000)).await;
    let b = c.client(p, opts(1000)).await;
    let both = [a.clone(), b.clone()];
    let name = "story";
    let mut tokens = Vec::new();
    for cl in both.iter().cycle().take(4) {
        tokens.push(grab(cl, name).await);
    }
    tokens.extend(contend(&both, name, 3, 2).await);

    // A paused node.
    c.servers[4].pause();
    tokens.extend(contend(&both, name, 2, 2).await);
    c.servers[4].resume();

    // Node 0 loses its data; grants go on with the other four.
    c.servers[0].restart().expect("restart");
    tokens.push(grab(&a, name).await);
    tokens.extend(contend(&both, name, 2, 2).await);
    wait_recounted(&ab, &c, &[0], Duration::from_secs(8)).await;

    // Two more (a minority) lose their data at once.
    c.servers[1].restart().expect("restart");
    c.servers[2].restart().expect("restart");
    tokens.extend(contend(&both, name, 2, 2).await);
    wait_recounted(&ab, &c, &[1, 2], Duration::from_secs(8)).await;

    // Only the three restarted nodes remain (each came back without its counters, and was
    // quarantined): their clocks floor the tokens above every one issued before.
    c.servers[3].kill();
    c.servers[4].kill();
    tokens.push(grab(&b, name).await);
    tokens.extend(contend(&both, name, 2, 2).await);
    assert_increasing(&tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_apply_to_every_node() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(RedisOptions {
                password: Some("s3cret".into()),
                ..RedisOptions::default()
            })
            .expect("redis-server")
        })
        .collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = |pw: &str| format!("redlock://:{pw}@{}?quarantine=0s", hosts.join(","));
    let o = opts(1000);
    let err = RedlockBackend::connect(&url("badpass"), &o)
        .await
        .err()
        .expect("wrong password");
    assert!(matches!(err, distlock_core::Error::Auth { .. }), "{err:?}");
    assert!(!err.to_string().contains("badpass"), "{err}");
    let b = RedlockBackend::connect(&url("s3cret"), &o)
        .await
        .expect("connect");
    let client = Client::new(Arc::new(b), o).expect("client");
    grab(&client, "auth").await;
}

/// The only intact node that saw the latest tokens is gone, and the majority left is two nodes
/// that lost their data plus two that never saw those tokens. Their counters alone would hand
/// out old tokens again; the clock floor of every vote (and the quarantine of the nodes that
/// lost their data) does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_past_lost_witnesses() {
    let mut c = Cluster::start(5);
    c.settle().await;
    let p = "quarantine=500ms&check_interval=100ms";
    let (y, yb) = c.client_and_backend(p, opts(1000)).await;
    let name = "witness";
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(grab(&y, name).await);
    }
    // X is cut off from nodes 3 and 4 (it sees closed ports there): its grants raise only
    // nodes 0, 1 and 2.
    let hosts: Vec<String> = (0..5)
        .map(|i| {
            let port = if i < 3 {
                c.servers[i].port()
            } else {
                distlock_testkit::free_port()
            };
            format!("127.0.0.1:{port}")
        })
        .collect();
    let o = opts(1000);
    let xb = RedlockBackend::connect(&format!("redlock://{}?{p}", hosts.join(",")), &o)
        .await
        .expect("connect X");
    let x = Client::new(Arc::new(xb), o).expect("client");
    for _ in 0..10 {
        tokens.push(grab(&x, name).await);
    }
    let last = *tokens.last().expect("tokens");
    assert!(c.fence(3, name) < last && c.fence(4, name) < last);
    // Nodes 0 and 1 (a minority) lose their data; Y initialises them again (quarantined).
    c.servers[0].restart().expect("restart");
    c.servers[1].restart().expect("restart");
    wait_recounted(&yb, &c, &[0, 1], Duration::from_secs(8)).await;
    // Node 2, the last intact node that saw the latest tokens, goes away.
    c.servers[2].kill();
    tokens.push(grab(&y, name).await);
    tokens.extend(contend(&[y], name, 3, 2).await);
    assert_increasing(&tokens);
}

/// Waiters queue behind a holder one after the other (each starts once the one before it is
/// in node 0's queue, so their order is known); `fault` hits a node while they are queued; the
/// holder releases. The waiters must get the lock in the order they queued, every waiter must
/// get it each round within its deadline (no give-up), with never two holders inside at once
/// and strictly increasing tokens.
async fn queue_through_a_fault(name: &str, fault: impl FnOnce(&mut Cluster)) -> Cluster {
    const WAITERS: usize = 6;
    const ROUNDS: usize = 3;
    let mut c = Cluster::start(5);
    c.settle().await;
    let p = "quarantine=500ms&node_timeout=50ms";
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(c.client(p, opts(1000)).await);
    }
    let holder = acquired(&clients[0], name).await;
    let rec = Arc::new(OverlapRecorder::new());
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut joins = Vec::new();
    for i in 0..WAITERS {
        let (lock, rec, order) = (
            clients[i % clients.len()].lock(name).expect("lock"),
            rec.clone(),
            order.clone(),
        );
        joins.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = lock
                    .acquire_timeout(Duration::from_secs(10))
                    .await
                    .expect("a queued waiter gave up");
                let visit = rec.enter(
                    lock.name(),
                    &format!("w{i}"),
                    g.fencing_token(),
                    g.is_lost(),
                );
                order.lock().expect("order").push((i, g.fencing_token()));
                tokio::time::sleep(Duration::from_millis(2)).await;
                rec.exit(visit, g.is_lost());
                assert_eq!(
                    g.release().await.expect("release"),
                    ReleaseOutcome::Released
                );
            }
        }));
        let t = Instant::now();
        while c.queued_on(0, name) < i + 1 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "waiter {i} never queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    fault(&mut c);
    assert_eq!(holder.release().await.expect("r"), ReleaseOutcome::Released);
    for j in joins {
        j.await.expect("waiter");
    }
    rec.assert_no_overlap();
    let order = order.lock().expect("order").clone();
    let first: Vec<usize> = order.iter().take(WAITERS).map(|(i, _)| *i).collect();
    assert_eq!(
        first,
        (0..WAITERS).collect::<Vec<_>>(),
        "not served in turn: {order:?}"
    );
    assert_eq!(order.len(), WAITERS * ROUNDS);
    let tokens: Vec<u64> = order.iter().map(|(_, t)| *t).collect();
    assert_increasing(&tokens);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiters_are_served_in_turn_past_a_killed_node() {
    queue_through_a_fault("queue-kill", |c| c.servers[3].kill()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiters_are_served_in_turn_past_a_paused_node() {
    let mut c = queue_through_a_fault("queue-pause", |c| c.servers[4].pause()).await;
    c.servers[4].resume();
    // Every queue entry went with its waiter (released or given up), on every node.
    let t = Instant::now();
    while (0..5).any(|i| c.queued_on(i, "queue-pause") > 0) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "queue entries left behind"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = &mut c;
}

/// One uncontended leadership of election `name`; its token.
async fn grab_election(c: &Client, name: &str) -> u64 {
    let e = c.election(name).expect("election");
    let l = e
        .campaign_timeout("v", Duration::from_secs(10))
        .await
        .expect("campaign");
    let t = l.fencing_token();
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    t
}

/// The fencing counters of a name set back by hand on every node (a majority and more: the
/// deterministic stand-in for nodes rolled back to older snapshots), the rollback a floor step
/// old (as a node's quarantine makes every loss of its data): the next token of a lock and of
/// an election is still above every token issued before. Every node that has a counter has it
/// with an expiry (a bounded lifetime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_after_counters_are_set_back_on_every_node() {
    let c = Cluster::start(3);
    c.settle().await;
    let a = c.client("quarantine=500ms", opts(1000)).await;
    let mut failures = Vec::new();
    for election in [false, true] {
        let (name, fence) = match election {
            false => ("set-back", "dlock:{set-back}:fence"),
            true => ("set-back-el", "dlock:{set-back-el}:election:fence"),
        };
        let grab_one = || async {
            match election {
                false => grab(&a, name).await,
                true => grab_election(&a, name).await,
            }
        };
        let mut tokens = Vec::new();
        for _ in 0..3 {
            tokens.push(grab_one().await);
        }
        let pttls: Vec<i64> = c
            .servers
            .iter()
            .map(|s| {
                s.command(&["PTTL", fence])
                    .expect("PTTL")
                    .parse()
                    .expect("a number")
            })
            .collect();
        // -2: that node's (background) vote has not landed yet; -1: no expiry.
        if pttls.contains(&-1) || pttls.iter().filter(|p| **p > 0).count() < 2 {
            failures.push(format!("{name}: the nodes' counters' PTTLs are {pttls:?}"));
        }
        for s in &c.servers {
            let reply = s.command(&["SET", fence, &tokens[0].to_string()]);
            assert_eq!(reply.expect("SET"), "OK");
        }
        c.wait_past_floor_step(tokens[2]).await;
        let next = grab_one().await;
        if next <= tokens[2] {
            failures.push(format!(
                "{name}: token {next} after {tokens:?} (every node's counter set back to {})",
                tokens[0]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every node crashes and comes back from an RDB snapshot taken before the last grants (the
/// whole cluster rolled back: no node has the latest counters, none can seed the others): once
/// the nodes count again, the next token is still above every token issued before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_after_every_node_restarts_from_an_older_snapshot() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let p = "quarantine=500ms&check_interval=100ms";
    let (a, ab) = c.client_and_backend(p, opts(1000)).await;
    let name = "snapshot";
    let mut tokens = vec![grab(&a, name).await];
    for s in &c.servers {
        assert_eq!(s.command(&["SAVE"]).expect("SAVE"), "OK");
    }
    for _ in 0..3 {
        tokens.push(grab(&a, name).await);
    }
    for s in &mut c.servers {
        s.crash_restart().expect("restart");
    }
    wait_recounted(&ab, &c, &[0, 1, 2], Duration::from_secs(10)).await;
    tokens.push(grab(&a, name).await);
    assert_increasing(&tokens);
}
