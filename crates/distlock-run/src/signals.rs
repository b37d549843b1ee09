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

/// True when standard input is a terminal and this process is in its foreground process
/// group (a command typed at a shell prompt, not `&`).
pub(crate) fn foreground_terminal() -> bool {
    // SAFETY: isatty, tcgetpgrp and getpgrp only read state.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// The foreground process group of the terminal on standard input, if any.
pub(crate) fn terminal_owner() -> Option<libc::pid_t> {
    // SAFETY: tcgetpgrp only reads state.
    let g = unsafe { libc::tcgetpgrp(0) };
    (g > 0).then_some(g)
}

/// Makes `pgrp` the foreground process group of the terminal on standard input, also from a
/// background group (SIGTTOU, which the kernel sends a background caller, is ignored for the
/// call). False if the terminal refused.
pub(crate) fn give_terminal(pgrp: libc::pid_t) -> bool {
    // SAFETY: signal swaps a disposition (SIG_IGN and back, no handler code); tcsetpgrp only
    // changes the terminal's state.
    unsafe {
        let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        let ok = libc::tcsetpgrp(0, pgrp) == 0;
        libc::signal(libc::SIGTTOU, old);
        ok
    }
}
