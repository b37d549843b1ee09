//! Ended attempts whose requests may still be on their way.
//!
//! Lease mode (PostgreSQL) and table mode (MySQL) run each request as one statement (or one
//! transaction) on a shared connection, and after a request got no answer in time they go on
//! with another connection. The unanswered copy may still reach the server later — after its
//! attempt was answered "held" and given up, or granted and released — and would then grant
//! the lock to an attempt nobody waits for: the lock held by nobody for a whole lease. So the
//! end of such an attempt is recorded on the server (in the statement that gives it up or
//! releases it), and every grant checks that record in its own statement or transaction.
//!
//! Only an attempt that had an unanswered request needs the record: a request that was
//! answered was executed, and no copy of it is left. [`Unanswered`] keeps those attempts, so
//! that the common path (every request answered) writes nothing more. A record lives for
//! [`ENDED_KEEP`]: the assumption is that a request reaches the server (and runs) within that
//! long after it was sent, or never.

use distlock_core::{AttemptId, Result};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex as StdMutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long the server keeps the record that an attempt ended (and how long this client
/// remembers an attempt's unanswered request): one hour. Far longer than a TCP connection
/// keeps retransmitting a request before it gives up (about 15 minutes with Linux's defaults)
/// and than any operation timeout; a request held up longer than this (a server frozen for
/// an hour with the request in its socket buffer) could still grant an ended attempt, which
/// then frees itself when its lease ends.
pub const ENDED_KEEP: Duration = Duration::from_secs(3600);

/// At most this many records of ended attempts per lock are kept on the server (the oldest
/// dropped first), so that a lock's row (PostgreSQL) stays small however many attempts end
/// with unanswered requests within [`ENDED_KEEP`].
pub const ENDED_MAX_PER_LOCK: usize = 1000;

/// Sweep attempts older than [`ENDED_KEEP`] once the table grows past this many.
const SWEEP_AT: usize = 1024;

/// The attempts of one backend that sent a request without getting its answer (a timeout, a
/// broken connection, a request dropped midway), since their last [`ENDED_KEEP`]: their end
/// must be recorded on the server. Forgotten once recorded, or after [`ENDED_KEEP`].
#[derive(Debug, Default)]
pub struct Unanswered {
    map: StdMutex<HashMap<AttemptId, Instant>>,
}

/// Takes the attempt off the table when its request was answered, unless it was already on
/// it (an earlier request of the attempt is still unanswered). Dropped without being
/// disarmed (the request failed or was dropped midway): the attempt stays.
struct Mark<'a> {
    table: &'a Unanswered,
    attempt: &'a AttemptId,
    answered: bool,
    was_there: bool,
}

impl Drop for Mark<'_> {
    fn drop(&mut self) {
        if self.answered && !self.was_there {
            self.table.lock().remove(self.attempt);
        }
    }
}

impl Unanswered {
    fn lock(&self) -> MutexGuard<'_, HashMap<AttemptId, Instant>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `request` of `attempt`, and remembers the attempt unless an answer came back (an
    /// `Ok`): an error, or a request dropped midway, may leave a copy on its way to the
    /// server.
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
        let was_there = {
            let mut map = self.lock();
            if map.len() >= SWEEP_AT {
                map.retain(|_, at| at.elapsed() < ENDED_KEEP);
            }
            map.insert(attempt.clone(), Instant::now()).is_some()
        };
        let mut mark = Mark {
            table: self,
            attempt,
            answered: false,
            was_there,
        };
        let r = request.await;
        mark.answered = r.is_ok();
        r
    }

    /// Whether `attempt` had a request without an answer (within [`ENDED_KEEP`]): its end
    /// must be recorded on the server.
    pub fn pending(&self, attempt: &AttemptId) -> bool {
        self.lock()
            .get(attempt)
            .is_some_and(|at| at.elapsed() < ENDED_KEEP)
    }

    /// The end of `attempt` is recorded on the server: forget it.
    pub fn recorded(&self, attempt: &AttemptId) {
        self.lock().remove(attempt);
    }

    /// Attempts remembered (for tests).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn remembers_attempts_without_an_answer() {
        let t = Unanswered::default();
        let (a, b) = (AttemptId::new(), AttemptId::new());
        t.track(&a, async { Ok(()) }).await.expect("answered");
        assert!(!t.pending(&a));
        let _ = t
            .track(&a, async {
                Err::<(), _>(distlock_core::Error::Runtime("timed out".into()))
            })
            .await;
        assert!(t.pending(&a));
        // A later answer does not clear an earlier unanswered request.
        t.track(&a, async { Ok(()) }).await.expect("answered");
        assert!(t.pending(&a));
        // Dropped midway: remembered.
        let never = t.track(&b, std::future::pending::<Result<()>>());
        let _ = tokio::time::timeout(Duration::from_millis(10), never).await;
        assert!(t.pending(&b));
        t.recorded(&a);
        t.recorded(&b);
        assert!(t.is_empty());
    }
}
