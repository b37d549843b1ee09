//! The signals a host forwards to the command's group, and waiting for them.

/// Resolves when `s` delivers a signal; never if there is no handler.
pub(crate) async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// The signals a host forwards to the command.
pub(crate) const FORWARDED: [libc::c_int; 4] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// Handlers for the signals a host forwards to the command (SIGTERM, SIGINT, SIGHUP,
/// SIGQUIT).
pub fn forwarded_signals() -> Vec<(libc::c_int, tokio::signal::unix::Signal)> {
    use tokio::signal::unix::{signal, SignalKind};
    FORWARDED
        .iter()
        .filter_map(|&n| Some((n, signal(SignalKind::from_raw(n)).ok()?)))
        .collect()
}

/// Resolves with the number of whichever of `sigs` arrives first.
///
/// # Errors
/// None: it resolves only with a signal number.
///
/// # Cancel safety
/// Cancel safe: a signal that arrived is not lost when the future is dropped; the next call
/// sees it.
pub async fn recv_any(sigs: &mut [(libc::c_int, tokio::signal::unix::Signal)]) -> libc::c_int {
    std::future::poll_fn(|cx| {
        for (n, s) in sigs.iter_mut() {
            if let std::task::Poll::Ready(Some(())) = s.poll_recv(cx) {
                return std::task::Poll::Ready(*n);
            }
        }
        std::task::Poll::Pending
    })
    .await
}
