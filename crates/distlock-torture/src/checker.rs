//! The checker: finds double grants, bad tokens and lost updates in a [`History`].
//!
//! It trusts nothing but the recorded times and the one-clock assumption (docs/torture.md):
//! it re-derives every verdict from the events, including what the register should have
//! refused, so a register bug is found too.

use crate::history::{AttemptId, EventKind, History, Kind, RegisterOpKind, SERVER};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Most violations of one kind listed in a report (all are counted).
pub const MAX_LISTED: usize = 20;

/// One thing that must not happen to a correct lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "violation", rename_all = "kebab-case")]
pub enum Violation {
    /// Two holders held the lock at once, each by its own lease: a double grant. A holder
    /// never told its grant was lost holds until its section ends; one told lost holds until
    /// it was told or the lease end its lock had last confirmed, whichever came first (a
    /// holder frozen past its lease is not counted: no lock can stop it, fencing does).
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
    /// More holders of a semaphore at once, each by its own lease (as for
    /// [`Violation::Overlap`]), than it has permits.
    OverLimit {
        /// The holders at that moment.
        holders: Vec<AttemptId>,
        /// The permits.
        limit: u32,
        /// Where the excess starts (µs).
        from: u64,
        /// Where it ends (µs).
        to: u64,
    },
    /// The lock stayed held by nobody alive (its last owner released, was killed or told its
    /// grant was lost) while a waiter untouched by any nemesis waited, for longer than a
    /// lease and a margin: a grant that outlived its owner, or a release that freed nothing.
    HeldByNobody {
        /// The lock name's index.
        lock: u32,
        /// The owner whose claim ended last before the gap, if any.
        last: Option<AttemptId>,
        /// Where the gap starts: nobody alive held the lock from here (µs).
        from: u64,
        /// Where it ends: the next grant, or the end of the history (µs).
        to: u64,
        /// How long waiters waited in it, µs (server nemeses' windows left out).
        waited_us: u64,
        /// The longest wait a correct lock may cause there, µs.
        bound_us: u64,
    },
    /// A waiter of a first-come-first-served lock gave up after later arrivals were granted
    /// the lock more times than there are workers (a queue would have served it first).
    Starved {
        /// The waiter.
        waiter: AttemptId,
        /// Its attempt start (µs).
        from: u64,
        /// When it gave up (µs).
        to: u64,
        /// Grants of later arrivals during its wait.
        overtaken: u64,
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
            Violation::OverLimit { .. } => "over-limit",
            Violation::HeldByNobody { .. } => "held-by-nobody",
            Violation::Starved { .. } => "starved",
        }
    }

    /// The attempts it names and the span it covers (µs), for the timeline.
    pub fn span(&self) -> (Vec<&AttemptId>, u64, u64) {
        match self {
            Violation::Overlap { a, b, from, to } => (vec![a, b], *from, *to),
            Violation::DuplicateToken { a, b, .. } => (vec![a, b], 0, 0),
            Violation::TokenOrder { earlier, later, .. } => (vec![earlier, later], 0, 0),
            Violation::LostUpdate { by, t, .. } | Violation::StaleAccepted { by, t, .. } => {
                (vec![by], *t, *t)
            }
            Violation::OverLimit {
                holders, from, to, ..
            } => (holders.iter().collect(), *from, *to),
            Violation::HeldByNobody { last, from, to, .. } => (last.iter().collect(), *from, *to),
            Violation::Starved {
                waiter, from, to, ..
            } => (vec![waiter], *from, *to),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::Overlap { a, b, from, to } => write!(
                f,
                "overlap: {a} and {b} both held the lock by their own leases for {} µs (from t={from})",
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
            Violation::OverLimit {
                holders,
                limit,
                from,
                to,
            } => {
                let names: Vec<String> = holders.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "over limit: {} holders of a {limit}-permit semaphore for {} µs (from t={from}), each by its own lease: {}",
                    holders.len(),
                    to - from,
                    names.join(", ")
                )
            }
            Violation::HeldByNobody {
                lock,
                last,
                from,
                to,
                waited_us,
                bound_us,
            } => {
                write!(f, "held by nobody: lock {lock} ")?;
                if let Some(last) = last {
                    write!(f, "(last owner {last}) ")?;
                }
                write!(
                    f,
                    "granted to no one from t={from} to t={to} while waiters waited {waited_us} µs (a correct lock: at most {bound_us} µs)"
                )
            }
            Violation::Starved {
                waiter,
                from,
                to,
                overtaken,
            } => write!(
                f,
                "starved: {waiter} waited from t={from} and gave up at t={to} while {overtaken} later arrivals were granted the lock"
            ),
        }
    }
}

