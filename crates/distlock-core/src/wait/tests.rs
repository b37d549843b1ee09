use super::*;
use crate::backend::{GrantRef, HoldKey, LockInfo, LockKind, ReleaseOutcome, RenewOutcome};
use crate::lost::LostSignal;
use crate::subscriptions::Subscriptions;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

#[test]
fn waiter_timing() {
    let s = Duration::from_secs(1);
    assert_eq!(waiter_ttl(s), s);
    assert_eq!(heartbeat(s), Duration::from_millis(250));
    let l = Duration::from_secs(30);
    assert_eq!(waiter_ttl(l), MAX_WAITER_TTL);
    assert_eq!(heartbeat(l), Duration::from_secs(1));
}

/// A token that fires after `d`.
fn cancel_after(d: Duration) -> CancellationToken {
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(d).await;
        c2.cancel();
    });
    cancel
}

fn conn_err(n: u32) -> Error {
    Error::connection("fake", "nowhere", format!("failure {n}"))
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        attempts: 1,
        base_delay: Duration::from_millis(2),
        max_delay: Duration::from_millis(10),
    }
}

/// Runs `s` for at most 60 ms.
async fn run_briefly(s: &mut Script) -> Result<Option<Granted>> {
    run(
        s,
        Deadline::after(Duration::from_millis(60)),
        &CancellationToken::new(),
        quick(),
    )
    .await
}

/// Runs `s` with no deadline until it returns a grant.
async fn run_to_grant(s: &mut Script) -> Granted {
    run(s, Deadline::never(), &CancellationToken::new(), quick())
        .await
        .expect("wait")
        .expect("granted")
}

/// A strategy that plays a script of attempt results and counts what the loop does.
#[derive(Default)]
struct Script {
    attempts: Vec<Result<Attempt>>,
    wakes: Vec<Result<Option<Wake>>>,
    tried: u32,
    gave_up: u32,
    retried: u32,
}

#[async_trait]
impl WaitStrategy for Script {
    async fn attempt(&mut self, _: Deadline, _: &CancellationToken) -> Result<Attempt> {
        self.tried += 1;
        if self.attempts.is_empty() {
            return Ok(Attempt::Held { retry_in: None });
        }
        self.attempts.remove(0)
    }

    async fn wake(&mut self, until: Deadline) -> Result<Option<Wake>> {
        if self.wakes.is_empty() {
            until.reached().await;
            return Ok(None);
        }
        self.wakes.remove(0)
    }

    fn retry(&mut self, e: &Error) -> bool {
        self.retried += 1;
        e.is_retryable()
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(Duration::from_millis(5))
    }

    async fn give_up(&mut self) {
        self.gave_up += 1;
    }
}

impl Script {
    fn with(attempts: Vec<Result<Attempt>>, wakes: Vec<Result<Option<Wake>>>) -> Script {
        Script {
            attempts,
            wakes,
            ..Script::default()
        }
    }
}

fn granted(token: u64) -> Granted {
    Granted {
        token,
        requested_at: crate::clock::Instant::now(),
    }
}

#[tokio::test]
async fn the_last_error_is_reported_when_the_deadline_passes() {
    let mut s = Script::with((0..1000).map(|n| Err(conn_err(n))).collect(), vec![]);
    let cancel = CancellationToken::new();
    let start = Instant::now();
    let r = run(
        &mut s,
        Deadline::after(Duration::from_millis(60)),
        &cancel,
        quick(),
    )
    .await;
    let e = r.expect_err("the last error");
    assert!(e.is_connection(), "{e:?}");
    // The very last failure, not the first.
    let last = s.tried - 1;
    assert_eq!(
        e.to_string(),
        format!("cannot talk to fake at nowhere: failure {last}")
    );
    assert!(s.tried > 1, "never retried");
    assert_eq!(s.retried, s.tried);
    assert_eq!(s.gave_up, 1);
    assert!(start.elapsed() >= Duration::from_millis(60));
}

