//! Snapshots as plain text: the frame of `dlock top` (and `--once`) and one lock's detail.

use crate::model::{HolderRow, LockRow, Snapshot, Sort};
use std::fmt::Write as _;
use std::time::Duration;

/// A duration in a table cell: `850ms`, `12.3s`, `5m02s`, `2h05m`, `3d04h`.
///
/// ```
/// use distlock_observe::short;
/// use std::time::Duration;
/// assert_eq!(short(Duration::from_millis(12_345)), "12.3s");
/// assert_eq!(short(Duration::from_secs(302)), "5m02s");
/// ```
pub fn short(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        _ if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ if s < 86_400 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{:02}h", s / 86_400, s / 3600 % 24),
    }
}

fn ms_cell(ms: Option<u64>, at_least: bool) -> String {
    match ms {
        None => "-".to_owned(),
        // Already there at the first look, and seen once: how long is unknown.
        Some(0) if at_least => "?".to_owned(),
        Some(ms) => {
            let d = short(Duration::from_millis(ms));
            if at_least {
                format!("≥{d}")
            } else {
                d
            }
        }
    }
}

fn lease_cell(h: &HolderRow) -> String {
    h.lease_left_ms.map_or_else(
        || "session".to_owned(),
        |ms| short(Duration::from_millis(ms)),
    )
}

/// `owner` (`(+N)` when there are more holders).
fn holder_cell(r: &LockRow) -> String {
    match r.holders.first() {
        None => "-".to_owned(),
        Some(h) if r.holders.len() == 1 => h.owner.clone(),
        Some(h) => format!("{} (+{})", h.owner, r.holders.len() - 1),
    }
}

/// The columns of the frame: header and the cell of a row.
const COLUMNS: [&str; 10] = [
    "NAME",
    "KIND",
    "HOLDER",
    "HOST",
    "PID",
    "HELD FOR",
    "LEASE LEFT",
    "TOKEN",
    "WAITERS",
    "OLDEST WAIT",
];

fn cells(r: &LockRow) -> [String; 10] {
    let h = r.holders.first();
    [
        r.name.clone(),
        r.kind.to_owned(),
        holder_cell(r),
        h.and_then(|h| h.host.clone()).unwrap_or_else(|| "-".into()),
        h.and_then(|h| h.pid)
            .map_or_else(|| "-".into(), |p| p.to_string()),
        h.map_or_else(
            || "-".into(),
            |h| ms_cell(Some(h.held_for_ms), h.held_for_at_least),
        ),
        h.map_or_else(|| "-".into(), lease_cell),
        r.fencing_token.to_string(),
        r.waiters.map_or_else(|| "?".into(), |w| w.to_string()),
        ms_cell(r.oldest_wait_ms, r.oldest_wait_at_least),
    ]
}

/// The summary line of a snapshot: backend, counts, order.
pub fn title(snap: &Snapshot, sort: Sort) -> String {
    let mut t = format!(
        "dlock top: {} ({}): {} locks, {} held, {} waiting",
        snap.backend,
        snap.endpoint,
        snap.locks.len(),
        snap.held(),
        snap.waiters()
    );
    if let Some(w) = snap.oldest_wait() {
        let _ = write!(t, ", oldest wait {}", short(w));
    }
    let _ = write!(t, "; by {}", sort.as_str());
    t
}

