//! The keeper's chunked renewals, against an in-memory backend that records every call.

use super::RENEW_CHUNK;
use crate::backend::{
    async_trait, AcquireReply, AcquireRequest, Backend, GrantRef, LockInfo, LockKind,
    ReleaseOutcome, ReleaseWatch, RenewOutcome,
};
use crate::subscriptions::Subscriptions;
use crate::{Client, ClientOptions, Error, LockGuard, LostReason, Result};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Grants every acquisition (a new token each), renews every grant except the refused ones,
/// and records the tokens of each renewal call.
#[derive(Default)]
struct Recorder {
    next_token: AtomicU64,
    calls: Mutex<Vec<Vec<u64>>>,
    refused: Mutex<HashSet<u64>>,
    /// Grants whose renewal fails on its own (answered `Unconfirmed`).
    unconfirmed: Mutex<HashSet<u64>>,
    /// Renewal calls still to fail (with a connection error).
    fail: AtomicU32,
    failed: Mutex<Vec<Vec<u64>>>,
}

impl Recorder {
    fn calls(&self) -> Vec<Vec<u64>> {
        self.calls.lock().expect("calls").clone()
    }
}

#[async_trait]
impl Backend for Recorder {
    fn kind(&self) -> &'static str {
        "recorder"
    }
    fn endpoint(&self) -> String {
        "memory".into()
    }
    async fn acquire(&self, _: &AcquireRequest) -> Result<AcquireReply> {
        let token = self.next_token.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(AcquireReply::Granted { token })
    }
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let subs: Subscriptions<String> = Subscriptions::new("recorder", "memory");
        Ok(Box::new(
            subs.subscribe(req.key.name.to_string(), &req.attempt).0,
        ))
    }
    async fn give_up(&self, _: &AcquireRequest) -> Result<()> {
        Ok(())
    }
    async fn release(&self, _: &GrantRef) -> Result<ReleaseOutcome> {
        Ok(ReleaseOutcome::Released)
    }
    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        let tokens: Vec<u64> = holds.iter().map(|(g, _)| g.token).collect();
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.failed.lock().expect("failed").push(tokens);
            return Err(Error::connection("recorder", "memory", "injected failure"));
        }
        let refused = self.refused.lock().expect("refused").clone();
        let unconfirmed = self.unconfirmed.lock().expect("unconfirmed").clone();
        let out = tokens
            .iter()
            .map(|t| {
                if refused.contains(t) {
                    RenewOutcome::NotHeld
                } else if unconfirmed.contains(t) {
                    RenewOutcome::Unconfirmed
                } else {
                    RenewOutcome::Renewed
                }
            })
            .collect();
        self.calls.lock().expect("calls").push(tokens);
        Ok(out)
    }
    async fn inspect(&self, name: &str, _: LockKind) -> Result<LockInfo> {
        Ok(LockInfo::new(name))
    }
}

/// A client whose watchdog renews every second (3 s lease: a loaded machine can stall the
/// keeper for most of a second without a loss), holding `n` locks.
async fn holding(n: usize) -> (Arc<Recorder>, Client, Vec<LockGuard>) {
    let backend = Arc::new(Recorder::default());
    let opts = ClientOptions::default().watchdog_lease(Duration::from_secs(3));
    let client = Client::new(backend.clone(), opts).expect("client");
    let mut guards = Vec::with_capacity(n);
    for i in 0..n {
        let g = client
            .lock(&format!("l{i}"))
            .expect("lock")
            .acquire()
            .await
            .expect("acquire");
        guards.push(g);
    }
    (backend, client, guards)
}