#[tokio::test]
async fn an_answer_after_failures_clears_the_error() {
    let mut s = Script::with(vec![Err(conn_err(0)), Err(conn_err(1))], vec![]);
    // Then held (the default) until the deadline: a plain timeout.
    let cancel = CancellationToken::new();
    let r = run(
        &mut s,
        Deadline::after(Duration::from_millis(50)),
        &cancel,
        quick(),
    )
    .await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(s.tried >= 3);
    assert_eq!(s.gave_up, 1);
}

#[tokio::test]
async fn a_cancelled_wait_is_none_even_after_failures() {
    let mut s = Script::with((0..100_000).map(|n| Err(conn_err(n))).collect(), vec![]);
    let cancel = cancel_after(Duration::from_millis(30));
    let t = Instant::now();
    let r = run(&mut s, Deadline::never(), &cancel, quick()).await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(s.gave_up, 1);
}

#[tokio::test]
async fn cancel_stops_a_sleeping_wait_at_once() {
    let mut s = Script::default();
    let cancel = cancel_after(Duration::from_millis(20));
    let t = Instant::now();
    let r = run(&mut s, Deadline::never(), &cancel, quick()).await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // Held, slept at most a heartbeat each time: several attempts.
    assert!(s.tried >= 2, "the heartbeat did not bound the sleep");
    assert_eq!(s.gave_up, 1);
}

#[tokio::test]
async fn a_handoff_is_confirmed_by_the_next_attempt() {
    // Before: the handoff was taken as a grant measured from the attempt before it (tried 2),
    // though its notice may be older than that attempt.
    let confirmed_at = crate::clock::Instant::now();
    let mut s = Script::with(
        vec![
            Ok(Attempt::Held { retry_in: None }),
            Ok(Attempt::Held { retry_in: None }),
            Ok(Attempt::Granted(Granted {
                token: 77,
                requested_at: confirmed_at,
            })),
        ],
        vec![
            Ok(Some(Wake::Released)),
            Ok(Some(Wake::HandedOver { token: 77 })),
        ],
    );
    let g = run_to_grant(&mut s).await;
    assert_eq!(g.token, 77);
    assert_eq!(
        g.requested_at, confirmed_at,
        "measured from the confirming attempt"
    );
    assert_eq!(
        s.tried, 3,
        "a release and a handoff are each followed by an attempt"
    );
    assert_eq!(s.gave_up, 0, "a grant was given up");
}

#[tokio::test]
async fn a_stale_handoff_is_not_a_grant() {
    // The handoff's notice came after the lock had gone to another: the confirming attempt
    // is answered "held" and the wait goes on to its deadline.
    let mut s = Script::with(
        vec![Ok(Attempt::Held { retry_in: None })],
        vec![Ok(Some(Wake::HandedOver { token: 5 }))],
    );
    let r = run_briefly(&mut s).await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(s.tried >= 2);
    assert_eq!(s.gave_up, 1);
}

/// A handoff the backend vouches for ends the wait at once, measured from the request the
/// backend names; one that only names the request it followed is confirmed like any other.
#[tokio::test]
async fn a_vouched_handoff_is_the_grant_and_a_numbered_one_is_confirmed() {
    let sent = crate::clock::Instant::now();
    let mut s = Script::with(
        vec![Ok(Attempt::Held { retry_in: None })],
        vec![Ok(Some(Wake::Granted {
            token: 9,
            requested_at: sent,
        }))],
    );
    let g = run_to_grant(&mut s).await;
    assert_eq!((g.token, g.requested_at), (9, sent));
    assert_eq!(s.tried, 1, "no confirming attempt");
    assert_eq!(s.gave_up, 0);

    let mut s = Script::with(
        vec![Ok(Attempt::Held { retry_in: None })],
        vec![Ok(Some(Wake::HandedOverAfter {
            token: 5,
            request: 3,
        }))],
    );
    let r = run_briefly(&mut s).await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(
        s.tried >= 2,
        "a numbered handoff is confirmed by an attempt"
    );
}

