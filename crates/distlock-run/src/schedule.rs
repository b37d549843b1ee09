//! The stop schedule and the verdict: pure arithmetic on boot-clock instants.

use distlock_core::LostReason;
use std::time::Duration;

/// The stop schedule: SIGTERM to the command at `term`, SIGKILL at `kill` (boot clock, see
/// [`crate::boot_now`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Schedule {
    /// When the command (every process it started) gets SIGTERM.
    pub term: Duration,
    /// When the command (every process it started) gets SIGKILL.
    pub kill: Duration,
}

impl Schedule {
    /// The stop schedule for a confirmed lease ending at `lease_end` (boot clock): dead
    /// `margin` before it, SIGTERM `grace` before that.
    pub fn for_lease(lease_end: Duration, grace: Duration, margin: Duration) -> Schedule {
        let kill = lease_end.saturating_sub(margin);
        Schedule {
            term: kill.saturating_sub(grace),
            kill,
        }
    }

    pub(crate) fn to_line(self) -> String {
        format!("D {} {}\n", crate::ns(self.term), crate::ns(self.kill))
    }

    pub(crate) fn parse(line: &str) -> Option<Schedule> {
        let mut it = line.split(' ');
        if it.next()? != "D" {
            return None;
        }
        let term: u64 = it.next()?.parse().ok()?;
        let kill: u64 = it.next()?.parse().ok()?;
        Some(Schedule {
            term: Duration::from_nanos(term),
            kill: Duration::from_nanos(kill),
        })
    }
}

/// How far before the confirmed lease end the command must be dead: signal delivery, the
/// kernel tearing the processes down, and a loaded machine's scheduling.
pub fn margin(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// The longest grace that still lets renewals fail for a while before the stop must start.
pub fn max_grace(lease: Duration) -> Duration {
    (lease / 2).saturating_sub(margin(lease))
}

/// What is known when the command has ended.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Facts {
    /// The last confirmed lease end.
    pub lease_end: Duration,
    /// When the stop was due under that lease.
    pub term_at: Duration,
    /// When the command ended (the guard's measurement, or when the host saw the guard gone).
    pub cmd_end: Duration,
    /// When the host started stopping the command, if it did.
    pub stopped_at: Option<Duration>,
    /// When the host saw the lock lost, and why.
    pub lost_seen: Option<(Duration, LostReason)>,
    /// The release found the grant gone.
    pub release_not_held: bool,
    /// When the release was sent.
    pub release_sent: Duration,
}

impl Facts {
    /// The facts of a run whose last confirmed lease ended at `lease_end`, whose stop was due
    /// at `term_at` and whose command ended at `cmd_end`; nothing else happened yet (set the
    /// other fields).
    pub fn new(lease_end: Duration, term_at: Duration, cmd_end: Duration) -> Facts {
        Facts {
            lease_end,
            term_at,
            cmd_end,
            stopped_at: None,
            lost_seen: None,
            release_not_held: false,
            release_sent: Duration::ZERO,
        }
    }
}

/// Why the run was not protected to its end, or `None` if it was.
pub fn verdict(f: &Facts) -> Option<String> {
    if let Some(t) = f.stopped_at {
        if t <= f.cmd_end {
            return Some("renewals were not confirmed in time and the command was stopped".into());
        }
    }
    if f.cmd_end >= f.term_at {
        return Some(
            "the command was still running when it had to be stopped for the lease to hold".into(),
        );
    }
    if let Some((t, reason)) = &f.lost_seen {
        // A loss the server reported (deleted, taken over, session ended) happened at some
        // unknown moment before the host heard of it: the command may have run without the lock.
        if *t <= f.cmd_end || *reason != LostReason::LeaseExpired {
            return Some(format!("{reason}"));
        }
    }
    if f.release_not_held && f.release_sent < f.lease_end {
        return Some(
            "the server no longer had the lock when it was released, within the lease".into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            lease_end: Duration::from_secs(10),
            term_at: Duration::from_secs(8),
            cmd_end: Duration::from_secs(5),
            stopped_at: None,
            lost_seen: None,
            release_not_held: false,
            release_sent: Duration::from_secs(6),
        }
    }

    #[test]
    fn schedule_ends_a_margin_before_the_lease() {
        let s = Schedule::for_lease(
            Duration::from_secs(10),
            Duration::from_secs(2),
            Duration::from_millis(500),
        );
        assert_eq!(s.kill, Duration::from_millis(9500));
        assert_eq!(s.term, Duration::from_millis(7500));
        assert!(
            max_grace(Duration::from_millis(600)) + margin(Duration::from_millis(600))
                <= Duration::from_millis(300)
        );
    }

    #[test]
    fn schedule_lines_round_trip() {
        let s = Schedule::for_lease(
            Duration::from_nanos(10_000_000_123),
            Duration::from_secs(1),
            Duration::from_millis(100),
        );
        assert_eq!(Schedule::parse(s.to_line().trim_end()), Some(s));
        assert_eq!(Schedule::parse("D 1"), None);
        assert_eq!(Schedule::parse("X 1 2"), None);
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict(&facts()), None);
        let f = Facts {
            cmd_end: Duration::from_secs(9),
            ..facts()
        };
        assert!(verdict(&f).is_some(), "ran past the stop time");
        let f = Facts {
            stopped_at: Some(Duration::from_secs(4)),
            ..facts()
        };
        assert!(verdict(&f).is_some(), "stopped by the host");
        let f = Facts {
            lost_seen: Some((Duration::from_secs(7), LostReason::NotHeld)),
            ..facts()
        };
        assert!(verdict(&f).is_some(), "server-side loss of unknown time");
        let f = Facts {
            lost_seen: Some((Duration::from_secs(11), LostReason::LeaseExpired)),
            ..facts()
        };
        assert_eq!(
            verdict(&f),
            None,
            "the lease ran out after the command ended"
        );
        let f = Facts {
            release_not_held: true,
            ..facts()
        };
        assert!(verdict(&f).is_some(), "gone within the lease");
        let f = Facts {
            release_not_held: true,
            release_sent: Duration::from_secs(12),
            ..facts()
        };
        assert_eq!(verdict(&f), None, "released after the lease ran out");
    }
}
