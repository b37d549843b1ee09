//! Fenced writes: the store a lock protects rejects the writes of a holder whose lease ended.
//!
//! A lock cannot stop its holder from stalling — a GC pause, a stopped or swapped-out process,
//! a slow disk — past its lease, and then writing as if it still held the lock, after the next
//! holder wrote. Every dlock grant carries a fencing token that rises with every grant of the
//! lock's name (`LockGuard::fencing_token`); this crate makes the **store** check it, in the
//! same atomic step as the write:
//!
//! | store | feature | the check and the write in one step |
//! |---|---|---|
//! | files | `file` | [`file::FencedFile`]: the token in the file's first line, checked under `flock(2)`, the file replaced by `rename(2)` |
//! | Redis | `redis` | [`redis::RedisFence`]: one Lua script per command (SET, HSET, INCRBY, DECRBY, DEL, GET, your own Lua) over your connection |
//! | PostgreSQL | `postgres` | [`postgres::PgFence`]: a fence row per resource, checked and raised by one upsert in your transaction (tokio-postgres) |
//! | MySQL, MariaDB | `mysql` | [`mysql::MySqlFence`]: a fence row per resource, locked, checked and raised in your transaction (mysql_async) |
//! | etcd | `etcd` | [`etcd::EtcdHolder::txn`]: a transaction guarded on the holder's lock key (exists with the grant's create revision) |
//! | ZooKeeper | `zookeeper` | [`zookeeper::ZkHolder::multi`]: a multi-op whose first operation checks the holder's lock node |
//! | your own | — | implement [`FenceRecord`] for what your store keeps and call [`FenceRecord::admit`] inside its transaction |
//!
//! # The rule
//! Written once, in [`decide`]; every store here applies it the same way (the Lua scripts and
//! SQL statements mirror it and are tested against the same [`CASES`]). A store keeps, per
//! resource, the [`Stamp`] of the last write it accepted: a token and the write's sequence
//! number within its grant. A write stamped `(t, s)` against a recorded `(T, S)`:
//!
//! - `t < T`: **rejected** with [`Error::Stale`] `{ token: t, newer: T }`. A lower token is an
//!   older grant: its holder's lease ended and the lock was granted again, and the newer holder
//!   already wrote. Whatever the old holder computed is based on what it read before.
//! - `t > T`: **applied**, and `(t, s)` recorded: a newer grant. Its holder is the only one
//!   the lock service still vouches for.
//! - `t == T`: the **same grant** — two grants of a name never share a token. It is applied:
//!   the holder writing again, another re-entrant guard of its hold, or the retry of a write
//!   whose reply was lost. Rejecting it would make the current holder unable to write twice.
//!   But a retry must have the effect of one write: for a write that is not idempotent (an
//!   increment, an append) give every write of the grant its own sequence number
//!   ([`Stamp::seq`], 1, 2, 3…) and send the retry with the same stamp: a write with
//!   `0 < s <= S` was applied already and is answered [`Outcome::Duplicate`] without being
//!   applied again. A write without a sequence number (`s == 0`) is applied every time: use
//!   it for writes whose repetition has the effect of one (SET of a value, DEL).
//!
//! Tokens of different lock names are unrelated: fence one resource with one lock name.
//!
//! # Fence the read too
//! A holder that reads, computes and writes (the stock decrement of a flash sale) must raise
//! the fence **before it reads**, not only when it writes: otherwise the old holder can write
//! between the new holder's read and write — accepted, since the new token was not seen yet —
//! and the new holder then overwrites it from a stale read (a lost update). A fenced read
//! ([`file::FencedFile::read`], [`redis::RedisFence::get`]) records the token as a write does,
//! so from then on the old holder's writes are rejected; or do the read and the write in one
//! fenced step ([`file::FencedFile::update`], your own Lua).
//!
//! ```
//! use distlock_fence::{decide, Decision, Error, Stamp};
//!
//! let recorded = Some(Stamp::new(7).seq(2));
//! assert_eq!(decide(Stamp::new(9), recorded), Ok(Decision::Apply));       // a newer grant
//! assert_eq!(decide(Stamp::new(7).seq(3), recorded), Ok(Decision::Apply)); // the holder's next write
//! assert_eq!(decide(Stamp::new(7).seq(2), recorded), Ok(Decision::Duplicate)); // its retry
//! assert_eq!(decide(Stamp::new(5), recorded), Err(Error::Stale { token: 5, newer: 7 }));
//! ```

