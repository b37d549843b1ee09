//! Ended attempts whose requests may still be on their way.
//!
//! Lease mode (PostgreSQL) and table mode (MySQL) go on with another connection after a
//! request got no answer; the unanswered copy may reach the server after its attempt ended and
//! would grant the lock to nobody for a whole lease. So the end of such an attempt is recorded
//! on the server by its give-up or release, and every grant checks that record in its own
//! statement or transaction (docs/postgres.md, *Lease mode in detail*). Only attempts the
//! core's [`Unanswered`] keeps (an unanswered request) need the record; others write nothing.

pub use distlock_core::ended::Unanswered;
use std::time::Duration;

/// How long the server keeps an ended attempt's record (and this client an attempt's
/// unanswered request): the core's [`KEEP`](distlock_core::ended::KEEP), one hour.
pub const ENDED_KEEP: Duration = distlock_core::ended::KEEP;

/// At most this many records of ended attempts per lock are kept on the server (the oldest
/// dropped first), so that a lock's row (PostgreSQL) stays small however many attempts end
/// with unanswered requests within [`ENDED_KEEP`].
pub const ENDED_MAX_PER_LOCK: usize = 1000;
