//! The `seckill --timeline FILE.svg` picture: per strategy a block with one lane per worker
//! process, a bar per lock hold (or unprotected read → write window, or optimistic attempt),
//! a dot per order — red for the orders beyond the initial stock —, the pause of a stopped
//! buyer (`--pause`) with the end of its lease and its late write (landed or rejected by the
//! fence), and a legend on top.
//! Drawn by [`distlock_torture::timeline`] (shared with `dlock torture --timeline`).
//!
//! Buyers whose bars overlap in time (`none`: all of them) get their own row inside the lane,
//! so a lane is as tall as its largest number of simultaneous buyers: a lane of one row is a
//! process whose buyers never overlapped.

use distlock_torture::timeline as svg;

/// What a bar shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// A lock hold, acquire to release.
    Hold,
    /// An unprotected read → write window.
    Window,
    /// An optimistic attempt that won (read → compare-and-set).
    Attempt,
    /// An optimistic attempt that lost.
    Conflict,
    /// The buyer's process stopped (`--pause`).
    Pause,
}

/// A moment of a buyer's life marked with a dot of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// Its lease ended (the lock service may hand the lock on).
    LeaseLost,
    /// It wrote after its lease ended, and the write landed.
    LateWrite,
    /// The store's fence rejected its read or write.
    Rejected,
}

impl MarkKind {
    const ALL: [MarkKind; 3] = [MarkKind::LeaseLost, MarkKind::LateWrite, MarkKind::Rejected];

    fn label(self) -> &'static str {
        match self {
            MarkKind::LeaseLost => "lease lost",
            MarkKind::LateWrite => "late write landed",
            MarkKind::Rejected => "write rejected by the fence",
        }
    }

    fn class(self) -> &'static str {
        match self {
            MarkKind::LeaseLost => "mark lease-lost",
            MarkKind::LateWrite => "mark late-write",
            MarkKind::Rejected => "mark rejected",
        }
    }

    fn color(self) -> &'static str {
        match self {
            MarkKind::LeaseLost => "#8c564b",
            MarkKind::LateWrite => RED,
            MarkKind::Rejected => GREEN,
        }
    }
}

impl BarKind {
    fn color(self) -> &'static str {
        match self {
            BarKind::Hold => "#1f77b4",
            BarKind::Window => "#ff9f40",
            BarKind::Attempt => "#9467bd",
            BarKind::Conflict => "#c7c7c7",
            BarKind::Pause => "#444444",
        }
    }

    fn label(self) -> &'static str {
        match self {
            BarKind::Hold => "lock held",
            BarKind::Window => "unprotected read → write",
            BarKind::Attempt => "optimistic attempt (won)",
            BarKind::Conflict => "optimistic attempt (lost)",
            BarKind::Pause => "process stopped (--pause)",
        }
    }

    fn class(self) -> &'static str {
        match self {
            BarKind::Hold => "hold",
            BarKind::Window => "window",
            BarKind::Attempt => "attempt",
            BarKind::Conflict => "conflict",
            BarKind::Pause => "pause",
        }
    }
}

/// One bar: `[start_us, end_us]` since the common start.
#[derive(Clone, Copy, Debug)]
pub struct Bar {
    /// What it shows.
    pub kind: BarKind,
    /// Start, µs.
    pub start_us: u64,
    /// End, µs.
    pub end_us: u64,
}

/// One buyer's bars and order.
#[derive(Clone, Debug)]
pub struct Track {
    /// Worker process index (0-based), i.e. the lane.
    pub process: usize,
    /// Buyer id.
    pub buyer: u64,
    /// Its bars.
    pub bars: Vec<Bar>,
    /// Its marked moments, µs.
    pub marks: Vec<(MarkKind, u64)>,
    /// When its order was created (µs) and whether that order was beyond the stock.
    pub order: Option<(u64, bool)>,
}

/// One strategy.
#[derive(Clone, Debug)]
pub struct Block {
    /// Strategy name (also the `data-strategy` attribute).
    pub strategy: String,
    /// Title line.
    pub title: String,
    /// Number of lanes.
    pub processes: usize,
    /// Every buyer.
    pub tracks: Vec<Track>,
}