/// How late lost signals fired after the lease their lock last confirmed had ended, µs.
///
/// `count`, `p50_us`, `p99_us` and `max_us` are over one set: the signals that fired after
/// their lease end. A signal that fired before it (the lock found the grant gone while the
/// lease still ran: a failed renewal, a session closed) is counted in `early`, one with no
/// known lease end in `unknown`; neither is a lateness of 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lateness {
    /// Lost signals that fired after their lease end: the set the percentiles are over.
    pub count: usize,
    /// Lost signals that fired at or before their lease end.
    #[serde(default)]
    pub early: usize,
    /// Lost signals without a known lease end.
    #[serde(default)]
    pub unknown: usize,
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
    /// The register's value at the end (the sum over the lock names).
    pub final_value: u64,
    /// Attempts that gave up after later arrivals were granted the lock more times than
    /// there are workers (a violation only for a first-come-first-served lock).
    #[serde(default)]
    pub starved: u64,
    /// The most holders of one lock name at once, each by its own lease: 1 for a
    /// mutex that kept its promise, up to N for a semaphore of N permits, readers sharing.
    #[serde(default)]
    pub max_holders: u64,
    /// The longest time the lock was held by nobody alive while a waiter untouched by a
    /// nemesis waited, µs.
    #[serde(default)]
    pub longest_unheld_wait_us: u64,
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
pub(crate) struct Section {
    pub(crate) id: AttemptId,
    pub(crate) attempt_start: u64,
    pub(crate) grant: u64,
    pub(crate) token: u64,
    /// A shared grant (a reader).
    shared: bool,
    /// The lease the lock stated at the grant, µs.
    lease: Option<u64>,
    /// The critical section's end: release started, or the kill.
    pub(crate) end: u64,
    /// Until when its holder held the lock by its own lease: `end`, or for a holder told its
    /// grant was lost, when it was told or the lease end the lock last confirmed, whichever
    /// came first.
    pub(crate) valid_end: u64,
    /// When its worker stopped owning the grant: the release returned, the kill, or the lost
    /// signal.
    claim_end: u64,
    /// Whether its holder was told the grant was lost (the tests pick sections by it).
    #[cfg_attr(not(test), allow(dead_code))]
    told_lost: bool,
}

/// One attempt that waited: when, and how it ended.
#[derive(Debug, Clone)]
pub(crate) struct Wait {
    pub(crate) id: AttemptId,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) granted: bool,
}

/// What [`sections`] derives from the events.
pub(crate) struct Derived {
    pub(crate) sections: Vec<Section>,
    pub(crate) waits: Vec<Wait>,
    history_end: u64,
}

/// Checks a history.
pub fn check(h: &History) -> Analysis {
    let mut out = Analysis::default();
    for n in &h.nemeses {
        *out.nemeses.entry(n.nemesis.clone()).or_insert(0) += 1;
    }
    let d = sections(h, &mut out);
    let mut locks: Vec<u32> = d.sections.iter().map(|s| s.id.lock).collect();
    locks.extend(d.waits.iter().map(|w| w.id.lock));
    locks.sort_unstable();
    locks.dedup();
    for lock in locks {
        let s: Vec<Section> = d
            .sections
            .iter()
            .filter(|s| s.id.lock == lock)
            .cloned()
            .collect();
        let w: Vec<&Wait> = d.waits.iter().filter(|w| w.id.lock == lock).collect();
        match h.kind {
            Kind::Semaphore(n) => over_limit(&s, n, &mut out),
            _ => overlaps(&s, &mut out),
        }
        let most = most_at_once(&s).len() as u64;
        out.stats.max_holders = out.stats.max_holders.max(most);
        tokens(&s, &mut out);
        if h.lease_us > 0 {
            held_by_nobody(h, lock, &s, &w, d.history_end, &mut out);
        }
        starved(h, &s, &w, &mut out);
    }
    register(h, &mut out);
    out
}

/// Time windows `(from, until)`, µs.
type Windows = Vec<(u64, u64)>;

