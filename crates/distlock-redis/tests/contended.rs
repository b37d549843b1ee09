//! The plain mutex's contended mode (`?handoff_after=`, src/contended.rs): a release frees the
//! lock for whoever asks first while the oldest waiter is young, and hands it over, oldest
//! first, once that waiter has waited `handoff_after` (by default a multiple of the client's
//! recent holds, bounded). On real redis-servers, with a slow waiter behind a delaying proxy.

mod common;

use common::{acquired, client_for, released};

use distlock_core::{Client, ClientOptions, LockGuard};
use distlock_redis::{DEFAULT_HANDOFF_AFTER, MAX_HANDOFF_AFTER};
use distlock_testkit::conformance::{fast_opts, unique_name};
use distlock_testkit::{DelayProxy, RedisServer};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Long leases: no lease end or heartbeat wakes anybody within a case unless it says so.
fn opts() -> ClientOptions {
    fast_opts()
        .watchdog_lease(Duration::from_secs(30))
        .op_timeout(Duration::from_secs(5))
}

fn with_handoff_after(url: &str, after: &str) -> String {
    format!("{url}?handoff_after={after}")
}

/// How many attempts are queued for mutex `name`.
fn queue_len(server: &RedisServer, name: &str) -> usize {
    let card = server
        .command(&["ZCARD", &format!("dlock:{{{name}}}:queue")])
        .expect("ZCARD");
    card.parse()
        .unwrap_or_else(|_| panic!("ZCARD answered {card:?}"))
}

/// Waits until `n` attempts are queued for mutex `name`.
async fn queued(server: &RedisServer, name: &str, n: usize) {
    let t = Instant::now();
    loop {
        if queue_len(server, name) >= n {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The attempt id the grant hash of mutex `name` names ("" when free).
fn holder(server: &RedisServer, name: &str) -> String {
    let attempt = server
        .command(&["HGET", &format!("dlock:{{{name}}}"), "attempt"])
        .expect("HGET");
    if attempt == "(nil)" {
        String::new()
    } else {
        attempt
    }
}

/// The queued waiter's acquisition ends with the lock within 10 s; it is released.
async fn served(wait: tokio::task::JoinHandle<distlock_core::Result<LockGuard>>) {
    let w = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the waiter was never served")
        .expect("join")
        .expect("acquired");
    released(w).await;
}

/// A server and three clients, with `?handoff_after=AFTER` if given (else the adaptive
/// threshold): two straight to it and a slow one through a proxy (no delay until a case sets
/// one).
struct Slowed {
    server: RedisServer,
    direct: [Client; 2],
    proxy: DelayProxy,
    slow: Client,
}

async fn slowed(after: Option<&str>) -> Slowed {
    let server = RedisServer::start().expect("redis");
    let url_of = |url: String| match after {
        Some(a) => with_handoff_after(&url, a),
        None => url,
    };
    let url = url_of(server.url());
    let (a, _) = client_for(&url, opts()).await;
    let (b, _) = client_for(&url, opts()).await;
    let proxy = DelayProxy::start(server.addr(), Duration::ZERO).expect("proxy");
    let (slow, _) = client_for(
        &url_of(format!("redis://127.0.0.1:{}", proxy.port())),
        opts(),
    )
    .await;
    Slowed {
        server,
        direct: [a, b],
        proxy,
        slow,
    }
}

/// `lock` waits (20 s at most) in a task, returned once the server counts `n` queued.
async fn in_line(
    server: &RedisServer,
    lock: distlock_core::Lock,
    name: &str,
    n: usize,
) -> tokio::task::JoinHandle<distlock_core::Result<LockGuard>> {
    let wait = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await });
    queued(server, name, n).await;
    wait
}

/// Releases `g` while one waiter is queued and checks the release sent one wake-up, `w
/// ATTEMPT` (the lock freed for whoever asks first; `handed` is the failure otherwise); then
/// `barger` takes the free lock and holds it.
async fn woken_and_barged(
    server: &RedisServer,
    g: LockGuard,
    barger: &Client,
    name: &str,
    handed: &str,
) -> LockGuard {
    let mut spy = server.spy("dlock:wake:*").expect("spy");
    released(g).await;
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert_eq!(
        seen.len(),
        1,
        "one wake-up, for the oldest waiter: {seen:?}"
    );
    assert!(seen[0].1.starts_with("w "), "{handed}: {seen:?}");
    barger
        .lock(name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try")
        .expect("the barger did not get the free lock")
}

/// The oldest waiter has waited less than `handoff_after`: the release frees the lock and
/// wakes that waiter alone (`w ATTEMPT`, no handoff), and a barger that asks first gets it
/// while the waiter — slowed by a proxy — stays queued in its place; it gets the lock at the
/// barger's release. (Before the contended mode the release handed the lock to the waiter and
/// the barger's try was refused: 'the barger did not get the free lock'.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_waiter_is_woken_and_a_barger_takes_the_free_lock() {
    let Slowed {
        server,
        direct: [holder_c, barger],
        proxy,
        slow: waiter,
    } = slowed(Some("10s")).await;
    let name = unique_name("barge");
    let g = acquired(&holder_c, &name).await;
    let wait = in_line(&server, waiter.lock(&name).expect("lock"), &name, 1).await;
    // The waiter's next request (after its wake-up) comes 300 ms late.
    proxy.set_request_delay(Duration::from_millis(300));
    let got = woken_and_barged(
        &server,
        g,
        &barger,
        &name,
        "the young waiter was woken, not handed the lock",
    )
    .await;
    // The woken waiter asked too late: still queued, not holding.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !wait.is_finished(),
        "the waiter got a lock the barger holds"
    );
    assert_eq!(queue_len(&server, &name), 1, "the waiter lost its place");
    proxy.set_request_delay(Duration::ZERO);
    released(got).await;
    served(wait).await;
}

