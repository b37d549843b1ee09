//! Ended attempts stay ended: the attempts with a request that may still reach the server.
//!
//! After a reply timed out this backend goes on over a fresh connection ([`crate::conn`]), so
//! a request whose answer never came may still be on its way — in a proxy, a socket buffer,
//! a stalled server — when its attempt has ended (a retry was answered "held", the wait ran
//! out, the grant was released). Run then, it would grant the lock to an attempt nobody waits
//! for, or queue it for the next release's handoff: the lock held by nobody for a lease.
//!
//! So every acquire-side script refuses an attempt whose **end record**
//! `NS:{NAME}:ended:ATTEMPT` exists (in the lock's hash tag, so in its Cluster slot): it
//! neither grants nor queues it, and answers "held". The record is written by the attempt's
//! give-up and by the release of its grant, in the same round trip, before the release script
//! runs (a `SET … PX` pipelined in front of it), and only for an attempt that has a request
//! without an answer: [`Unanswered`] counts them, so an attempt whose every request was
//! answered (the uncontended case) costs nothing. The record lives
//! [`record_lifetime`] (at least [`ENDED_FOR`]): the assumption is that no request reaches the
//! server later than that after it was sent.

use distlock_core::backend::AttemptId;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long an end record lives at least: longer than any plausible late delivery of a
/// request (minutes of TCP retransmission of a connection the client gave up, or a server
/// stalled that long with the request in its socket buffer).
pub(crate) const ENDED_FOR: Duration = Duration::from_secs(300);

/// The lifetime of an end record with operation timeout `op_timeout`: [`ENDED_FOR`], or 20
/// operation timeouts if that is longer.
pub(crate) fn record_lifetime(op_timeout: Duration) -> Duration {
    ENDED_FOR.max(op_timeout.saturating_mul(20))
}

/// The attempts of this backend with a request that may still reach the server: one in
/// flight, or one that failed without an answer less than the record lifetime ago.
pub(crate) struct Unanswered {
    keep: Duration,
    inner: Mutex<Inner>,
}

struct Inner {
    attempts: HashMap<AttemptId, Entry>,
    /// Size at which finished entries older than `keep` are dropped (amortized pruning).
    prune_at: usize,
}

struct Entry {
    in_flight: u32,
    /// A request of the attempt got no answer (an error, or dropped before its reply).
    unanswered: bool,
    /// When its last request was sent.
    last_sent: Instant,
}

/// Entries kept before the first pruning.
const PRUNE_FROM: usize = 64;

impl Unanswered {
    /// A table whose unanswered requests count for `keep` after their send.
    pub(crate) fn new(keep: Duration) -> Self {
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
        crate::lock(&self.inner)
    }

    /// A request of `attempt` is sent now; call [`Sent::answered`] when its reply came. A
    /// `Sent` dropped without it (an error, or the caller gone) marks the attempt.
    pub(crate) fn sent(&self, attempt: &AttemptId) -> Sent<'_> {
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

    /// If a request of `attempt` may still reach the server, how long its end record must
    /// live; `None` when every request of it was answered.
    pub(crate) fn end_record(&self, attempt: &AttemptId) -> Option<Duration> {
        let inner = self.inner();
        let e = inner.attempts.get(attempt)?;
        (e.in_flight > 0 || (e.unanswered && e.last_sent.elapsed() < self.keep))
            .then_some(self.keep)
    }
}

/// One request in flight (see [`Unanswered::sent`]).
pub(crate) struct Sent<'a> {
    table: &'a Unanswered,
    attempt: AttemptId,
    answered: bool,
}

impl Sent<'_> {
    /// The server answered the request.
    pub(crate) fn answered(mut self) {
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

    #[test]
    fn only_attempts_with_an_unanswered_request_need_a_record() {
        let t = Unanswered::new(Duration::from_secs(60));
        let (a, b, c) = (AttemptId::new(), AttemptId::new(), AttemptId::new());
        // Answered: nothing kept.
        t.sent(&a).answered();
        assert_eq!(t.end_record(&a), None);
        assert!(t.inner().attempts.is_empty());
        // In flight: may still arrive.
        let pending = t.sent(&b);
        assert_eq!(t.end_record(&b), Some(Duration::from_secs(60)));
        drop(pending);
        // Failed (or dropped) without an answer: kept, even after a later answered retry.
        assert_eq!(t.end_record(&b), Some(Duration::from_secs(60)));
        t.sent(&b).answered();
        assert_eq!(t.end_record(&b), Some(Duration::from_secs(60)));
        assert_eq!(t.end_record(&c), None);
    }

    #[test]
    fn old_unanswered_attempts_are_pruned() {
        let t = Unanswered::new(Duration::ZERO);
        for _ in 0..PRUNE_FROM {
            drop(t.sent(&AttemptId::new()));
        }
        assert_eq!(t.inner().attempts.len(), PRUNE_FROM);
        // Past `keep` they need no record, and the next send drops them.
        let a = AttemptId::new();
        assert_eq!(t.end_record(&a), None);
        let pending = t.sent(&a);
        assert_eq!(t.inner().attempts.len(), 1);
        assert!(t.end_record(&a).is_some(), "in flight");
        drop(pending);
        assert_eq!(record_lifetime(Duration::from_secs(3)), ENDED_FOR);
        assert_eq!(
            record_lifetime(Duration::from_secs(60)),
            Duration::from_secs(1200)
        );
    }
}
