//! Ended attempts stay ended (docs/redis-lock.md, "Safety argument", 9): after a reply timed
//! out, a request may still reach the server after its attempt ended, and would grant or queue
//! an attempt nobody waits for. So every acquire-side script refuses an attempt whose **end
//! record** `NS:{NAME}:ended:ATTEMPT` (in the lock's slot) exists; the attempt's give-up or
//! release sets it first, in the same round trip, only for an attempt with a request still
//! without an answer ([`Unanswered`]: the uncontended case costs nothing). The record lives
//! [`record_lifetime`]: no request is assumed to arrive later than that after it was sent.

pub(crate) use distlock_core::ended::Unanswered;
use std::time::Duration;

/// How long an end record lives at least: longer than any plausible late delivery of a
/// request (minutes of TCP retransmission of a connection the client gave up, or a server
/// stalled that long with the request in its socket buffer).
pub(crate) const ENDED_FOR: Duration = Duration::from_secs(300);

/// The lifetime of an end record with operation timeout `op_timeout`: [`ENDED_FOR`], or 20
/// operation timeouts if that is longer.
pub(crate) fn record_lifetime(op_timeout: Duration) -> Duration {
    ENDED_FOR.max(op_timeout.saturating_mul(20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_outlives_twenty_operation_timeouts_and_five_minutes() {
        assert_eq!(record_lifetime(Duration::from_secs(3)), ENDED_FOR);
        assert_eq!(
            record_lifetime(Duration::from_secs(60)),
            Duration::from_secs(1200)
        );
    }
}