#[tokio::test]
async fn a_permanent_error_ends_the_wait_and_gives_up() {
    let mut s = Script::with(vec![Ok(Attempt::Again), Err(Error::invalid("bad"))], vec![]);
    let r = run(
        &mut s,
        Deadline::never(),
        &CancellationToken::new(),
        quick(),
    )
    .await;
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert_eq!(s.tried, 2);
    assert_eq!(s.gave_up, 1);
    // A failing wake-up after "held" is retried, but a deadline after it is a plain timeout:
    // the holder, not the notifications, kept the lock from us.
    let mut s = Script::with(
        vec![Ok(Attempt::Held { retry_in: None })],
        (0..100_000).map(|n| Err(conn_err(n))).collect(),
    );
    let r = run(
        &mut s,
        Deadline::after(Duration::from_millis(40)),
        &CancellationToken::new(),
        quick(),
    )
    .await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(s.retried >= 1);
    // A wake-up's error is handled like an attempt's.
    let mut s = Script::with(
        vec![Ok(Attempt::Held { retry_in: None })],
        vec![Err(conn_err(5)), Err(Error::unexpected("fake", "garbage"))],
    );
    let r = run(
        &mut s,
        Deadline::never(),
        &CancellationToken::new(),
        quick(),
    )
    .await;
    assert!(matches!(r, Err(Error::UnexpectedReply { .. })), "{r:?}");
    assert_eq!(s.retried, 2);
}

#[tokio::test]
async fn retrying_rounds() {
    let cancel = CancellationToken::new();
    let n = AtomicU32::new(0);
    // Two failures, an early stop, then the grant.
    let g = retrying(Deadline::never(), &cancel, quick(), || async {
        match n.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Err(conn_err(0)),
            2 => Ok(None),
            _ => Ok(Some(granted(5))),
        }
    })
    .await
    .expect("wait");
    assert_eq!(g.map(|g| g.token), Some(5));
    assert_eq!(n.load(Ordering::SeqCst), 4);
    // Failing rounds until the deadline: the last error.
    let e = retrying(
        Deadline::after(Duration::from_millis(30)),
        &cancel,
        quick(),
        || async { Err::<Option<Granted>, _>(conn_err(9)) },
    )
    .await
    .expect_err("last error");
    assert!(e.to_string().contains("failure 9"), "{e}");
    // An immediate deadline: nothing is tried.
    let tried = AtomicBool::new(false);
    let r = retrying(
        Deadline::after(Duration::ZERO),
        &cancel,
        quick(),
        || async {
            tried.store(true, Ordering::SeqCst);
            Ok(None)
        },
    )
    .await;
    assert!(matches!(r, Ok(None)));
    assert!(!tried.load(Ordering::SeqCst));
}

/// An in-memory backend: one mutex per process, releases notified through [`Subscriptions`].
struct Fake {
    held: AtomicBool,
    fail_acquires: AtomicU32,
    acquires: AtomicU32,
    gave_up: AtomicU32,
    subs: Subscriptions<String>,
}

impl Fake {
    fn new() -> Arc<Fake> {
        Arc::new(Fake {
            held: AtomicBool::new(true),
            fail_acquires: AtomicU32::new(0),
            acquires: AtomicU32::new(0),
            gave_up: AtomicU32::new(0),
            subs: Subscriptions::new("fake", "memory"),
        })
    }

    fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        self.subs.notify_released(&"k".to_string());
    }
}

#[async_trait]
impl Backend for Fake {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn endpoint(&self) -> String {
        "memory".into()
    }
    async fn acquire(&self, _: &AcquireRequest) -> Result<AcquireReply> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        if self
            .fail_acquires
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(conn_err(1));
        }
        if self.held.swap(true, Ordering::SeqCst) {
            return Ok(AcquireReply::Held {
                ttl: Some(Duration::from_secs(3600)),
            });
        }
        Ok(AcquireReply::Granted { token: 3 })
    }
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        Ok(Box::new(self.subs.subscribe("k".into(), &req.attempt).0))
    }
    async fn give_up(&self, _: &AcquireRequest) -> Result<()> {
        self.gave_up.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn release(&self, _: &GrantRef) -> Result<ReleaseOutcome> {
        Ok(ReleaseOutcome::Released)
    }
    async fn renew(&self, h: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        Ok(vec![RenewOutcome::Renewed; h.len()])
    }
    async fn inspect(&self, name: &str, _: LockKind) -> Result<LockInfo> {
        Ok(LockInfo {
            name: name.into(),
            ..LockInfo::default()
        })
    }
}