/// Waits (up to a minute) until every token of `tokens` was renewed `times` times in the
/// calls made after the first `from`; returns those calls.
async fn renewed(b: &Recorder, from: usize, tokens: &[u64], times: usize) -> Vec<Vec<u64>> {
    let started = std::time::Instant::now();
    loop {
        let calls = b.calls().split_off(from);
        let mut seen: HashMap<u64, usize> = HashMap::new();
        for t in calls.iter().flatten() {
            *seen.entry(*t).or_default() += 1;
        }
        if tokens
            .iter()
            .all(|t| seen.get(t).is_some_and(|n| *n >= times))
        {
            return calls;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not every hold was renewed {times} times: {} calls",
            calls.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tokens(guards: &[LockGuard]) -> Vec<u64> {
    guards.iter().map(LockGuard::fencing_token).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_renews_every_hold_in_equal_chunks_of_at_most_1000() {
    let (b, _client, guards) = holding(2_500).await;
    let from = b.calls().len();
    let calls = renewed(&b, from, &tokens(&guards), 3).await;
    for c in &calls {
        assert!(c.len() <= RENEW_CHUNK, "a call of {} holds", c.len());
        let distinct: HashSet<_> = c.iter().collect();
        assert_eq!(distinct.len(), c.len(), "a hold twice in one call");
    }
    // A round planned with all 2,500 holds: three chunks of equal size, not 1000/1000/500.
    assert!(
        calls.iter().any(|c| c.len() == 834),
        "chunk sizes {:?}",
        calls.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(guards.iter().all(|g| !g.is_lost()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_grant_in_a_chunk_is_lost_and_the_others_renew() {
    let (b, client, guards) = holding(1_500).await;
    let stale = guards[700].fencing_token();
    b.refused.lock().expect("refused").insert(stale);
    let reason = tokio::time::timeout(Duration::from_secs(30), guards[700].lost())
        .await
        .expect("the refused hold was never lost");
    assert_eq!(reason, LostReason::NotHeld);
    let calls = b.calls();
    let refusing = calls
        .iter()
        .find(|c| c.contains(&stale))
        .expect("the refusing call");
    assert!(refusing.len() > 1, "the refused grant was renewed alone");
    // The others keep being renewed; the lost hold is not sent again.
    let from = calls.len();
    let others: Vec<u64> = tokens(&guards)
        .into_iter()
        .filter(|t| *t != stale)
        .collect();
    let later = renewed(&b, from, &others, 2).await;
    assert!(later.iter().flatten().all(|t| *t != stale));
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_lost(), i == 700, "guard {i}");
    }
    assert_eq!(client.held_count(), 1_499);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_chunk_is_sent_again_and_nothing_is_lost() {
    let (b, _client, guards) = holding(1_500).await;
    b.fail.store(1, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let failed = loop {
        if let Some(f) = b.failed.lock().expect("failed").first().cloned() {
            break f;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no call failed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(failed.len() <= RENEW_CHUNK);
    let from = b.calls().len();
    renewed(&b, from, &failed, 1).await;
    renewed(&b, from, &tokens(&guards), 2).await;
    assert!(guards.iter().all(|g| !g.is_lost()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_hold_is_sent_again_alone_and_lost_at_its_lease_end() {
    let (b, client, guards) = holding(5).await;
    let bad = guards[2].fencing_token();
    b.unconfirmed.lock().expect("unconfirmed").insert(bad);
    let from = b.calls().len();
    let reason = tokio::time::timeout(Duration::from_secs(30), guards[2].lost())
        .await
        .expect("the unconfirmed hold was never lost");
    assert_eq!(reason, LostReason::LeaseExpired);
    let calls = b.calls().split_off(from);
    // Tried again on its own between rounds, the others not sent with it.
    assert!(
        calls.iter().any(|c| c == &vec![bad]),
        "never retried alone: {calls:?}"
    );
    let others: Vec<u64> = tokens(&guards).into_iter().filter(|t| *t != bad).collect();
    renewed(&b, from, &others, 3).await;
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_lost(), i == 2, "guard {i}");
    }
    assert_eq!(client.held_count(), 4);
}

/// A suspend (stood in for by the boot-time clock jumping on while tokio's, the monotonic
/// clock, does not) that outlived the leases ends the holds promptly after the resume:
/// `lost()` futures that were waiting since before it resolve within a few seconds, not at the
/// keeper's next round or at the lease end as tokio's timers count it.
#[tokio::test]
async fn lost_fires_promptly_after_a_suspend() {
    let backend = Arc::new(Recorder::default());
    // The first round is 20 s away, the fixed lease ends 120 s after its grant (tokio time).
    let opts = ClientOptions::default().watchdog_lease(Duration::from_secs(60));
    let client = Client::new(backend, opts).expect("client");
    let watched = client
        .lock("suspend-watchdog")
        .expect("lock")
        .acquire()
        .await
        .expect("acquire");
    let fixed = client
        .lock("suspend-fixed")
        .expect("lock")
        .lease(Duration::from_secs(120))
        .expect("lease")
        .acquire()
        .await
        .expect("acquire");
    let w = tokio::spawn(watched.lost_signal().lost_owned());
    let f = tokio::spawn(fixed.lost_signal().lost_owned());
    // Both are waiting on their timers before the suspend.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!w.is_finished() && !f.is_finished());
    crate::clock::suspend_for_test(Duration::from_secs(600));
    let both = async { (w.await.expect("task"), f.await.expect("task")) };
    let (rw, rf) = tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .expect("lost() did not resolve within 10 s of a resume that outlived the leases");
    assert_eq!(rw, LostReason::LeaseExpired);
    assert_eq!(rf, LostReason::LeaseExpired);
    assert_eq!(client.held_count(), 0);
}

/// A lock whose session ended ([`LostReason::SessionEnded`]: an SQL connection or a ZooKeeper
/// session gone) vouches for no more than its last confirmed request: the server frees a
/// session's locks as the session ends, which may be before the client hears of it (`dlock
/// torture`, PostgreSQL session-mode election with `reset`: the next leader was granted
/// 389 µs before the old one heard, and the old one's lease deadline still ran a lease
/// past its last renewal). Any other loss leaves the deadline as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_ended_vouches_only_for_its_last_confirmed_request() {
    let (backend, _client, guards) = holding(2).await;
    let before = crate::clock::Instant::now();
    let calls = backend.calls().len();
    // One renewal of both after `before`: their last confirmed request was sent after it.
    renewed(&backend, calls, &tokens(&guards), 1).await;
    let after = crate::clock::Instant::now();
    let (ended, refused) = (&guards[0], &guards[1]);
    let lease_end = ended.lease_deadline();
    assert!(lease_end > after, "a held lock's deadline is a lease ahead");
    ended
        .lost_signal()
        .fire(LostReason::SessionEnded("connection reset".into()));
    let vouched = ended.lease_deadline();
    assert!(
        vouched >= before && vouched <= after,
        "after its session ended the lock's deadline should be its last renewal's send time, \
         between {before:?} and {after:?}; it is {vouched:?} (held: {lease_end:?})"
    );
    let kept = refused.lease_deadline();
    refused.lost_signal().fire(LostReason::NotHeld);
    assert_eq!(refused.lease_deadline(), kept);
}
