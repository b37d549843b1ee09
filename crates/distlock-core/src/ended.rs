//! Attempts with a request that may still reach the server: which ended attempts need an
//! **end record**.
//!
//! A backend that goes on over another connection after a request got no answer in time
//! (Redis, PostgreSQL's lease mode, MySQL's table mode) leaves the unanswered copy on its way —
//! in a proxy, a socket buffer, a stalled server. Run after its attempt ended (a retry was
//! answered "held" and the wait gave up, or the grant was released), it would grant the lock
//! to an attempt nobody waits for: the lock held by nobody for a whole lease. So such a backend
//! records the end of the attempt on the server, in the request that gives it up or releases
//! it, and every grant checks that record in its own script, statement or transaction.
//!
//! Only an attempt with a request in flight or without an answer needs the record: a request
//! that was answered was executed, and no copy of it is left. [`Unanswered`] keeps those
//! attempts, so that the common path (every request answered) writes nothing more. A request
//! counts for `keep` after it was sent: the assumption is that it reaches the server (and
//! runs) within that long, or never; the record on the server must live as long.

use crate::backend::AttemptId;
use crate::Result;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The `keep` of [`Unanswered::default`]: one hour. Far longer than a TCP connection keeps
/// retransmitting a request before it gives up (about 15 minutes with Linux's defaults) and
/// than any operation timeout; a request held up longer (a server frozen for an hour with the
/// request in its socket buffer) could still grant an ended attempt, which then frees itself
/// when its lease ends.
pub const KEEP: Duration = Duration::from_secs(3600);

/// Entries kept before the first pruning.
const PRUNE_FROM: usize = 64;

/// The attempts of one backend with a request that may still reach the server: one in flight,
/// or one that failed without an answer less than `keep` ago.
#[derive(Debug)]
pub struct Unanswered {
    keep: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    attempts: HashMap<AttemptId, Entry>,
    /// Size at which finished entries older than `keep` are dropped (amortized pruning).
    prune_at: usize,
}

#[derive(Debug)]
struct Entry {
    in_flight: u32,
    /// A request of the attempt got no answer (an error, or dropped before its reply).
    unanswered: bool,
    /// When its last request was sent.
    last_sent: Instant,
}

impl Default for Unanswered {
    /// A table whose unanswered requests count for [`KEEP`].
    fn default() -> Self {
        Unanswered::new(KEEP)
    }
}

