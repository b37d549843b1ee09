//! The TCP socket under a driver connection, for [`distlock_sql::closewatch`].
//!
//! mysql_async has no accessor for it. Its `Debug` text of a connection shows the stream
//! (plain or TLS) as the standard library prints a TCP stream — local address, peer address,
//! file descriptor — before any of the connection's options; the text is read up to that
//! point only (never as far as the options, which hold the password), and the descriptor is
//! used only if the kernel reports exactly those two addresses for it. A driver whose text
//! changed gives `None` (the holder is then told of a closed connection at its next renewal;
//! `dlock doctor` says so).

use mysql_async::Conn;
use std::fmt::{self, Write};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, FromRawFd, RawFd};

/// Read no further into the `Debug` text than this (the stream comes within its first
/// few hundred bytes).
const MAX_TEXT: usize = 16 * 1024;

/// Collects the `Debug` text until the first complete `fd: N` and stops there (a write error
/// ends the formatting); stops before the options in any case.
#[derive(Default)]
struct Probe {
    text: String,
}

impl Write for Probe {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.text.len() + s.len() > MAX_TEXT || s.contains("options") {
            return Err(fmt::Error);
        }
        self.text.push_str(s);
        if found(&self.text).is_some() {
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// `(local, peer, fd)` of the first complete `addr: A, peer: P, fd: N` in `text`.
fn found(text: &str) -> Option<(SocketAddr, SocketAddr, RawFd)> {
    let at = text.find("addr: ")?;
    let rest = &text[at + "addr: ".len()..];
    let (local, rest) = rest.split_once(", peer: ")?;
    let (peer, rest) = rest.split_once(", fd: ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    // The number is complete only when something follows it.
    if digits.is_empty() || rest.len() == digits.len() {
        return None;
    }
    Some((
        local.parse().ok()?,
        peer.parse().ok()?,
        digits.parse().ok()?,
    ))
}

/// The socket of `conn`, checked with the kernel; `None` if it cannot be told for sure.
pub(crate) fn socket_of(conn: &Conn) -> Option<BorrowedFd<'_>> {
    let mut probe = Probe::default();
    // Ends with an error by design once the descriptor is seen.
    let _ = write!(probe, "{conn:?}");
    let (local, peer, fd) = found(&probe.text)?;
    if fd < 0 {
        return None;
    }
    // SAFETY: `from_raw_fd` on a number that may not be ours is only read through
    // (`getsockname`/`getpeername`) and never closed (`ManuallyDrop`); a number that is no
    // open socket makes those calls fail.
    let s = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    if s.local_addr().ok()? != local || s.peer_addr().ok()? != peer {
        return None;
    }
    // SAFETY: the descriptor is the connection's own socket (the kernel reports the
    // connection's two addresses for it, and two open TCP sockets never share both), which
    // stays open as long as `conn` is borrowed.
    Some(unsafe { BorrowedFd::borrow_raw(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_stream_and_stops_before_the_options() {
        let plain = "Conn { connection id: 7, server version: (11, 4, 2), pool: None, \
            pending_result: Ok(None), tx_status: None, stream: Some(Stream (endpoint=Plain(Some(\
            PollEvented { io: Some(TcpStream { addr: 127.0.0.1:40022, peer: 127.0.0.1:3306, \
            fd: 12 }) })))), options: Opts { pass: Some(\"secret\") } }";
        let mut p = Probe::default();
        let _ = p.write_str(plain);
        assert!(p.text.is_empty(), "a chunk with the options was kept");
        // As the formatter writes it: piece by piece.
        let mut p = Probe::default();
        let mut stopped = false;
        for piece in plain.split_inclusive(' ') {
            if p.write_str(piece).is_err() {
                stopped = true;
                break;
            }
        }
        assert!(stopped);
        assert!(!p.text.contains("secret"), "{}", p.text);
        assert_eq!(
            found(&p.text),
            Some((
                "127.0.0.1:40022".parse().expect("addr"),
                "127.0.0.1:3306".parse().expect("addr"),
                12
            ))
        );
        let v6 = "TlsStream { io: TcpStream { addr: [::1]:5, peer: [::1]:3306, fd: 3 }, session";
        assert_eq!(found(v6).map(|f| f.2), Some(3));
        // Not complete yet: the number may go on.
        assert_eq!(
            found("TcpStream { addr: [::1]:5, peer: [::1]:3306, fd: 3"),
            None
        );
        assert_eq!(found("Socket(UnixStream { fd: 3 })"), None);
    }
}
