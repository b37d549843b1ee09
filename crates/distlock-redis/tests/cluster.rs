//! `redis+cluster://` on a real Redis Cluster: the shared conformance, adversarial and
//! election suites, and what a cluster adds (names on every master, the batched watchdog per
//! node, a `redis://` URL at a cluster node).
//!
//! A cluster is six processes (three here: the suites need no replicas) and takes seconds to
//! form, so each test below runs a group of cases one after another on one cluster (every case
//! uses its own lock names; data loss and lock breaking touch only the case's own locks or
//! run alone in their group). The suites' proxied cases are skipped, saying so: the cluster
//! client reaches each node at the address the cluster announces, not through a proxy.

mod common;

use common::{acquired, client_for, released};
use distlock_core::backend::{GrantRef, HoldKey, RenewOutcome};
use distlock_core::{Backend, Error, LockKind, Operator};
use distlock_redis::RedisBackend;
use distlock_testkit::conformance::{self as suite, adversarial, fast_opts, ServerHarness};
use distlock_testkit::RedisCluster;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn harness() -> ServerHarness<RedisCluster> {
    let t = Instant::now();
    let cluster = RedisCluster::start_with(3, 0).expect("start a redis cluster");
    eprintln!("cluster of 3 masters formed in {:?}", t.elapsed());
    ServerHarness::new(cluster, RedisCluster::url, |url, o| async move {
        RedisBackend::connect(&url, &o).await
    })
    .lose_data(|c| async move {
        for m in c.masters().expect("masters") {
            assert_eq!(
                c.servers()[m].command(&["FLUSHALL"]).expect("FLUSHALL"),
                "OK"
            );
        }
    })
    .break_lock(|c, name| async move {
        let key = format!("dlock:{{{name}}}");
        let reply = c.command_at_key(&key, &["DEL", &key]);
        assert_eq!(reply.expect("DEL"), "1", "nothing to delete");
    })
}

/// One test running `cases` in turn on one cluster.
macro_rules! group {
    ($test:ident: $($case:path),* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let h = harness();
            $(
                let t = Instant::now();
                $case(&h).await;
                eprintln!("{} passed in {:?}", stringify!($case), t.elapsed());
            )*
        }
    };
}

group!(conformance_mutex:
    suite::mutual_exclusion, suite::try_acquire_contended, suite::reentrancy,
    suite::non_owner_cannot_release, suite::fencing_tokens_increase,
    suite::acquire_timeout_deadline, suite::waiter_woken_by_release,
    suite::cancelled_acquire_leaves_nothing);
group!(conformance_leases:
    suite::watchdog_renews, suite::drop_releases, suite::fixed_lease_expires,
    suite::crashed_holder_frees_at_lease_end, suite::extend_lease, suite::lost_when_broken,
    suite::invalid_input, suite::backend_contract);
group!(conformance_kinds:
    suite::rw_readers_share_writer_excludes, suite::rw_downgrade_and_tokens,
    suite::rw_writer_not_starved, suite::fair_lock_fifo, suite::semaphore_permits,
    suite::multi_lock_no_deadlock);
group!(adversarial_cases:
    adversarial::late_reply_on_release, adversarial::retried_acquire_is_one,
    adversarial::late_reply_on_renew, adversarial::extend_shorter_than_watchdog,
    adversarial::fixed_and_watchdog_guards, adversarial::sibling_waiters_handoff,
    adversarial::rw_sibling_waiters, adversarial::cancel_at_every_await,
    adversarial::semaphore_edges, adversarial::data_loss_tokens_increase);
group!(adversarial_soak: adversarial::contended_soak);
group!(election_cases:
    suite::one_leader_at_a_time, suite::try_campaign_and_leader, suite::resign_wakes_candidate,
    suite::proclaim_changes_value, suite::stale_proclaim_is_ignored, suite::observe_changes,
    suite::partitioned_leader_replaced, suite::cancelled_campaign_leaves_nothing,
    suite::election_apart_from_lock, suite::election_invalid_input);

/// Grants of `n` mutexes named `{prefix}-{i}` on `b`, each by a direct acquire.
async fn grants(b: &RedisBackend, prefix: &str, n: usize, lease: Duration) -> Vec<GrantRef> {
    use distlock_core::backend::{AcquireReply, AcquireRequest};
    let mut out = Vec::new();
    for i in 0..n {
        let key = HoldKey::new(format!("{prefix}-{i}"), "owner", LockKind::Mutex);
        let req = AcquireRequest::new(key, lease, distlock_core::LostSignal::new());
        match b.acquire(&req).await.expect("acquire") {
            AcquireReply::Granted { token } => out.push(req.grant(token)),
            other => panic!("not granted: {other:?}"),
        }
    }
    out
}

