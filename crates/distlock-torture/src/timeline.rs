//! SVG timelines: blocks of lanes (one per worker process), bars (a hold, a wait, a window),
//! dots (an order, a refused write, a kill) and bands (a nemesis over a lane or the whole
//! block, a violation), with a legend on top. Pure drawing, no I/O: `dlock torture
//! --timeline` and the lab's `seckill --timeline` map their runs onto it.
//!
//! Tracks whose bars overlap in time within one lane get their own rows inside the lane, so a
//! lane is as tall as its largest number of simultaneous tracks.

use std::fmt::Write;

/// One bar: `[start_us, end_us]` on the block's time axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    /// Its CSS class (what it shows, for scripts reading the SVG).
    pub class: &'static str,
    /// Fill colour.
    pub color: &'static str,
    /// Start, µs.
    pub start_us: u64,
    /// End, µs.
    pub end_us: u64,
    /// Tooltip.
    pub title: String,
}

/// One dot at a moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Dot {
    /// Its CSS class.
    pub class: &'static str,
    /// Fill colour.
    pub color: &'static str,
    /// Radius, px.
    pub radius: f64,
    /// When, µs.
    pub at_us: u64,
    /// Tooltip.
    pub title: String,
}

/// What one actor (a buyer, an attempt) did, in one lane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Track {
    /// The lane (0-based).
    pub lane: usize,
    /// Its bars.
    pub bars: Vec<Bar>,
    /// Its dots, drawn on its row.
    pub dots: Vec<Dot>,
}

/// A translucent band over a time span: of one lane, or of the whole block.
#[derive(Clone, Debug, PartialEq)]
pub struct Band {
    /// The lane, or `None` for every lane.
    pub lane: Option<usize>,
    /// Its CSS class.
    pub class: &'static str,
    /// Fill colour (drawn at 25% opacity, with a solid outline for a span under 2 px).
    pub color: &'static str,
    /// Start, µs.
    pub from_us: u64,
    /// End, µs.
    pub to_us: u64,
    /// Tooltip.
    pub title: String,
}

/// One block: a title and its lanes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    /// `(name, value)` of the block's data attribute (`data-strategy="lock"`).
    pub data: (&'static str, String),
    /// Title line.
    pub title: String,
    /// The lanes' labels, top to bottom.
    pub lanes: Vec<String>,
    /// Every track.
    pub tracks: Vec<Track>,
    /// Bands, drawn under the bars.
    pub bands: Vec<Band>,
}

/// A legend entry.
#[derive(Clone, Debug, PartialEq)]
pub enum Key {
    /// A bar of this colour.
    Bar(&'static str, &'static str),
    /// A dot of this colour and radius.
    Dot(&'static str, f64, &'static str),
    /// A band of this colour.
    Band(&'static str, &'static str),
}

/// The legend: entries and a line of explanation under them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Legend {
    /// Entries, left to right.
    pub keys: Vec<Key>,
    /// The line under them.
    pub note: String,
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

