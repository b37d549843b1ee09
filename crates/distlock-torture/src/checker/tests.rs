//! Property-style tests: histories generated from a correct lock (with paused and killed
//! holders) have no violation; each injected fault is always found.

use super::*;
use crate::history::{Event, NemesisEvent, RegisterOp};

const LEASE: u64 = 2_000_000;
const RUNS: u64 = 300;

/// Builds the history of a correct mutex with fencing: sections one after another, some
/// holders paused past their lease (told lost on resume, their write refused) or killed.
struct Gen {
    rng: fastrand::Rng,
    h: History,
    t: u64,
    token: u64,
    value: u64,
    max_token: u64,
    attempts: HashMap<String, u64>,
    generation: HashMap<usize, u64>,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: fastrand::Rng::with_seed(seed),
            h: History::default(),
            t: 1_000,
            token: 1_000 + seed % 1_000,
            value: 0,
            max_token: 0,
            attempts: HashMap::new(),
            generation: HashMap::new(),
        }
    }

    fn worker(&mut self) -> String {
        let slot = self.rng.usize(..6);
        let g = *self.generation.entry(slot).or_insert(0);
        format!("w{slot}.{g}")
    }

    fn ev(&mut self, id: &AttemptId, t: u64, kind: EventKind) {
        self.h.events.push(Event {
            id: id.clone(),
            t,
            t_coord: t + 3,
            kind,
        });
    }

    fn reg(&mut self, id: &AttemptId, t: u64, op: RegisterOpKind, token: u64, value: u64) -> bool {
        let accepted = token >= self.max_token;
        if accepted {
            self.max_token = token;
        }
        self.h.register.push(RegisterOp {
            id: id.clone(),
            t,
            op,
            token,
            value,
            accepted,
        });
        self.ev(
            id,
            t + 2,
            EventKind::Register {
                sent: t - 1,
                op,
                token,
                value,
                accepted,
            },
        );
        accepted
    }

    /// Starts an attempt of a fresh worker and grants it: (id, grant time, token).
    fn grant(&mut self) -> (AttemptId, u64, u64) {
        let worker = self.worker();
        let n = self.attempts.entry(worker.clone()).or_insert(0);
        let id = AttemptId {
            worker,
            attempt: *n,
        };
        *n += 1;
        let start = self.t;
        // Waiters that gave up before this grant.
        if self.rng.u8(..10) == 0 {
            let w = self.worker();
            let n = self.attempts.entry(w.clone()).or_insert(0);
            let f = AttemptId {
                worker: w,
                attempt: *n,
            };
            *n += 1;
            self.ev(&f, start, EventKind::AttemptStart);
            self.ev(
                &f,
                start + 5,
                EventKind::AttemptFailed {
                    error: "deadline".into(),
                },
            );
        }
        self.ev(&id, start, EventKind::AttemptStart);
        let g = start + self.rng.u64(10..500);
        self.token += self.rng.u64(1..5);
        let token = self.token;
        self.ev(
            &id,
            g,
            EventKind::Grant {
                token,
                lease_end: Some(g + LEASE),
            },
        );
        (id, g, token)
    }

    /// One section of a holder that runs normally.
    fn normal(&mut self) {
        let (id, g, token) = self.grant();
        let r = g + self.rng.u64(5..100);
        let v = self.value;
        self.reg(&id, r, RegisterOpKind::Read, token, v);
        let w = r + self.rng.u64(5..300);
        self.value += 1;
        let nv = self.value;
        assert!(self.reg(&id, w, RegisterOpKind::Write, token, nv));
        let rel = w + self.rng.u64(5..50);
        self.ev(&id, rel, EventKind::ReleaseStart);
        self.ev(
            &id,
            rel + 20,
            EventKind::Released {
                outcome: "released".into(),
            },
        );
        self.t = rel + 30 + self.rng.u64(0..200);
    }

    /// A holder paused past its lease: others run meanwhile; on resume it is told lost and
    /// its write is refused.
    fn paused(&mut self) {
        let (id, g, token) = self.grant();
        let r = g + 10;
        let v = self.value;
        self.reg(&id, r, RegisterOpKind::Read, token, v);
        self.t = g + LEASE + self.rng.u64(1..100_000);
        for _ in 0..self.rng.usize(1..4) {
            self.normal();
        }
        let lost = self.t + self.rng.u64(0..50_000);
        self.ev(
            &id,
            lost,
            EventKind::Lost {
                lease_end: Some(g + LEASE),
                reason: "not-held".into(),
            },
        );
        assert!(!self.reg(&id, lost + 5, RegisterOpKind::Write, token, v + 1));
        self.ev(&id, lost + 10, EventKind::ReleaseStart);
        self.ev(
            &id,
            lost + 30,
            EventKind::Released {
                outcome: "taken".into(),
            },
        );
        self.t = lost + 40;
    }

    /// A holder killed in its section; the next grant comes after its lease.
    fn killed(&mut self) {
        let (id, g, token) = self.grant();
        let v = self.value;
        self.reg(&id, g + 10, RegisterOpKind::Read, token, v);
        let k = g + 20 + self.rng.u64(0..1_000);
        self.h.killed.push((id.worker.clone(), k));
        self.h.nemeses.push(NemesisEvent {
            nemesis: "kill".into(),
            worker: id.worker.clone(),
            t: k,
            until: k,
        });
        let slot: usize = id.worker[1..id.worker.find('.').unwrap()].parse().unwrap();
        *self.generation.get_mut(&slot).unwrap() += 1;
        self.t = g + LEASE + self.rng.u64(1..10_000);
    }

    fn history(seed: u64) -> History {
        let mut g = Gen::new(seed);
        for _ in 0..g.rng.usize(20..80) {
            match g.rng.u8(..10) {
                0 => g.paused(),
                1 => g.killed(),
                _ => g.normal(),
            }
        }
        g.h
    }
}

