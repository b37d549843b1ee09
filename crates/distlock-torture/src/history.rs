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
    /// Which of the run's lock names it is for (`--names`), from 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lock: u32,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.worker, self.attempt)?;
        if self.lock != 0 {
            write!(f, "@{}", self.lock)?;
        }
        Ok(())
    }
}

/// The kind of lock a run tortures, and so the rule its holders must keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "permits")]
pub enum Kind {
    /// A mutex: one holder at a time.
    #[default]
    Mutex,
    /// A first-come-first-served mutex: one holder at a time, and waiters are not passed
    /// over by later arrivals.
    Fair,
    /// A read-write lock: a writer holds alone; readers may share.
    ReadWrite,
    /// A semaphore of this many permits: at most that many holders at once.
    Semaphore(u32),
    /// A leader election: one leader at a time.
    Election,
}

impl Kind {
    /// How many holders may hold at once (readers of a read-write lock aside).
    pub fn capacity(self) -> usize {
        match self {
            Kind::Semaphore(n) => n as usize,
            _ => 1,
        }
    }

    /// Whether every holder works on the fenced register (a semaphore's holders hold at
    /// once, so one register cannot tell a stale holder from a concurrent one).
    pub fn uses_register(self) -> bool {
        !matches!(self, Kind::Semaphore(_))
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Mutex => f.write_str("mutex"),
            Kind::Fair => f.write_str("fair"),
            Kind::ReadWrite => f.write_str("read-write"),
            Kind::Semaphore(n) => write!(f, "semaphore={n}"),
            Kind::Election => f.write_str("election"),
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Kind, String> {
        match s {
            "mutex" => Ok(Kind::Mutex),
            "fair" => Ok(Kind::Fair),
            "read-write" | "rw" => Ok(Kind::ReadWrite),
            "election" => Ok(Kind::Election),
            _ => match s.strip_prefix("semaphore=") {
                Some(n) => permits(n).map(Kind::Semaphore),
                None => Err(format!(
                    "unknown kind `{s}`; choose mutex, fair, read-write, semaphore=N or election"
                )),
            },
        }
    }
}

/// The `N` of a `semaphore=N` kind: a number of permits from 1 to [`distlock::MAX_PERMITS`].
///
/// # Errors
/// A message naming the range.
pub fn permits(n: &str) -> Result<u32, String> {
    match n.parse::<u32>() {
        Ok(n) if (1..=distlock::MAX_PERMITS).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{n}` is not a number of permits (1 to {})",
            distlock::MAX_PERMITS
        )),
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
        /// A shared grant (a reader of a read-write lock): it may overlap other shared ones.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        shared: bool,
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
    /// Read the value as a shared holder (a reader of a read-write lock): never refused, as
    /// a reader cannot harm the value, but its token counts as seen.
    SharedRead,
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

/// The name a server nemesis's event carries in [`NemesisEvent::worker`].
pub const SERVER: &str = "server";

/// A nemesis the coordinator applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NemesisEvent {
    /// `pause`, `kill`, `delay`, `drop`, `reset`, `duplicate`, `restart-server` or `failover`.
    pub nemesis: String,
    /// The worker it hit ([`SERVER`] for a server nemesis: every worker).
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
    /// What was tortured: the rule the checker holds the grants to.
    #[serde(default)]
    pub kind: Kind,
    /// The lease the workers asked for, µs (0: unknown; the liveness checks are then off).
    #[serde(default)]
    pub lease_us: u64,
}
