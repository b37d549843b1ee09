//! What a node answers to the quorum steps, and how its replies are read.

use crate::error::{shape, KIND};
use crate::int;
use distlock_core::backend::RenewOutcome;
use distlock_core::{Error, ReleaseOutcome, Result};
use redis::Value;
use std::time::Duration;

/// One node's answer to [`RedisNode::vote`](crate::RedisNode::vote).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuorumReply {
    /// The node's epoch is not the one the caller knows: it lost its data or was initialised
    /// again since the caller looked. Nothing was changed; the vote must not count.
    EpochMismatch,
    /// Granted afresh to this attempt; the node's fencing counter moved on to `counter`: its
    /// old value + 1, or the node's clock in µs if that is higher (`scripts/fence.lua`).
    Granted {
        /// The node's counter after the grant (the token stored with the hold).
        counter: u64,
    },
    /// This attempt already held the lock on this node (a retry, or a vote of an earlier round
    /// of the same attempt): the same hold, its lease made to run at least the asked lease.
    Holds {
        /// The node's counter, or its clock in µs if that is higher (so a fresh token above
        /// it is above every token issued before, as a grant's).
        counter: u64,
        /// The token stored with the hold on this node.
        token: u64,
    },
    /// Free on this node, but another waiter is first in this node's wait queue (its turn).
    Behind {
        /// The node's counter.
        counter: u64,
    },
    /// Another attempt (of any owner) holds the lock on this node.
    Held {
        /// The node's counter.
        counter: u64,
        /// How long that attempt's lease still runs here, if it expires.
        ttl: Option<Duration>,
    },
}

/// [`QuorumReply`], the node's restart quarantine, and whether the node had forgotten the
/// scripts (`NOSCRIPT`: it restarted, or someone ran `SCRIPT FLUSH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuorumVote {
    /// The node's answer.
    pub reply: QuorumReply,
    /// How long the node's restart quarantine still runs by its own clock (`None`: over). A
    /// vote of a quarantined node must not count.
    pub quarantine: Option<Duration>,
    /// The scripts had to be loaded again before the vote could run.
    pub scripts_reloaded: bool,
    /// This attempt is the first live waiter in the node's wait queue.
    pub first: bool,
}

impl QuorumVote {
    /// A vote with `reply` and nothing else to tell: no quarantine, scripts in place, not
    /// first in a queue (for tests and tools that tally votes).
    pub fn new(reply: QuorumReply) -> Self {
        QuorumVote {
            reply,
            quarantine: None,
            scripts_reloaded: false,
            first: false,
        }
    }
}

/// One node's hold of a Redlock lock, as [`RedisNode::hold`](crate::RedisNode::hold) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeHold {
    /// The attempt id the hold is addressed to (empty: not a hash of ours).
    pub attempt: String,
    /// The owner id of that attempt.
    pub owner: String,
    /// The token stored with the hold (`None`: missing or not a number).
    pub token: Option<u64>,
    /// How long the hold's lease still runs here, if it expires.
    pub lease_left: Option<Duration>,
    /// An election's advertised value and its proclamation number (`None` for a lock, or an
    /// election hold without them).
    pub value: Option<(String, u64)>,
}

impl NodeHold {
    /// A hold as a node stores it (for tests and tools that merge nodes' views).
    pub fn new(
        attempt: &str,
        owner: &str,
        token: Option<u64>,
        lease_left: Option<Duration>,
    ) -> Self {
        NodeHold {
            attempt: attempt.to_owned(),
            owner: owner.to_owned(),
            token,
            lease_left,
            value: None,
        }
    }
}

/// What `INFO server` says about the process behind a node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// Changes on every start of the server process.
    pub run_id: String,
    /// Time since the process started (whole seconds, rounded down).
    pub uptime: Duration,
    /// The server's clock (`TIME`) in ms since the Unix epoch, when it was asked.
    pub now_ms: u64,
}

pub(super) fn uint(what: &str, v: &Value) -> Result<u64> {
    int(v)
        .and_then(|i| u64::try_from(i).ok())
        .ok_or_else(|| shape(what, v))
}

