//! Proclaiming and observing an election ([`Backend::observe`](distlock_core::Backend::observe));
//! see docs/file-backend.md, section *Elections*. Every change but one rewrites the record,
//! which inotify reports (a thread blocks reading the inotify descriptor; removing the watch
//! queues `IN_IGNORED`, which ends it). The leader's death writes nothing, and inotify's close
//! event comes *before* the kernel removes the dead process's lock: so while someone leads, a
//! second thread blocks in `flock(LOCK_SH)` on a descriptor of its own and returns the instant
//! the lock goes. Threads, not tokio's reactor: any tokio runtime will do.

use crate::record::Side;
use crate::table::{Entry, Family};
use crate::{sys, waiting, Inner};
use distlock_core::backend::{async_trait, ReleaseWatch, Wake};
use distlock_core::Result;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::Notify;

/// The inotify events that mean the record may have changed.
const CHANGES: u32 = libc::IN_MODIFY | libc::IN_CLOSE_WRITE | libc::IN_ATTRIB;
/// The events that mean the watched file is no longer the election's file.
const GONE: u32 = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED;
/// The part of [`GONE`] one asks for (the kernel sends `IN_IGNORED` unasked).
const WATCHED_GONE: u32 = libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;

/// What the watch's threads tell it.
#[derive(Default)]
struct Signals {
    /// inotify reported a change of the record since the watch last looked.
    changed: AtomicBool,
    /// The inotify thread ended: the file was deleted or replaced, or inotify failed.
    broken: Mutex<Option<io::Error>>,
    /// Woken (`notify_one`: the permit is stored) after each of the above and each death.
    notify: Notify,
}

impl Signals {
    fn broken(&self) -> MutexGuard<'_, Option<io::Error>> {
        self.broken.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    /// Advertises `value` as proclamation `seq` of the leader of election `name`, whose
    /// checked grant `entry` holds, if `seq` is above the last one applied.
    pub(crate) fn proclaim(
        &self,
        entry: &mut Entry,
        name: &str,
        seq: u64,
        value: &str,
    ) -> Result<()> {
        let Some(h) = entry.grants[Side::Write as usize]
            .first_mut()
            .filter(|h| seq > h.seq)
        else {
            return Ok(());
        };
        let last = (
            h.value.replace(Arc::from(value)),
            std::mem::replace(&mut h.seq, seq),
        );
        // Written under our exclusive lock; the table keeps the last value written.
        let written = self.sync(Family::Election, name, entry, false).map(drop);
        written.inspect_err(|_| {
            if let Some(h) = entry.grants[Side::Write as usize].first_mut() {
                (h.value, h.seq) = last;
            }
        })
    }
}

/// One observer's subscription to an election: the inotify thread, and the thread that
/// notices the leader's lock go.
pub(crate) struct ObserveWatch {
    inner: Arc<Inner>,
    path: PathBuf,
    signals: Arc<Signals>,
    /// The inotify descriptor the thread reads, and the watch on the file, removed (which
    /// ends the thread) when the watch is dropped.
    inotify: Arc<OwnedFd>,
    wd: c_int,
    /// The flag of the death thread blocked in `flock(LOCK_SH)` while the lock is held, if
    /// one runs: set once the lock was released (or its `flock` failed).
    death: Option<Arc<AtomicBool>>,
}

impl Drop for ObserveWatch {
    fn drop(&mut self) {
        // SAFETY: no pointers; the descriptor is open (we share it). A failure means the watch
        // is gone already (the file was deleted or replaced), and the thread with it.
        unsafe { libc::inotify_rm_watch(self.inotify.as_raw_fd(), self.wd) };
    }
}