/// A queued waiter keeps its place: the release wakes the oldest waiter alone, and while that
/// one's next request is on its way (600 ms late through a proxy) the heartbeats of a waiter
/// queued behind it (every 100 ms: its lease is 400 ms) find the lock free and leave it — only
/// a newcomer barges. The oldest is served first, then the other. (Before, the second waiter's
/// heartbeat took the lock the release had freed: 'a waiter queued behind the oldest took the
/// free lock'; a test that then waited for the oldest while the second held on hung.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_does_not_pass_the_one_queued_before_it() {
    let Slowed {
        server,
        direct: [holder_c, second_c],
        proxy,
        slow: first_c,
    } = slowed(Some("10s")).await;
    let name = unique_name("keeps-place");
    let g = acquired(&holder_c, &name).await;
    let first = in_line(&server, first_c.lock(&name).expect("lock"), &name, 1).await;
    let lock = second_c
        .lock(&name)
        .expect("lock")
        .lease(Duration::from_millis(400))
        .expect("lease");
    let second = in_line(&server, lock, &name, 2).await;
    proxy.set_request_delay(Duration::from_millis(600));
    let mut spy = server.spy("dlock:wake:*").expect("spy");
    released(g).await;
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert!(
        seen.len() == 1 && seen[0].1.starts_with("w "),
        "the release frees the lock and wakes the oldest: {seen:?}"
    );
    // Several heartbeats of the second waiter while the first's request is delayed (the only
    // scripts run meanwhile: nobody holds a lock to renew): counted, so that the case cannot
    // pass because none came.
    let before = server.calls("evalsha").expect("INFO");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let asked = server.calls("evalsha").expect("INFO") - before;
    assert!(
        asked >= 2,
        "the second waiter asked {asked} times in 400 ms"
    );
    let now = holder(&server, &name);
    assert!(
        !second.is_finished() && now.is_empty(),
        "a waiter queued behind the oldest took the free lock: held by {now:?}"
    );
    proxy.set_request_delay(Duration::ZERO);
    let w = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the oldest waiter was never served")
        .expect("join")
        .expect("acquired");
    assert!(!second.is_finished(), "two holders");
    released(w).await;
    served(second).await;
}

