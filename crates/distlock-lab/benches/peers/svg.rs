//! `--svg FILE`: the curves of one run as an SVG plot (no dependencies: lines and text).

use std::fmt::Write as _;

/// One line of a panel: its label, colour and points (x, y).
pub(super) struct Series {
    pub(super) label: String,
    pub(super) color: &'static str,
    pub(super) points: Vec<(f64, f64)>,
}

/// One chart: title, axis labels, whether the y axis is logarithmic, its lines.
pub(super) struct Panel {
    pub(super) title: String,
    pub(super) x_label: String,
    pub(super) y_label: String,
    pub(super) log_y: bool,
    pub(super) series: Vec<Series>,
}

const W: f64 = 460.0;
const H: f64 = 300.0;
const PAD_L: f64 = 70.0;
const PAD_R: f64 = 20.0;
const PAD_T: f64 = 40.0;
const PAD_B: f64 = 70.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round number of the axis for ticks: 1, 2 or 5 times a power of ten.
fn nice(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    let m = v / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

fn fmt_num(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn panel(out: &mut String, p: &Panel, ox: f64, oy: f64) {
    let pts = p.series.iter().flat_map(|s| s.points.iter().copied());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        if !p.log_y || y > 0.0 {
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (1.0, 10.0, 1.0, 10.0);
    }
    // x: logarithmic (clients, names, locks grow by factors).
    let (lx0, lx1) = (x0.max(1e-9).ln(), (x1.max(x0 * 1.0001)).ln());
    let (ly0, ly1) = if p.log_y {
        let lo = 10f64.powf(y0.max(1e-9).log10().floor());
        let hi = 10f64.powf(y1.max(lo * 1.0001).log10().ceil());
        (lo.log10(), hi.log10())
    } else {
        (0.0, nice(y1 * 1.05))
    };
    let pw = W - PAD_L - PAD_R;
    let ph = H - PAD_T - PAD_B;
    let sx = |x: f64| ox + PAD_L + (x.max(1e-9).ln() - lx0) / (lx1 - lx0).max(1e-9) * pw;
    let sy = |y: f64| {
        let v = if p.log_y { y.max(1e-9).log10() } else { y };
        oy + PAD_T + ph - (v - ly0) / (ly1 - ly0).max(1e-9) * ph
    };
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="14" font-weight="bold">{}</text>"#,
        ox + PAD_L,
        oy + 22.0,
        esc(&p.title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="{}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##,
        ox + PAD_L,
        oy + PAD_T
    );
    // y ticks.
    let ticks: Vec<f64> = if p.log_y {
        (ly0 as i32..=ly1 as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=5).map(|i| ly1 * i as f64 / 5.0).collect()
    };
    for t in ticks {
        let y = sy(t);
        let _ = writeln!(
            out,
            r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            ox + PAD_L,
            ox + PAD_L + pw,
            ox + PAD_L - 5.0,
            y + 4.0,
            fmt_num(t)
        );
    }
    // x ticks: the points' own x values.
    let mut xs: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| q.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
            sx(x),
            oy + PAD_T + ph + 15.0,
            fmt_num(x)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
        ox + PAD_L + pw / 2.0,
        oy + PAD_T + ph + 32.0,
        esc(&p.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="12" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
        ox + 16.0,
        oy + PAD_T + ph / 2.0,
        ox + 16.0,
        oy + PAD_T + ph / 2.0,
        esc(&p.y_label)
    );
    for (i, s) in p.series.iter().enumerate() {
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|q| !p.log_y || q.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            path.join(" "),
            s.color
        );
        for q in &path {
            let (x, y) = q.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                out,
                r#"<circle cx="{x}" cy="{y}" r="3" fill="{}"/>"#,
                s.color
            );
        }
        // Legend under the axis label.
        let lx = ox + PAD_L + (i % 3) as f64 * (pw / 3.0);
        let ly = oy + PAD_T + ph + 50.0 + (i / 3) as f64 * 14.0;
        let _ = writeln!(
            out,
            r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}" font-size="11">{}</text>"#,
            ly - 9.0,
            s.color,
            lx + 14.0,
            ly,
            esc(&s.label)
        );
    }
}

/// Panels two to a row, and `notes` (one line each) under them.
pub(super) fn plot(title: &str, panels: &[Panel], notes: &[String]) -> String {
    let rows = panels.len().div_ceil(2);
    let width = 2.0 * W;
    let height = 40.0 + rows as f64 * H + 20.0 + notes.len() as f64 * 16.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="20" y="26" font-size="16" font-weight="bold">{}</text>"#,
        esc(title)
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, (i % 2) as f64 * W, 40.0 + (i / 2) as f64 * H);
    }
    for (i, n) in notes.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<text x="20" y="{}" font-size="12">{}</text>"#,
            40.0 + rows as f64 * H + 16.0 * (i + 1) as f64,
            esc(n)
        );
    }
    out.push_str("</svg>\n");
    out
}
