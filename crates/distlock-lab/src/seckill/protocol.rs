//! What a worker process tells its parent: JSON lines on its stdout.
//!
//! ```text
//! {"type":"ready"}                                   connected, waiting for `go <unix µs>` on stdin
//! {"type":"buyer","buyer":7,"outcome":"bought",…}   one line per buyer, as soon as it is done
//! {"type":"error","message":"…"}                     the worker cannot go on (it then exits 1)
//! ```
//!
//! Times are microseconds since the common start instant the parent sent.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How buyers protect the read → check → write → order sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// No protection at all.
    #[serde(rename = "none")]
    NoLock,
    /// An in-process mutex: protects the buyers of one process from each other only.
    Local,
    /// Version compare-and-set, retried from the read on conflict.
    Optimistic,
    /// `try_acquire` of the distributed lock: a buyer who misses gives up at once.
    Trylock,
    /// `acquire_timeout(--wait)` of the distributed lock.
    Lock,
    /// The lock, and the stock read and written through the store's fence with the grant's
    /// fencing token (crate distlock-fence): a holder whose lease ended is rejected.
    Fenced,
}

impl Strategy {
    /// Every strategy, in the order `all` runs them.
    pub const ALL: [Strategy; 6] = [
        Strategy::NoLock,
        Strategy::Local,
        Strategy::Optimistic,
        Strategy::Trylock,
        Strategy::Lock,
        Strategy::Fenced,
    ];

    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::NoLock => "none",
            Strategy::Local => "local",
            Strategy::Optimistic => "optimistic",
            Strategy::Trylock => "trylock",
            Strategy::Lock => "lock",
            Strategy::Fenced => "fenced",
        }
    }

    /// Parses one strategy name.
    pub fn parse(s: &str) -> Option<Strategy> {
        Strategy::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// True when buyers wait for a lock (and so have a lock wait to report).
    pub fn has_lock(self) -> bool {
        matches!(
            self,
            Strategy::Local | Strategy::Trylock | Strategy::Lock | Strategy::Fenced
        )
    }

    /// True when buyers use the distributed lock.
    pub fn uses_dlock(self) -> bool {
        matches!(self, Strategy::Trylock | Strategy::Lock | Strategy::Fenced)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// For clap: one strategy.
pub fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| {
        format!(
            "unknown strategy `{s}`; choose from none, local, optimistic, trylock, lock, fenced (or all)"
        )
    })
}

/// The `--strategy` list: comma-separated names, or `all`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strategies(pub Vec<Strategy>);

/// For clap: `none,local`, `all`, … (duplicates are dropped, the order is kept).
pub fn parse_strategies(s: &str) -> Result<Strategies, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        if part.eq_ignore_ascii_case("all") {
            for k in Strategy::ALL {
                if !out.contains(&k) {
                    out.push(k);
                }
            }
            continue;
        }
        let k = parse_strategy(part)?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        return Err(
            "no strategy given; choose from none, local, optimistic, trylock, lock, fenced (or all)".into(),
        );
    }
    Ok(Strategies(out))
}

/// What happened to one buyer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Created an order.
    Bought,
    /// Read a stock of zero (or less).
    SoldOut,
    /// `trylock`: the lock was held.
    Missed,
    /// `lock`: not acquired within `--wait`.
    TimedOut,
    /// `optimistic`: every compare-and-set attempt lost.
    Conflicts,
    /// `fenced`: the store rejected the buyer's read or write: a newer holder had used it.
    Rejected,
    /// A store or lock error.
    Error,
}

/// What a bar of the timeline shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// A lock hold, acquire to release.
    Hold,
    /// The unprotected read → write window (`none`, `local`).
    Window,
    /// An optimistic attempt that won its compare-and-set (read → CAS).
    Attempt,
    /// An optimistic attempt that lost its compare-and-set.
    Conflict,
    /// The buyer's process stopped (`--pause`) while the buyer held the lock.
    Pause,
}

/// One interval of a buyer's life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// What it was.
    pub kind: SpanKind,
    /// Start, µs since the common start.
    pub start_us: u64,
    /// End, µs since the common start.
    pub end_us: u64,
}

/// The report of one buyer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuyerReport {
    /// Buyer id (0-based across all processes).
    pub buyer: u64,
    /// What happened.
    pub outcome: Outcome,
    /// How long the buyer waited for its lock, µs (strategies with a lock).
    pub wait_us: Option<u64>,
    /// Bars for the timeline.
    pub spans: Vec<Span>,
    /// When its order was created, µs.
    pub order_us: Option<u64>,
    /// When the buyer was done, µs.
    pub done_us: u64,
    /// When it wrote the stock, µs (also a write the store rejected).
    #[serde(default)]
    pub write_us: Option<u64>,
    /// It wrote after its lease had ended (it held a lock whose lease ran out first).
    #[serde(default)]
    pub late_write: bool,
    /// When the store rejected its read or write (`fenced`), µs.
    #[serde(default)]
    pub rejected_us: Option<u64>,
    /// Errors met on the way (also a release that failed after a sale).
    pub errors: Vec<String>,
}

/// A buyer holding the lock has read the stock and waits for the parent's word (one line,
/// `continue`, on its stdin) before it goes on; the parent stops its process first if it is
/// the one to pause (`--pause`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausePoint {
    /// The buyer.
    pub buyer: u64,
    /// When it asked, µs.
    pub at_us: u64,
    /// When its lease ends unless it is renewed, µs.
    pub lease_end_us: u64,
}

/// One line of a worker's stdout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMsg {
    /// Connected; waiting for the start line.
    Ready,
    /// A buyer is done.
    Buyer(BuyerReport),
    /// A buyer is at the pause point.
    PausePoint(PausePoint),
    /// The worker cannot go on.
    Error {
        /// Why.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_lists() {
        assert_eq!(parse_strategies("all").map(|s| s.0.len()), Ok(6));
        assert_eq!(
            parse_strategies("lock, none,lock").map(|s| s.0),
            Ok(vec![Strategy::Lock, Strategy::NoLock])
        );
        let e = parse_strategies("none,pessimistic").unwrap_err();
        assert!(e.contains("unknown strategy `pessimistic`"), "{e}");
        assert!(parse_strategies(" , ").is_err());
    }

    #[test]
    fn messages_round_trip() {
        let m = WorkerMsg::Buyer(BuyerReport {
            buyer: 3,
            outcome: Outcome::SoldOut,
            wait_us: None,
            spans: vec![Span {
                kind: SpanKind::Window,
                start_us: 1,
                end_us: 2,
            }],
            order_us: None,
            done_us: 5,
            write_us: None,
            late_write: false,
            rejected_us: None,
            errors: vec![],
        });
        let line = serde_json::to_string(&m).expect("serialize");
        assert!(
            line.starts_with(r#"{"type":"buyer","buyer":3,"outcome":"sold_out""#),
            "{line}"
        );
        let back: WorkerMsg = serde_json::from_str(&line).expect("parse");
        assert_eq!(back, m);
        let r: WorkerMsg = serde_json::from_str(r#"{"type":"ready"}"#).expect("parse");
        assert_eq!(r, WorkerMsg::Ready);
    }
}
