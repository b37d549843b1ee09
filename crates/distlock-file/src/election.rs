//! Observing an election ([`Backend::observe`](distlock_core::Backend::observe)): see the
//! crate documentation, section *Elections*.
//!
//! An election is a mutex on `<hash>.election` (see [`crate::mutex::Flavor`]); every change of
//! its state but one rewrites its record: a grant (holder and value), a proclamation (value and
//! seq), a resignation (the holder line removed). Those are seen through **inotify** on the
//! file (`IN_MODIFY`, `IN_CLOSE_WRITE`), from this process and every other. The one change
//! that writes nothing is the leader's death: the kernel drops its `flock` when its last
//! descriptor closes. That is seen by a thread that blocks in `flock(LOCK_SH)` on a descriptor
//! of its own while someone holds the lock, and returns the instant the lock goes (it then
//! unlocks at once). inotify's close event is no substitute: the kernel sends it *before* it
//! removes the dead process's lock, so an observer woken by it could still find the lock held.

use crate::mutex::Flavor;
use crate::{sys, Inner};
use distlock_core::backend::{async_trait, ReleaseWatch, Wake};
use distlock_core::Result;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

/// The inotify events that mean the record may have changed.
const CHANGES: u32 = libc::IN_MODIFY | libc::IN_CLOSE_WRITE | libc::IN_ATTRIB;
/// The events that mean the watched file is no longer the election's file.
const GONE: u32 = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED;
/// The part of [`GONE`] one asks for (the kernel sends `IN_IGNORED` unasked).
const WATCHED_GONE: u32 = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;

/// One observer's subscription to an election: inotify on its file, and the thread that
/// notices the leader's lock go.
pub(crate) struct ObserveWatch {
    inner: Arc<Inner>,
    path: PathBuf,
    inotify: AsyncFd<OwnedFd>,
    /// The thread blocked in `flock(LOCK_SH)` while the lock is held, if one runs.
    death: Option<Arc<Death>>,
}

/// What the death thread tells its watch.
#[derive(Default)]
struct Death {
    /// The lock was released (or the `flock` failed).
    done: AtomicBool,
    notify: Notify,
}

impl ObserveWatch {
    /// Subscribes to election `name` from now on: inotify first, then the death thread if the
    /// election is led now (so a leader that dies right after this returns is seen).
    pub(crate) fn new(inner: &Arc<Inner>, name: &str) -> Result<ObserveWatch> {
        let path = inner.fpath(Flavor::Election, name);
        // The file must exist to be watched: create it as a candidate would (empty: a fresh
        // election). Lock files are never deleted.
        drop(inner.open_rw(&path)?);
        let inotify = watch_file(&path).map_err(|e| {
            inner.io_error(format!("cannot watch {} with inotify", path.display()), e)
        })?;
        let mut w = ObserveWatch {
            inner: inner.clone(),
            path,
            inotify,
            death: None,
        };
        w.arm_death()?;
        Ok(w)
    }

    /// Starts the death thread if the election is led now and none runs.
    fn arm_death(&mut self) -> Result<()> {
        if self.death.is_some() {
            return Ok(());
        }
        let path = &self.path;
        let file = std::fs::File::open(path).map_err(|e| {
            self.inner
                .io_error(format!("cannot open {}", path.display()), e)
        })?;
        let free = sys::try_lock(&file, sys::Mode::Shared).map_err(|e| {
            self.inner
                .io_error(format!("cannot probe {}", path.display()), e)
        })?;
        if free {
            // Nobody leads: the next leader's grant writes the record, which inotify reports.
            sys::unlock_and_close(file);
            return Ok(());
        }
        let death = Arc::new(Death::default());
        let theirs = death.clone();
        std::thread::Builder::new()
            .name("distlock-file-observe".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                match sys::lock_blocking(&file, sys::Mode::Shared) {
                    Ok(()) => sys::unlock_and_close(file),
                    Err(e) => {
                        tracing::warn!(error = %e, "waiting for the election's leader failed")
                    }
                }
                theirs.done.store(true, Ordering::SeqCst);
                theirs.notify.notify_one();
            })
            .map_err(|e| {
                self.inner.io_error(
                    "cannot start a thread to watch the election's leader".to_owned(),
                    e,
                )
            })?;
        self.death = Some(death);
        Ok(())
    }

    /// Reads the pending inotify events: `Ok(true)` if any says the record may have changed,
    /// `Err` if the file is no longer watched (deleted or replaced).
    fn drain(&self) -> io::Result<bool> {
        let mut changed = false;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads at most `buf.len()` bytes into `buf`, from a descriptor we own.
            let n = unsafe {
                libc::read(
                    self.inotify.get_ref().as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(changed),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            let n = usize::try_from(n).unwrap_or(0);
            if n == 0 {
                return Ok(changed);
            }
            let mut at = 0;
            let header = std::mem::size_of::<libc::inotify_event>();
            while at + header <= n {
                // SAFETY: the kernel wrote whole events; `read_unaligned` copes with any
                // alignment of the buffer.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
                if ev.mask & GONE != 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "the election file {} was deleted or replaced",
                            self.path.display()
                        ),
                    ));
                }
                if ev.mask & (CHANGES | libc::IN_Q_OVERFLOW) != 0 {
                    changed = true;
                }
                at += header + ev.len as usize;
            }
        }
    }
}

#[async_trait]
impl ReleaseWatch for ObserveWatch {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            if let Some(d) = &self.death {
                if d.done.load(Ordering::SeqCst) {
                    self.death = None;
                    // Before the observer reads the state: a later leader's death is seen.
                    self.arm_death()?;
                    return Ok(Wake::Released);
                }
            }
            let death = self.death.clone();
            let died = async {
                match &death {
                    Some(d) => d.notify.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ready = self.inotify.readable() => {
                    let mut ready = ready.map_err(|e| {
                        self.inner.io_error("inotify failed".to_owned(), e)
                    })?;
                    let drained = self.drain();
                    ready.clear_ready();
                    match drained {
                        Ok(true) => {
                            self.arm_death()?;
                            return Ok(Wake::Released);
                        }
                        Ok(false) => {}
                        Err(e) => return Err(self.inner.io_error("the election watch ended".to_owned(), e)),
                    }
                }
                _ = died => {}
            }
        }
    }
}

/// A non-blocking inotify descriptor watching `path` for changes, registered with tokio.
fn watch_file(path: &std::path::Path) -> io::Result<AsyncFd<OwnedFd>> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))?;
    // SAFETY: no pointers; the flags are valid.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `c` is NUL-terminated and outlives the call; `fd` is open.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), CHANGES | WATCHED_GONE) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the `AsyncFd` owns `fd`, which stays open and the same until it is dropped.
    // (Needs a runtime with I/O enabled, as every tokio runtime built with `enable_all`.)
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
