//! The plain mutex's contended mode (docs/redis-lock.md, "Contended mode", also why the tails
//! stay bounded), and the replies of the lean mutex scripts.
//!
//! A release with waiters hands the lock to the oldest live waiter (strict FIFO: the fair
//! lock's and an election's only way) or, for a plain mutex whose oldest waiter has waited less
//! than the *handoff threshold*, frees it and wakes that waiter alone: whoever asks first gets
//! it, but a waiter queued behind a live one keeps its place (scripts/acquire_wait.lua). The
//! threshold is `?handoff_after=DUR` (`0`: hand over always), else [`HOLD_MULTIPLE`] × this
//! client's recent mean hold within [`MIN_HANDOFF_AFTER`] ..= [`MAX_HANDOFF_AFTER`]
//! ([`DEFAULT_HANDOFF_AFTER`] before the first release).

use crate::error::shape;
use distlock_core::conn::ConnectionString;
use distlock_core::{AttemptId, LockKind, Result};
use redis::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The handoff threshold before this client has released a plain mutex (nothing observed).
pub const DEFAULT_HANDOFF_AFTER: Duration = Duration::from_millis(5);

/// The adaptive threshold is this many recent mean holds: a queue younger than that many
/// critical sections lets a running client take a free lock.
pub const HOLD_MULTIPLE: u32 = 64;

/// The adaptive threshold's floor (Go's `sync.Mutex` starvation threshold).
pub const MIN_HANDOFF_AFTER: Duration = Duration::from_millis(1);

/// The adaptive threshold's ceiling: whatever the holds, a waiter that has waited this long is
/// served FIFO (the `T` of the tail bound in docs/redis-lock.md, "Contended mode").
pub const MAX_HANDOFF_AFTER: Duration = Duration::from_millis(20);

/// How many unreleased grants [`RecentHolds`] remembers; beyond that the oldest is forgotten
/// (its hold is then not sampled).
const TRACKED: usize = 64;

/// The plain mutex's handoff threshold, one per backend (its clones share the samples).
#[derive(Clone, Debug)]
pub(crate) enum HandoffAfter {
    /// `?handoff_after=DUR`.
    Fixed(Duration),
    /// [`HOLD_MULTIPLE`] × the recent mean hold, bounded (the default).
    Adaptive(Arc<RecentHolds>),
}

impl Default for HandoffAfter {
    fn default() -> Self {
        HandoffAfter::Adaptive(Arc::default())
    }
}

/// The recent hold times of one client's plain mutexes: from a grant's reply to its release.
#[derive(Debug, Default)]
pub(crate) struct RecentHolds {
    /// Exponentially weighted mean (weight 1/8 per sample), in µs; 0 before the first.
    mean_us: AtomicU64,
    /// Grants not released yet, with the moment their reply came.
    open: Mutex<Vec<(AttemptId, Instant)>>,
}

impl RecentHolds {
    fn granted(&self, attempt: &AttemptId) {
        let mut open = crate::lock(&self.open);
        if open.iter().any(|(a, _)| a == attempt) {
            // A retry of a granted attempt: the hold began with the first grant.
            return;
        }
        if open.len() >= TRACKED {
            open.remove(0);
        }
        open.push((attempt.clone(), Instant::now()));
    }

    fn released(&self, attempt: &AttemptId) {
        let since = {
            let mut open = crate::lock(&self.open);
            let Some(i) = open.iter().position(|(a, _)| a == attempt) else {
                return;
            };
            open.swap_remove(i).1
        };
        let sample = since.elapsed().as_micros().min(u128::from(u32::MAX)) as u64;
        // A lost update between two concurrent releases costs one sample: it is an estimate.
        let mean = self.mean_us.load(Ordering::Relaxed);
        let next = if mean == 0 {
            sample.max(1)
        } else {
            (mean * 7 + sample) / 8
        };
        self.mean_us.store(next.max(1), Ordering::Relaxed);
    }

    /// [`HOLD_MULTIPLE`] × the mean hold, within the bounds.
    fn threshold(&self) -> Duration {
        match self.mean_us.load(Ordering::Relaxed) {
            0 => DEFAULT_HANDOFF_AFTER,
            mean => (Duration::from_micros(mean) * HOLD_MULTIPLE)
                .clamp(MIN_HANDOFF_AFTER, MAX_HANDOFF_AFTER),
        }
    }
}

impl HandoffAfter {
    /// A plain mutex's grant to `attempt` (its reply just came): its hold starts.
    pub(crate) fn granted(&self, kind: LockKind, attempt: &AttemptId) {
        if let (HandoffAfter::Adaptive(h), LockKind::Mutex) = (self, kind) {
            h.granted(attempt);
        }
    }

    /// `attempt`'s grant is being released: its hold is a sample.
    pub(crate) fn released(&self, kind: LockKind, attempt: &AttemptId) {
        if let (HandoffAfter::Adaptive(h), LockKind::Mutex) = (self, kind) {
            h.released(attempt);
        }
    }