/// The table of `snap` (header and one line per lock, in its order), each line cut to
/// `width` characters; `selected` marks one row with `>` (the terminal view).
pub fn table(snap: &Snapshot, width: usize, selected: Option<usize>) -> Vec<String> {
    let rows: Vec<[String; 10]> = snap.locks.iter().map(cells).collect();
    let mut widths = COLUMNS.map(|c| c.chars().count());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    // Long names and owners are cut so the numbers stay on screen.
    widths[0] = widths[0].min(40);
    widths[2] = widths[2].min(40);
    let line = |cells: &[String], mark: bool| {
        let mut s = String::from(if mark { "> " } else { "  " });
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            let cut: String = c.chars().take(w).collect();
            // Numbers right-aligned, text left-aligned.
            if i >= 4 && i != 5 && i != 6 && i != 9 {
                let _ = write!(s, "{cut:>w$}  ");
            } else {
                let _ = write!(s, "{cut:<w$}  ");
            }
        }
        let s = s.trim_end().to_owned();
        s.chars().take(width).collect::<String>()
    };
    let header: Vec<String> = COLUMNS.iter().map(|c| (*c).to_owned()).collect();
    let mut out = vec![line(&header, false)];
    for (i, r) in rows.iter().enumerate() {
        out.push(line(r, selected == Some(i)));
    }
    out
}

/// One frame of `dlock top` as plain text (`--once`): the title, the table, lines cut to
/// `width` characters.
pub fn frame(snap: &Snapshot, width: usize) -> String {
    frame_sorted(snap, Sort::Contention, width)
}

/// [`frame`] naming the order the rows are in.
pub fn frame_sorted(snap: &Snapshot, sort: Sort, width: usize) -> String {
    let mut out = title(snap, sort);
    out.push('\n');
    for l in table(snap, width, None) {
        out += &l;
        out.push('\n');
    }
    if snap.locks.is_empty() {
        out += "  (no locks)\n";
    }
    out
}

/// One lock in full: its holders, then its queue in order.
pub fn detail(row: &LockRow) -> Vec<String> {
    let mut out = vec![format!(
        "lock {} ({}): {}, fencing token {}",
        row.name,
        row.kind,
        if row.held { "held" } else { "free" },
        row.fencing_token
    )];
    if let Some(p) = row.permits {
        let used: u32 = row.holders.iter().map(|h| h.count).sum();
        out.push(format!("permits: {used} of {p} in use"));
    }
    out.push(format!("holders ({}):", row.holders.len()));
    for h in &row.holders {
        let mut s = format!("  {}", h.owner);
        if let (Some(host), Some(pid)) = (&h.host, h.pid) {
            let _ = write!(s, "  host {host} pid {pid}");
        }
        if let Some(side) = h.side {
            let _ = write!(s, "  {side}");
        }
        if h.count > 1 {
            let _ = write!(s, "  ×{}", h.count);
        }
        let _ = write!(
            s,
            "  held {}  lease {}",
            ms_cell(Some(h.held_for_ms), h.held_for_at_least),
            lease_cell(h)
        );
        if let Some(v) = &h.value {
            let _ = write!(s, "  value {v:?}");
        }
        out.push(s);
    }
    match row.waiters {
        None => out.push("queue: not kept by this backend".to_owned()),
        Some(n) if row.queue.is_empty() && n > 0 => out.push(format!(
            "queue: {n} waiting (this backend does not name them), oldest {}",
            ms_cell(row.oldest_wait_ms, row.oldest_wait_at_least)
        )),
        Some(_) => {
            out.push(format!("queue ({}), first in line first:", row.queue.len()));
            for (i, w) in row.queue.iter().enumerate() {
                let mut s = format!("  {}. {}", i + 1, w.owner);
                if let (Some(host), Some(pid)) = (&w.host, w.pid) {
                    let _ = write!(s, "  host {host} pid {pid}");
                }
                if let Some(side) = w.side {
                    let _ = write!(s, "  wants {side}");
                }
                let _ = write!(s, "  waiting {}", ms_cell(w.waited_ms, false));
                out.push(s);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fit_a_cell() {
        assert_eq!(short(Duration::from_millis(0)), "0ms");
        assert_eq!(short(Duration::from_millis(999)), "999ms");
        assert_eq!(short(Duration::from_secs(60)), "1m00s");
        assert_eq!(short(Duration::from_secs(3600 * 2 + 300)), "2h05m");
        assert_eq!(short(Duration::from_secs(86_400 * 3 + 3600 * 4)), "3d04h");
    }
}
