//! Handoff notices as grants: the number and send time of each waiting attempt's latest request
//! (docs/redis-lock.md, "Operations", the handoff's `SEQ`).
//!
//! A handoff notice `h TOKEN ATTEMPT SEQ` comes on the subscriber connection, so it may be
//! older than the waiter's latest request (`dlock torture` seed 12). It is the grant only when
//! it names the attempt's latest request, that request was answered "held" (so the server
//! granted after answering it, and the lease runs from no earlier than its send time), and half
//! the lease from that send time is still ahead. Any other notice is confirmed by one more
//! attempt of the same attempt (`distlock_core::wait`).

use distlock_core::backend::{async_trait, AttemptId, ReleaseWatch, Wake};
use distlock_core::clock::Instant;
use distlock_core::{LockKind, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How many attempts the table keeps before it drops those whose latest request is older
/// than [`STALE`] (an attempt is forgotten when granted or given up; this bounds the rest).
const KEEP: usize = 4096;
const STALE: Duration = Duration::from_secs(600);

/// A request's number and send time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) seq: u64,
    at: Instant,
}

/// The latest request of one waiting attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Last {
    sent: Sent,
    /// Answered "held" (a request without an answer, or that failed, vouches for nothing).
    held: bool,
}

/// This client's waiting attempts' latest requests (one per backend, shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Requests {
    next: AtomicU64,
    last: Mutex<HashMap<AttemptId, Last>>,
}

impl Requests {
    fn table(&self) -> MutexGuard<'_, HashMap<AttemptId, Last>> {
        crate::lock(&self.last)
    }

    /// Numbers a request of `attempt` about to be sent, with its send time. An attempt the
    /// table knows (it waited already) is marked as having this request in flight; an
    /// attempt's first request (the uncontended acquire, usually granted) touches nothing.
    pub(crate) fn sent(&self, attempt: &AttemptId) -> Sent {
        let sent = Sent {
            seq: self.next.fetch_add(1, Ordering::Relaxed) + 1,
            at: Instant::now(),
        };
        if let Some(l) = self.table().get_mut(attempt) {
            *l = Last { sent, held: false };
        }
        sent
    }

    /// Request `sent` of `attempt` was answered "held": it is the attempt's latest.
    pub(crate) fn held(&self, attempt: &AttemptId, sent: Sent) {
        let mut t = self.table();
        if t.len() >= KEEP {
            t.retain(|_, l| sent.at.saturating_duration_since(l.sent.at) < STALE);
        }
        t.insert(attempt.clone(), Last { sent, held: true });
    }

    /// `attempt` is granted or gave up: nothing of it is vouched for any more.
    pub(crate) fn forget(&self, attempt: &AttemptId) {
        self.table().remove(attempt);
    }

    /// The send time a handoff to `attempt` after its request `request` is measured from, if
    /// this client vouches for it as the grant (see the module docs); the attempt is then
    /// forgotten.
    fn vouch(&self, attempt: &AttemptId, request: u64, lease: Duration) -> Option<Instant> {
        let mut t = self.table();
        let at = vouched(t.get(attempt)?, request, lease, Instant::now())?;
        t.remove(attempt);
        Some(at)
    }
}

/// The decision: `Some(send time)` when `request` is the attempt's latest (`last`), answered
/// "held", and at least half of `lease` measured from its send time is left at `now`.
fn vouched(last: &Last, request: u64, lease: Duration, now: Instant) -> Option<Instant> {
    let Last { sent, held } = *last;
    (request != 0 && request == sent.seq && held && now < sent.at + lease / 2).then_some(sent.at)
}

/// A waiting mutex attempt's watch that turns the handoffs this client vouches for into
/// [`Wake::Granted`].
pub(crate) struct Vouching {
    pub(crate) inner: Box<dyn ReleaseWatch>,
    pub(crate) requests: Arc<Requests>,
    pub(crate) attempt: AttemptId,
    pub(crate) lease: Duration,
    pub(crate) kind: LockKind,
    pub(crate) handoff_after: crate::contended::HandoffAfter,
}

#[async_trait]
impl ReleaseWatch for Vouching {
    /// # Cancel safety
    /// Cancel safe: the inner watch is, and what follows it does not await.
    async fn changed(&mut self) -> Result<Wake> {
        Ok(match self.inner.changed().await? {
            Wake::HandedOverAfter { token, request } if token > 0 => {
                match self.requests.vouch(&self.attempt, request, self.lease) {
                    Some(requested_at) => {
                        self.handoff_after.granted(self.kind, &self.attempt);
                        Wake::Granted {
                            token,
                            requested_at,
                        }
                    }
                    None => Wake::HandedOver { token },
                }
            }
            w => w,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);

    fn last(held: bool) -> (Last, Instant) {
        let at = Instant::now();
        (
            Last {
                sent: Sent { seq: 7, at },
                held,
            },
            at,
        )
    }

    #[test]
    fn a_handoff_after_the_latest_answered_request_is_measured_from_its_send_time() {
        let (l, sent) = last(true);
        assert_eq!(vouched(&l, 7, LEASE, sent), Some(sent));
        assert_eq!(
            vouched(&l, 7, LEASE, sent + Duration::from_secs(4)),
            Some(sent)
        );
    }

    #[test]
    fn anything_else_is_confirmed() {
        let (l, sent) = last(true);
        // Older than the latest request: the seed-12 notice, heard after a later "held".
        assert_eq!(vouched(&l, 6, LEASE, sent), None);
        // Not numbered (an older client's script), or a number never sent.
        assert_eq!(vouched(&l, 0, LEASE, sent), None);
        assert_eq!(vouched(&l, 8, LEASE, sent), None);
        // Half the lease or more gone since the request (a waiter stopped, a slow delivery).
        assert_eq!(vouched(&l, 7, LEASE, sent + LEASE / 2), None);
        assert_eq!(vouched(&l, 7, LEASE, sent + LEASE * 3), None);
        // The request was never answered "held" (no answer, an error).
        let (unanswered, sent) = last(false);
        assert_eq!(vouched(&unanswered, 7, LEASE, sent), None);
    }

    #[test]
    fn the_table_vouches_once_for_the_latest_request_of_an_attempt() {
        let r = Requests::default();
        let a = AttemptId::new();
        let first = r.sent(&a);
        r.held(&a, first);
        let second = r.sent(&a);
        assert_eq!(
            r.vouch(&a, second.seq, LEASE),
            None,
            "second not answered yet"
        );
        assert_eq!(r.vouch(&a, first.seq, LEASE), None, "older than the latest");
        r.held(&a, second);
        assert_eq!(r.vouch(&a, first.seq, LEASE), None, "older than the latest");
        assert!(r.vouch(&a, second.seq, LEASE).is_some());
        assert_eq!(r.vouch(&a, second.seq, LEASE), None, "vouched once");
        let b = AttemptId::new();
        let s = r.sent(&b);
        assert!(r.table().is_empty(), "a first request is not recorded");
        r.held(&b, s);
        r.forget(&b);
        assert_eq!(r.vouch(&b, s.seq, LEASE), None, "forgotten");
    }
}