#![warn(missing_docs)]

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "file")]
pub mod file;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

use std::fmt;

/// A write's claim: the fencing token of the grant it is made under, and its sequence number
/// within that grant (0: none, see [the rule](crate#the-rule)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp {
    /// The grant's fencing token (`LockGuard::fencing_token`).
    pub token: u64,
    /// The write's sequence number within the grant; 0 for a write without one.
    pub seq: u64,
}

impl Stamp {
    /// A write under the grant of `token`, without a sequence number: applied every time it
    /// is sent while the token is not stale (for writes whose repetition has the effect of
    /// one).
    pub const fn new(token: u64) -> Stamp {
        Stamp { token, seq: 0 }
    }

    /// The same token with sequence number `seq`: the write is applied at most once, and not
    /// after a later write of the same grant (a higher `seq`).
    #[must_use]
    pub const fn seq(self, seq: u64) -> Stamp {
        Stamp { seq, ..self }
    }

    /// Parses `"<token> <seq>"`, the form stores keep it in ([`Display`](fmt::Display)).
    pub fn parse(s: &str) -> Option<Stamp> {
        let mut it = s.split_ascii_whitespace();
        let token = it.next()?.parse().ok()?;
        let seq = it.next()?.parse().ok()?;
        it.next().is_none().then_some(Stamp { token, seq })
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.token, self.seq)
    }
}

/// What to do with a write that passed the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply it and record its stamp ([`recorded_after`]).
    Apply,
    /// The same grant sent this write (this sequence number) or a later one already: answer
    /// [`Outcome::Duplicate`] and change nothing.
    Duplicate,
}

/// The rule, written once: what a store that recorded `recorded` does with a write stamped
/// `stamp` (see [the rule](crate#the-rule)).
///
/// # Errors
/// [`Error::Stale`] when `stamp.token` is below the recorded token.
pub fn decide(stamp: Stamp, recorded: Option<Stamp>) -> Result<Decision> {
    let Some(rec) = recorded else {
        return Ok(Decision::Apply);
    };
    if stamp.token < rec.token {
        return Err(Error::Stale {
            token: stamp.token,
            newer: rec.token,
        });
    }
    if stamp.token == rec.token && stamp.seq != 0 && stamp.seq <= rec.seq {
        return Ok(Decision::Duplicate);
    }
    Ok(Decision::Apply)
}

/// The stamp a store records after it applied a write stamped `stamp` over `recorded`: the
/// write's token, and the highest sequence number seen under it.
pub fn recorded_after(stamp: Stamp, recorded: Option<Stamp>) -> Stamp {
    match recorded {
        Some(rec) if rec.token == stamp.token => Stamp {
            token: stamp.token,
            seq: rec.seq.max(stamp.seq),
        },
        _ => stamp,
    }
}

/// The answer to a fenced write that was not stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a duplicate was not applied"]
pub enum Outcome<T> {
    /// Applied, with the store's answer.
    Applied(T),
    /// This write (its sequence number) was applied before under the same grant, or a later
    /// one of the grant was: nothing changed.
    Duplicate,
}

impl<T> Outcome<T> {
    /// The store's answer, or `None` for a duplicate.
    pub fn applied(self) -> Option<T> {
        match self {
            Outcome::Applied(v) => Some(v),
            Outcome::Duplicate => None,
        }
    }

    /// True for [`Outcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }

    /// Maps the applied answer.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Applied(v) => Outcome::Applied(f(v)),
            Outcome::Duplicate => Outcome::Duplicate,
        }
    }
}

/// The error of a grant whose key (etcd) or node (ZooKeeper) is gone: `newer` is the current
/// holder's token (`head`) when it is above `token`, else `changed`, the revision or zxid at
/// which the grant was found gone — in any case above `token`.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
fn grant_gone(token: u64, head: Option<i64>, changed: i64) -> Error {
    let newer = head
        .filter(|h| u64::try_from(*h).is_ok_and(|h| h > token))
        .unwrap_or(changed);
    Error::Stale {
        token,
        newer: u64::try_from(newer)
            .unwrap_or(0)
            .max(token.saturating_add(1)),
    }
}

