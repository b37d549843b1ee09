//! `--json` of `dlock run` and `dlock elect`: one JSON object on the last line of stdout,
//! after everything the command printed.
//!
//! Fields (all always present; `null` where they do not apply):
//! - `name`: the lock's (or election's) name; `kind`: `mutex`, `fair`, `read`, `write`,
//!   `semaphore` or `election`;
//! - `outcome`: `ran` (the command ran under the lock and ended; `exit_code` is its status),
//!   `lost` (the lock was lost before the command ended), `not_acquired` (held elsewhere for
//!   the whole wait, or on the one try of -n), `unreachable` (the lock service could not be
//!   reached), `error` (anything else: bad input, the command could not be started…);
//! - `exit_code`: dlock's exit status; `command_status`: the command's own (128+N for signal
//!   N), when it ran to its end;
//! - `owner`, `fencing_token`: the holder dlock was, when it acquired;
//! - `waited_ms`: from dlock's start to the grant (or to giving up); `held_ms`: from the grant
//!   to the release.

use crate::run::Ran;
use serde_json::{json, Value};
use std::time::Instant;

/// What the final object says, gathered as dlock goes.
pub(crate) struct JsonReport {
    /// `--json` given: print at the end; otherwise print nothing.
    on: bool,
    started: Instant,
    name: String,
    kind: &'static str,
    conflict_exit: u8,
    acquired: Option<(Instant, String, u64)>,
}

impl JsonReport {
    /// A report for lock (or election) `name` of `kind`, printed only when `on`;
    /// `conflict_exit` is the exit code of "not acquired" (-E).
    pub(crate) fn new(on: bool, name: &str, kind: &'static str, conflict_exit: u8) -> Self {
        JsonReport {
            on,
            started: Instant::now(),
            name: name.to_owned(),
            kind,
            conflict_exit,
            acquired: None,
        }
    }

    /// The lock was acquired as `owner` with `fencing_token`.
    pub(crate) fn acquired(&mut self, owner: &str, fencing_token: u64) {
        self.acquired = Some((Instant::now(), owner.to_owned(), fencing_token));
    }

    /// Prints the object for dlock giving up with `code` before any command ran; returns
    /// `code`.
    pub(crate) fn gave_up(&self, code: u8) -> u8 {
        let outcome = if code == self.conflict_exit {
            "not_acquired"
        } else if code == crate::EXIT_UNREACHABLE {
            "unreachable"
        } else {
            "error"
        };
        self.print(outcome, code, None);
        code
    }

    /// Prints the object for a supervised command that went as `ran`; returns its code.
    pub(crate) fn ran(&self, ran: Ran) -> u8 {
        let outcome = if ran.lost {
            "lost"
        } else if ran.status.is_some() {
            "ran"
        } else {
            "error"
        };
        self.print(outcome, ran.code, ran.status);
        ran.code
    }

    fn print(&self, outcome: &str, code: u8, status: Option<u8>) {
        if !self.on {
            return;
        }
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (waited, held, owner, token) = match &self.acquired {
            Some((at, owner, token)) => (
                at.duration_since(self.started),
                Some(ms(at.elapsed())),
                Some(owner.as_str()),
                Some(*token),
            ),
            None => (self.started.elapsed(), None, None, None),
        };
        let v: Value = json!({
            "name": self.name,
            "kind": self.kind,
            "outcome": outcome,
            "exit_code": code,
            "command_status": status,
            "owner": owner,
            "fencing_token": token,
            "waited_ms": ms(waited),
            "held_ms": held,
        });
        println!("{v}");
    }
}