impl ObserveWatch {
    /// Subscribes to election `name` from now on: inotify first, then the death thread if the
    /// election is led now (so a leader that dies right after this returns is seen).
    pub(crate) fn new(inner: &Arc<Inner>, name: &str) -> Result<ObserveWatch> {
        let path = inner.lock_path(Family::Election, name);
        // The file must exist to be watched: create it as a candidate would (empty: a fresh
        // election). Lock files are never deleted.
        drop(inner.open_rw(&path)?);
        let (inotify, wd) = watch_file(&path).map_err(|e| {
            inner.io_error(format!("cannot watch {} with inotify", path.display()), e)
        })?;
        let inotify = Arc::new(inotify);
        let signals = Arc::new(Signals::default());
        let (theirs, their_fd, their_path) = (signals.clone(), inotify.clone(), path.clone());
        waiting::spawn(
            inner,
            "distlock-file-inotify",
            "watch the election",
            move || inotify_thread(&their_fd, &theirs, &their_path),
        )?;
        let mut w = ObserveWatch {
            inner: inner.clone(),
            path,
            signals,
            inotify,
            wd,
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
        let Some(file) = self.inner.held_elsewhere(&self.path)? else {
            // Nobody leads: the next leader's grant writes the record, which inotify reports.
            return Ok(());
        };
        let died = Arc::new(AtomicBool::new(false));
        let (their_died, signals) = (died.clone(), self.signals.clone());
        let what = "watch the election's leader";
        waiting::spawn(&self.inner, "distlock-file-observe", what, move || {
            match sys::lock_blocking(&file, sys::Mode::Shared) {
                Ok(()) => sys::unlock_and_close(file),
                Err(e) => tracing::warn!(error = %e, "waiting for the election's leader failed"),
            }
            their_died.store(true, Ordering::SeqCst);
            signals.notify.notify_one();
        })?;
        self.death = Some(died);
        Ok(())
    }
}

#[async_trait]
impl ReleaseWatch for ObserveWatch {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            let died = self.death.take_if(|d| d.load(Ordering::SeqCst)).is_some();
            if died || self.signals.changed.swap(false, Ordering::SeqCst) {
                // Before the observer reads the state: a later leader's death is seen.
                self.arm_death()?;
                return Ok(Wake::Released);
            }
            if let Some(e) = self.signals.broken().take() {
                return Err(self.inner.io_error(
                    format!("the watch of election file {} ended", self.path.display()),
                    e,
                ));
            }
            // `notify_one` stores a permit: a signal since the checks above is not missed.
            let signals = self.signals.clone();
            signals.notify.notified().await;
        }
    }
}

/// Body of the inotify thread: reports changes of the record until the file is no longer
/// watched (the watch was dropped, or the file deleted or replaced) or inotify fails.
fn inotify_thread(inotify: &OwnedFd, signals: &Signals, path: &Path) {
    let mut buf = [0u8; 4096];
    let header = std::mem::size_of::<libc::inotify_event>();
    let e = 'read: loop {
        // SAFETY: reads at most `buf.len()` bytes into `buf`, from a descriptor we share.
        let n = unsafe { libc::read(inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let n = match usize::try_from(n) {
            Ok(0) => break io::Error::from(io::ErrorKind::UnexpectedEof),
            Ok(n) => n,
            Err(_) => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => continue,
                e => break e,
            },
        };
        let (mut at, mut changed) = (0, false);
        while at + header <= n {
            // SAFETY: the kernel wrote whole events; `read_unaligned` copes with any alignment
            // of the buffer.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
            if ev.mask & GONE != 0 {
                let gone = format!(
                    "the election file {} was deleted or replaced",
                    path.display()
                );
                break 'read io::Error::new(io::ErrorKind::NotFound, gone);
            }
            changed |= ev.mask & (CHANGES | libc::IN_Q_OVERFLOW) != 0;
            at += header + ev.len as usize;
        }
        if changed {
            signals.changed.store(true, Ordering::SeqCst);
            signals.notify.notify_one();
        }
    };
    *signals.broken() = Some(e);
    signals.notify.notify_one();
}

/// An inotify descriptor watching `path` for changes, and the watch.
fn watch_file(path: &Path) -> io::Result<(OwnedFd, c_int)> {
    let c = sys::c_path(path)?;
    // SAFETY: no pointers; the flags are valid.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
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
    Ok((fd, wd))
}
