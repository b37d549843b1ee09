//! The plain mutex's contended mode, and the replies of the lean mutex scripts.
//!
//! A release with waiters either hands the lock to the oldest live waiter (strict FIFO, the
//! fair lock's and an election's only way) or — for a plain mutex whose oldest waiter has
//! waited less than [`DEFAULT_HANDOFF_AFTER`] (`?handoff_after=DUR`) — frees it and wakes
//! that waiter alone (`w ATTEMPT` on its wake channel): whoever asks first gets it, the
//! releaser included, as Go's `sync.Mutex` lets a running goroutine take a free lock. Once
//! the oldest waiter has waited that long, releases hand over again, oldest first, until the
//! oldest has not (scripts/release.lua; docs/redis-lock.md, "Contended mode", argues why the
//! tails stay bounded). `handoff_after=0` hands over always.

use crate::error::{shape, KIND};
use distlock_core::conn::ConnectionString;
use distlock_core::{Error, Result};
use redis::Value;
use std::time::Duration;

/// How long the oldest waiter of a plain mutex may wait before releases hand the lock over
/// (FIFO) instead of freeing it for whoever asks first.
pub const DEFAULT_HANDOFF_AFTER: Duration = Duration::from_millis(5);

/// `?handoff_after=DUR` ([`DEFAULT_HANDOFF_AFTER`] when absent).
pub(crate) fn handoff_after(cs: &ConnectionString) -> Result<Duration> {
    Ok(cs
        .duration("handoff_after")?
        .unwrap_or(DEFAULT_HANDOFF_AFTER))
}

/// The release script's ARGV[3] for a lock: the wait in ms after which a release hands over,
/// `""` for strict FIFO (a fair lock, an election, or `handoff_after=0`).
pub(crate) fn barge_arg(fair: bool, election: bool, after: Duration) -> String {
    if fair || election || after.is_zero() {
        String::new()
    } else {
        after.as_millis().max(1).to_string()
    }
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

/// The mutex release script's reply (1 released, 0 no lock, 3 another grant), as the other
/// families' `{outcome, 0}`.
pub(crate) fn release_reply(mode: &str, v: &Value) -> Result<(i64, i64)> {
    match crate::int(v) {
        Some(n) if matches!(n, 0 | 1 | 3) => Ok((n, 0)),
        Some(n) => Err(Error::unexpected(
            KIND,
            format!("{mode}: unexpected reply {n}"),
        )),
        None => Err(shape(mode, v)),
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
        assert_eq!(release_reply("release", &Value::Int(3)).ok(), Some((3, 0)));
        assert!(release_reply("release", &Value::Int(2)).is_err());
    }

    #[test]
    fn only_the_plain_mutex_barges() {
        let ms = Duration::from_millis(5);
        assert_eq!(barge_arg(false, false, ms), "5");
        assert_eq!(barge_arg(true, false, ms), "");
        assert_eq!(barge_arg(false, true, ms), "");
        assert_eq!(barge_arg(false, false, Duration::ZERO), "");
    }
}
