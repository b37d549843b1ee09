//! The live view of `dlock top` driven through a pseudo terminal against a real Redis: it
//! draws the table, `s` changes the order, `/` filters by prefix, Enter opens one lock's
//! detail with its holder and its queue in order, Esc goes back, `q` quits (exit 0, the
//! terminal restored).

mod ops_common;
mod pty;
use distlock_testkit::RedisServer;
use ops_common::*;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the screen may take to show something (a loaded machine draws slowly).
const PATIENCE: Duration = Duration::from_secs(60);

/// The terminal's output, read as it comes.
struct Screen {
    master: std::fs::File,
    seen: String,
    child: Child,
}

impl Screen {
    /// Reads until the output after byte `from` contains every one of `want` (in one
    /// redraw: after the last screen clear), or fails naming what it saw.
    fn shows(&mut self, from: usize, want: &[&str]) -> usize {
        let t = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            let tail = &self.seen[from.min(self.seen.len())..];
            let last = tail.rfind("\x1b[2J").map_or(tail, |i| &tail[i..]);
            if want.iter().all(|w| last.contains(w)) {
                return self.seen.len();
            }
            match self.master.read(&mut buf) {
                Ok(0) => panic!("the terminal closed; it showed {:?}", self.seen),
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if t.elapsed() > PATIENCE {
                        let _ = self.child.kill();
                        panic!("no {want:?} on screen; the last redraw: {last:?}");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("reading the terminal: {e}; it showed {:?}", self.seen),
            }
        }
    }

    fn press(&mut self, keys: &[u8]) -> usize {
        let at = self.seen.len();
        self.master.write_all(keys).expect("type");
        at
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_sorts_filters_and_opens_a_lock_with_its_queue_in_order() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let (_a, held) = hold(&url, "tty-jobs", Duration::from_secs(5)).await;
    let (_c, other) = hold(&url, "tty-other", Duration::from_secs(5)).await;
    let b = client(&url, Duration::from_secs(5)).await;
    let waiter = |owner: &str| {
        let lock = b.lock("tty-jobs").unwrap().with_owner(owner).unwrap();
        tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(60)).await })
    };
    // The second queues only once the first is in line (the queue is by arrival).
    let first = waiter("first-in-line");
    let t = Instant::now();
    while client(&url, Duration::from_secs(5))
        .await
        .inspect("tty-jobs")
        .await
        .unwrap()
        .waiters
        != Some(1)
    {
        assert!(t.elapsed() < PATIENCE, "the first waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = waiter("second-in-line");

    let (master, slave) = pty::openpty(Some((160, 40)));
    let mut cmd = Command::new(DLOCK);
    cmd.env("DLOCK_BACKEND", &url)
        .env("TERM", "xterm")
        .args(["top", "--refresh", "200ms"])
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave));
    pty::controlling_terminal(&mut cmd);
    let child = cmd.spawn().expect("spawn");
    drop(cmd);
    let mut s = Screen {
        master,
        seen: String::new(),
        child,
    };
    // The table, the contended lock first, with its holder and two waiters.
    let at = s.shows(
        0,
        &[
            "by contention",
            "tty-jobs",
            "tty-other",
            held.owner(),
            "2 waiting",
        ],
    );
    let first_row = |screen: &str| -> Option<String> {
        let last = screen.rfind("\x1b[2J").map_or(screen, |i| &screen[i..]);
        last.split("\r\n")
            .find(|l| l.contains("tty-"))
            .map(str::to_owned)
    };
    assert!(
        first_row(&s.seen[at..]).is_none_or(|r| r.contains("tty-jobs")),
        "{:?}",
        s.seen
    );

    // `s`: by name.
    let from = s.press(b"s");
    s.shows(from, &["by name"]);
    // `/` and a prefix: only that lock.
    let from = s.press(b"/tty-o");
    s.shows(from, &["prefix: tty-o"]);
    let from = s.press(b"\r");
    s.shows(from, &["prefix \"tty-o\"", "tty-other", other.owner()]);
    let last = s.seen[from..].to_owned();
    let redraw = last.rfind("\x1b[2J").map_or(last.as_str(), |i| &last[i..]);
    assert!(!redraw.contains("tty-jobs"), "filtered out: {redraw:?}");
    // Back to every lock; select the first row (tty-jobs by name) and open it.
    let from = s.press(b"/");
    s.shows(from, &["prefix: tty-o"]);
    let from = s.press(b"\x7f\x7f\x7f\x7f\x7f\r");
    s.shows(from, &["tty-jobs", "tty-other", "by name"]);
    let from = s.press(b"\r");
    s.shows(
        from,
        &[
            "lock tty-jobs (mutex): held",
            "holders (1):",
            held.owner(),
            "queue (2), first in line first:",
            "1. first-in-line",
            "2. second-in-line",
        ],
    );
    // Esc: back to the table; q: quit.
    let from = s.press(b"\x1b");
    s.shows(from, &["by name", "tty-other"]);
    s.press(b"q");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().expect("try_wait") {
            break st;
        }
        assert!(t.elapsed() < PATIENCE, "q did not quit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{:?}", s.seen);
    // The terminal is given back: the alternate screen left, the cursor shown.
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.master.read(&mut buf) {
        if n == 0 {
            break;
        }
        s.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(
        s.seen.ends_with("\x1b[?25h\x1b[?1049l"),
        "{:?}",
        &s.seen[s.seen.len().saturating_sub(80)..]
    );

    held.release().await.unwrap();
    for w in [first, second] {
        waited(w, PATIENCE).await.release().await.unwrap();
    }
}
