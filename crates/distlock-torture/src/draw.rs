//! `dlock torture --timeline FILE.svg`: a run as a [`timeline`](crate::timeline) — one block
//! per lock name, one lane per worker slot (a killed worker's successor keeps its lane), a
//! bar per wait and per hold, the nemeses as bands over the lanes they hit (over every lane
//! for a server's), the violations in red over the attempts they name.

use crate::checker::{self, Analysis, Violation};
use crate::history::{AttemptId, History, SERVER};
use crate::timeline::{self as svg, Band, Bar, Block, Dot, Key, Legend, Track};
use std::collections::HashMap;

const HOLD: &str = "#1f77b4";
const PAST_LEASE: &str = "#aec7e8";
const WAIT: &str = "#d9d9d9";
const RED: &str = "#d62728";
const PAUSE: &str = "#9467bd";
const KILL: &str = "#111111";
const NETWORK: &str = "#ff7f0e";
const SERVER_COLOR: &str = "#8c564b";

/// The worker slot of a worker id (`w3.1` → 3).
fn slot(worker: &str) -> Option<usize> {
    worker.strip_prefix('w')?.split('.').next()?.parse().ok()
}

fn nemesis_color(name: &str) -> &'static str {
    match name {
        "pause" => PAUSE,
        "kill" => KILL,
        "pause-server" | "restart-server" | "failover" => SERVER_COLOR,
        _ => NETWORK,
    }
}

