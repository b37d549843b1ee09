//! Thin, safe wrappers around the few system calls the backend needs. [`lock_blocking`],
//! [`Mode`] and [`same_file`] are public: distlock-fence's fenced files and the lab's file
//! store lock their files with them.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Kind of `flock` lock (its value is the `flock(2)` operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Mode {
    /// `LOCK_SH`: a read hold, a pass through the turnstile, a consistent read of a record,
    /// or a probe whether anyone holds a lock.
    Shared = libc::LOCK_SH,
    /// `LOCK_EX`: a mutex, a write hold, a waiting writer's turnstile, a record update.
    Exclusive = libc::LOCK_EX,
}

fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: `flock` only reads the descriptor number; `file` keeps the descriptor open
        // for the duration of the call.
        let r = unsafe { libc::flock(file.as_raw_fd(), operation) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// `flock(mode | LOCK_NB)`: `Ok(true)` if the lock was taken, `Ok(false)` if someone else
/// holds a conflicting lock.
pub(crate) fn try_lock(file: &File, mode: Mode) -> io::Result<bool> {
    match flock(file, mode as libc::c_int | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

/// `flock(mode)`, retried on `EINTR`: blocks the calling thread until the lock is ours. On a
/// descriptor that already holds a lock, converts it (an exclusive lock becomes shared, or the
/// reverse). The lock goes with the open file description when its last descriptor closes.
///
/// # Errors
///
/// `flock(2)`'s error other than `EINTR` (e.g. `ENOLCK`, `EBADF`).
pub fn lock_blocking(file: &File, mode: Mode) -> io::Result<()> {
    flock(file, mode as libc::c_int)
}

/// True unless process `pid` surely does not exist (`kill(pid, 0)` fails with `ESRCH`).
/// Pids outside `1..=i32::MAX` (which `kill` would read as process groups) count as dead.
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Unlocks explicitly, then closes. Unlocking first matters when a `fork`ed child still shares
/// the open file description: closing our descriptor alone would leave the lock held.
pub(crate) fn unlock_and_close(file: File) {
    if let Err(e) = flock(&file, libc::LOCK_UN) {
        // Closing the descriptor below still releases the lock unless a forked child shares it.
        tracing::warn!(error = %e, "flock(LOCK_UN) failed; closing the lock file instead");
    }
    drop(file);
}

/// True if `path` still names the file `file` is open on (it was not deleted or replaced).
///
/// # Errors
///
/// `fstat` of `file` or `stat` of `path` failed (other than `path` not existing).
pub fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    let ours = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(ours.dev() == now.dev() && ours.ino() == now.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The real user id (`$UID`).
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The effective user id: the owner of the files and directories this process creates.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `path` as a C string (refused if it contains a NUL byte).
pub(crate) fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
}

/// The file-system type of the file system `path` is on (`statfs(2)`'s `f_type`, as the 32
/// bits the kernel's magic numbers use).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn fs_magic(path: &Path) -> io::Result<u64> {
    let c = c_path(path)?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a writable buffer of the right type;
    // statfs only writes through the pointer.
    let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statfs succeeded, so it filled the struct (which was zeroed before anyway).
    let st = unsafe { st.assume_init() };
    // `f_type` is signed on some targets: the magic numbers are 32-bit patterns.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_type as u64) & 0xffff_ffff)
}