/// The time windows in which a nemesis hit each worker, and the server's.
fn nemesis_windows(h: &History) -> (HashMap<&str, Windows>, Windows) {
    let mut by: HashMap<&str, Windows> = HashMap::new();
    let mut server = Vec::new();
    for n in &h.nemeses {
        if n.worker == SERVER {
            server.push((n.t, n.until));
        } else {
            by.entry(n.worker.as_str())
                .or_default()
                .push((n.t, n.until));
        }
    }
    (by, server)
}

/// Builds the sections and waits from the events, and the lock counts and lateness.
pub(crate) fn sections(h: &History, out: &mut Analysis) -> Derived {
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
        grant: Option<(u64, u64, bool, Option<u64>)>,
        failed: Option<u64>,
        lost: Option<u64>,
        lost_lease_end: Option<u64>,
        release_start: Option<u64>,
        released: Option<u64>,
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
            EventKind::Grant {
                token,
                lease_end,
                shared,
            } => {
                out.stats.grants += 1;
                a.grant = Some((
                    e.t,
                    *token,
                    *shared,
                    lease_end.map(|l| l.saturating_sub(e.t)),
                ));
            }
            EventKind::AttemptFailed { .. } => {
                out.stats.failed_attempts += 1;
                a.failed = Some(e.t);
            }
            EventKind::Lost { lease_end, .. } => {
                out.stats.lost += 1;
                a.lost = Some(e.t);
                a.lost_lease_end = *lease_end;
                match lease_end {
                    Some(end) if e.t > *end => late.push(e.t - end),
                    Some(_) => out.lost_lateness.early += 1,
                    None => out.lost_lateness.unknown += 1,
                }
            }
            EventKind::ReleaseStart => a.release_start = Some(e.t),
            // A release that finds the grant gone tells the holder only after its section:
            // not a lost signal.
            EventKind::Released { .. } => a.released = Some(e.t),
            EventKind::Register { .. } => {}
        }
    }
    late.sort_unstable();
    if let Some(&max) = late.last() {
        let at = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
        out.lost_lateness.count = late.len();
        out.lost_lateness.p50_us = at(0.5);
        out.lost_lateness.p99_us = at(0.99);
        out.lost_lateness.max_us = max;
    }
    let mut sections = Vec::new();
    let mut waits = Vec::new();
    for (id, a) in by {
        let kill = killed.get(id.worker.as_str()).copied();
        if let Some(start) = a.start {
            let end = a
                .grant
                .map(|g| g.0)
                .or(a.failed)
                .or(kill)
                .unwrap_or(history_end)
                .max(start);
            waits.push(Wait {
                id: id.clone(),
                start,
                end,
                granted: a.grant.is_some(),
            });
        }
        let Some((grant, token, shared, lease)) = a.grant else {
            continue;
        };
        let end = a.release_start.or(kill).unwrap_or(history_end).max(grant);
        let claim_end = [a.released.or(a.release_start), kill, a.lost]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(history_end)
            .max(grant);
        let valid_end = match a.lost {
            // Told lost, it holds no longer than it was told, nor past the lease its lock
            // last confirmed (a frozen holder told on resuming); a lost signal without a lease
            // end says nothing of the lease.
            Some(told) => a.lost_lease_end.unwrap_or(grant).min(told).min(end),
            None => end,
        };
        sections.push(Section {
            id: id.clone(),
            valid_end,
            attempt_start: a.start.unwrap_or(grant).min(grant),
            grant,
            token,
            shared,
            lease,
            end,
            claim_end,
            told_lost: a.lost.is_some(),
        });
    }
    sections.sort_by_key(|s| (s.grant, s.end));
    Derived {
        sections,
        waits,
        history_end,
    }
}

/// Double grants: holders that held by their own lease at once, not both shared.
fn overlaps(s: &[Section], out: &mut Analysis) {
    for (i, a) in s.iter().enumerate() {
        for b in s[i + 1..].iter().take_while(|b| b.grant < a.valid_end) {
            if b.grant >= b.valid_end || b.id.worker == a.id.worker || (a.shared && b.shared) {
                continue;
            }
            out.push(Violation::Overlap {
                a: a.id.clone(),
                b: b.id.clone(),
                from: b.grant,
                to: a.valid_end.min(b.valid_end),
            });
        }
    }
}

