//! The live terminal view of `dlock top`: a small ANSI renderer over the text frame (no
//! terminal library: the alternate screen, raw input and a redraw a refresh).

use crate::model::{LockRow, Snapshot, Sort};
use crate::monitor::Monitor;
use crate::text;
use std::io::{self, Write};
use std::time::Duration;
use tokio::sync::mpsc;

/// How the live view starts.
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// The order of the rows (`s` cycles).
    pub sort: Sort,
    /// Only names starting with this (within the monitor's prefix; `/` changes it).
    pub filter: String,
    /// How often to look again.
    pub refresh: Duration,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions {
            sort: Sort::Contention,
            filter: String::new(),
            refresh: Duration::from_secs(1),
        }
    }
}

/// A key the view knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Char(char),
    Enter,
    Esc,
    Backspace,
    Up,
    Down,
    Interrupt,
}

/// The keys in one read from the terminal (an escape sequence arrives in one read).
fn keys(chunk: &[u8]) -> Vec<Key> {
    match chunk {
        b"\x1b" => return vec![Key::Esc],
        b"\x1b[A" | b"\x1bOA" => return vec![Key::Up],
        b"\x1b[B" | b"\x1bOB" => return vec![Key::Down],
        [0x1b, ..] => return Vec::new(),
        _ => {}
    }
    String::from_utf8_lossy(chunk)
        .chars()
        .filter_map(|c| match c {
            '\r' | '\n' => Some(Key::Enter),
            '\u{7f}' | '\u{8}' => Some(Key::Backspace),
            '\u{3}' | '\u{4}' => Some(Key::Interrupt),
            c if !c.is_control() => Some(Key::Char(c)),
            _ => None,
        })
        .collect()
}

/// What is on screen.
#[derive(Debug, Clone)]
enum Mode {
    List,
    /// Typing a prefix (the text so far).
    Filter(String),
    /// One lock (its name and kind), its detail as last read.
    Detail(LockRow),
}

/// The terminal in raw mode on the alternate screen until dropped.
struct Screen {
    saved: libc::termios,
}

impl Screen {
    fn enter() -> io::Result<Screen> {
        // SAFETY: isatty, tcgetattr and tcsetattr read or write the termios of fd 0 through a
        // pointer to a value we own; no other memory is touched.
        unsafe {
            if libc::isatty(0) != 1 || libc::isatty(1) != 1 {
                return Err(io::Error::other(
                    "dlock top needs a terminal: use --once for a frame as plain text",
                ));
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut raw = saved;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG | libc::IEXTEN);
            raw.c_iflag &= !(libc::IXON | libc::ICRNL);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            if libc::tcsetattr(0, libc::TCSANOW, &raw) != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut out = io::stdout();
            out.write_all(b"\x1b[?1049h\x1b[?25l")?;
            out.flush()?;
            Ok(Screen { saved })
        }
    }

    /// Columns and rows (80×24 when the terminal does not say).
    fn size() -> (usize, usize) {
        // SAFETY: TIOCGWINSZ writes a winsize we own.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0;
        if ok && ws.ws_col > 0 && ws.ws_row > 0 {
            (usize::from(ws.ws_col), usize::from(ws.ws_row))
        } else {
            (80, 24)
        }
    }

    fn draw(lines: &[String]) -> io::Result<()> {
        let (w, h) = Screen::size();
        let mut out = String::from("\x1b[H\x1b[2J");
        for (i, l) in lines.iter().take(h).enumerate() {
            if i > 0 {
                out += "\r\n";
            }
            out.extend(l.chars().take(w));
        }
        let mut o = io::stdout();
        o.write_all(out.as_bytes())?;
        o.flush()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let mut out = io::stdout();
        let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = out.flush();
        // SAFETY: restores the termios saved in `enter`.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
    }
}

const HELP: &str = "q quit  s sort  / prefix  ↑↓ j k select  enter detail  esc back";

/// Runs the live view on the terminal until `q` (or Ctrl-C): the table refreshed every
/// `opts.refresh`, keys to sort (`s`), filter by prefix (`/`, then the prefix and Enter),
/// select (arrows, `j`/`k`) and open one lock's detail (Enter: its holders and its queue in
/// order; Esc back).
///
/// # Errors
/// Not a terminal (use [`crate::frame`] instead), or the terminal's I/O errors. A failed
/// look at the backend is shown on screen, not returned.
pub async fn run(monitor: &Monitor, opts: TopOptions) -> io::Result<()> {
    let screen = Screen::enter()?;
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
    // Reads of the terminal block: a thread of their own (left blocked in read at the end;
    // the process exits after the view).
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: reads into a buffer we own, at most its length.
            let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 || tx.blocking_send(buf[..n as usize].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut view = View {
        sort: opts.sort,
        filter: opts.filter,
        selected: 0,
        mode: Mode::List,
        snap: None,
        error: None,
    };
    let mut tick = tokio::time::interval(opts.refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => view.look(monitor).await,
            chunk = rx.recv() => {
                let Some(chunk) = chunk else { break };
                let mut quit = false;
                for k in keys(&chunk) {
                    if view.key(k, monitor).await {
                        quit = true;
                    }
                }
                if quit {
                    break;
                }
            }
        }
        Screen::draw(&view.lines())?;
    }
    drop(screen);
    Ok(())
}

