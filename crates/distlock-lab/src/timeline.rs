//! The `seckill --timeline FILE.svg` picture: per strategy a block with one lane per worker
//! process, a bar per lock hold (or unprotected read → write window, or optimistic attempt),
//! a dot per order — red for the orders beyond the initial stock —, the pause of a stopped
//! buyer (`--pause`) with the end of its lease and its late write (landed or rejected by the
//! fence), and a legend on top.
//!
//! Buyers whose bars overlap in time (`none`: all of them) get their own row inside the lane,
//! so a lane is as tall as its largest number of simultaneous buyers: a lane of one row is a
//! process whose buyers never overlapped.

use std::fmt::Write;

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

/// A moment of a buyer's life marked with a symbol.
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
    fn label(self) -> &'static str {
        match self {
            MarkKind::LeaseLost => "lease lost",
            MarkKind::LateWrite => "late write landed",
            MarkKind::Rejected => "write rejected by the fence",
        }
    }

    fn class(self) -> &'static str {
        match self {
            MarkKind::LeaseLost => "lease-lost",
            MarkKind::LateWrite => "late-write",
            MarkKind::Rejected => "rejected",
        }
    }

    /// The symbol, centred on (`x`, `y`).
    fn shape(self, x: f64, y: f64) -> String {
        match self {
            MarkKind::LeaseLost => format!(
                r#"<path d="M{:.1},{:.1} v{:.1}" stroke="{RED}" stroke-width="2""#,
                x,
                y - 5.0,
                10.0
            ),
            MarkKind::LateWrite => format!(
                r#"<path d="M{:.1},{:.1} l4,7 h-8 z" fill="{RED}""#,
                x,
                y - 4.0
            ),
            MarkKind::Rejected => format!(
                r#"<path d="M{:.1},{:.1} l7,7 m0,-7 l-7,7" stroke="{GREEN}" stroke-width="2""#,
                x - 3.5,
                y - 3.5
            ),
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

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 24.0;
const ROW: f64 = 7.0;
const BAR: f64 = 5.0;
const LANE_PAD: f64 = 4.0;
const LANE_GAP: f64 = 3.0;
const TITLE: f64 = 22.0;
const AXIS: f64 = 18.0;
const BLOCK_GAP: f64 = 20.0;
const LEGEND: f64 = 40.0;
const RED: &str = "#d62728";
const GREEN: &str = "#2ca02c";

/// Escapes text for XML.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

/// A tick step (1, 2 or 5 × 10ⁿ µs) giving about eight ticks over `span_us`.
fn tick_step(span_us: u64) -> u64 {
    let raw = (span_us as f64 / 8.0).max(1.0);
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (step as u64).max(1)
}

/// Extent of a track in µs.
fn extent(t: &Track) -> Option<(u64, u64)> {
    let marks = || t.marks.iter().map(|m| m.1);
    let starts = t
        .bars
        .iter()
        .map(|b| b.start_us)
        .chain(t.order.map(|o| o.0))
        .chain(marks());
    let ends = t
        .bars
        .iter()
        .map(|b| b.end_us)
        .chain(t.order.map(|o| o.0))
        .chain(marks());
    Some((starts.min()?, ends.max()?))
}

/// Renders the blocks as a standalone SVG document (starts with `<svg`).
pub fn render(blocks: &[Block]) -> String {
    let plot = WIDTH - LEFT - RIGHT;
    let mut body = String::new();
    let mut y = LEGEND;
    for block in blocks {
        y += render_block(&mut body, block, y, plot);
        y += BLOCK_GAP;
    }
    let height = y.ceil();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    legend(&mut s);
    s.push_str(&body);
    s.push_str("</svg>\n");
    s
}

fn legend(s: &mut String) {
    let _ = writeln!(s, r#"<g class="legend" transform="translate({LEFT},12)">"#);
    let mut x = 0.0;
    for kind in [
        BarKind::Hold,
        BarKind::Window,
        BarKind::Attempt,
        BarKind::Conflict,
        BarKind::Pause,
    ] {
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="0" width="18" height="{BAR}" fill="{}"/><text x="{}" y="6">{}</text>"#,
            kind.color(),
            x + 22.0,
            esc(kind.label())
        );
        x += 30.0 + kind.label().chars().count() as f64 * 5.6;
    }
    let _ = writeln!(
        s,
        r#"<circle cx="{}" cy="3" r="2.5" fill="{GREEN}"/><text x="{}" y="6">order</text>"#,
        x + 4.0,
        x + 12.0
    );
    x += 52.0;
    let _ = writeln!(
        s,
        r#"<circle cx="{}" cy="3" r="3.5" fill="{RED}"/><text x="{}" y="6">oversold order (beyond the stock)</text>"#,
        x + 4.0,
        x + 12.0
    );
    x += 200.0;
    for kind in [MarkKind::LeaseLost, MarkKind::LateWrite, MarkKind::Rejected] {
        let _ = writeln!(
            s,
            r#"{}/><text x="{}" y="6">{}</text>"#,
            kind.shape(x + 4.0, 3.0),
            x + 12.0,
            esc(kind.label())
        );
        x += 24.0 + kind.label().chars().count() as f64 * 5.6;
    }
    let _ = writeln!(
        s,
        r##"<text x="0" y="22" fill="#555">time since the common start →  one lane per worker process; overlapping buyers of a process get their own rows</text>"##
    );
    s.push_str("</g>\n");
}

/// Draws one block at `y0`; returns its height.
fn render_block(s: &mut String, block: &Block, y0: f64, plot: f64) -> f64 {
    let span_us = block
        .tracks
        .iter()
        .filter_map(extent)
        .map(|(_, e)| e)
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = plot / span_us as f64;
    let x = |us: u64| LEFT + us as f64 * scale;

    // Rows inside each lane: first-fit by pixel extent.
    let mut order: Vec<usize> = (0..block.tracks.len()).collect();
    order.sort_by_key(|&i| extent(&block.tracks[i]).map_or(0, |e| e.0));
    let mut lane_rows: Vec<Vec<f64>> = vec![Vec::new(); block.processes.max(1)];
    let mut row_of = vec![0usize; block.tracks.len()];
    for &i in &order {
        let t = &block.tracks[i];
        let Some((a, b)) = extent(t) else { continue };
        let Some(rows) = lane_rows.get_mut(t.process) else {
            continue;
        };
        let (xa, xb) = (x(a), x(b).max(x(a) + 3.0));
        let row = match rows.iter().position(|end| *end <= xa + 0.5) {
            Some(r) => r,
            None => {
                rows.push(0.0);
                rows.len() - 1
            }
        };
        rows[row] = xb;
        row_of[i] = row;
    }

    let _ = writeln!(
        s,
        r#"<g class="block" data-strategy="{}" transform="translate(0,{y0})">"#,
        esc(&block.strategy)
    );
    let _ = writeln!(
        s,
        r#"<text class="title" x="{LEFT}" y="14" font-size="13" font-weight="bold">{}</text>"#,
        esc(&block.title)
    );
    let lanes_top = TITLE + AXIS;
    let mut lane_y = Vec::with_capacity(lane_rows.len());
    let mut y = lanes_top;
    for rows in &lane_rows {
        lane_y.push(y);
        y += rows.len().max(1) as f64 * ROW + 2.0 * LANE_PAD + LANE_GAP;
    }
    let bottom = y;

    // Axis and grid.
    let step = tick_step(span_us);
    let mut t = 0;
    while t <= span_us {
        let tx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{tx:.1}" y1="{}" x2="{tx:.1}" y2="{bottom}" stroke="#e4e4e4"/><text x="{tx:.1}" y="{}" text-anchor="middle" fill="#555">{}</text>"##,
            lanes_top - 3.0,
            lanes_top - 6.0,
            esc(&axis_label(t, step))
        );
        t += step;
    }

    for (p, rows) in lane_rows.iter().enumerate() {
        let ly = lane_y[p];
        let h = rows.len().max(1) as f64 * ROW + 2.0 * LANE_PAD;
        let _ = writeln!(s, r#"<g class="lane" data-process="{}">"#, p + 1);
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{ly}" width="{plot}" height="{h}" fill="#f6f6f6"/><text x="{}" y="{}" text-anchor="end">process {}</text>"##,
            LEFT - 6.0,
            ly + h / 2.0 + 4.0,
            p + 1
        );
        for (i, tr) in block.tracks.iter().enumerate() {
            if tr.process != p {
                continue;
            }
            let ry = ly + LANE_PAD + row_of[i] as f64 * ROW;
            for b in &tr.bars {
                let bx = x(b.start_us);
                // A 1 px gap keeps back-to-back bars (retries) apart.
                let w = x(b.end_us) - bx;
                let bw = if w > 3.0 { w - 1.0 } else { w.max(1.0) };
                let _ = writeln!(
                    s,
                    r#"<rect class="{}" x="{bx:.1}" y="{ry:.1}" width="{bw:.1}" height="{BAR}" fill="{}"><title>buyer {}: {} {}–{}</title></rect>"#,
                    b.kind.class(),
                    b.kind.color(),
                    tr.buyer,
                    esc(b.kind.label()),
                    ms(b.start_us),
                    ms(b.end_us)
                );
            }
            for &(kind, at) in &tr.marks {
                let _ = writeln!(
                    s,
                    r#"<g class="mark {}">{}><title>buyer {}: {} at {}</title></path></g>"#,
                    kind.class(),
                    kind.shape(x(at), ry + BAR / 2.0),
                    tr.buyer,
                    esc(kind.label()),
                    ms(at)
                );
            }
            if let Some((at, oversold)) = tr.order {
                let (class, r, fill) = if oversold {
                    ("order oversold", 3.5, RED)
                } else {
                    ("order", 2.5, GREEN)
                };
                let _ = writeln!(
                    s,
                    r#"<circle class="{class}" cx="{:.1}" cy="{:.1}" r="{r}" fill="{fill}"><title>buyer {}: order at {}{}</title></circle>"#,
                    x(at),
                    ry + BAR / 2.0,
                    tr.buyer,
                    ms(at),
                    if oversold { " (oversold)" } else { "" }
                );
            }
        }
        s.push_str("</g>\n");
    }
    s.push_str("</g>\n");
    bottom
}

fn axis_label(t: u64, step: u64) -> String {
    if step >= 1000 {
        format!("{} ms", t / 1000)
    } else {
        format!("{:.1} ms", t as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks() {
        assert_eq!(tick_step(8_000), 1_000);
        assert_eq!(tick_step(80_000), 10_000);
        assert_eq!(tick_step(100_000), 20_000);
        assert_eq!(tick_step(1), 1);
    }

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
