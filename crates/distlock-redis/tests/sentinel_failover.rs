//! `redis+sentinel://` across failovers, on three real sentinels, a master and a replica: the
//! SAME backend object follows the master the sentinels promote (killed or paused master, a
//! manual failover), its waiters move with it, and what a failover keeps of a held lock is
//! what docs/redis-lock.md says (kept with `wait_replicas=1`, lost without a replicated grant).

mod common;

use common::released;
use distlock_core::{Client, ClientOptions, LockGuard, LostReason, ReleaseOutcome};
use distlock_redis::{RedisBackend, RedisBuilderExt};
use distlock_testkit::conformance::unique_name;
use distlock_testkit::{RedisServer, SentinelOptions, SentinelSetup};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous bounds (CI: 2 cores, everything in parallel); the sentinels' down-after is 1 s.
const PROMOTION: Duration = Duration::from_secs(60);
const FOLLOW: Duration = Duration::from_secs(30);

/// Short operations; the held lock's lease (15 s) outlasts a failover (down-after 1 s, the
/// election, the promotion) so that only the failover, not a missed renewal, decides its fate.
fn opts() -> ClientOptions {
    ClientOptions::default()
        .watchdog_lease(Duration::from_secs(15))
        .op_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2))
}

async fn backend(url: &str) -> (Client, Arc<RedisBackend>) {
    let b = Arc::new(RedisBackend::connect(url, &opts()).await.expect("connect"));
    (Client::new(b.clone(), opts()).expect("client"), b)
}

fn port_of(b: &RedisBackend) -> u16 {
    let at = b.sentinel_master().expect("a sentinel backend");
    at.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("host:port")
}