/// Draws the run `h`, checked as `a`, titled `title`.
pub fn render(h: &History, a: &Analysis, title: &str) -> String {
    let d = checker::sections(h, &mut Analysis::default());
    let t0 = h
        .events
        .iter()
        .map(|e| e.t)
        .chain(h.nemeses.iter().map(|n| n.t))
        .min()
        .unwrap_or(0);
    let rel = |t: u64| t.saturating_sub(t0);
    let lanes = h
        .events
        .iter()
        .filter_map(|e| slot(&e.id.worker))
        .max()
        .map_or(1, |m| m + 1);
    let mut locks: Vec<u32> = h.events.iter().map(|e| e.id.lock).collect();
    locks.sort_unstable();
    locks.dedup();
    let grant_of: HashMap<&AttemptId, u64> = d.sections.iter().map(|s| (&s.id, s.grant)).collect();
    let mut blocks = Vec::new();
    for lock in locks {
        let mut tracks: HashMap<&AttemptId, Track> = HashMap::new();
        for w in d.waits.iter().filter(|w| w.id.lock == lock) {
            let t = tracks.entry(&w.id).or_default();
            t.lane = slot(&w.id.worker).unwrap_or(0);
            t.bars.push(Bar {
                class: "wait",
                color: WAIT,
                start_us: rel(w.start),
                end_us: rel(w.end),
                title: format!(
                    "{}: waited {}–{}{}",
                    w.id,
                    svg::ms(rel(w.start)),
                    svg::ms(rel(w.end)),
                    if w.granted { "" } else { ", no grant" }
                ),
            });
        }
        for s in d.sections.iter().filter(|s| s.id.lock == lock) {
            let t = tracks.entry(&s.id).or_default();
            t.lane = slot(&s.id.worker).unwrap_or(0);
            t.bars.push(Bar {
                class: "hold",
                color: HOLD,
                start_us: rel(s.grant),
                end_us: rel(s.valid_end.max(s.grant)),
                title: format!(
                    "{}: token {}, held {}–{}",
                    s.id,
                    s.token,
                    svg::ms(rel(s.grant)),
                    svg::ms(rel(s.valid_end))
                ),
            });
            if s.end > s.valid_end {
                t.bars.push(Bar {
                    class: "past-lease",
                    color: PAST_LEASE,
                    start_us: rel(s.valid_end),
                    end_us: rel(s.end),
                    title: format!(
                        "{}: in its section past its lease (told lost) until {}",
                        s.id,
                        svg::ms(rel(s.end))
                    ),
                });
            }
        }
        for op in h
            .register
            .iter()
            .filter(|o| o.id.lock == lock && !o.accepted)
        {
            if let Some(t) = tracks.get_mut(&op.id) {
                t.dots.push(Dot {
                    class: "refused",
                    color: RED,
                    radius: 2.0,
                    at_us: rel(op.t),
                    title: format!(
                        "{}: {:?} with token {} refused by the register",
                        op.id, op.op, op.token
                    ),
                });
            }
        }
        let mut bands: Vec<Band> = h
            .nemeses
            .iter()
            .map(|n| Band {
                lane: if n.worker == SERVER {
                    None
                } else {
                    slot(&n.worker)
                },
                class: "nemesis",
                color: nemesis_color(&n.nemesis),
                from_us: rel(n.t),
                to_us: rel(n.until),
                title: format!(
                    "{} {} {}–{}",
                    n.nemesis,
                    n.worker,
                    svg::ms(rel(n.t)),
                    svg::ms(rel(n.until))
                ),
            })
            .collect();
        for v in &a.violations {
            let (ids, from, to) = v.span();
            if matches!(v, Violation::HeldByNobody { lock: l, .. } if *l != lock)
                || ids.iter().any(|i| i.lock != lock)
            {
                continue;
            }
            let instant = ids.iter().filter_map(|i| grant_of.get(i).copied());
            let spans: Vec<(u64, u64)> = if to > 0 {
                vec![(from, to)]
            } else {
                instant.map(|g| (g, g)).collect()
            };
            let lanes_hit: Vec<Option<usize>> = if ids.is_empty() {
                vec![None]
            } else {
                ids.iter().map(|i| slot(&i.worker)).collect()
            };
            for (f, t) in spans {
                for lane in &lanes_hit {
                    bands.push(Band {
                        lane: *lane,
                        class: "violation",
                        color: RED,
                        from_us: rel(f),
                        to_us: rel(t),
                        title: v.to_string(),
                    });
                }
            }
        }
        let mut tracks: Vec<Track> = tracks.into_values().collect();
        tracks.sort_by_key(|t| (t.lane, t.bars.first().map(|b| b.start_us)));
        blocks.push(Block {
            data: ("lock", lock.to_string()),
            title: if lock == 0 {
                title.to_string()
            } else {
                format!("lock {lock}")
            },
            lanes: (0..lanes).map(|i| format!("w{i}")).collect(),
            tracks,
            bands,
        });
    }
    let legend = Legend {
        keys: vec![
            Key::Bar(HOLD, "held"),
            Key::Bar(PAST_LEASE, "past its lease (told lost)"),
            Key::Bar(WAIT, "waiting"),
            Key::Dot(RED, 2.0, "write refused"),
            Key::Band(PAUSE, "pause"),
            Key::Band(KILL, "kill"),
            Key::Band(NETWORK, "network"),
            Key::Band(SERVER_COLOR, "server"),
            Key::Band(RED, "violation"),
        ],
        note: "time since the first event →  one lane per worker slot; hover for attempts, tokens and violations".into(),
    };
    svg::render(&legend, &blocks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Event, EventKind, NemesisEvent};

    fn ev(worker: &str, t: u64, kind: EventKind) -> Event {
        Event {
            id: AttemptId {
                worker: worker.into(),
                attempt: 0,
                lock: 0,
            },
            t,
            t_coord: 0,
            kind,
        }
    }

    #[test]
    fn an_overlap_is_drawn_over_both_lanes() {
        let grant = |token| EventKind::Grant {
            token,
            lease_end: None,
            shared: false,
        };
        let h = History {
            events: vec![
                ev("w0.0", 1_000, EventKind::AttemptStart),
                ev("w0.0", 2_000, grant(1)),
                ev("w1.0", 1_500, EventKind::AttemptStart),
                ev("w1.0", 3_000, grant(2)),
                ev("w0.0", 5_000, EventKind::ReleaseStart),
                ev("w1.0", 6_000, EventKind::ReleaseStart),
            ],
            nemeses: vec![NemesisEvent {
                nemesis: "restart-server".into(),
                worker: SERVER.into(),
                t: 2_500,
                until: 2_600,
            }],
            ..History::default()
        };
        let a = checker::check(&h);
        assert_eq!(a.violation_counts.get("overlap"), Some(&1));
        let svg = render(&h, &a, "t");
        assert_eq!(svg.matches(r#"class="lane""#).count(), 2);
        assert_eq!(svg.matches(r#"class="hold""#).count(), 2);
        assert_eq!(svg.matches(r#"class="wait""#).count(), 2);
        assert_eq!(svg.matches(r#"class="violation""#).count(), 2);
        // The server's nemesis spans the block: its band is outside every lane group.
        let last_lane = svg.rfind(r#"class="lane""#).unwrap();
        assert!(svg[last_lane..].contains("restart-server server"));
    }
}
