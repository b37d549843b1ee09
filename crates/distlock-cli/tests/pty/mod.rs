//! Pseudo terminals for the tests that drive dlock as a user at a terminal would.
#![allow(dead_code)] // each test binary uses its own subset

use std::os::fd::{FromRawFd, OwnedFd};

/// A pseudo terminal of `cols`×`rows` (the kernel's 0×0 when `None`), its master side
/// non-blocking: (master, slave).
pub fn openpty(size: Option<(u16, u16)>) -> (std::fs::File, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    let ws = size.map(|(cols, rows)| libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    });
    // SAFETY: openpty writes the two descriptors; the name and termios are null, the size
    // null or read from a value we own.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            ws.as_ref()
                .map_or(std::ptr::null(), |w| w as *const libc::winsize),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned here alone.
    unsafe {
        let flags = libc::fcntl(master, libc::F_GETFL);
        libc::fcntl(master, libc::F_SETFL, flags | libc::O_NONBLOCK);
        (
            std::fs::File::from_raw_fd(master),
            OwnedFd::from_raw_fd(slave),
        )
    }
}

/// Makes the child about to exec the leader of a session of its own whose controlling
/// terminal is its standard input (the pty), as a shell runs a command typed at its prompt.
pub fn controlling_terminal(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec, only setsid and ioctl.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