struct View {
    sort: Sort,
    filter: String,
    selected: usize,
    mode: Mode,
    snap: Option<Snapshot>,
    error: Option<String>,
}

impl View {
    async fn look(&mut self, monitor: &Monitor) {
        match &self.mode {
            Mode::Detail(row) => match monitor.detail(&row.name, row.lock_kind()).await {
                Ok(r) => {
                    self.mode = Mode::Detail(r);
                    self.error = None;
                }
                Err(e) => self.error = Some(e.to_string()),
            },
            _ => match monitor.refresh(self.sort).await {
                Ok(mut s) => {
                    s.retain_prefix(&self.filter);
                    self.selected = self.selected.min(s.locks.len().saturating_sub(1));
                    self.snap = Some(s);
                    self.error = None;
                }
                Err(e) => self.error = Some(e.to_string()),
            },
        }
    }

    /// Handles `k`; true to quit.
    async fn key(&mut self, k: Key, monitor: &Monitor) -> bool {
        if k == Key::Interrupt {
            return true;
        }
        match &mut self.mode {
            Mode::Filter(text) => match k {
                Key::Enter => {
                    self.filter = std::mem::take(text);
                    self.mode = Mode::List;
                    self.selected = 0;
                    self.look(monitor).await;
                }
                Key::Esc => self.mode = Mode::List,
                Key::Backspace => {
                    text.pop();
                }
                Key::Char(c) => text.push(c),
                _ => {}
            },
            Mode::Detail(_) => match k {
                Key::Char('q') => return true,
                Key::Esc | Key::Backspace | Key::Enter => {
                    self.mode = Mode::List;
                    self.look(monitor).await;
                }
                _ => {}
            },
            Mode::List => {
                let n = self.snap.as_ref().map_or(0, |s| s.locks.len());
                match k {
                    Key::Char('q') => return true,
                    Key::Char('s') => {
                        self.sort = self.sort.next();
                        self.look(monitor).await;
                    }
                    Key::Char('/') => self.mode = Mode::Filter(self.filter.clone()),
                    Key::Up | Key::Char('k') => self.selected = self.selected.saturating_sub(1),
                    Key::Down | Key::Char('j') => {
                        self.selected = (self.selected + 1).min(n.saturating_sub(1));
                    }
                    Key::Enter => {
                        let row = self
                            .snap
                            .as_ref()
                            .and_then(|s| s.locks.get(self.selected))
                            .cloned();
                        if let Some(row) = row {
                            self.mode = Mode::Detail(row);
                            self.look(monitor).await;
                        }
                    }
                    _ => {}
                }
            }
        }
        false
    }

    fn lines(&self) -> Vec<String> {
        let (width, _) = Screen::size();
        let mut out = Vec::new();
        match (&self.mode, &self.snap) {
            (Mode::Detail(row), _) => {
                out.extend(text::detail(row));
                out.push(String::new());
                out.push("esc back  q quit".to_owned());
            }
            (_, Some(snap)) => {
                let mut title = text::title(snap, self.sort);
                if !self.filter.is_empty() {
                    title += &format!("; prefix {:?}", self.filter);
                }
                out.push(title);
                out.extend(text::table(snap, width, Some(self.selected)));
                if snap.locks.is_empty() {
                    out.push("  (no locks)".to_owned());
                }
                out.push(String::new());
                out.push(match &self.mode {
                    Mode::Filter(t) => format!("prefix: {t}▏ (enter apply, esc cancel)"),
                    _ => HELP.to_owned(),
                });
            }
            (_, None) => out.push("looking…".to_owned()),
        }
        if let Some(e) = &self.error {
            out.push(format!("error: {e}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keys_and_escape_sequences() {
        assert_eq!(keys(b"q"), [Key::Char('q')]);
        assert_eq!(keys(b"\x1b[A"), [Key::Up]);
        assert_eq!(keys(b"\x1b"), [Key::Esc]);
        assert_eq!(keys(b"ab\r"), [Key::Char('a'), Key::Char('b'), Key::Enter]);
        assert_eq!(keys(b"\x1b[5~"), []);
        assert_eq!(keys(b"\x03"), [Key::Interrupt]);
    }
}
