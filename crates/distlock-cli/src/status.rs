//! The status of a wait: on a terminal, after about a second, one line on stderr redrawn
//! every second — how long dlock has waited, who holds the lock (owner, host, pid, how long
//! at least, its lease), how many wait in the queue where the backend keeps one — cleared
//! when the wait ends. Off a terminal, nothing; with `-v` (or `DLOCK_LOG`), a `still waiting`
//! event every ten seconds instead of the line.

use crate::holder::{brief, look, Seen, Target};
use crate::run::human;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long a wait goes before its status shows.
const FIRST_AFTER: Duration = Duration::from_secs(1);
/// How often the line is redrawn.
const REDRAW: Duration = Duration::from_secs(1);
/// How often `-v` reports a wait that goes on.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Erases the terminal line the cursor is on: carriage return, erase to the end of line.
const ERASE: &str = "\r\x1b[K";

/// Whether the line is on the terminal now, and whether it may still be drawn.
#[derive(Default)]
struct Screen {
    drawn: bool,
    stopped: bool,
}

/// The status of one wait; [`Status::stop`] ends it (and erases the line).
pub(crate) struct Status {
    task: Option<tokio::task::JoinHandle<()>>,
    screen: Arc<Mutex<Screen>>,
}

impl Status {
    /// Starts showing the wait for `what` (`lock `NAME``) on `target`, begun at `since`:
    /// a line on a terminal unless `-v` logs, the `-v` events otherwise, nothing when
    /// neither.
    pub(crate) fn start(
        client: &distlock::Client,
        target: &Target,
        what: &str,
        since: Instant,
    ) -> Status {
        let screen = Arc::new(Mutex::new(Screen::default()));
        let logging = tracing::enabled!(tracing::Level::INFO);
        let terminal = std::io::stderr().is_terminal();
        if !logging && !terminal {
            return Status { task: None, screen };
        }
        let (client, target, what) = (client.clone(), target.clone(), what.to_owned());
        let shared = screen.clone();
        let task = tokio::spawn(async move {
            // Nothing before the first second: a lock granted by then costs no extra request.
            tokio::time::sleep_until(since + FIRST_AFTER).await;
            // The first look: a holder still there later has held it at least since.
            let mut first: Option<Seen> = None;
            loop {
                let now = look(&client, &target).await;
                if first.is_none() {
                    first.clone_from(&now);
                }
                let waited = Duration::from_secs(since.elapsed().as_secs());
                let mut line = format!("waiting {} for {what}", human(waited));
                if let Some(who) = now.as_ref().and_then(|n| brief(n, first.as_ref())) {
                    line += &format!(": {who}");
                }
                if let Some(n) = now.as_ref().and_then(Seen::waiters).filter(|n| *n > 0) {
                    line += &format!("; {n} queued");
                }
                if logging {
                    tracing::info!("still {line}");
                    tokio::time::sleep(LOG_EVERY).await;
                } else {
                    draw(&shared, &line);
                    tokio::time::sleep(REDRAW).await;
                }
            }
        });
        Status {
            task: Some(task),
            screen,
        }
    }

    /// Ends the status: no more lines, and the one on the terminal erased.
    pub(crate) fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        if let Ok(mut s) = self.screen.lock() {
            s.stopped = true;
            if s.drawn {
                s.drawn = false;
                let mut err = std::io::stderr();
                let _ = err.write_all(ERASE.as_bytes()).and_then(|()| err.flush());
            }
        }
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        self.end();
    }
}

/// Draws `line` over the previous one, cut to the terminal's width (a line that wraps could
/// not be erased).
fn draw(screen: &Mutex<Screen>, line: &str) {
    let Ok(mut s) = screen.lock() else { return };
    if s.stopped {
        return;
    }
    let line = fit(
        &format!("dlock: {line}"),
        terminal_columns().saturating_sub(1),
    );
    let mut err = std::io::stderr();
    if err
        .write_all(format!("{ERASE}{line}").as_bytes())
        .and_then(|()| err.flush())
        .is_ok()
    {
        s.drawn = true;
    }
}

/// The width of the terminal on stderr; 80 when it cannot be asked.
fn terminal_columns() -> usize {
    // SAFETY: an all-zero winsize is a valid value of this plain C struct.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ only writes into the struct we own.
    let rc = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}

/// `s` cut to at most `columns` terminal columns (an ellipsis marks the cut).
fn fit(s: &str, columns: usize) -> String {
    use unicode_width::UnicodeWidthChar;
    if unicode_width::UnicodeWidthStr::width(s) <= columns {
        return s.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > columns {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn cuts_to_the_terminal_width() {
        assert_eq!(fit("short", 10), "short");
        assert_eq!(fit("a longer line", 6), "a lon…");
        // Two columns per CJK character: the cut never splits one.
        assert_eq!(fit("注文注文", 6), "注文…");
    }
}
