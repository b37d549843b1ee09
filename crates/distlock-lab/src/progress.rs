//! A minimal progress bar on stderr, drawn only when stderr is a terminal.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const WIDTH: usize = 30;
const EVERY: Duration = Duration::from_millis(50);

/// One progress line, redrawn in place (at most every 50 ms) and erased by [`Progress::finish`].
pub struct Progress {
    enabled: bool,
    label: String,
    total: u64,
    last: Option<Instant>,
}

impl Progress {
    /// A bar for `total` steps; it draws only if `wanted` and stderr is a terminal.
    pub fn new(wanted: bool, label: impl Into<String>, total: u64) -> Self {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            label: label.into(),
            total,
            last: None,
        }
    }

    /// Shows `done` of the total steps, with `note` after the counts.
    pub fn set(&mut self, done: u64, note: &str) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if done < self.total && self.last.is_some_and(|t| now.duration_since(t) < EVERY) {
            return;
        }
        self.last = Some(now);
        let filled = if self.total == 0 {
            WIDTH
        } else {
            (done.min(self.total) as f64 / self.total as f64 * WIDTH as f64) as usize
        };
        let bar = format!("{}{}", "#".repeat(filled), "-".repeat(WIDTH - filled));
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{:<12} [{bar}] {done}/{} {note}",
            self.label, self.total
        );
        let _ = err.flush();
    }

    /// Erases the line.
    pub fn finish(&mut self) {
        if self.enabled && self.last.is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
        self.last = None;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
