//! The checker: finds double grants, bad tokens and lost updates in a [`History`].
//!
//! It trusts nothing but the recorded times and the one-clock assumption (docs/torture.md):
//! it re-derives every verdict from the events, including what the register should have
//! refused, so a register bug is found too.

use crate::history::{AttemptId, EventKind, History, RegisterOpKind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Most violations of one kind listed in a report (all are counted).
pub const MAX_LISTED: usize = 20;

/// One thing that must not happen to a correct lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "violation", rename_all = "kebab-case")]
pub enum Violation {
    /// Two critical sections overlapped and neither holder was told its lock was lost: a
    /// double grant.
    Overlap {
        /// The earlier-granted holder.
        a: AttemptId,
        /// The other one.
        b: AttemptId,
        /// Where the overlap starts (µs).
        from: u64,
        /// Where it ends (µs).
        to: u64,
    },
    /// Two grants carried the same fencing token.
    DuplicateToken {
        /// The token.
        token: u64,
        /// The first grant with it.
        a: AttemptId,
        /// Another one.
        b: AttemptId,
    },
    /// A grant that surely came later (its acquire started after the other's grant returned)
    /// got a token that is not higher.
    TokenOrder {
        /// The grant that came first, and its token.
        earlier: AttemptId,
        /// Its token.
        earlier_token: u64,
        /// The later grant.
        later: AttemptId,
        /// Its token.
        later_token: u64,
    },
    /// An accepted write did not build on the value before it: an increment was lost.
    LostUpdate {
        /// Who wrote.
        by: AttemptId,
        /// The register's value before the write.
        before: u64,
        /// What it wrote (a correct increment writes `before + 1`).
        wrote: u64,
        /// When (register clock, µs).
        t: u64,
    },
    /// The register accepted an operation whose token was below one it had already seen.
    StaleAccepted {
        /// Who sent it.
        by: AttemptId,
        /// Its token.
        token: u64,
        /// The highest token seen before it.
        newer: u64,
        /// When (register clock, µs).
        t: u64,
    },
}

impl Violation {
    /// The violation's kind, as in the JSON report.
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::Overlap { .. } => "overlap",
            Violation::DuplicateToken { .. } => "duplicate-token",
            Violation::TokenOrder { .. } => "token-order",
            Violation::LostUpdate { .. } => "lost-update",
            Violation::StaleAccepted { .. } => "stale-accepted",
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::Overlap { a, b, from, to } => write!(
                f,
                "overlap: {a} and {b} both held the lock for {} µs (from t={from}), neither told it was lost",
                to - from
            ),
            Violation::DuplicateToken { token, a, b } => {
                write!(f, "duplicate token: {a} and {b} were both granted token {token}")
            }
            Violation::TokenOrder {
                earlier,
                earlier_token,
                later,
                later_token,
            } => write!(
                f,
                "token order: {later} was granted {later_token} after {earlier} was granted {earlier_token}"
            ),
            Violation::LostUpdate { by, before, wrote, t } => write!(
                f,
                "lost update: {by} wrote {wrote} over {before} at t={t} (an increment was lost)"
            ),
            Violation::StaleAccepted { by, token, newer, t } => write!(
                f,
                "stale write accepted: {by} with token {token} after token {newer} at t={t}"
            ),
        }
    }
}

/// Percentiles of how late lost signals fired after their lease ended, µs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lateness {
    /// Lost signals with a known lease end.
    pub count: usize,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest.
    pub max_us: u64,
}

/// Counts over the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Acquire calls.
    pub attempts: u64,
    /// Grants.
    pub grants: u64,
    /// Acquire calls that ended without a grant.
    pub failed_attempts: u64,
    /// Lost signals.
    pub lost: u64,
    /// Register operations accepted.
    pub register_accepted: u64,
    /// Register operations refused for a stale token.
    pub register_rejected: u64,
    /// Accepted writes.
    pub writes: u64,
    /// The register's value at the end.
    pub final_value: u64,
}

/// The checker's result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Analysis {
    /// Violations, at most [`MAX_LISTED`] of each kind.
    pub violations: Vec<Violation>,
    /// How many of each kind were found.
    pub violation_counts: BTreeMap<String, u64>,
    /// Lost-signal lateness.
    pub lost_lateness: Lateness,
    /// Counts.
    pub stats: Stats,
    /// Nemeses applied, by name.
    pub nemeses: BTreeMap<String, u64>,
}

impl Analysis {
    /// True when no violation was found.
    pub fn ok(&self) -> bool {
        self.violation_counts.is_empty()
    }

    fn push(&mut self, v: Violation) {
        let n = self
            .violation_counts
            .entry(v.kind().to_string())
            .or_insert(0);
        *n += 1;
        if *n as usize <= MAX_LISTED {
            self.violations.push(v);
        }
    }
}

/// A grant and what became of it.
#[derive(Debug, Clone)]
struct Section {
    id: AttemptId,
    attempt_start: u64,
    grant: u64,
    token: u64,
    end: u64,
    told_lost: bool,
}

/// Checks a history.
pub fn check(h: &History) -> Analysis {
    let mut out = Analysis::default();
    for n in &h.nemeses {
        *out.nemeses.entry(n.nemesis.clone()).or_insert(0) += 1;
    }
    let sections = sections(h, &mut out);
    overlaps(&sections, &mut out);
    tokens(&sections, &mut out);
    register(h, &mut out);
    out
}