pub(super) fn positive_ms(ms: i64) -> Option<Duration> {
    crate::inspect::ms(ms).filter(|d| !d.is_zero())
}

pub(super) fn parse_info(text: &str, now_ms: u64) -> Result<ServerInfo> {
    let info = crate::ops::parse_info(text);
    let run_id = (info.get("run_id").map(|r| r.trim()))
        .filter(|r| !r.is_empty())
        .ok_or_else(|| Error::unexpected(KIND, "INFO server has no run_id"))?;
    let uptime = (info.get("uptime_in_seconds"))
        .and_then(|u| u.trim().parse::<u64>().ok())
        .ok_or_else(|| Error::unexpected(KIND, "INFO server has no uptime_in_seconds"))?;
    Ok(ServerInfo {
        run_id: run_id.to_owned(),
        uptime: Duration::from_secs(uptime),
        now_ms,
    })
}

/// A vote's reply (`quorum_acquire.lua`): `-1` the epoch differs; an integer > 0 the
/// uncontended grant (the counter; no quarantine left, not first in a queue); otherwise
/// `{status, counter, x, quarantine_left_ms, first}`. `scripts_reloaded` is left false.
pub(super) fn vote_reply(v: &Value) -> Result<QuorumVote> {
    let bad = || shape("quorum acquire", v);
    let (reply, qleft, first) = match v {
        Value::Int(-1) => (QuorumReply::EpochMismatch, 0, 0),
        Value::Int(c) if *c > 0 => (QuorumReply::Granted { counter: *c as u64 }, 0, 0),
        Value::Array(items) => {
            let nums: Option<Vec<i64>> = items.iter().map(int).collect();
            let Some(&[status, c, x, q, f]) = nums.as_deref() else {
                return Err(bad());
            };
            let counter = u64::try_from(c).map_err(|_| bad())?;
            let reply = match status {
                1 if counter > 0 => QuorumReply::Granted { counter },
                2 if x >= 0 => QuorumReply::Holds {
                    counter,
                    token: x as u64,
                },
                0 => QuorumReply::Held {
                    counter,
                    ttl: crate::inspect::ms(x),
                },
                3 => QuorumReply::Behind { counter },
                _ => return Err(bad()),
            };
            (reply, q, f)
        }
        _ => return Err(bad()),
    };
    Ok(QuorumVote {
        reply,
        quarantine: positive_ms(qleft),
        scripts_reloaded: false,
        first: first == 1,
    })
}

/// A release's reply (`quorum_release.lua`): `1` released, `0` nothing here, `3` another
/// attempt holds it, `-1 - TOKEN` this attempt holds it here under another token.
pub(super) fn release_reply(v: &Value) -> Result<std::result::Result<ReleaseOutcome, u64>> {
    match int(v) {
        Some(n) if n < 0 => Ok(Err(u64::try_from(-1 - n).unwrap_or(0))),
        Some(n) => crate::release_outcome("quorum release", n).map(Ok),
        None => Err(shape("quorum release", v)),
    }
}

/// One `quorum_renew_many.lua` reply for `n` grants: `{flags, tokens...}`, a flag per grant
/// (`1` renewed, `0` not held, `2` held with another token) and the stored token of each `2`.
pub(super) fn renew_reply(
    v: &Value,
    n: usize,
) -> Result<Vec<std::result::Result<RenewOutcome, u64>>> {
    let bad = || shape("quorum renew", v);
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let (flags, mut tokens) = match items.split_first() {
        Some((Value::BulkString(f), rest)) if f.len() == n => (f, rest.iter()),
        _ => return Err(bad()),
    };
    let out = flags
        .iter()
        .map(|f| match f {
            b'1' => Ok(Ok(RenewOutcome::Renewed)),
            b'0' => Ok(Ok(RenewOutcome::NotHeld)),
            b'2' => tokens
                .next()
                .and_then(int)
                .map(|t| Err(u64::try_from(t).unwrap_or(0)))
                .ok_or_else(bad),
            _ => Err(bad()),
        })
        .collect::<Result<Vec<_>>>()?;
    if tokens.next().is_some() {
        return Err(bad());
    }
    Ok(out)
}