/// Lock names spread over every master, and the watchdog's batch is one script per slot, one
/// pipeline per master: 300 grants cost one EVALSHA per distinct slot on each master, and a
/// stale grant in the batch is reported lost alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_spread_and_renewals_batch_per_node() {
    let cluster = RedisCluster::start_with(3, 0).expect("cluster");
    let opts = fast_opts();
    let b = RedisBackend::connect(&cluster.url(), &opts)
        .await
        .expect("connect");
    let lease = Duration::from_secs(20);
    let gs = grants(&b, "spread", 300, lease).await;
    // Which master holds each lock, and how many slots per master the batch spans.
    let mut on: Vec<BTreeSet<u16>> = vec![BTreeSet::new(); cluster.servers().len()];
    for g in &gs {
        let key = format!("dlock:{{{}}}", g.key.name);
        let m = cluster.master_of(&key).expect("master");
        assert_eq!(
            cluster.servers()[m]
                .command(&["EXISTS", &key])
                .expect("EXISTS"),
            "1"
        );
        let slot: u16 = cluster
            .command(&["CLUSTER", "KEYSLOT", &key])
            .expect("KEYSLOT")
            .parse()
            .expect("slot");
        on[m].insert(slot);
    }
    let used = on.iter().filter(|s| !s.is_empty()).count();
    assert_eq!(
        used, 3,
        "300 names should land on all three masters: {on:?}"
    );
    let calls = |c: &RedisCluster| -> Vec<u64> {
        c.servers()
            .iter()
            .map(|s| s.command_calls("evalsha").expect("commandstats"))
            .collect()
    };
    // A stale grant: lock 7 was taken over (its token is not ours any more).
    let mut holds: Vec<(GrantRef, Duration)> = gs.iter().map(|g| (g.clone(), lease)).collect();
    holds[7].0.token += 1000;
    let before = calls(&cluster);
    let t = Instant::now();
    let out = b.renew(&holds).await.expect("renew");
    let took = t.elapsed();
    let after = calls(&cluster);
    for (i, o) in out.iter().enumerate() {
        let want = if i == 7 {
            RenewOutcome::NotHeld
        } else {
            RenewOutcome::Renewed
        };
        assert_eq!(*o, want, "grant {i}");
    }
    for (m, slots) in on.iter().enumerate() {
        let scripts = after[m] - before[m];
        eprintln!("master {m}: {} slots, {scripts} renew scripts", slots.len());
        assert_eq!(
            scripts,
            slots.len() as u64,
            "one script per slot on master {m}"
        );
    }
    eprintln!("300 renewals over 3 masters in {took:?}");
    // The stale grant did not touch the real one, which stays held and renewable.
    assert_eq!(
        b.renew(&[(gs[7].clone(), lease)]).await.expect("renew"),
        vec![RenewOutcome::Renewed]
    );
}

/// `list` scans every master, `inspect` and a forced release reach the lock's master, and
/// `doctor` reports every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_span_the_masters() {
    let cluster = RedisCluster::start_with(3, 0).expect("cluster");
    let (client, b) = client_for(&cluster.url(), fast_opts()).await;
    let gs = grants(&b, "ops", 30, Duration::from_secs(20)).await;
    let listed = b.list("ops-").await.expect("list");
    assert_eq!(listed.len(), 30, "{listed:?}");
    // Read in a pipeline per master: each lock with its holder, whichever master has it.
    assert!(
        listed.iter().all(|l| l.info.holders.len() == 1),
        "{listed:?}"
    );
    let info = b.inspect("ops-3", LockKind::Mutex).await.expect("inspect");
    assert_eq!(info.holders.len(), 1);
    let forced = b
        .force_release("ops-3", LockKind::Mutex)
        .await
        .expect("force");
    assert_eq!(forced.removed.len(), 1);
    let g = acquired(&client, "ops-3").await;
    assert!(g.fencing_token() > gs[3].token);
    released(g).await;
    let findings = b.diagnose().await.expect("doctor");
    let masters: BTreeSet<String> = findings
        .iter()
        .filter_map(|f| f.message.strip_prefix("master "))
        .filter_map(|m| m.split(':').take(2).collect::<Vec<_>>().join(":").into())
        .collect();
    assert_eq!(masters.len(), 3, "{findings:#?}");
    assert!(
        findings
            .iter()
            .all(|f| f.severity != distlock_core::Severity::Unsafe
                || f.check == "maxmemory-policy"
                || f.check == "replication"),
        "{findings:#?}"
    );
}