/// Builds the sections from the events, and the lock counts and lateness.
fn sections(h: &History, out: &mut Analysis) -> Vec<Section> {
    let history_end = h
        .events
        .iter()
        .map(|e| e.t)
        .chain(h.register.iter().map(|o| o.t))
        .chain(h.killed.iter().map(|k| k.1))
        .max()
        .unwrap_or(0);
    let killed: HashMap<&str, u64> = h.killed.iter().map(|(w, t)| (w.as_str(), *t)).collect();
    #[derive(Default)]
    struct Acc {
        start: Option<u64>,
        grant: Option<(u64, u64)>,
        lost: bool,
        release_start: Option<u64>,
    }
    let mut by: BTreeMap<&AttemptId, Acc> = BTreeMap::new();
    let mut late = Vec::new();
    for e in &h.events {
        let a = by.entry(&e.id).or_default();
        match &e.kind {
            EventKind::AttemptStart => {
                out.stats.attempts += 1;
                a.start = Some(e.t);
            }
            EventKind::Grant { token, .. } => {
                out.stats.grants += 1;
                a.grant = Some((e.t, *token));
            }
            EventKind::AttemptFailed { .. } => out.stats.failed_attempts += 1,
            EventKind::Lost { lease_end, .. } => {
                out.stats.lost += 1;
                a.lost = true;
                if let Some(end) = lease_end {
                    late.push(e.t.saturating_sub(*end));
                }
            }
            EventKind::ReleaseStart => a.release_start = Some(e.t),
            // A release that finds the grant gone tells the holder only after its section:
            // not a lost signal.
            EventKind::Released { .. } | EventKind::Register { .. } => {}
        }
    }
    late.sort_unstable();
    if let Some(&max) = late.last() {
        let at = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
        out.lost_lateness = Lateness {
            count: late.len(),
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: max,
        };
    }
    let mut v: Vec<Section> = by
        .into_iter()
        .filter_map(|(id, a)| {
            let (grant, token) = a.grant?;
            let end = a
                .release_start
                .or_else(|| killed.get(id.worker.as_str()).copied())
                .unwrap_or(history_end)
                .max(grant);
            Some(Section {
                id: id.clone(),
                attempt_start: a.start.unwrap_or(grant).min(grant),
                grant,
                token,
                end,
                told_lost: a.lost,
            })
        })
        .collect();
    v.sort_by_key(|s| (s.grant, s.end));
    v
}

/// Double grants: sections that overlap, neither told lost.
fn overlaps(s: &[Section], out: &mut Analysis) {
    for (i, a) in s.iter().enumerate() {
        if a.told_lost {
            continue;
        }
        for b in s[i + 1..].iter().take_while(|b| b.grant < a.end) {
            if b.told_lost || b.id.worker == a.id.worker {
                continue;
            }
            out.push(Violation::Overlap {
                a: a.id.clone(),
                b: b.id.clone(),
                from: b.grant,
                to: a.end.min(b.end),
            });
        }
    }
}

/// Duplicate tokens and tokens not increasing in grant order.
fn tokens(s: &[Section], out: &mut Analysis) {
    let mut seen: HashMap<u64, &AttemptId> = HashMap::new();
    for x in s {
        if let Some(first) = seen.get(&x.token) {
            out.push(Violation::DuplicateToken {
                token: x.token,
                a: (*first).clone(),
                b: x.id.clone(),
            });
        } else {
            seen.insert(x.token, &x.id);
        }
    }
    // `s` is sorted by grant time; visit the grants by attempt start, adding to the prefix
    // every grant that returned before that start.
    let mut by_start: Vec<&Section> = s.iter().collect();
    by_start.sort_by_key(|x| x.attempt_start);
    let mut next = 0;
    let mut max: Option<&Section> = None;
    for later in by_start {
        while next < s.len() && s[next].grant < later.attempt_start {
            if max.is_none_or(|m| s[next].token > m.token) {
                max = Some(&s[next]);
            }
            next += 1;
        }
        if let Some(m) = max {
            if m.token >= later.token && m.id != later.id {
                out.push(Violation::TokenOrder {
                    earlier: m.id.clone(),
                    earlier_token: m.token,
                    later: later.id.clone(),
                    later_token: later.token,
                });
            }
        }
    }
}

/// Lost updates and stale operations accepted, replayed in the register's order.
fn register(h: &History, out: &mut Analysis) {
    let mut value = 0u64;
    let mut max_token: Option<u64> = None;
    for op in &h.register {
        if !op.accepted {
            out.stats.register_rejected += 1;
            continue;
        }
        out.stats.register_accepted += 1;
        if let Some(newer) = max_token.filter(|&m| op.token < m) {
            out.push(Violation::StaleAccepted {
                by: op.id.clone(),
                token: op.token,
                newer,
                t: op.t,
            });
        }
        max_token = Some(max_token.map_or(op.token, |m| m.max(op.token)));
        if op.op == RegisterOpKind::Write {
            out.stats.writes += 1;
            if op.value != value + 1 {
                out.push(Violation::LostUpdate {
                    by: op.id.clone(),
                    before: value,
                    wrote: op.value,
                    t: op.t,
                });
            }
            value = op.value;
        }
    }
    out.stats.final_value = value;
}

#[cfg(test)]
mod tests;
