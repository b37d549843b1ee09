//! What a torture run records: worker events, register operations, nemeses.
//!
//! Every time is in microseconds on the machine-wide lease clock
//! ([`distlock::clock::Instant::as_boottime`], CLOCK_BOOTTIME on Linux): workers run on the
//! coordinator's host, so a worker's clock and the coordinator's are the same clock and their
//! readings can be compared (see docs/torture.md, "Clocks").

use serde::{Deserialize, Serialize};

/// Now on the shared clock, µs.
pub fn now_us() -> u64 {
    to_us(distlock::clock::Instant::now().as_boottime())
}

/// A clock reading as µs.
pub fn to_us(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One attempt of one worker: the unit grants, sections and register calls belong to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptId {
    /// The worker process (`w<slot>.<generation>`).
    pub worker: String,
    /// The attempt's number within the worker, from 0.
    pub attempt: u64,
}

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.worker, self.attempt)
    }
}

/// What a worker reports (one JSON line each on its stdout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum EventKind {
    /// An acquire call starts.
    AttemptStart,
    /// The acquire call returned a grant.
    Grant {
        /// The grant's fencing token.
        token: u64,
        /// When the lease the worker was granted ends, if the lock says.
        lease_end: Option<u64>,
    },
    /// The acquire call ended without a grant (deadline, error).
    AttemptFailed {
        /// Why.
        error: String,
    },
    /// The lock told the worker its grant was lost.
    Lost {
        /// The lease end the lock last confirmed, if it says.
        lease_end: Option<u64>,
        /// The lock's reason.
        reason: String,
    },
    /// A register call was answered.
    Register {
        /// When the call was sent (worker clock).
        sent: u64,
        /// `read` or `write`.
        op: RegisterOpKind,
        /// The token it carried.
        token: u64,
        /// The value read, or the value written.
        value: u64,
        /// Whether the register accepted it.
        accepted: bool,
    },
    /// The release call starts: the critical section is over.
    ReleaseStart,
    /// The release call returned.
    Released {
        /// The lock's answer (`released`, `expired`, `taken`, `error: …`).
        outcome: String,
    },
}

/// One worker event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Whose attempt.
    #[serde(flatten)]
    pub id: AttemptId,
    /// When it happened on the worker's clock, µs.
    pub t: u64,
    /// When the coordinator read it, µs (0 in generated histories).
    #[serde(default)]
    pub t_coord: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// A register operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RegisterOpKind {
    /// Read the value.
    Read,
    /// Write a value.
    Write,
}

/// One operation as the register saw it, in the register's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterOp {
    /// Whose attempt sent it.
    #[serde(flatten)]
    pub id: AttemptId,
    /// When the register handled it (coordinator clock), µs.
    pub t: u64,
    /// Read or write.
    pub op: RegisterOpKind,
    /// The token it carried.
    pub token: u64,
    /// The value read (the register's value) or written.
    pub value: u64,
    /// Whether the register accepted it (token not below the highest seen).
    pub accepted: bool,
}

/// A nemesis the coordinator applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NemesisEvent {
    /// `pause`, `kill`, `delay`, `drop` or `reset`.
    pub nemesis: String,
    /// The worker it hit.
    pub worker: String,
    /// When it started (coordinator clock), µs.
    pub t: u64,
    /// When it ended (resume, heal), µs; equal to `t` for instant ones.
    pub until: u64,
}

/// Everything a run recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// Worker events, in the order the coordinator read them.
    pub events: Vec<Event>,
    /// Register operations, in the register's order.
    pub register: Vec<RegisterOp>,
    /// Nemeses applied.
    pub nemeses: Vec<NemesisEvent>,
    /// Workers killed, with the time of the kill: their open section ends there.
    pub killed: Vec<(String, u64)>,
}
