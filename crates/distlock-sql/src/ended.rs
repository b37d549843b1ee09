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
//! Only an attempt that had an unanswered request needs the record; the core's
//! [`Unanswered`] keeps those attempts (for [`ENDED_KEEP`]), so that the common path (every
//! request answered) writes nothing more. A record on the server lives as long.

pub use distlock_core::ended::Unanswered;
use std::time::Duration;

/// How long the server keeps the record that an attempt ended (and how long this client
/// remembers an attempt's unanswered request): the core's [`KEEP`](distlock_core::ended::KEEP),
/// one hour.
pub const ENDED_KEEP: Duration = distlock_core::ended::KEEP;

/// At most this many records of ended attempts per lock are kept on the server (the oldest
/// dropped first), so that a lock's row (PostgreSQL) stays small however many attempts end
/// with unanswered requests within [`ENDED_KEEP`].
pub const ENDED_MAX_PER_LOCK: usize = 1000;