/// Waits until `b` sends its calls to `port`.
async fn follows(b: &RedisBackend, port: u16) -> Duration {
    let t = Instant::now();
    while port_of(b) != port {
        assert!(
            t.elapsed() < FOLLOW,
            "the backend stayed on {:?}",
            b.sentinel_master()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.elapsed()
}

async fn promoted(setup: &SentinelSetup) -> Duration {
    let s = setup;
    tokio::task::block_in_place(|| s.wait_for_promotion(PROMOTION)).expect("promotion")
}

/// The same client takes and gives back fresh names (within a generous bound: the first calls
/// after the switch may be retried).
async fn works_on(c: &Client, names: usize) {
    for _ in 0..names {
        let name = unique_name("after-failover");
        let g = c
            .lock(&name)
            .expect("lock")
            .acquire_timeout(Duration::from_secs(20))
            .await
            .expect("acquire after the failover");
        released(g).await;
    }
}

async fn held(c: &Client, name: &str) -> LockGuard {
    c.lock(name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(20))
        .await
        .expect("acquire")
}

/// A setup whose standby replica (never promoted) keeps `wait_replicas=1` satisfiable after
/// the failover, while the old master is away.
fn with_standby() -> SentinelSetup {
    SentinelSetup::start_with(SentinelOptions {
        standby_replica: true,
        ..Default::default()
    })
    .expect("sentinel setup")
}

/// Replies `READONLY` the server gave (`INFO errorstats`).
fn readonly_errors(s: &RedisServer) -> u64 {
    let stats = s.command(&["INFO", "errorstats"]).expect("errorstats");
    stats
        .lines()
        .find_map(|l| l.strip_prefix("errorstat_READONLY:count="))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

fn evalsha_calls(s: &RedisServer) -> u64 {
    s.command_calls("evalsha").expect("commandstats")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_master_replicated_grant_survives_and_the_same_backend_follows() {
    let mut setup = with_standby();
    let url = format!("{}?wait_replicas=1&wait_timeout=300ms", setup.url());
    let (c, b) = backend(&url).await;
    let (other, _) = backend(&url).await;
    let name = unique_name("kept");
    let g = held(&c, &name).await;
    let token = g.fencing_token();
    setup.master_mut().kill();
    let took = promoted(&setup).await;
    let moved = follows(&b, setup.replica().port()).await;
    eprintln!("promoted after {took:?}, followed {moved:?} later");
    works_on(&c, 3).await;
    // The grant was on the replica before it was acknowledged: still held, by us.
    assert!(
        other
            .lock(&name)
            .expect("lock")
            .try_acquire()
            .await
            .expect("try")
            .is_none(),
        "a second holder after the failover"
    );
    // And the guard keeps renewing on the new master (its deadline moves on).
    let before = g.lease_deadline();
    let t = Instant::now();
    while g.lease_deadline() <= before {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "no renewal on the new master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!g.is_lost(), "lost too early");
    assert_eq!(g.fencing_token(), token);
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_master_unreplicated_grant_is_lost_and_signalled() {
    let mut setup = SentinelSetup::start().expect("sentinel setup");
    let url = setup.url();
    let (c, b) = backend(&url).await;
    let (other, _) = backend(&url).await;
    let name = unique_name("lost");
    // An earlier grant the replica confirmed: the fencing counter it will be promoted with.
    let (w, _) = backend(&format!("{url}?wait_replicas=1&wait_timeout=300ms")).await;
    released(held(&w, &name).await).await;
    // Cut the replica off before the grant: paused, and its link killed by the master, so
    // the grant (acknowledged: no wait_replicas) never reaches it.
    setup.replica_mut().pause();
    setup
        .master()
        .command(&["CLIENT", "KILL", "TYPE", "replica"])
        .expect("client kill");
    let g = held(&c, &name).await;
    setup.master_mut().kill();
    setup.replica_mut().resume();
    promoted(&setup).await;
    follows(&b, setup.replica().port()).await;
    // The promoted replica never had the grant: another client takes the lock ...
    let g2 = other
        .lock(&name)
        .expect("lock")
        .acquire_timeout(Duration::from_secs(20))
        .await
        .expect("the lost lock is free on the new master");
    // ... with a token above the one the old master issued last, although the promoted
    // replica's counter missed that grant: a fenced store refuses the deposed holder.
    assert!(
        g2.fencing_token() > g.fencing_token(),
        "the promoted replica granted token {} after the old master's {}",
        g2.fencing_token(),
        g.fencing_token()
    );
    // ... and the first holder is told: its renewal finds no grant.
    let reason = tokio::time::timeout(Duration::from_secs(20), g.lost())
        .await
        .expect("the lost signal did not fire");
    assert!(matches!(reason, LostReason::NotHeld), "{reason:?}");
    works_on(&c, 2).await;
    released(g2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_blocked_across_the_failover_is_woken_on_the_new_master() {
    let mut setup = with_standby();
    let url = format!("{}?wait_replicas=1&wait_timeout=300ms", setup.url());
    let (holder, hb) = backend(&url).await;
    let (waiter, wb) = backend(&url).await;
    let name = unique_name("woken");
    let g = held(&holder, &name).await;
    let lock = waiter.lock(&name).expect("lock");
    let wait = tokio::spawn(async move {
        let r = lock.acquire_timeout(Duration::from_secs(90)).await;
        (r, Instant::now())
    });
    let t = Instant::now();
    while wb.subscribed_channels().await == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    setup.master_mut().kill();
    promoted(&setup).await;
    let new = setup.replica().port();
    follows(&hb, new).await;
    follows(&wb, new).await;
    // The waiter subscribes again, on the new master (the old one is dead).
    let t = Instant::now();
    while wb.subscribed_channels().await == 0 {
        assert!(
            t.elapsed() < FOLLOW,
            "the waiter did not subscribe on the new master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!wait.is_finished(), "the waiter took a lock that is held");
    let released_at = Instant::now();
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    let (r, got_at) = tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("the waiter never got the lock")
        .expect("task");
    let g2 = r.expect("acquire");
    let woke = got_at.duration_since(released_at);
    // Woken by the release: well before the 15 s lease would have let it retry by itself.
    assert!(
        woke < Duration::from_secs(5),
        "woken {woke:?} after the release"
    );
    released(g2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_master_is_failed_over_and_gets_no_lock_writes_when_back() {
    let mut setup = with_standby();
    let url = format!("{}?wait_replicas=1&wait_timeout=300ms", setup.url());
    let (c, b) = backend(&url).await;
    let name = unique_name("paused");
    let g = held(&c, &name).await;
    setup.master_mut().pause();
    promoted(&setup).await;
    follows(&b, setup.replica().port()).await;
    works_on(&c, 2).await;
    // The old master comes back, still believing it is the master until the sentinels
    // demote it.
    setup.master_mut().resume();
    tokio::task::block_in_place(|| setup.wait_old_master_demoted(PROMOTION)).expect("demoted");
    let calls = evalsha_calls(setup.master());
    works_on(&c, 3).await;
    assert!(!g.is_lost(), "lost too early");
    assert_eq!(
        g.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        evalsha_calls(setup.master()),
        calls,
        "lock scripts were sent to the demoted master"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demoted_master_readonly_reply_moves_the_backend() {
    let setup = SentinelSetup::start().expect("sentinel setup");
    // No +switch-master subscription: only the failed calls can find the failover.
    let b = Arc::new(
        RedisBackend::builder(setup.url())
            .options(opts())
            .without_switch_subscription()
            .connect()
            .await
            .expect("connect"),
    );
    let c = Client::new(b.clone(), opts()).expect("client");
    works_on(&c, 1).await;
    let old = setup.master().port();
    assert_eq!(port_of(&b), old);
    setup.failover().expect("SENTINEL FAILOVER");
    promoted(&setup).await;
    tokio::task::block_in_place(|| setup.wait_old_master_demoted(PROMOTION)).expect("demoted");
    // Nothing told the backend: it still points at the old master, now a replica.
    assert_eq!(port_of(&b), old);
    let calls = evalsha_calls(setup.master());
    let readonly_before = readonly_errors(setup.master());
    // The sentinels are paused for a moment (under the 2 s that would put them in TILT):
    // the backend reconnects to the old address (the sentinels cut its connection when they
    // demoted the node) and is refused READONLY until it can ask them where the master is.
    for s in setup.sentinels() {
        s.pause();
    }
    let c2 = c.clone();
    let first = tokio::spawn(async move { works_on(&c2, 1).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for s in setup.sentinels() {
        s.resume();
    }
    first
        .await
        .expect("acquire while the sentinels were paused");
    works_on(&c, 3).await;
    assert_eq!(port_of(&b), setup.replica().port());
    // Every lock script that reached the demoted master was refused (READONLY): none ran.
    let reached = evalsha_calls(setup.master()) - calls;
    let refused = readonly_errors(setup.master()) - readonly_before;
    eprintln!("{reached} lock scripts reached the demoted master, {refused} refused READONLY");
    assert!(refused > 0, "the backend never met a READONLY reply");
    assert!(
        reached <= refused,
        "{reached} lock scripts reached the demoted master, only {refused} were refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_password_is_separate_and_never_shown() {
    let setup = SentinelSetup::start_with(SentinelOptions {
        sentinel_password: Some("sentinel-s3cret".into()),
        ..Default::default()
    })
    .expect("sentinel setup");
    let url = setup.url();
    for bad in [url.clone(), format!("{url}?sentinel_password=wrong-pass")] {
        let e = RedisBackend::builder(&bad)
            .options(opts())
            .ignore_env()
            .connect()
            .await
            .err()
            .expect("must fail");
        assert!(matches!(e, distlock_core::Error::Auth { .. }), "{e:?}");
        let text = format!("{e} {e:?}");
        assert!(text.contains("sentinel_password"), "{text}");
        assert!(
            !text.contains("wrong-pass") && !text.contains("s3cret"),
            "{text}"
        );
    }
    let (c, _) = backend(&format!("{url}?sentinel_password=sentinel-s3cret")).await;
    works_on(&c, 1).await;
    let b = RedisBackend::builder(&url)
        .options(opts())
        .sentinel_password("sentinel-s3cret")
        .connect()
        .await
        .expect("builder's sentinel password");
    let c = Client::new(Arc::new(b), opts()).expect("client");
    works_on(&c, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_is_heard_from_another_sentinel_without_any_call() {
    let mut setup = SentinelSetup::start().expect("sentinel setup");
    let (_c, b) = backend(&setup.url()).await;
    // The backend listens to the first sentinel (its subscriber shows in CLIENT LIST) ...
    let t = Instant::now();
    while !setup
        .sentinel_command(0, &["CLIENT", "LIST"])
        .is_some_and(|l| l.contains(" sub=1 "))
    {
        assert!(t.elapsed() < FOLLOW, "no subscriber on the first sentinel");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... which goes silent (paused, its connection open);
    // the other two still agree on the failover.
    setup.sentinels()[0].pause();
    setup.master_mut().kill();
    promoted(&setup).await;
    // No call is made: only the +switch-master subscription, moved to another sentinel
    // when the silent one did not answer its ping, can move the backend.
    let moved = follows(&b, setup.replica().port()).await;
    eprintln!("followed {moved:?} after the promotion, without a call");
    setup.sentinels()[0].resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_passwords_are_used_across_a_failover() {
    let mut setup = SentinelSetup::start_with(SentinelOptions {
        sentinel_password: Some("sentinel-pw".into()),
        master_password: Some("master-pw".into()),
        ..Default::default()
    })
    .expect("sentinel setup");
    // The master's password in the URL, the sentinels' from the builder.
    let b = Arc::new(
        RedisBackend::builder(setup.url())
            .options(opts())
            .sentinel_password("sentinel-pw")
            .ignore_env()
            .connect()
            .await
            .expect("connect"),
    );
    let c = Client::new(b.clone(), opts()).expect("client");
    works_on(&c, 1).await;
    setup.master_mut().kill();
    promoted(&setup).await;
    // The listener reached the sentinels with their password, the new master was reached
    // (ROLE, then the locks) with the master's.
    follows(&b, setup.replica().port()).await;
    works_on(&c, 2).await;
}
