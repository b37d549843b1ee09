//! Watching a holder's socket for a close by the other side, so that its lost signal fires
//! when the server frees the lock on reading that end, not a renewal later when another client
//! may hold it (docs/mysql.md, *Session mode in detail*, "Losing the lock").
//!
//! It polls a duplicate of the driver's descriptor for readiness only, never reading, so the
//! driver's protocol is untouched. The duplicate keeps the socket open: a connection being
//! closed is shut down through [`CloseWatch::shutdown`] first, so the server sees it at once.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio_util::sync::CancellationToken;

/// A watch on one connection's socket: calls its callback once when the other side closes or
/// resets the connection, unless stopped first. Dropping it stops it.
#[derive(Debug)]
pub struct CloseWatch {
    fd: Arc<AsyncFd<OwnedFd>>,
    stop: CancellationToken,
    closed: Arc<AtomicBool>,
}

impl CloseWatch {
    /// Watches the socket `fd` (a duplicate of it: the caller's descriptor is left alone) on
    /// the current Tokio runtime; `on_close` runs once, on the runtime, when the other side
    /// closes or resets the connection, and never after [`CloseWatch::stop`] or a drop.
    ///
    /// # Errors
    /// No Tokio runtime with I/O here, or the descriptor could not be duplicated or registered
    /// (then nothing is watched).
    pub fn start(
        fd: BorrowedFd<'_>,
        on_close: impl FnOnce() + Send + 'static,
    ) -> io::Result<CloseWatch> {
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("no Tokio runtime to watch on: {e}")))?;
        let _in_rt = rt.enter();
        // Deprecated for descriptors the `AsyncFd` does not own (tokio 1.54); this one
        // owns its duplicate, and the replacement is not in the tokio versions we allow.
        #[allow(deprecated)]
        let fd = Arc::new(AsyncFd::with_interest(
            fd.try_clone_to_owned()?,
            Interest::READABLE,
        )?);
        let stop = CancellationToken::new();
        let closed = Arc::new(AtomicBool::new(false));
        rt.spawn(watch(fd.clone(), stop.clone(), closed.clone(), on_close));
        Ok(CloseWatch { fd, stop, closed })
    }

    /// Stops the watch: the callback does not run from now on (it may be running now).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Whether the other side's close was seen (the callback ran or is running).
    pub fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Stops the watch and shuts the socket down both ways, for the connection's owner that is
    /// closing it: the server sees the close now, not when the watch's duplicate is dropped.
    pub fn shutdown(&self) {
        self.stop();
        // SAFETY: `shutdown(2)` on a descriptor this watch owns (the `Arc` keeps it open); it
        // touches no memory.
        unsafe {
            libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR);
        }
    }
}

impl Drop for CloseWatch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `fd` reads closed (a FIN, a reset, a hang-up) and runs `on_close`, unless
/// stopped first. Data arriving (the driver's replies) only re-arms the wait.
async fn watch(
    fd: Arc<AsyncFd<OwnedFd>>,
    stop: CancellationToken,
    closed: Arc<AtomicBool>,
    on_close: impl FnOnce(),
) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            ready = fd.readable() => match ready {
                Ok(guard) if guard.ready().is_read_closed() => break,
                // A reply for the driver: wait for the next change.
                Ok(mut guard) => guard.clear_ready(),
                // The registration failed: nothing is known about the connection.
                Err(e) => {
                    tracing::debug!(error = %e, "watching a holder's socket failed");
                    return;
                }
            },
        }
    }
    if !stop.is_cancelled() {
        closed.store(true, Ordering::SeqCst);
        on_close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, _) = l.accept().expect("accept");
        c.set_nonblocking(true).expect("nonblocking");
        (c, s)
    }

    fn watched(c: &TcpStream) -> (CloseWatch, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w = CloseWatch::start(c.as_fd(), move || tx.send(()).unwrap_or_default());
        (w.expect("watch"), rx)
    }

    #[tokio::test]
    async fn fires_on_close_and_reset_not_on_data() {
        // The peer writes (a reply), then closes or resets: only the end fires.
        for by_reset in [false, true] {
            let (c, mut s) = pair();
            let (w, mut rx) = watched(&c);
            s.write_all(b"reply").expect("write");
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(rx.try_recv().is_err(), "data alone fired the watch");
            assert!(!w.closed());
            match by_reset {
                true => reset(s),
                false => s.shutdown(Shutdown::Both).expect("shutdown"),
            }
            tokio::time::timeout(Duration::from_secs(10), &mut rx)
                .await
                .unwrap_or_else(|_| panic!("no callback after the end (reset: {by_reset})"))
                .expect("callback dropped");
            assert!(w.closed());
        }
    }

    #[tokio::test]
    async fn stopped_or_dropped_watches_stay_silent_and_shutdown_closes() {
        let (c, s) = pair();
        let (w, mut rx) = watched(&c);
        w.stop();
        s.shutdown(Shutdown::Both).expect("shutdown");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err(), "a stopped watch fired");

        // Our own shutdown reaches the peer although the watch's duplicate is still open.
        let (c, mut s) = pair();
        let (w, _rx) = watched(&c);
        w.shutdown();
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).expect("the peer saw no close");
        assert!(rest.is_empty(), "data instead of the close");
    }

    /// Closes `s` with a reset (`SO_LINGER` 0).
    fn reset(s: TcpStream) {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt with a valid `linger` on a descriptor `s` owns.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "SO_LINGER");
    }
}