/// `redis://` at a cluster node fails at connect, naming `redis+cluster://`, password hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_at_a_cluster_node_names_the_cluster_scheme() {
    let cluster = RedisCluster::start_with(3, 0).expect("cluster");
    let port = cluster.servers()[0].port();
    // (The test nodes have no password; the error's URL is the redacted one, see the
    // address unit tests.)
    let url = format!("redis://127.0.0.1:{port}");
    let err = RedisBackend::connect(&url, &fast_opts())
        .await
        .err()
        .expect("must fail");
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("redis+cluster://"), "{text}");
    eprintln!("{text}");
}

/// `rediss+cluster://`: locks, a waiter woken through the TLS subscriber, on a cluster whose
/// nodes serve TLS.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_over_tls_cluster() {
    let cluster = RedisCluster::start_tls().expect("TLS cluster");
    let url = cluster.tls_url().expect("tls url");
    let (a, _) = client_for(&url, fast_opts()).await;
    let (b, _) = client_for(&url, fast_opts()).await;
    for i in 0..10 {
        released(acquired(&a, &format!("tls-{i}")).await).await;
    }
    let g = acquired(&a, "tls-wait").await;
    let lock = b.lock("tls-wait").expect("lock");
    let waiter = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(10)).await });
    suite::wait_for_waiters(&b, "tls-wait", LockKind::Mutex, 1).await;
    released(g).await;
    let g2 = waiter.await.expect("join").expect("handed over");
    released(g2).await;
    // Without the test CA the nodes' certificates are not trusted.
    let (base, _) = url.split_once('?').expect("query");
    let err = RedisBackend::connect(base, &fast_opts())
        .await
        .err()
        .expect("untrusted");
    assert!(err.is_connection(), "{err:?}");
}

/// Issue 23 #3 on a cluster: an attempt whose request timed out (its master paused) and that
/// then gave up leaves its end record in the lock's own slot (the record rides with the
/// give-up, routed to that master), and a late copy of its request after that neither queues
/// nor takes the lock. (The proxied late-request cases cannot run here: the cluster client
/// reaches each node at the address the cluster announces.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_attempt_stays_ended_in_its_slot() {
    use distlock_core::backend::{AcquireReply, AcquireRequest};
    let mut cluster = RedisCluster::start_with(3, 0).expect("cluster");
    let opts = fast_opts();
    let b = RedisBackend::connect(&cluster.url(), &opts)
        .await
        .expect("connect");
    let name = suite::unique_name("ended-slot");
    let lease = Duration::from_secs(20);
    let request = |owner: &str| {
        let key = HoldKey::new(name.as_str(), owner, LockKind::Mutex);
        AcquireRequest::new(key, lease, distlock_core::LostSignal::new())
    };
    let holder = request("holder");
    let token = match b.acquire(&holder).await.expect("acquire") {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    let mut late = request("late");
    late.waiter_ttl = Some(Duration::from_secs(2));
    let lock_key = format!("dlock:{{{name}}}");
    let m = cluster.master_of(&lock_key).expect("master");
    cluster.pause(m);
    let r = b.acquire(&late).await;
    cluster.resume(m);
    assert!(r.is_err(), "answered by a paused master: {r:?}");
    b.give_up(&late).await.expect("give up");
    let record = format!("dlock:{{{name}}}:ended:{}", late.attempt.as_str());
    let pttl: i64 = cluster.servers()[m]
        .command(&["PTTL", &record])
        .expect("PTTL")
        .parse()
        .expect("a number");
    assert!(
        pttl > 60_000,
        "no end record on the lock's master: PTTL {pttl}"
    );
    // A late copy of the request: refused, not queued.
    assert!(matches!(
        b.acquire(&late).await.expect("acquire"),
        AcquireReply::Held { .. }
    ));
    let queued = cluster
        .command_at_key(&lock_key, &["ZCARD", &format!("dlock:{{{name}}}:queue")])
        .expect("ZCARD");
    assert_eq!(queued, "0", "the ended attempt was queued");
    b.release(&holder.grant(token)).await.expect("release");
    let other = request("other");
    assert!(
        matches!(
            b.acquire(&other).await.expect("acquire"),
            AcquireReply::Granted { .. }
        ),
        "not free after the holder released it"
    );
}
