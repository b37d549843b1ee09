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
