//! Renewals at scale on real redis-servers: every node renews a chunk of grants in one script
//! (`quorum_renew_many.lua`), so many holds of one client cost one `EVALSHA` per node per
//! chunk of up to 1,000, each grant is still checked on its own, and the quorum is tallied per
//! grant (a grant made stale on a majority in the middle of a batch is lost alone).

mod common;

use common::{evalsha_calls, opts, pttl, wait_counting, Cluster};
use distlock_core::backend::{AcquireReply, AcquireRequest, GrantRef, HoldKey, RenewOutcome};
use distlock_core::{Backend, LockGuard, LockKind, LostReason, LostSignal};
use distlock_redlock::RedlockBackend;
use std::time::{Duration, Instant};

fn evalsha_all(c: &Cluster) -> Vec<u64> {
    c.servers.iter().map(evalsha_calls).collect()
}

/// Waits until every node has run at least `n` more `EVALSHA` than `from`.
async fn evalsha_after(c: &Cluster, from: &[u64], n: u64) {
    let t = Instant::now();
    loop {
        let now = evalsha_all(c);
        if now.iter().zip(from).all(|(a, b)| a - b >= n) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the nodes ran {:?} of {n} scripts",
            now.iter().zip(from).map(|(a, b)| a - b).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Node `i`'s live holds among `dlock:{PREFIX*}` (hashes with an attempt and a TTL), and the
/// longest TTL among them (ms).
fn held_on(c: &Cluster, i: usize, prefix: &str) -> (usize, i64) {
    const COUNT: &str = "local n, max = 0, 0
        for _, k in ipairs(redis.call('keys', 'dlock:{' .. ARGV[1] .. '*}')) do
          local ttl = redis.call('pttl', k)
          if ttl > 0 and redis.call('hget', k, 'attempt') then n = n + 1 end
          if ttl > max then max = ttl end
        end
        return {n, max}";
    let reply = c.servers[i]
        .command(&["EVAL", COUNT, "0", prefix])
        .expect("EVAL");
    let v: Vec<i64> = reply
        .lines()
        .map(|l| {
            l.parse()
                .unwrap_or_else(|_| panic!("count reply {reply:?}"))
        })
        .collect();
    assert_eq!(v.len(), 2, "count reply {reply:?}");
    (v[0] as usize, v[1])
}

const HOLDS: usize = 500;

/// 500 holds of one client on 3 nodes, 2 s watchdog lease: through several ticks none is lost
/// and every node runs one script per tick (not one per hold); then one grant in the middle
/// made stale on two nodes (another attempt's hold, shorter lease) is lost alone, and the
/// stale holds are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_holds_renew_in_one_script_per_node_and_a_stale_one_is_lost_alone() {
    let c = Cluster::start(3);
    c.settle().await;
    let lease = Duration::from_millis(2_000);
    let interval = lease / 3;
    let (client, b) = c.client_and_backend("quarantine=500ms", opts(2_000)).await;
    wait_counting(&b, 3, Duration::from_secs(10)).await;
    let mut guards: Vec<LockGuard> = Vec::with_capacity(HOLDS);
    for i in 0..HOLDS {
        guards.push(
            client
                .lock(&format!("m{i}"))
                .expect("lock")
                .acquire()
                .await
                .expect("acquire"),
        );
    }
    let last = format!("m{}", HOLDS - 1);
    c.wait_held_on(&[0, 1, 2], &last, Duration::from_secs(10))
        .await;
    let acquired = Instant::now();

    // At least four ticks, and more than a lease.
    let from = evalsha_all(&c);
    let start = Instant::now();
    evalsha_after(&c, &from, 4).await;
    while acquired.elapsed() < lease {
        evalsha_after(&c, &evalsha_all(&c), 1).await;
    }
    let ran: Vec<u64> = evalsha_all(&c)
        .iter()
        .zip(&from)
        .map(|(a, b)| a - b)
        .collect();
    let ticks = start.elapsed().as_millis() as u64 / interval.as_millis() as u64 + 1;
    eprintln!(
        "{HOLDS} holds, {:?}: EVALSHA per node {ran:?} in at most {ticks} ticks",
        start.elapsed()
    );
    // One script per tick per node (a retried chunk may add one); one per hold would be
    // 500 a tick.
    for (i, n) in ran.iter().enumerate() {
        assert!(*n <= 2 * ticks, "node {i} ran {n} scripts in {ticks} ticks");
    }
    assert!(guards.iter().all(|g| !g.is_lost()), "a hold was lost");
    for i in 0..3 {
        let (n, max) = held_on(&c, i, "m");
        assert_eq!(n, HOLDS, "node {i}'s holds");
        assert!(max <= lease.as_millis() as i64, "a lease longer than asked");
    }

    // One grant in the middle of the batch made stale on a majority: its hold on nodes 0 and 1
    // now another attempt's, with a lease shorter than the watchdog's.
    let stale = HOLDS / 2;
    let name = format!("m{stale}");
    let key = format!("dlock:{{{name}}}");
    let short = 1_500;
    for i in [0, 1] {
        c.servers[i]
            .command(&["HSET", &key, "attempt", "someone-else"])
            .expect("HSET");
        c.servers[i]
            .command(&["PEXPIRE", &key, &short.to_string()])
            .expect("PEXPIRE");
    }
    let reason = tokio::time::timeout(lease * 4, guards[stale].lost())
        .await
        .expect("the stale hold was never lost");
    assert_eq!(reason, LostReason::NotHeld);
    // The stale holds were refused, not renewed.
    for i in [0, 1] {
        let attempt = c.servers[i]
            .command(&["HGET", &key, "attempt"])
            .expect("HGET");
        assert_eq!(attempt, "someone-else", "node {i}");
        assert!(pttl(&c, i, &name) <= short, "node {i} renewed a stale hold");
    }
    // The others keep renewing (two more ticks).
    evalsha_after(&c, &evalsha_all(&c), 2).await;
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_lost(), i == stale, "guard {i}");
    }
    assert_eq!(client.held_count(), HOLDS - 1);
}