    /// The threshold a release passes now.
    pub(crate) fn now(&self) -> Duration {
        match self {
            HandoffAfter::Fixed(d) => *d,
            HandoffAfter::Adaptive(h) => h.threshold(),
        }
    }

    /// The release script's ARGV[3] for a lock: the wait in ms after which a release hands
    /// over, `""` for strict FIFO (a fair lock, an election, or `handoff_after=0`).
    pub(crate) fn barge_arg(&self, fair: bool, election: bool) -> String {
        let after = self.now();
        if fair || election || after.is_zero() {
            String::new()
        } else {
            after.as_millis().max(1).to_string()
        }
    }
}

/// `?handoff_after=DUR` fixed; adaptive when absent.
pub(crate) fn handoff_after(cs: &ConnectionString) -> Result<HandoffAfter> {
    Ok(match cs.duration("handoff_after")? {
        Some(d) => HandoffAfter::Fixed(d),
        None => HandoffAfter::default(),
    })
}

/// The mutex acquire script's reply, as the other families' `{granted, token or PTTL}`: a
/// token (> 0) granted; `-2 - PTTL` held (0 and -1: no PTTL to tell).
pub(crate) fn acquire_reply(v: &Value) -> Result<(i64, i64)> {
    match crate::int(v) {
        Some(token) if token > 0 => Ok((1, token)),
        Some(held) => Ok((0, -2 - held)),
        None => Err(shape("acquire", v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_decode_as_the_other_families() {
        assert_eq!(acquire_reply(&Value::Int(17)).ok(), Some((1, 17)));
        // Held with 1500 ms left; held with no PTTL to tell (-1: no expiry, -2: no key).
        assert_eq!(acquire_reply(&Value::Int(-1502)).ok(), Some((0, 1500)));
        assert_eq!(acquire_reply(&Value::Int(-1)).ok(), Some((0, -1)));
        assert_eq!(acquire_reply(&Value::Int(0)).ok(), Some((0, -2)));
        assert!(acquire_reply(&Value::Nil).is_err());
        let released = |n| crate::release_outcome("release", n).ok();
        assert_eq!(
            released(3),
            Some(distlock_core::ReleaseOutcome::TakenByOther)
        );
        assert_eq!(released(2), None);
    }

    #[test]
    fn only_the_plain_mutex_barges() {
        let ms = HandoffAfter::Fixed(Duration::from_millis(5));
        assert_eq!(ms.barge_arg(false, false), "5");
        assert_eq!(ms.barge_arg(true, false), "");
        assert_eq!(ms.barge_arg(false, true), "");
        assert_eq!(
            HandoffAfter::Fixed(Duration::ZERO).barge_arg(false, false),
            ""
        );
    }

    #[test]
    fn the_adaptive_threshold_follows_the_holds_within_bounds() {
        let h = HandoffAfter::default();
        assert_eq!(h.now(), DEFAULT_HANDOFF_AFTER, "nothing observed yet");
        let holds = |h: &HandoffAfter, kind, held: Duration, n: usize| {
            for _ in 0..n {
                let a = AttemptId::new();
                h.granted(kind, &a);
                std::thread::sleep(held);
                h.released(kind, &a);
            }
        };
        // Fair locks and elections are not sampled.
        holds(&h, LockKind::Fair, Duration::from_millis(2), 3);
        assert_eq!(h.now(), DEFAULT_HANDOFF_AFTER);
        // Long holds: the ceiling.
        holds(&h, LockKind::Mutex, Duration::from_millis(2), 3);
        assert_eq!(h.now(), MAX_HANDOFF_AFTER);
        // Very short holds pull it down to the floor after enough samples.
        let quick = HandoffAfter::default();
        holds(&quick, LockKind::Mutex, Duration::ZERO, 40);
        assert!(quick.now() < MAX_HANDOFF_AFTER, "{:?}", quick.now());
        assert!(quick.now() >= MIN_HANDOFF_AFTER);
        // A release of a grant never seen is no sample; a fixed threshold never moves.
        quick.released(LockKind::Mutex, &AttemptId::new());
        let fixed = HandoffAfter::Fixed(Duration::from_millis(7));
        holds(&fixed, LockKind::Mutex, Duration::from_millis(1), 2);
        assert_eq!(fixed.now(), Duration::from_millis(7));
        assert_eq!(fixed.barge_arg(false, false), "7");
        assert_eq!(fixed.barge_arg(true, false), "");
    }

    #[test]
    fn open_grants_are_bounded() {
        let h = RecentHolds::default();
        let first = AttemptId::new();
        h.granted(&first);
        for _ in 0..TRACKED {
            h.granted(&AttemptId::new());
        }
        assert_eq!(crate::lock(&h.open).len(), TRACKED);
        // The oldest was forgotten: its release is no sample.
        h.released(&first);
        assert_eq!(h.mean_us.load(Ordering::Relaxed), 0);
    }
}