/// An error of a fenced write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The write's token is below one the store accepted: the lock was granted again after
    /// this holder's lease ended, and the newer holder wrote (or read under the fence).
    /// Nothing was written. Do not retry with the same token: acquire the lock again and
    /// start over from a fresh read.
    #[error(
        "stale fencing token {token}: the store accepted token {newer} already (the lock was \
         granted again after this holder's lease ended); nothing was written — acquire the \
         lock again and redo the work from a fresh read"
    )]
    Stale {
        /// The rejected write's token.
        token: u64,
        /// The newer token the store had accepted.
        newer: u64,
    },
    /// The store failed or answered something unexpected; the write may or may not have been
    /// applied (retry it with the same [`Stamp`]: a retry has the effect of one write).
    #[error("{store}: {message}")]
    Store {
        /// Which store (`file`, `redis`, …) and where.
        store: String,
        /// What failed.
        message: String,
        /// The driver's error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Bad input (an empty key list, a resource name a store cannot hold, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl PartialEq for Error {
    /// Equal kinds with equal fields; store errors compare by store and message.
    fn eq(&self, other: &Error) -> bool {
        match (self, other) {
            (
                Error::Stale { token, newer },
                Error::Stale {
                    token: t2,
                    newer: n2,
                },
            ) => token == t2 && newer == n2,
            (
                Error::Store { store, message, .. },
                Error::Store {
                    store: s2,
                    message: m2,
                    ..
                },
            ) => store == s2 && message == m2,
            (Error::InvalidArgument(a), Error::InvalidArgument(b)) => a == b,
            _ => false,
        }
    }
}

impl Error {
    /// A store error with its driver's cause.
    pub fn store(
        store: impl Into<String>,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Store {
            store: store.into(),
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// True for [`Error::Stale`].
    pub fn is_stale(&self) -> bool {
        matches!(self, Error::Stale { .. })
    }
}

/// Result of a fenced operation.
pub type Result<T> = std::result::Result<T, Error>;

/// The fence of one resource as your store keeps it (a row's column, a document's field, a
/// value beside the data), read and written inside your store's own atomic step — a
/// transaction, a row lock, a compare-and-set retry, a mutex.
///
/// Implement the two accessors; [`admit`](FenceRecord::admit) applies [the rule](crate#the-rule)
/// and records the stamp. Call it in the same atomic step as the write, before the write, and
/// write only on [`Decision::Apply`].
///
/// ```
/// use distlock_fence::{Decision, Error, FenceRecord, Stamp};
///
/// /// A row of the application: the data and the fence beside it.
/// struct Account { balance: i64, fence: Option<Stamp> }
///
/// impl FenceRecord for Account {
///     fn recorded(&self) -> Option<Stamp> { self.fence }
///     fn record(&mut self, stamp: Stamp) { self.fence = Some(stamp) }
/// }
///
/// let mut row = Account { balance: 100, fence: None };
/// // Holder with token 7, its first write (sequence 1): applied.
/// let deposit = |row: &mut Account, stamp: Stamp| -> Result<(), Error> {
///     if row.admit(stamp)? == Decision::Apply {
///         row.balance += 10;
///     }
///     Ok(())
/// };
/// deposit(&mut row, Stamp::new(7).seq(1))?;
/// deposit(&mut row, Stamp::new(7).seq(1))?; // a retry: not applied again
/// deposit(&mut row, Stamp::new(9).seq(1))?; // the next holder
/// assert_eq!(row.balance, 120);
/// assert!(deposit(&mut row, Stamp::new(7).seq(2)).unwrap_err().is_stale());
/// # Ok::<(), Error>(())
/// ```
pub trait FenceRecord {
    /// The stamp of the last write accepted, `None` if none was.
    fn recorded(&self) -> Option<Stamp>;

    /// Keeps `stamp` as the last write accepted.
    fn record(&mut self, stamp: Stamp);

    /// The rule ([`decide`]) against what is recorded; on [`Decision::Apply`] records the
    /// stamp ([`recorded_after`]) — write then, in the same atomic step; on
    /// [`Decision::Duplicate`] changes nothing.
    ///
    /// # Errors
    /// [`Error::Stale`] when the stamp's token is below the recorded one (nothing recorded).
    fn admit(&mut self, stamp: Stamp) -> Result<Decision> {
        let recorded = self.recorded();
        let decision = decide(stamp, recorded)?;
        if decision == Decision::Apply {
            self.record(recorded_after(stamp, recorded));
        }
        Ok(decision)
    }
}

/// An in-memory fence: `None` until the first write.
impl FenceRecord for Option<Stamp> {
    fn recorded(&self) -> Option<Stamp> {
        *self
    }

    fn record(&mut self, stamp: Stamp) {
        *self = Some(stamp);
    }
}

/// Checks a SQL table name: `name` or `schema.name`, each part a plain identifier (ASCII
/// letters, digits and `_`, not starting with a digit, 1 to 63 bytes), so it can be written
/// into statements as it is.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn sql_table_name(table: &str) -> Result<()> {
    let ok = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && !part.starts_with(|c: char| c.is_ascii_digit())
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| ok(p)) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "fence table `{}` must be `name` or `schema.name`, each of ASCII letters, digits and `_`, not starting with a digit, at most 63 bytes",
            table.escape_debug()
        )))
    }
}