const RED: &str = "#d62728";
const GREEN: &str = "#2ca02c";
const KINDS: [BarKind; 5] = [
    BarKind::Hold,
    BarKind::Window,
    BarKind::Attempt,
    BarKind::Conflict,
    BarKind::Pause,
];
/// Radius of a mark's dot.
const MARK: f64 = 4.0;

/// Renders the blocks as a standalone SVG document (starts with `<svg`).
pub fn render(blocks: &[Block]) -> String {
    let mut keys: Vec<svg::Key> = KINDS
        .into_iter()
        .map(|k| svg::Key::Bar(k.color(), k.label()))
        .collect();
    keys.push(svg::Key::Dot(GREEN, 2.5, "order"));
    keys.push(svg::Key::Dot(RED, 3.5, "oversold order (beyond the stock)"));
    keys.extend(
        MarkKind::ALL
            .into_iter()
            .map(|m| svg::Key::Dot(m.color(), MARK, m.label())),
    );
    let legend = svg::Legend {
        keys,
        note: "time since the common start →  one lane per worker process; overlapping buyers of a process get their own rows".into(),
    };
    let blocks: Vec<svg::Block> = blocks.iter().map(block).collect();
    svg::render(&legend, &blocks)
}

fn block(b: &Block) -> svg::Block {
    svg::Block {
        data: ("strategy", b.strategy.clone()),
        title: b.title.clone(),
        lanes: (1..=b.processes.max(1))
            .map(|p| format!("process {p}"))
            .collect(),
        tracks: b
            .tracks
            .iter()
            .map(|t| svg::Track {
                lane: t.process,
                bars: t
                    .bars
                    .iter()
                    .map(|bar| svg::Bar {
                        class: bar.kind.class(),
                        color: bar.kind.color(),
                        start_us: bar.start_us,
                        end_us: bar.end_us,
                        title: format!(
                            "buyer {}: {} {}–{}",
                            t.buyer,
                            bar.kind.label(),
                            svg::ms(bar.start_us),
                            svg::ms(bar.end_us)
                        ),
                    })
                    .collect(),
                dots: t
                    .order
                    .map(|(at, oversold)| svg::Dot {
                        class: if oversold { "order oversold" } else { "order" },
                        color: if oversold { RED } else { GREEN },
                        radius: if oversold { 3.5 } else { 2.5 },
                        at_us: at,
                        title: format!(
                            "buyer {}: order at {}{}",
                            t.buyer,
                            svg::ms(at),
                            if oversold { " (oversold)" } else { "" }
                        ),
                    })
                    .into_iter()
                    .chain(t.marks.iter().map(|&(kind, at)| svg::Dot {
                        class: kind.class(),
                        color: kind.color(),
                        radius: MARK,
                        at_us: at,
                        title: format!("buyer {}: {} at {}", t.buyer, kind.label(), svg::ms(at)),
                    }))
                    .collect(),
            })
            .collect(),
        bands: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_shape() {
        let bar = |s, e| Bar {
            kind: BarKind::Window,
            start_us: s,
            end_us: e,
        };
        let block = Block {
            strategy: "none".into(),
            title: "none <&>".into(),
            processes: 2,
            tracks: vec![
                Track {
                    process: 0,
                    buyer: 0,
                    bars: vec![bar(0, 5000)],
                    marks: vec![],
                    order: Some((5100, false)),
                },
                Track {
                    process: 0,
                    buyer: 1,
                    bars: vec![bar(10, 5000)],
                    marks: vec![(MarkKind::Rejected, 5150)],
                    order: Some((5200, true)),
                },
            ],
        };
        let svg = render(&[block]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches(r#"class="lane""#).count(), 2);
        assert_eq!(svg.matches("order oversold").count(), 1);
        assert_eq!(svg.matches(r#"class="mark rejected""#).count(), 1);
        assert!(svg.contains("none &lt;&amp;&gt;"));
    }
}
