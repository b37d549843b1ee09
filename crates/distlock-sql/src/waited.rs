//! What a server-side wait's end means for its attempt, decided once for every dialect.
//!
//! A dialect runs the blocking statement (`pg_advisory_lock`, `GET_LOCK(name, seconds)`) and
//! reads how it ended into a [`WaitEnd`]; [`after`] says what to do with the connection and
//! what to answer. The dialect only carries that out with its statements.

use distlock_core::{Error, Result};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How one server-side wait ended, as the dialect read its reply.
#[derive(Debug)]
pub enum WaitEnd {
    /// The server granted the lock to the waiting connection.
    Granted,
    /// The server's own timer (the deadline) ran out.
    TimedOut {
        /// The connection may hold the lock all the same (PostgreSQL keeps a grant that lands
        /// as its `lock_timeout` fires): give it back before the connection is reused.
        may_hold: bool,
    },
    /// The client stopped the wait (its caller cancelled, or the safety net after the
    /// deadline passed). `Some(held)`: whether the connection holds the lock is known;
    /// `None`: unknown, or the connection must not be reused (a stop signal may still be on
    /// its way to it).
    Stopped(Option<bool>),
    /// The wait failed: the error to answer (retryable ones make the engine wait again).
    Failed(Error),
}

/// What becomes of the waiting connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Record the grant on the connection and answer it.
    Register,
    /// Give the connection back to the pool.
    Reuse {
        /// Release the lock on it first (closing it instead if that fails, which frees the
        /// lock all the same).
        unlock: bool,
    },
    /// Close the connection (whatever it holds goes with it).
    Close,
}

/// The step for `end`, and what the wait answers when the step is not [`Step::Register`]:
/// `Ok(())` (not granted; the engine waits again while the deadline allows) or the error.
pub fn after(end: WaitEnd) -> (Step, Result<()>) {
    match end {
        WaitEnd::Granted => (Step::Register, Ok(())),
        WaitEnd::TimedOut { may_hold } => (Step::Reuse { unlock: may_hold }, Ok(())),
        WaitEnd::Stopped(Some(held)) => (Step::Reuse { unlock: held }, Ok(())),
        WaitEnd::Stopped(None) => (Step::Close, Ok(())),
        WaitEnd::Failed(e) => (Step::Close, Err(e)),
    }
}

/// The time a wait may take (`Some(None)`: no deadline), or `None` when it must not start:
/// the deadline has passed or the caller cancelled.
pub fn budget(deadline: Option<Instant>, cancel: &CancellationToken) -> Option<Option<Duration>> {
    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    (!left.is_some_and(|r| r.is_zero()) && !cancel.is_cancelled()).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        let reuse = |unlock| Step::Reuse { unlock };
        let failed = || WaitEnd::Failed(Error::Runtime("x".into()));
        for (end, step, ok) in [
            (WaitEnd::Granted, Step::Register, true),
            (WaitEnd::TimedOut { may_hold: true }, reuse(true), true),
            (WaitEnd::TimedOut { may_hold: false }, reuse(false), true),
            // Granted as the caller went away: given straight back.
            (WaitEnd::Stopped(Some(true)), reuse(true), true),
            (WaitEnd::Stopped(Some(false)), reuse(false), true),
            (WaitEnd::Stopped(None), Step::Close, true),
            (failed(), Step::Close, false),
        ] {
            let what = format!("{end:?}");
            let (s, r) = after(end);
            assert_eq!((s, r.is_ok()), (step, ok), "{what}");
        }
        assert!(matches!(after(failed()).1, Err(Error::Runtime(_))));
    }

    #[test]
    fn budgets() {
        let go = CancellationToken::new();
        assert_eq!(budget(None, &go), Some(None));
        let later = Instant::now() + Duration::from_secs(60);
        assert!(matches!(budget(Some(later), &go), Some(Some(d)) if d > Duration::from_secs(50)));
        assert_eq!(budget(Some(Instant::now()), &go), None);
        let stop = CancellationToken::new();
        stop.cancel();
        assert_eq!(budget(Some(later), &stop), None);
        assert_eq!(budget(None, &stop), None);
    }
}