impl Unanswered {
    /// A table whose unanswered requests count for `keep` after their send.
    pub fn new(keep: Duration) -> Self {
        Unanswered {
            keep,
            inner: Mutex::new(Inner {
                attempts: HashMap::new(),
                prune_at: PRUNE_FROM,
            }),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // A few map operations on plain data: a poisoned lock holds whole data.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request of `attempt` is sent now; call [`Sent::answered`] when its reply came. A
    /// `Sent` dropped without it (an error, or the caller gone) marks the attempt.
    pub fn sent(&self, attempt: &AttemptId) -> Sent<'_> {
        let mut inner = self.inner();
        if inner.attempts.len() >= inner.prune_at {
            let keep = self.keep;
            inner
                .attempts
                .retain(|_, e| e.in_flight > 0 || e.last_sent.elapsed() < keep);
            inner.prune_at = PRUNE_FROM.max(inner.attempts.len() * 2);
        }
        let e = inner
            .attempts
            .entry(attempt.clone())
            .or_insert_with(|| Entry {
                in_flight: 0,
                unanswered: false,
                last_sent: Instant::now(),
            });
        e.in_flight += 1;
        e.last_sent = Instant::now();
        Sent {
            table: self,
            attempt: attempt.clone(),
            answered: false,
        }
    }

    /// Runs `request` of `attempt` between [`sent`](Self::sent) and [`Sent::answered`]: an
    /// `Ok` is an answer; an error, or a request dropped midway, may leave a copy on its way.
    ///
    /// # Errors
    /// `request`'s.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped midway, the attempt is remembered.
    pub async fn track<T>(
        &self,
        attempt: &AttemptId,
        request: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let sent = self.sent(attempt);
        let r = request.await;
        if r.is_ok() {
            sent.answered();
        }
        r
    }

    /// If a request of `attempt` may still reach the server, how long its end record must
    /// live (`keep`); `None` when every request of it was answered.
    pub fn end_record(&self, attempt: &AttemptId) -> Option<Duration> {
        let inner = self.inner();
        let e = inner.attempts.get(attempt)?;
        (e.in_flight > 0 || (e.unanswered && e.last_sent.elapsed() < self.keep))
            .then_some(self.keep)
    }

    /// Whether the end of `attempt` must be recorded on the server
    /// ([`end_record`](Self::end_record) is `Some`).
    pub fn pending(&self, attempt: &AttemptId) -> bool {
        self.end_record(attempt).is_some()
    }

    /// The end of `attempt` is recorded on the server: forget it.
    pub fn recorded(&self, attempt: &AttemptId) {
        self.inner().attempts.remove(attempt);
    }

    /// Attempts remembered (for tests).
    pub fn len(&self) -> usize {
        self.inner().attempts.len()
    }

    /// True if none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request in flight (see [`Unanswered::sent`]).
#[must_use = "a request dropped without `answered` counts as unanswered"]
pub struct Sent<'a> {
    table: &'a Unanswered,
    attempt: AttemptId,
    answered: bool,
}

impl Sent<'_> {
    /// The server answered the request.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        let mut inner = self.table.inner();
        let Some(e) = inner.attempts.get_mut(&self.attempt) else {
            return;
        };
        e.in_flight = e.in_flight.saturating_sub(1);
        e.unanswered |= !self.answered;
        if e.in_flight == 0 && !e.unanswered {
            inner.attempts.remove(&self.attempt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP_1M: Duration = Duration::from_secs(60);

    #[test]
    fn only_attempts_with_an_unanswered_request_need_a_record() {
        let t = Unanswered::new(KEEP_1M);
        let (a, b, c) = (AttemptId::new(), AttemptId::new(), AttemptId::new());
        // Answered: nothing kept.
        t.sent(&a).answered();
        assert_eq!(t.end_record(&a), None);
        assert!(t.is_empty());
        // In flight: may still arrive.
        let pending = t.sent(&b);
        assert_eq!(t.end_record(&b), Some(KEEP_1M));
        drop(pending);
        // Failed (or dropped) without an answer: kept, even after a later answered retry.
        assert_eq!(t.end_record(&b), Some(KEEP_1M));
        t.sent(&b).answered();
        assert_eq!(t.end_record(&b), Some(KEEP_1M));
        assert_eq!(t.end_record(&c), None);
        t.recorded(&b);
        assert!(t.is_empty());
    }

    /// The SQL backends' table of before failed this: an earlier request answered while a
    /// later one was still in flight took the attempt off the table.
    #[test]
    fn a_request_still_in_flight_keeps_its_attempt_when_another_is_answered() {
        let t = Unanswered::new(KEEP_1M);
        let a = AttemptId::new();
        let first = t.sent(&a);
        let second = t.sent(&a);
        first.answered();
        assert!(t.pending(&a), "the second request may still arrive");
        drop(second);
        assert!(t.pending(&a), "and it got no answer");
        let (b, c) = (AttemptId::new(), AttemptId::new());
        let first = t.sent(&b);
        t.sent(&b).answered();
        assert!(t.pending(&b), "the first request may still arrive");
        first.answered();
        assert!(!t.pending(&b), "both answered");
        drop(t.sent(&c));
        t.recorded(&c);
        assert!(!t.pending(&c));
    }

    #[tokio::test]
    async fn track_remembers_errors_and_requests_dropped_midway() {
        let t = Unanswered::default();
        let (a, b) = (AttemptId::new(), AttemptId::new());
        t.track(&a, async { Ok(()) }).await.expect("answered");
        assert!(!t.pending(&a));
        let failed = t.track(&a, async {
            Err::<(), _>(crate::Error::Runtime("timed out".into()))
        });
        assert!(failed.await.is_err());
        assert!(t.pending(&a));
        let never = t.track(&b, std::future::pending::<Result<()>>());
        let _ = tokio::time::timeout(Duration::from_millis(10), never).await;
        assert!(t.pending(&b));
        assert_eq!(t.end_record(&b), Some(KEEP));
    }

    #[test]
    fn old_unanswered_attempts_are_pruned() {
        let t = Unanswered::new(Duration::ZERO);
        for _ in 0..PRUNE_FROM {
            drop(t.sent(&AttemptId::new()));
        }
        assert_eq!(t.len(), PRUNE_FROM);
        // Past `keep` they need no record, and the next send drops them.
        let a = AttemptId::new();
        assert_eq!(t.end_record(&a), None);
        let pending = t.sent(&a);
        assert_eq!(t.len(), 1);
        assert!(t.end_record(&a).is_some(), "in flight");
        drop(pending);
    }
}