fn grants(h: &History) -> Vec<usize> {
    h.events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.kind, EventKind::Grant { .. }))
        .map(|(i, _)| i)
        .collect()
}

fn token_of(h: &History, i: usize) -> u64 {
    match h.events[i].kind {
        EventKind::Grant { token, .. } => token,
        _ => unreachable!(),
    }
}

#[test]
fn correct_histories_have_no_violation() {
    for seed in 0..RUNS {
        let h = Gen::history(seed);
        let a = check(&h);
        assert!(a.ok(), "seed {seed}: {:?}", a.violations);
        assert!(a.stats.grants > 0 && a.stats.writes > 0);
        assert_eq!(a.stats.final_value, a.stats.writes, "seed {seed}");
    }
}

#[test]
fn lost_signals_are_measured() {
    let h = Gen::history(7);
    let a = check(&h);
    assert_eq!(a.lost_lateness.count as u64, a.stats.lost);
    assert!(a.lost_lateness.p50_us <= a.lost_lateness.p99_us);
    assert!(a.lost_lateness.p99_us <= a.lost_lateness.max_us);
}

#[test]
fn an_injected_overlap_is_always_found() {
    for seed in 0..RUNS {
        let mut h = Gen::history(seed);
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xdead);
        // A second holder granted inside some normal section, told nothing.
        let sections = super::sections(&h, &mut Analysis::default());
        let normal: Vec<&Section> = sections
            .iter()
            .filter(|s| !s.told_lost && s.end > s.grant + 2)
            .collect();
        let s = normal[rng.usize(..normal.len())];
        let at = rng.u64(s.grant + 1..s.end);
        let id = AttemptId {
            worker: "intruder.0".into(),
            attempt: 0,
        };
        for (t, kind) in [
            (at - 1, EventKind::AttemptStart),
            (
                at,
                EventKind::Grant {
                    token: u64::MAX - seed,
                    lease_end: None,
                },
            ),
            (at + 1, EventKind::ReleaseStart),
        ] {
            h.events.push(Event {
                id: id.clone(),
                t,
                t_coord: 0,
                kind,
            });
        }
        let a = check(&h);
        assert!(
            a.violations.iter().any(|v| matches!(v,
                Violation::Overlap { a, b, .. } if (a == &s.id && b == &id) || (b == &s.id && a == &id))),
            "seed {seed}: {:?}",
            a.violations
        );
    }
}

#[test]
fn an_injected_duplicate_token_is_always_found() {
    for seed in 0..RUNS {
        let mut h = Gen::history(seed);
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xbeef);
        let g = grants(&h);
        let i = g[rng.usize(..g.len() - 1)];
        let j = g[rng.usize(g.iter().position(|&x| x == i).unwrap() + 1..g.len())];
        let t = token_of(&h, i);
        if let EventKind::Grant { token, .. } = &mut h.events[j].kind {
            *token = t;
        }
        let a = check(&h);
        assert!(
            a.violations.iter().any(|v| matches!(v,
                Violation::DuplicateToken { token, .. } if *token == t)),
            "seed {seed}: {:?}",
            a.violations
        );
    }
}

#[test]
fn an_injected_decreasing_token_is_always_found() {
    for seed in 0..RUNS {
        let mut h = Gen::history(seed);
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xfeed);
        let g = grants(&h);
        // A later grant gets a token below an earlier one's (not equal).
        let k = rng.usize(1..g.len());
        let below = token_of(&h, g[rng.usize(..k)]) - 1;
        if let EventKind::Grant { token, .. } = &mut h.events[g[k]].kind {
            *token = below;
        }
        let a = check(&h);
        assert!(
            a.violation_counts.contains_key("token-order"),
            "seed {seed}: {:?}",
            a.violations
        );
    }
}

#[test]
fn an_injected_lost_update_is_always_found() {
    for seed in 0..RUNS {
        let mut h = Gen::history(seed);
        let mut rng = fastrand::Rng::with_seed(seed ^ 0xcafe);
        let writes: Vec<usize> = (0..h.register.len())
            .filter(|&i| h.register[i].accepted && h.register[i].op == RegisterOpKind::Write)
            .collect();
        // Some write builds on a stale read: it writes the value the previous one wrote.
        let i = writes[rng.usize(1..writes.len())];
        h.register[i].value -= 1;
        let a = check(&h);
        assert!(
            a.violation_counts.contains_key("lost-update"),
            "seed {seed}: {:?}",
            a.violations
        );
    }
}

#[test]
fn an_accepted_stale_write_is_always_found() {
    let mut found = 0;
    for seed in 0..RUNS {
        let mut h = Gen::history(seed);
        // A refused write (a paused holder's) made accepted, as a broken register would.
        let Some(op) = h.register.iter_mut().find(|o| !o.accepted) else {
            continue;
        };
        op.accepted = true;
        let a = check(&h);
        assert!(
            a.violation_counts.contains_key("stale-accepted"),
            "seed {seed}: {:?}",
            a.violations
        );
        found += 1;
    }
    assert!(
        found > RUNS / 4,
        "only {found} histories had a paused holder"
    );
}

#[test]
fn nemeses_are_counted() {
    let h = Gen::history(3);
    let kills = h.killed.len() as u64;
    assert_eq!(check(&h).nemeses.get("kill").copied().unwrap_or(0), kills);
}