/// Where each section held by its own lease, as (time, starts, index) points sorted with
/// ends before starts at the same instant (a section that ends as another starts does not
/// overlap it).
fn valid_points(s: &[Section]) -> Vec<(u64, bool, usize)> {
    let mut points: Vec<(u64, bool, usize)> = Vec::new();
    for (i, x) in s.iter().enumerate().filter(|(_, x)| x.valid_end > x.grant) {
        points.push((x.grant, true, i));
        points.push((x.valid_end, false, i));
    }
    points.sort_unstable();
    points
}

/// The sections that held by their own lease at once at the busiest moment.
fn most_at_once(s: &[Section]) -> Vec<usize> {
    let points = valid_points(s);
    let (mut open, mut most) = (Vec::new(), Vec::new());
    for (_, starts, i) in points {
        if starts {
            open.push(i);
            if open.len() > most.len() {
                most.clone_from(&open);
            }
        } else {
            open.retain(|&j| j != i);
        }
    }
    most
}

/// More holders of a semaphore at once, each by its own lease, than it has permits.
fn over_limit(s: &[Section], limit: u32, out: &mut Analysis) {
    let points = valid_points(s);
    let mut open: Vec<usize> = Vec::new();
    let mut excess: Option<(u64, Vec<usize>)> = None;
    for (t, starts, i) in points {
        if starts {
            open.push(i);
        } else {
            open.retain(|&j| j != i);
        }
        let over = open.len() > limit as usize;
        match (&excess, over) {
            (None, true) => excess = Some((t, open.clone())),
            (Some(_), false) => {
                if let Some((from, holders)) = excess.take() {
                    out.push(Violation::OverLimit {
                        holders: holders.iter().map(|&j| s[j].id.clone()).collect(),
                        limit,
                        from,
                        to: t,
                    });
                }
            }
            _ => {}
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

/// Whether `[a, b)` meets any of `windows`.
fn hit(windows: Option<&Windows>, a: u64, b: u64) -> bool {
    windows.is_some_and(|w| w.iter().any(|&(t, u)| t < b && u >= a))
}

/// The liveness check: gaps in which nobody alive held the lock while a waiter that no
/// nemesis touched waited. A correct lock keeps a grant past its owner's end for at most the
/// lease it stated (a killed owner's lease runs out; a released one is free at once), and a
/// waiter notices within its wait loop's next try. The bound adds [`unheld_margin`] for what
/// the stated lease does not show: a server's coarser expiry (etcd rounds leases up to whole
/// seconds and sweeps expired ones every 500 ms; 2.2 s seen with a 1 s lease) and a loaded
/// machine's scheduling. A lock kept for a session far longer than the lease (ZooKeeper's
/// default 10 s) or never freed is still found.
fn held_by_nobody(
    h: &History,
    lock: u32,
    s: &[Section],
    waits: &[&Wait],
    history_end: u64,
    out: &mut Analysis,
) {
    let (by_worker, server) = nemesis_windows(h);
    let capacity = h.kind.capacity();
    // Waits no nemesis touched, and the server's windows (each to one lease past its end:
    // the clients reconnect) cut out of them.
    let healthy: Vec<(u64, u64)> = waits
        .iter()
        .filter(|w| !hit(by_worker.get(w.id.worker.as_str()), w.start, w.end))
        .map(|w| (w.start, w.end))
        .collect();
    let server: Vec<(u64, u64)> = server
        .into_iter()
        .map(|(t, u)| (t, u + h.lease_us))
        .collect();
    // Owner count changes: +1 at a grant, -1 at its claim's end.
    let mut points: Vec<(u64, i32)> = s
        .iter()
        .flat_map(|x| [(x.grant, 1), (x.claim_end, -1)])
        .collect();
    points.sort_unstable();
    let mut owners = 0i32;
    let mut free_from = Some(0u64);
    let mut gaps = Vec::new();
    for (t, d) in points {
        let was_free = owners < capacity as i32;
        owners += d;
        let free = owners < capacity as i32;
        match (was_free, free) {
            (true, false) => {
                if let Some(f) = free_from.take() {
                    gaps.push((f, t));
                }
            }
            (false, true) => free_from = Some(t),
            _ => {}
        }
    }
    if let Some(f) = free_from {
        gaps.push((f, history_end));
    }
    for (from, to) in gaps {
        if to <= from {
            continue;
        }
        // The owner whose claim ended at the gap's start, and the lease its lock stated.
        let last = s
            .iter()
            .filter(|x| x.claim_end <= from)
            .max_by_key(|x| x.claim_end);
        let stated = last.and_then(|x| x.lease).unwrap_or(0).max(h.lease_us);
        let bound = stated + unheld_margin(h.lease_us);
        let waited = covered(&healthy, &server, from, to);
        out.stats.longest_unheld_wait_us = out.stats.longest_unheld_wait_us.max(waited);
        if waited > bound {
            out.push(Violation::HeldByNobody {
                lock,
                last: last.map(|x| x.id.clone()),
                from,
                to,
                waited_us: waited,
                bound_us: bound,
            });
        }
    }
}

/// What the held-by-nobody check allows past the stated lease: two leases, at least 3 s.
pub fn unheld_margin(lease_us: u64) -> u64 {
    (2 * lease_us).max(3_000_000)
}

/// How much of `[from, to)` is covered by `cover` and not by `minus`, µs.
fn covered(cover: &[(u64, u64)], minus: &[(u64, u64)], from: u64, to: u64) -> u64 {
    let mut pts: Vec<(u64, i32, bool)> = Vec::new();
    for &(a, b) in cover {
        let (a, b) = (a.max(from), b.min(to));
        if a < b {
            pts.push((a, 1, true));
            pts.push((b, -1, true));
        }
    }
    for &(a, b) in minus {
        let (a, b) = (a.max(from), b.min(to));
        if a < b {
            pts.push((a, 1, false));
            pts.push((b, -1, false));
        }
    }
    pts.sort_unstable();
    let (mut c, mut m, mut last, mut sum) = (0i32, 0i32, from, 0u64);
    for (t, d, is_cover) in pts {
        if c > 0 && m == 0 {
            sum += t - last;
        }
        last = t;
        if is_cover {
            c += d;
        } else {
            m += d;
        }
    }
    sum
}

/// Waiters passed over: attempts that gave up after later arrivals were granted the lock more
/// times than there are workers. For a first-come-first-served lock each such attempt is a
/// violation (once queued, a waiter is behind at most one attempt of each other worker; the
/// margin is for the time its request took to be queued); for the others it is counted.
fn starved(h: &History, s: &[Section], waits: &[&Wait], out: &mut Analysis) {
    let (by_worker, _) = nemesis_windows(h);
    let workers: std::collections::HashSet<&str> = h
        .events
        .iter()
        .map(|e| e.id.worker.as_str().split('.').next().unwrap_or(""))
        .collect();
    let threshold = workers.len().max(2) as u64;
    for w in waits.iter().filter(|w| !w.granted) {
        if hit(by_worker.get(w.id.worker.as_str()), w.start, w.end) {
            continue;
        }
        let overtaken = s
            .iter()
            .filter(|x| x.attempt_start > w.start && x.grant < w.end && x.id.worker != w.id.worker)
            .count() as u64;
        if overtaken >= threshold {
            out.stats.starved += 1;
            if h.kind == Kind::Fair {
                out.push(Violation::Starved {
                    waiter: w.id.clone(),
                    from: w.start,
                    to: w.end,
                    overtaken,
                });
            }
        }
    }
}

/// Lost updates and stale operations accepted, replayed in the register's order, per lock
/// name. A shared read is never refused but its token counts as seen.
fn register(h: &History, out: &mut Analysis) {
    let mut value: HashMap<u32, u64> = HashMap::new();
    let mut max_token: HashMap<u32, u64> = HashMap::new();
    for op in &h.register {
        if !op.accepted {
            out.stats.register_rejected += 1;
            continue;
        }
        out.stats.register_accepted += 1;
        let max = max_token.get(&op.id.lock).copied();
        if op.op != RegisterOpKind::SharedRead {
            if let Some(newer) = max.filter(|&m| op.token < m) {
                out.push(Violation::StaleAccepted {
                    by: op.id.clone(),
                    token: op.token,
                    newer,
                    t: op.t,
                });
            }
        }
        max_token.insert(op.id.lock, max.map_or(op.token, |m| m.max(op.token)));
        if op.op == RegisterOpKind::Write {
            out.stats.writes += 1;
            let v = value.entry(op.id.lock).or_insert(0);
            if op.value != *v + 1 {
                out.push(Violation::LostUpdate {
                    by: op.id.clone(),
                    before: *v,
                    wrote: op.value,
                    t: op.t,
                });
            }
            *v = op.value;
        }
    }
    out.stats.final_value = value.values().sum();
}

#[cfg(test)]
mod tests;