fn request() -> AcquireRequest {
    let key = HoldKey {
        name: "k".into(),
        owner: "o".into(),
        kind: LockKind::Mutex,
    };
    AcquireRequest::new(key, Duration::from_secs(30), LostSignal::new())
}

#[tokio::test]
async fn watch_and_retry_wakes_on_a_release_and_unsubscribes() {
    let b = Fake::new();
    let b2 = b.clone();
    tokio::spawn(async move {
        // Wait until the waiter subscribed, then release.
        while b2.subs.watched() == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        b2.release();
    });
    let req = request();
    let g = tokio::time::timeout(
        Duration::from_secs(10),
        watch_and_retry(&*b, &req, None, &CancellationToken::new()),
    )
    .await
    .expect("the release never woke the waiter (the ttl is an hour)")
    .expect("wait")
    .expect("granted");
    assert_eq!(g.token, 3);
    assert_eq!(b.gave_up.load(Ordering::SeqCst), 0);
    assert_eq!(b.subs.watched(), 0, "the watch outlived the wait");
}

#[tokio::test]
async fn watch_and_retry_times_out_gives_up_and_reports_failures() {
    let b = Fake::new();
    let req = request();
    let deadline = Instant::now() + Duration::from_millis(50);
    let r = watch_and_retry(&*b, &req, Some(deadline), &CancellationToken::new()).await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert_eq!(b.gave_up.load(Ordering::SeqCst), 1);
    // Every attempt fails: the wait ends with the connection error.
    b.fail_acquires.store(u32::MAX, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_millis(80);
    let e = watch_and_retry(&*b, &req, Some(deadline), &CancellationToken::new())
        .await
        .expect_err("the last error");
    assert!(e.is_connection(), "{e:?}");
    assert_eq!(b.gave_up.load(Ordering::SeqCst), 2);
    // Failures, then an answer: retried, and granted once free.
    b.fail_acquires.store(2, Ordering::SeqCst);
    b.held.store(false, Ordering::SeqCst);
    let before = b.acquires.load(Ordering::SeqCst);
    let g = watch_and_retry(&*b, &req, None, &CancellationToken::new())
        .await
        .expect("wait");
    assert_eq!(g.map(|g| g.token), Some(3));
    assert_eq!(b.acquires.load(Ordering::SeqCst) - before, 3);
}

#[tokio::test]
async fn watch_and_retry_stops_on_cancel() {
    let b = Fake::new();
    let cancel = cancel_after(Duration::from_millis(30));
    let t = Instant::now();
    let r = watch_and_retry(&*b, &request(), None, &cancel).await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(b.gave_up.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn through_the_client_a_timeout_or_the_last_error() {
    let b = Fake::new();
    let client = crate::Client::new(b.clone(), crate::ClientOptions::default()).expect("client");
    let lock = client.lock("k").expect("lock");
    // Held the whole time: a timeout.
    let e = lock
        .acquire_timeout(Duration::from_millis(60))
        .await
        .expect_err("held");
    assert!(e.is_timeout(), "{e:?}");
    // Unreachable at the end of the wait: the connection error says why.
    b.fail_acquires.store(u32::MAX, Ordering::SeqCst);
    let e = lock
        .acquire_timeout(Duration::from_millis(60))
        .await
        .expect_err("unreachable");
    assert!(e.is_connection(), "{e:?}");
    // Reachable and free again: granted.
    b.fail_acquires.store(0, Ordering::SeqCst);
    b.held.store(false, Ordering::SeqCst);
    let g = lock
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("granted");
    assert_eq!(g.fencing_token(), 3);
}
