//! The server-side state of a [`Snapshot`] in the Prometheus text format (version 0.0.4).

use crate::model::Snapshot;
use crate::monitor::RefreshStats;
use std::fmt::Write as _;

/// The series `dlock serve` adds to the client metrics on `/metrics`: name, type, help.
/// Per-name series (`…_by_name`) are written only for the names asked for.
pub const SERIES: &[(&str, &str, &str)] = &[
    (
        "dlock_locks_listed",
        "gauge",
        "Locks the backend has state for under the watched prefix (held, waited for, or with a fencing counter).",
    ),
    ("dlock_locks_held", "gauge", "Locks held by at least one holder."),
    (
        "dlock_lock_waiters",
        "gauge",
        "Waiters queued on the server, over all locks (backends that keep a queue).",
    ),
    (
        "dlock_lock_oldest_wait_seconds",
        "gauge",
        "The longest wait of any queued waiter (0 when nobody waits).",
    ),
    (
        "dlock_observe_refreshes_total",
        "counter",
        "Looks at the backend, by result (ok, error).",
    ),
    (
        "dlock_observe_refresh_seconds",
        "gauge",
        "How long the last successful look took.",
    ),
    (
        "dlock_lock_held_by_name",
        "gauge",
        "1 when the lock is held, 0 when free (only the names given with --metrics-names).",
    ),
    (
        "dlock_lock_waiters_by_name",
        "gauge",
        "Waiters queued on the lock (only the names given with --metrics-names).",
    ),
    (
        "dlock_lock_oldest_wait_seconds_by_name",
        "gauge",
        "The longest wait on the lock (only the names given with --metrics-names).",
    ),
    (
        "dlock_lock_fencing_token_by_name",
        "gauge",
        "The last fencing token issued for the lock (only the names given with --metrics-names).",
    ),
];

/// A label value escaped for the text format (backslash, double quote, line feed).
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn head(out: &mut String, name: &str) {
    if let Some((_, ty, help)) = SERIES.iter().find(|(n, _, _)| *n == name) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {ty}");
    }
}

/// The series of [`SERIES`] for `snap` (taken from a backend of kind `snap.backend`) and the
/// refresh statistics `stats`; the per-name series for the locks in `names` only (a bounded
/// set, so a scrape stays small whatever the number of locks). `snap` is `None` before the
/// first successful look.
pub fn render(
    snap: Option<&Snapshot>,
    stats: RefreshStats,
    backend: &str,
    names: &[String],
) -> String {
    let mut out = String::new();
    let b = escape(backend);
    if let Some(snap) = snap {
        let gauges: [(&str, f64); 4] = [
            ("dlock_locks_listed", snap.locks.len() as f64),
            ("dlock_locks_held", snap.held() as f64),
            ("dlock_lock_waiters", snap.waiters() as f64),
            (
                "dlock_lock_oldest_wait_seconds",
                snap.oldest_wait().map_or(0.0, |d| d.as_secs_f64()),
            ),
        ];
        for (name, v) in gauges {
            head(&mut out, name);
            let _ = writeln!(out, "{name}{{backend=\"{b}\"}} {v}");
        }
    }
    head(&mut out, "dlock_observe_refreshes_total");
    let _ = writeln!(
        out,
        "dlock_observe_refreshes_total{{backend=\"{b}\",result=\"ok\"}} {}",
        stats.ok
    );
    let _ = writeln!(
        out,
        "dlock_observe_refreshes_total{{backend=\"{b}\",result=\"error\"}} {}",
        stats.failed
    );
    head(&mut out, "dlock_observe_refresh_seconds");
    let _ = writeln!(
        out,
        "dlock_observe_refresh_seconds{{backend=\"{b}\"}} {}",
        stats.last_duration.as_secs_f64()
    );
    let Some(snap) = snap.filter(|_| !names.is_empty()) else {
        return out;
    };
    type Value = fn(Option<&crate::LockRow>) -> f64;
    let by_name: [(&str, Value); 4] = [
        ("dlock_lock_held_by_name", |r| {
            f64::from(u8::from(r.is_some_and(|r| r.held)))
        }),
        ("dlock_lock_waiters_by_name", |r| {
            f64::from(r.and_then(|r| r.waiters).unwrap_or(0))
        }),
        ("dlock_lock_oldest_wait_seconds_by_name", |r| {
            r.and_then(crate::LockRow::oldest_wait)
                .map_or(0.0, |d| d.as_secs_f64())
        }),
        ("dlock_lock_fencing_token_by_name", |r| {
            r.map_or(0.0, |r| r.fencing_token as f64)
        }),
    ];
    for (series, value) in by_name {
        head(&mut out, series);
        for name in names {
            let _ = writeln!(
                out,
                "{series}{{backend=\"{b}\",name=\"{}\"}} {}",
                escape(name),
                value(snap.get(name))
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
