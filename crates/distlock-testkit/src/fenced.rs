//! Invariant checkers for contended tests: a fenced register and an overlap recorder.
//!
//! A case cannot tell from outcomes alone that a lock was broken: two holders may both have
//! finished "successfully". These two record what happened inside the critical sections and
//! check it afterwards (Jepsen's method): the [`FencedRegister`] is the resource a lock
//! protects, as a storage service that checks fencing tokens would be; the
//! [`OverlapRecorder`] finds two holders inside at once while both believed they held the lock.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// One write offered to a [`FencedRegister`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    /// The writer's fencing token.
    pub token: u64,
    /// Who wrote (a label the test chose, e.g. `client1/task3`).
    pub holder: String,
    /// Whether the writer believed it held the lock (its guard was not lost) when it wrote.
    pub believed_held: bool,
    /// Whether the register took the write.
    pub accepted: bool,
    /// When, from the register's creation.
    pub at: Duration,
}

#[derive(Debug, Default)]
struct Register {
    highest: u64,
    /// The holder that wrote with `highest`: a second holder with the same token means two
    /// grants shared a token, which the register must refuse too.
    highest_holder: Option<String>,
    writes: Vec<FencedWrite>,
}

/// A store that rejects any write whose fencing token is below the highest it has seen (or
/// equal to it but from another holder), and records every write, accepted or not.
///
/// ```
/// use distlock_testkit::FencedRegister;
///
/// let reg = FencedRegister::new();
/// assert!(reg.write(5, "a", true));
/// assert!(reg.write(5, "a", true)); // the same holder again
/// assert!(!reg.write(4, "b", false)); // stale: rejected
/// assert!(reg.write(6, "b", true));
/// reg.assert_no_rejected_belief(); // b's rejected write knew it was not the holder
/// ```
#[derive(Debug)]
pub struct FencedRegister {
    start: Instant,
    inner: Mutex<Register>,
}

impl Default for FencedRegister {
    fn default() -> Self {
        Self::new()
    }
}

impl FencedRegister {
    /// An empty register.
    pub fn new() -> Self {
        FencedRegister {
            start: Instant::now(),
            inner: Mutex::new(Register::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, Register> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offers a write by `holder` with `token`; returns whether it was accepted.
    /// `believed_held` is the writer's view (`!guard.is_lost()` right before the write).
    pub fn write(&self, token: u64, holder: &str, believed_held: bool) -> bool {
        let mut st = self.state();
        let accepted = token > st.highest
            || (token == st.highest && st.highest_holder.as_deref().is_none_or(|h| h == holder));
        if accepted {
            st.highest = token;
            st.highest_holder = Some(holder.to_owned());
        }
        let at = self.start.elapsed();
        st.writes.push(FencedWrite {
            token,
            holder: holder.to_owned(),
            believed_held,
            accepted,
            at,
        });
        accepted
    }

    /// The highest token accepted so far (0 if none).
    pub fn highest(&self) -> u64 {
        self.state().highest
    }

    /// Every write so far, in order.
    pub fn writes(&self) -> Vec<FencedWrite> {
        self.state().writes.clone()
    }

    /// Accepted writes so far.
    pub fn accepted(&self) -> usize {
        self.state().writes.iter().filter(|w| w.accepted).count()
    }

    /// Rejected writes so far.
    pub fn rejected(&self) -> Vec<FencedWrite> {
        self.state()
            .writes
            .iter()
            .filter(|w| !w.accepted)
            .cloned()
            .collect()
    }

    /// Fails if any write was rejected although its writer believed it held the lock: the
    /// lock let a newer holder in while an older one still thought it was the holder.
    ///
    /// # Panics
    /// Panics listing the offending writes and the writes just before each.
    pub fn assert_no_rejected_belief(&self) {
        let st = self.state();
        let bad: Vec<String> = st
            .writes
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.accepted && w.believed_held)
            .map(|(i, w)| {
                let before: Vec<&FencedWrite> = st.writes[i.saturating_sub(3)..i].iter().collect();
                format!("{w:?}\n    after {before:?}")
            })
            .collect();
        assert!(
            bad.is_empty(),
            "fenced register: {} write(s) rejected from holders that believed they held the lock:\n  {}",
            bad.len(),
            bad.join("\n  ")
        );
    }
}

/// One critical section, as recorded by an [`OverlapRecorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// Lock name.
    pub name: String,
    /// Who was inside (a label the test chose; re-entrant guards of one hold share it).
    pub holder: String,
    /// The guard's fencing token.
    pub token: u64,
    /// Entry time, from the recorder's creation.
    pub enter: Duration,
    /// Exit time; `None` if the section never ended (its task failed).
    pub exit: Option<Duration>,
    /// The guard's `is_lost()` at entry.
    pub lost_at_enter: bool,
    /// The guard's `is_lost()` at exit (`None` while inside).
    pub lost_at_exit: Option<bool>,
}

impl Interval {
    /// The holder believed it held the lock for the whole section (loss is monotonic, so
    /// "not lost at exit" covers the inside). A section that never ended counts as believed.
    pub fn believed(&self) -> bool {
        !self.lost_at_enter && self.lost_at_exit != Some(true)
    }