fn request(name: &str, lease: Duration) -> AcquireRequest {
    AcquireRequest::new(
        HoldKey::new(name, "owner", LockKind::Mutex),
        lease,
        LostSignal::new(),
    )
}

async fn granted(b: &RedlockBackend, req: &AcquireRequest) -> GrantRef {
    match b.acquire(req).await.expect("acquire") {
        AcquireReply::Granted { token } => req.grant(token),
        other => panic!("not granted: {other:?}"),
    }
}

/// One `renew` of 1,200 live grants and three stale ones in the middle (a wrong token, an
/// attempt that holds nothing, a hold overwritten by data of another type): two scripts per
/// node (1,000 + 203), the live grants renewed, the stale ones `NotHeld` and their keys'
/// leases untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_renew_is_one_script_per_thousand_grants_per_node() {
    let c = Cluster::start(3);
    c.settle().await;
    let o = opts(2_000);
    let b = c.backend("quarantine=500ms", &o).await;
    wait_counting(&b, 3, Duration::from_secs(10)).await;
    // Leases long enough that the first grant is still live after 1,203 sequential acquires on
    // a loaded machine (with 3 s, grant 0 had expired before the renew once in CI).
    let lease = Duration::from_secs(60);
    let short = Duration::from_secs(30);
    let mut holds = Vec::new();
    for i in 0..1_200 {
        let req = request(&format!("g{i}"), short);
        holds.push((granted(&b, &req).await, lease));
    }
    // A hold renewed with its token off by one (this attempt holds it with another token), and
    // one by an attempt that never held it.
    let x = granted(&b, &request("x", short)).await;
    let mut wrong_token = x.clone();
    wrong_token.token += 1;
    let _y = granted(&b, &request("y", short)).await;
    let never = request("y", short).grant(1);
    // And one whose key was overwritten on every node by data of another type.
    let z = granted(&b, &request("z", short)).await;
    holds.insert(600, (wrong_token, lease));
    holds.insert(601, (never, lease));
    holds.insert(602, (z, lease));
    for name in ["g1199", "x", "y", "z"] {
        c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(10))
            .await;
    }

    for s in &c.servers {
        s.command(&["SET", "dlock:{z}", "foreign", "PX", "3000"])
            .expect("SET");
    }

    let from = evalsha_all(&c);
    let out = b.renew(&holds).await.expect("renew");
    assert_eq!(out.len(), holds.len());
    for (i, o) in out.iter().enumerate() {
        let want = if (600..=602).contains(&i) {
            RenewOutcome::NotHeld
        } else {
            RenewOutcome::Renewed
        };
        assert_eq!(*o, want, "grant {i}");
    }
    // The slowest node's scripts may finish after the majority's answer.
    evalsha_after(&c, &from, 2).await;
    let ran: Vec<u64> = evalsha_all(&c)
        .iter()
        .zip(&from)
        .map(|(a, b)| a - b)
        .collect();
    eprintln!("renew of {} grants: EVALSHA per node {ran:?}", holds.len());
    assert_eq!(ran, vec![2, 2, 2], "scripts per node");
    for i in 0..3 {
        assert!(pttl(&c, i, "g0") > short.as_millis() as i64, "node {i}: g0");
        assert!(
            pttl(&c, i, "g1199") > short.as_millis() as i64,
            "node {i}: g1199"
        );
        for name in ["x", "y", "z"] {
            assert!(
                pttl(&c, i, name) <= short.as_millis() as i64,
                "node {i}: the stale renewal of {name} extended it"
            );
        }
    }
}