/// The rule's cases — `(recorded, write, expected)`, expected `Ok(true)` applied, `Ok(false)`
/// duplicate, `Err(newer)` stale — which every store's own form of the rule (Lua, SQL) is
/// tested against.
pub const CASES: &[(Option<Stamp>, Stamp, std::result::Result<bool, u64>)] = &[
    (None, Stamp::new(5), Ok(true)),
    (None, Stamp::new(5).seq(3), Ok(true)),
    (Some(Stamp::new(5)), Stamp::new(4), Err(5)),
    (Some(Stamp::new(5)), Stamp::new(4).seq(9), Err(5)),
    (Some(Stamp::new(5)), Stamp::new(5), Ok(true)),
    (Some(Stamp::new(5)), Stamp::new(6), Ok(true)),
    (Some(Stamp::new(5).seq(2)), Stamp::new(5).seq(1), Ok(false)),
    (Some(Stamp::new(5).seq(2)), Stamp::new(5).seq(2), Ok(false)),
    (Some(Stamp::new(5).seq(2)), Stamp::new(5).seq(3), Ok(true)),
    (Some(Stamp::new(5).seq(2)), Stamp::new(5), Ok(true)),
    (Some(Stamp::new(5).seq(2)), Stamp::new(6).seq(1), Ok(true)),
    // Tokens above 2^53 (no rounding through a float anywhere).
    (
        Some(Stamp::new(9_007_199_254_740_993)),
        Stamp::new(9_007_199_254_740_992),
        Err(9_007_199_254_740_993),
    ),
    (
        Some(Stamp::new(u64::MAX - 1)),
        Stamp::new(u64::MAX),
        Ok(true),
    ),
    // Tokens of different lengths in digits.
    (Some(Stamp::new(10)), Stamp::new(9), Err(10)),
    (Some(Stamp::new(9)), Stamp::new(10), Ok(true)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_on_its_cases() {
        for &(recorded, stamp, expected) in CASES {
            let got = match decide(stamp, recorded) {
                Ok(Decision::Apply) => Ok(true),
                Ok(Decision::Duplicate) => Ok(false),
                Err(Error::Stale { token, newer }) => {
                    assert_eq!(token, stamp.token);
                    Err(newer)
                }
                Err(e) => panic!("{e}"),
            };
            assert_eq!(got, expected, "{recorded:?} then {stamp:?}");
        }
    }

    #[test]
    fn recording() {
        let mut f: Option<Stamp> = None;
        assert_eq!(f.admit(Stamp::new(3).seq(2)), Ok(Decision::Apply));
        assert_eq!(f, Some(Stamp::new(3).seq(2)));
        // An unsequenced write of the grant keeps the highest sequence number.
        assert_eq!(f.admit(Stamp::new(3)), Ok(Decision::Apply));
        assert_eq!(f, Some(Stamp::new(3).seq(2)));
        assert_eq!(f.admit(Stamp::new(3).seq(2)), Ok(Decision::Duplicate));
        assert_eq!(f.admit(Stamp::new(4)), Ok(Decision::Apply));
        assert_eq!(f, Some(Stamp::new(4)));
        let e = f.admit(Stamp::new(3).seq(9)).unwrap_err();
        assert_eq!(e, Error::Stale { token: 3, newer: 4 });
        assert!(e.to_string().contains("stale fencing token 3"), "{e}");
        assert_eq!(f, Some(Stamp::new(4)));
    }

    #[test]
    fn stamps_as_text() {
        let s = Stamp::new(1_764_650_000_123_456).seq(7);
        assert_eq!(Stamp::parse(&s.to_string()), Some(s));
        for bad in ["", "1", "1 2 3", "x 1", "-1 2", "1 -2"] {
            assert_eq!(Stamp::parse(bad), None, "{bad}");
        }
    }
}