/// Once the oldest waiter has waited `handoff_after`, the release hands the lock to it (`h
/// TOKEN ATTEMPT SEQ`) and a barger asking right after is refused: it never overlaps the holder
/// the lock was handed to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_waiter_is_handed_the_lock_and_no_barger_overlaps_it() {
    let server = RedisServer::start().expect("redis");
    let url = with_handoff_after(&server.url(), "100ms");
    let (holder_c, _) = client_for(&url, opts()).await;
    let (barger, _) = client_for(&url, opts()).await;
    let (waiter, _) = client_for(&url, opts()).await;
    let name = unique_name("handoff");
    let g = acquired(&holder_c, &name).await;
    let wait = in_line(&server, waiter.lock(&name).expect("lock"), &name, 1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut spy = server.spy("dlock:wake:*").expect("spy");
    released(g).await;
    // The hash names the waiter's attempt at once (the release wrote it).
    let handed_to = holder(&server, &name);
    assert!(!handed_to.is_empty(), "the lock was not handed over");
    let barged = barger
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(barged.is_none(), "a barger got a lock handed to a waiter");
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].1.starts_with("h ") && seen[0].1.split(' ').nth(2) == Some(handed_to.as_str()),
        "{seen:?}"
    );
    let w = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("never acquired")
        .expect("join")
        .expect("acquired");
    assert_eq!(holder(&server, &name), handed_to);
    released(w).await;
}

/// A hot releaser (acquire, release, acquire again, with no pause) does not starve a waiter
/// whose every request comes late (20 ms through a proxy): the waiter is served within
/// `handoff_after` and a few of its round trips, and the two never hold at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_releaser_does_not_starve_a_slow_waiter() {
    hot_releaser_and_slow_waiter(Some("50ms"), Duration::ZERO, Duration::from_millis(50)).await;
}

/// The same with the adaptive threshold (no `handoff_after`): the hot releaser's holds of a
/// few ms put it at its ceiling, [`MAX_HANDOFF_AFTER`], and the slow waiter is still served
/// within that and a few of its round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_threshold_does_not_starve_a_slow_waiter() {
    hot_releaser_and_slow_waiter(None, Duration::from_millis(2), MAX_HANDOFF_AFTER).await;
}

/// A hot loop on one client holding `hold` per section, and a waiter on another whose
/// requests all come 20 ms late; `after`: the threshold the releases use at most.
async fn hot_releaser_and_slow_waiter(param: Option<&str>, hold: Duration, after: Duration) {
    let Slowed {
        server: _server,
        direct: [hot, _],
        proxy,
        slow,
    } = slowed(param).await;
    let name = unique_name("hot");
    let inside = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let hot_sections = Arc::new(AtomicUsize::new(0));
    let looping = {
        let (lock, inside, stop, sections) = (
            hot.lock(&name).expect("lock"),
            inside.clone(),
            stop.clone(),
            hot_sections.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let g = lock
                    .acquire_timeout(Duration::from_secs(10))
                    .await
                    .expect("hot acquire");
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                tokio::task::yield_now().await;
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                inside.store(false, Ordering::SeqCst);
                sections.fetch_add(1, Ordering::SeqCst);
                released(g).await;
            }
        })
    };
    // The hot loop runs.
    let t = Instant::now();
    while hot_sections.load(Ordering::SeqCst) < 20 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the hot loop is stuck"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.set_delay(Duration::from_millis(10));
    let lock = slow.lock(&name).expect("lock");
    for round in 0..3 {
        let t = Instant::now();
        let g = lock
            .acquire_timeout(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the slow waiter starved: {e}"));
        let waited = t.elapsed();
        assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
        tokio::time::sleep(Duration::from_millis(5)).await;
        inside.store(false, Ordering::SeqCst);
        released(g).await;
        // handoff_after, then the handoff's delivery and the confirming attempt (a round trip
        // of 20 ms through the proxy each), and room for a loaded machine.
        assert!(
            waited < after + Duration::from_secs(2),
            "round {round}: the slow waiter waited {waited:?}"
        );
    }
    stop.store(true, Ordering::SeqCst);
    looping.await.expect("hot loop");
    assert!(hot_sections.load(Ordering::SeqCst) > 20);
}

/// `n` acquire + hold `held` + release cycles of a lock of `c`'s own: the client's recent
/// holds, which the adaptive threshold follows.
async fn hold_a_while(c: &Client, held: Duration, n: usize) {
    let lock = c.lock(&unique_name("warm")).expect("lock");
    for _ in 0..n {
        let g = lock.acquire().await.expect("acquire");
        tokio::time::sleep(held).await;
        released(g).await;
    }
}