/// Escapes text for XML.
pub fn esc(s: &str) -> String {
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

/// `µs` as milliseconds with one decimal, for tooltips.
pub fn ms(us: u64) -> String {
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
    let starts = t
        .bars
        .iter()
        .map(|b| b.start_us)
        .chain(t.dots.iter().map(|d| d.at_us));
    let ends = t
        .bars
        .iter()
        .map(|b| b.end_us)
        .chain(t.dots.iter().map(|d| d.at_us));
    Some((starts.min()?, ends.max()?))
}

/// Renders the blocks as a standalone SVG document (starts with `<svg`).
pub fn render(legend: &Legend, blocks: &[Block]) -> String {
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
    render_legend(&mut s, legend);
    s.push_str(&body);
    s.push_str("</svg>\n");
    s
}

fn render_legend(s: &mut String, legend: &Legend) {
    let _ = writeln!(s, r#"<g class="legend" transform="translate({LEFT},12)">"#);
    let mut x = 0.0;
    for key in &legend.keys {
        let label = match key {
            Key::Bar(color, label) => {
                let _ = write!(
                    s,
                    r#"<rect x="{x}" y="0" width="18" height="{BAR}" fill="{color}"/>"#
                );
                label
            }
            Key::Band(color, label) => {
                let _ = write!(
                    s,
                    r#"<rect x="{x}" y="-2" width="18" height="9" fill="{color}" fill-opacity="0.25"/>"#
                );
                label
            }
            Key::Dot(color, r, label) => {
                let _ = write!(
                    s,
                    r#"<circle cx="{}" cy="3" r="{r}" fill="{color}"/>"#,
                    x + 9.0
                );
                label
            }
        };
        let _ = writeln!(s, r#"<text x="{}" y="6">{}</text>"#, x + 22.0, esc(label));
        x += 30.0 + label.chars().count() as f64 * 5.6;
    }
    let _ = writeln!(
        s,
        r##"<text x="0" y="22" fill="#555">{}</text>"##,
        esc(&legend.note)
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
        .chain(block.bands.iter().map(|b| b.to_us))
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = plot / span_us as f64;
    let x = |us: u64| LEFT + us.min(span_us) as f64 * scale;

    // Rows inside each lane: first-fit by pixel extent.
    let mut order: Vec<usize> = (0..block.tracks.len()).collect();
    order.sort_by_key(|&i| extent(&block.tracks[i]).map_or(0, |e| e.0));
    let mut lane_rows: Vec<Vec<f64>> = vec![Vec::new(); block.lanes.len().max(1)];
    let mut row_of = vec![0usize; block.tracks.len()];
    for &i in &order {
        let t = &block.tracks[i];
        let Some((a, b)) = extent(t) else { continue };
        let Some(rows) = lane_rows.get_mut(t.lane) else {
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
        r#"<g class="block" data-{}="{}" transform="translate(0,{y0})">"#,
        block.data.0,
        esc(&block.data.1)
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
    let lane_h = |p: usize| lane_rows[p].len().max(1) as f64 * ROW + 2.0 * LANE_PAD;

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

    for (p, label) in block.lanes.iter().enumerate() {
        let ly = lane_y[p];
        let h = lane_h(p);
        let _ = writeln!(s, r#"<g class="lane" data-lane="{}">"#, p + 1);
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{ly}" width="{plot}" height="{h}" fill="#f6f6f6"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            LEFT - 6.0,
            ly + h / 2.0 + 4.0,
            esc(label)
        );
        for b in block.bands.iter().filter(|b| b.lane == Some(p)) {
            band(s, b, &x, ly, h);
        }
        for (i, tr) in block.tracks.iter().enumerate() {
            if tr.lane != p {
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
                    r#"<rect class="{}" x="{bx:.1}" y="{ry:.1}" width="{bw:.1}" height="{BAR}" fill="{}"><title>{}</title></rect>"#,
                    b.class,
                    b.color,
                    esc(&b.title)
                );
            }
            for d in &tr.dots {
                let _ = writeln!(
                    s,
                    r#"<circle class="{}" cx="{:.1}" cy="{:.1}" r="{}" fill="{}"><title>{}</title></circle>"#,
                    d.class,
                    x(d.at_us),
                    ry + BAR / 2.0,
                    d.radius,
                    d.color,
                    esc(&d.title)
                );
            }
        }
        s.push_str("</g>\n");
    }
    for b in block.bands.iter().filter(|b| b.lane.is_none()) {
        band(s, b, &x, lanes_top, bottom - lanes_top);
    }
    s.push_str("</g>\n");
    bottom
}

fn band(s: &mut String, b: &Band, x: &impl Fn(u64) -> f64, y: f64, h: f64) {
    let bx = x(b.from_us);
    let w = x(b.to_us) - bx;
    let outline = if w < 2.0 {
        format!(r#" stroke="{}" stroke-width="1""#, b.color)
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        r#"<rect class="{}" x="{bx:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}" fill-opacity="0.25"{outline}><title>{}</title></rect>"#,
        b.class,
        w.max(1.0),
        b.color,
        esc(&b.title)
    );
}

fn axis_label(t: u64, step: u64) -> String {
    if step >= 1_000_000 {
        format!("{} s", t as f64 / 1e6)
    } else if step >= 1000 {
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
        assert_eq!(axis_label(2_000_000, 1_000_000), "2 s");
    }

    #[test]
    fn svg_shape() {
        let bar = |s, e| Bar {
            class: "hold",
            color: "#1f77b4",
            start_us: s,
            end_us: e,
            title: "a <hold>".into(),
        };
        let block = Block {
            data: ("run", "x".into()),
            title: "x <&>".into(),
            lanes: vec!["w0".into(), "w1".into()],
            tracks: vec![
                Track {
                    lane: 0,
                    bars: vec![bar(0, 5000)],
                    dots: vec![],
                },
                Track {
                    lane: 0,
                    bars: vec![bar(10, 5000)],
                    dots: vec![Dot {
                        class: "kill",
                        color: "black",
                        radius: 3.0,
                        at_us: 5000,
                        title: "killed".into(),
                    }],
                },
            ],
            bands: vec![
                Band {
                    lane: Some(1),
                    class: "nemesis",
                    color: "#9467bd",
                    from_us: 100,
                    to_us: 200,
                    title: "pause".into(),
                },
                Band {
                    lane: None,
                    class: "violation",
                    color: "#d62728",
                    from_us: 300,
                    to_us: 300,
                    title: "overlap".into(),
                },
            ],
        };
        let legend = Legend {
            keys: vec![Key::Bar("#1f77b4", "held"), Key::Dot("black", 3.0, "kill")],
            note: "time →".into(),
        };
        let svg = render(&legend, &[block]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<g").count(), svg.matches("</g>").count());
        assert_eq!(svg.matches(r#"class="lane""#).count(), 2);
        assert_eq!(svg.matches(r#"class="hold""#).count(), 2);
        assert!(svg.contains(r#"data-run="x""#));
        assert!(svg.contains("x &lt;&amp;&gt;") && svg.contains("a &lt;hold&gt;"));
        // The instant violation is drawn at least 1 px wide, outlined.
        assert!(svg.contains(r#"class="violation""#) && svg.contains("stroke="));
    }
}