    fn overlaps(&self, other: &Interval) -> bool {
        let end = |i: &Interval| i.exit.unwrap_or(Duration::MAX);
        self.enter < end(other) && other.enter < end(self)
    }
}

/// A critical section in progress: hand it back to [`OverlapRecorder::exit`].
#[derive(Debug)]
#[must_use = "a visit is ended with OverlapRecorder::exit"]
pub struct Visit(usize);

/// Records entry and exit of critical sections per (lock name, holder), with timestamps and
/// the guard's `is_lost()` at both ends; [`assert_no_overlap`](Self::assert_no_overlap) fails
/// if two different holders were inside one lock at once while both believed they held it.
///
/// ```
/// use distlock_testkit::OverlapRecorder;
///
/// let rec = OverlapRecorder::new();
/// let a = rec.enter("lock", "a", 1, false);
/// rec.exit(a, false);
/// let b = rec.enter("lock", "b", 2, false);
/// rec.exit(b, false);
/// rec.assert_no_overlap();
/// ```
#[derive(Debug)]
pub struct OverlapRecorder {
    start: Instant,
    inner: Mutex<Vec<Interval>>,
}

impl Default for OverlapRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl OverlapRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        OverlapRecorder {
            start: Instant::now(),
            inner: Mutex::new(Vec::new()),
        }
    }

    fn intervals_mut(&self) -> MutexGuard<'_, Vec<Interval>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `holder` enters the critical section of `name` with a guard of fencing token `token`
    /// whose `is_lost()` is `lost` now.
    pub fn enter(&self, name: &str, holder: &str, token: u64, lost: bool) -> Visit {
        let enter = self.start.elapsed();
        let mut v = self.intervals_mut();
        v.push(Interval {
            name: name.to_owned(),
            holder: holder.to_owned(),
            token,
            enter,
            exit: None,
            lost_at_enter: lost,
            lost_at_exit: None,
        });
        Visit(v.len() - 1)
    }

    /// The section `visit` ends; the guard's `is_lost()` is `lost` now.
    pub fn exit(&self, visit: Visit, lost: bool) {
        let exit = self.start.elapsed();
        if let Some(i) = self.intervals_mut().get_mut(visit.0) {
            i.exit = Some(exit);
            i.lost_at_exit = Some(lost);
        }
    }

    /// Every section so far, in entry order.
    pub fn intervals(&self) -> Vec<Interval> {
        self.intervals_mut().clone()
    }

    /// Pairs of sections of one lock, by different holders, that overlapped in time while
    /// both holders believed they held the lock.
    pub fn overlaps(&self) -> Vec<(Interval, Interval)> {
        let v = self.intervals_mut();
        let mut out = Vec::new();
        for (i, a) in v.iter().enumerate() {
            for b in &v[i + 1..] {
                if a.name == b.name
                    && a.holder != b.holder
                    && a.believed()
                    && b.believed()
                    && a.overlaps(b)
                {
                    out.push((a.clone(), b.clone()));
                }
            }
        }
        out
    }

    /// # Panics
    /// Panics, printing the interval pairs, if two holders were inside one lock at once while
    /// both believed they held it.
    pub fn assert_no_overlap(&self) {
        let pairs = self.overlaps();
        if pairs.is_empty() {
            return;
        }
        let shown: Vec<String> = pairs
            .iter()
            .take(5)
            .map(|(a, b)| format!("{a:?}\n    overlaps {b:?}"))
            .collect();
        panic!(
            "mutual exclusion broken: {} overlapping pair(s) of believed holders, e.g.:\n  {}",
            pairs.len(),
            shown.join("\n  ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_rejects_stale_and_shared_tokens() {
        let r = FencedRegister::new();
        assert!(r.write(3, "a", true));
        assert!(
            !r.write(3, "b", true),
            "a second holder with the same token"
        );
        assert!(!r.write(2, "c", false));
        assert_eq!(r.highest(), 3);
        assert_eq!(r.accepted(), 1);
        assert_eq!(r.rejected().len(), 2);
        let caught = std::panic::catch_unwind(|| r.assert_no_rejected_belief());
        assert!(caught.is_err(), "b believed and was rejected");
    }

    #[test]
    fn overlap_only_between_believing_holders() {
        let rec = OverlapRecorder::new();
        let a = rec.enter("n", "a", 1, false);
        // Same holder (re-entry) and a holder that knew it had lost: no violation.
        let a2 = rec.enter("n", "a", 1, false);
        let lost = rec.enter("n", "x", 0, true);
        // Another lock entirely.
        let other = rec.enter("m", "b", 1, false);
        rec.exit(a2, false);
        rec.exit(lost, true);
        rec.exit(other, false);
        rec.exit(a, false);
        rec.assert_no_overlap();
        let a = rec.enter("n", "a", 2, false);
        let b = rec.enter("n", "b", 3, false);
        rec.exit(b, false);
        rec.exit(a, false);
        assert_eq!(rec.overlaps().len(), 1);
        assert!(std::panic::catch_unwind(|| rec.assert_no_overlap()).is_err());
    }
}