/// Without `handoff_after`, the threshold follows the client's recent holds: after holds of
/// 10 ms it is at its ceiling ([`MAX_HANDOFF_AFTER`], 20 ms), so a waiter queued about 10 ms
/// ago — older than the old fixed default of 5 ms — is woken, not handed the lock, and a
/// barger takes the free lock while the waiter (slowed by a proxy) stays queued. (Before the
/// threshold followed the holds: the lock was handed over, 'the waiter was handed the lock'.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_threshold_lets_a_barger_pass_a_waiter_younger_than_the_recent_holds() {
    let Slowed {
        server,
        direct: [holder_c, barger],
        proxy,
        slow: waiter,
    } = slowed(None).await;
    hold_a_while(&holder_c, Duration::from_millis(10), 4).await;
    let name = unique_name("adaptive");
    let g = acquired(&holder_c, &name).await;
    let wait = in_line(&server, waiter.lock(&name).expect("lock"), &name, 1).await;
    proxy.set_request_delay(Duration::from_millis(300));
    // Older than the old default, younger than the adaptive threshold.
    tokio::time::sleep(DEFAULT_HANDOFF_AFTER * 2).await;
    let got = woken_and_barged(&server, g, &barger, &name, "the waiter was handed the lock").await;
    proxy.set_request_delay(Duration::ZERO);
    released(got).await;
    served(wait).await;
}

/// The adaptive threshold never passes its ceiling: after holds far longer than it (so
/// `HOLD_MULTIPLE` × the mean is seconds), a waiter older than [`MAX_HANDOFF_AFTER`] is
/// handed the lock and a barger right after is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_threshold_still_hands_an_old_waiter_the_lock() {
    let server = RedisServer::start().expect("redis");
    let (holder_c, _) = client_for(&server.url(), opts()).await;
    let (barger, _) = client_for(&server.url(), opts()).await;
    let (waiter, _) = client_for(&server.url(), opts()).await;
    hold_a_while(&holder_c, Duration::from_millis(100), 2).await;
    let name = unique_name("adaptive-old");
    let g = acquired(&holder_c, &name).await;
    let wait = in_line(&server, waiter.lock(&name).expect("lock"), &name, 1).await;
    tokio::time::sleep(MAX_HANDOFF_AFTER * 2).await;
    let mut spy = server.spy("dlock:wake:*").expect("spy");
    released(g).await;
    let handed_to = holder(&server, &name);
    assert!(!handed_to.is_empty(), "the lock was not handed over");
    let barged = barger
        .lock(&name)
        .expect("lock")
        .try_acquire()
        .await
        .expect("try");
    assert!(barged.is_none(), "a barger got a lock handed to a waiter");
    let seen = tokio::task::block_in_place(|| spy.drain()).expect("spy");
    assert!(seen.len() == 1 && seen[0].1.starts_with("h "), "{seen:?}");
    let w = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("never acquired")
        .expect("join")
        .expect("acquired");
    released(w).await;
}

/// A fair lock keeps strict FIFO: even a waiter that has waited no time at all is handed the
/// lock, and a barger is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_always_hands_over() {
    let server = RedisServer::start().expect("redis");
    let url = with_handoff_after(&server.url(), "10s");
    let (holder_c, _) = client_for(&url, opts()).await;
    let (barger, _) = client_for(&url, opts()).await;
    let (waiter, _) = client_for(&url, opts()).await;
    let name = unique_name("fair");
    let g = fair(&holder_c, &name).acquire().await.expect("acquire");
    let wait = in_line(&server, fair(&waiter, &name), &name, 1).await;
    released(g).await;
    let barged = fair(&barger, &name).try_acquire().await.expect("try");
    assert!(barged.is_none(), "a barger passed a fair lock's waiter");
    let w = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("never acquired")
        .expect("join")
        .expect("acquired");
    released(w).await;
}

fn fair(c: &Client, name: &str) -> distlock_core::Lock {
    c.fair_lock(name).expect("fair lock")
}
