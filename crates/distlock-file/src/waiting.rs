//! Waiting without polling (see docs/file-backend.md, section *Waiting without polling*): the
//! loop of `acquire_wait`, the release watch over a name's generation, and the threads that
//! block in `flock` — per name and backend, one for each side (read, write) and one for a
//! read-write lock's turnstile — and park what they get for the waiters of their side.

use crate::record::Side;
use crate::table::{remove_if_idle, slot, Entry, Family, Target, TURNSTILE};
use crate::{sys, Inner};
use distlock_core::backend::{
    async_trait, wait, AcquireReply, Attempt, Deadline, Granted, ReleaseWatch, WaitStrategy, Wake,
};
use distlock_core::backoff::RetryPolicy;
use distlock_core::{AcquireRequest, Result};
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// [`Inner::acquire_wait`]'s strategy: an attempt (`first`: the first of the wait), then
/// sleep until the name's generation moves past the one read before the attempt (a release
/// after the attempt changes it).
struct NotifiedWait<'a> {
    watch: Watch,
    req: &'a AcquireRequest,
    first: bool,
}

#[async_trait]
impl WaitStrategy for NotifiedWait<'_> {
    async fn attempt(&mut self, _: Deadline, _: &CancellationToken) -> Result<Attempt> {
        let w = &mut self.watch;
        w.seen = w.generation().unwrap_or(w.seen);
        // On the lease clock, as every grant's start.
        let requested_at = distlock_core::clock::Instant::now();
        let first = std::mem::replace(&mut self.first, false);
        Ok(
            match (w.inner).try_acquire((w.family, w.side), self.req, true, first)? {
                AcquireReply::Granted { token } => {
                    Attempt::Granted(Granted::new(token, requested_at))
                }
                // Held by another attempt.
                _ => Attempt::Held { retry_in: None },
            },
        )
    }

    async fn wake(&mut self, until: Deadline) -> Result<Option<Wake>> {
        tokio::select! {
            r = self.watch.next(false) => r.map(|()| Some(Wake::Released)),
            _ = until.reached() => Ok(None),
        }
    }
}

/// A registered waiter or watch of one side of one name, with its release notifications
/// from this backend and from other processes: a waiter's ([`Inner::acquire_wait`]) or a
/// watch once [`rearm`](Self::rearm)ed. Unregisters on drop (and gives back what was held for
/// the waiters of that side if it was the last one).
pub(crate) struct Watch {
    inner: Arc<Inner>,
    family: Family,
    side: Side,
    name: Arc<str>,
    watcher: bool,
    notify: Arc<Notify>,
    seen: u64,
}

impl Watch {
    /// Registers a waiter (or, with `watcher`, a watch) of side `side` of lock `name` of
    /// `family`, reporting the first change after the name's current generation.
    pub(crate) fn new(
        inner: &Arc<Inner>,
        (family, side): Target,
        name: &Arc<str>,
        watcher: bool,
    ) -> Watch {
        let mut table = inner.table(family);
        let entry = table.entry(name.clone()).or_default();
        *counter(entry, side, watcher) += 1;
        Watch {
            inner: inner.clone(),
            family,
            side,
            name: name.clone(),
            watcher,
            notify: entry.notify.clone(),
            seen: entry.generation,
        }
    }

    /// The name's generation, bumped at every release, hand-over or waiting-thread event;
    /// `None` when the backend keeps nothing for the name.
    fn generation(&self) -> Option<u64> {
        let table = self.inner.table(self.family);
        table.get(&self.name).map(|e| e.generation)
    }

    /// Takes the waiting threads' error, if any, and starts the thread that notices a release
    /// by another process (or backend) if one is needed and none runs yet. A new watch is
    /// armed at once, to catch releases from then on, not only from the first `changed`.
    pub(crate) fn rearm(&self) -> Result<()> {
        let mut table = self.inner.table(self.family);
        let entry = table.entry(self.name.clone()).or_default();
        entry.kernel_error.take().map_or(Ok(()), Err)?;
        if entry.held() {
            // This backend's own release will wake the watch.
            return Ok(());
        }
        self.inner
            .arm((self.family, self.side), entry, &self.name, None)
    }

    /// Waits, as this waiter, for `req` without polling, with the core's retrying loop
    /// ([`wait::run`]): one non-blocking attempt under the table lock (which, when the lock
    /// is held, starts the waiting threads it needs), then sleep until the name's notifier
    /// fires, the deadline passes or `cancel` fires.
    pub(crate) async fn wait(
        self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let (deadline, policy) = (Deadline::from(deadline), RetryPolicy::default());
        let mut strategy = NotifiedWait {
            watch: self,
            req,
            first: true,
        };
        wait::run(&mut strategy, deadline, cancel, policy).await
    }

    /// Waits until the name's generation moves past the one last seen; with `rearm` (a
    /// watch: a waiter's attempts arm what they need) re-arms before each sleep.
    async fn next(&mut self, rearm: bool) -> Result<()> {
        loop {
            // Created before the generation is read: a release after the read wakes it.
            let notified = self.notify.notified();
            let generation = self.generation().unwrap_or(self.seen);
            if generation != self.seen {
                self.seen = generation;
                return Ok(());
            }
            if rearm {
                self.rearm()?;
            }
            notified.await;
        }
    }
}

#[async_trait]
impl ReleaseWatch for Watch {
    async fn changed(&mut self) -> Result<Wake> {
        self.next(true).await.map(|()| Wake::Released)
    }
}

fn counter(entry: &mut Entry, side: Side, watcher: bool) -> &mut usize {
    match watcher {
        false => &mut entry.waiters[side as usize],
        true => &mut entry.watchers[side as usize],
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut table = self.inner.table(self.family);
        let Some(entry) = table.get_mut(&self.name) else {
            return;
        };
        let n = counter(entry, self.side, self.watcher);
        *n = n.saturating_sub(1);
        if !self.watcher && entry.waiters[self.side as usize] == 0 {
            // The last waiter of this side gave up: nobody will claim the parked lock; for
            // the last writer, let new readers in again.
            let ts = entry.parked[slot(None)].take_if(|_| self.side == Side::Write);
            let parked = entry.parked[self.side as usize].take();
            let any = ts.is_some() || parked.is_some();
            ts.into_iter().chain(parked).for_each(sys::unlock_and_close);
            if any {
                entry.bump();
            }
        }
        if entry.interested() == 0 {
            entry.kernel_error = None;
        }
        remove_if_idle(&mut table, &self.name);
    }
}

impl Inner {
    /// A waiter of this backend queues: a writer of a read-write lock holds the turnstile
    /// (keeping new readers out); and a thread blocks for the lock itself ([`Inner::arm`]).
    pub(crate) fn queue(
        self: &Arc<Self>,
        t @ (family, side): Target,
        entry: &mut Entry,
        name: &Arc<str>,
        main: Option<File>,
    ) -> Result<()> {
        if (family, side) == (Family::Rw, Side::Write) && !entry.waiting(None) {
            let path = self.file(name, TURNSTILE);
            let ts = self.open_rw(&path)?;
            if self.try_flock(&ts, sys::Mode::Exclusive, &path)? {
                entry.parked[slot(None)] = Some(ts);
            } else {
                // Another writer waits (or a reader is passing): queue behind it.
                self.spawn_waiter(family, None, entry, name, move || {
                    sys::lock_blocking(&ts, sys::Mode::Exclusive).map(|()| ts)
                })?;
            }
        }
        self.arm(t, entry, name, main)
    }

    /// Starts the waiting thread of side `side` of `name` (for a waiter or a watch of that
    /// side), unless it runs already: it blocks for the lock file, `LOCK_EX` for the write
    /// side, `LOCK_SH` for the read side, passing the turnstile first unless `main` is given.
    /// `main` is a descriptor on the lock file (opened read-write, as the lock it gets may
    /// become a grant) to block on; a reader gives it after it passed the turnstile.
    pub(crate) fn arm(
        self: &Arc<Self>,
        (family, side): Target,
        entry: &mut Entry,
        name: &Arc<str>,
        main: Option<File>,
    ) -> Result<()> {
        if entry.waiting(Some(side)) {
            return Ok(());
        }
        let ts = (side == Side::Read && main.is_none())
            .then(|| self.open_rw(&self.file(name, TURNSTILE)))
            .transpose()?;
        let mode = [sys::Mode::Shared, sys::Mode::Exclusive][side as usize];
        let f = main.map_or_else(|| self.open_rw(&self.lock_path(family, name)), Ok)?;
        self.spawn_waiter(family, Some(side), entry, name, move || {
            if let Some(ts) = ts {
                sys::lock_blocking(&ts, sys::Mode::Shared)?;
                sys::unlock_and_close(ts);
            }
            sys::lock_blocking(&f, mode).map(|()| f)
        })
    }

    /// Starts the waiting thread of side `thread` of `name` (`None`: of the turnstile), which
    /// blocks in `block` and returns the descriptor it locked; [`waited`] then gets the
    /// outcome, under the table lock (which the caller holds: it sees the thread's flag set).
    /// The thread keeps only a weak reference to the backend while it blocks, so that it does
    /// not keep a dropped backend alive; if the backend is gone, the lock it got is given back
    /// at once.
    fn spawn_waiter(
        self: &Arc<Self>,
        family: Family,
        thread: Option<Side>,
        entry: &mut Entry,
        name: &Arc<str>,
        block: impl FnOnce() -> io::Result<File> + Send + 'static,
    ) -> Result<()> {
        let (weak, name) = (Arc::downgrade(self), name.clone());
        spawn(self, "distlock-file-wait", "wait for the lock", move || {
            let res = block();
            match weak.upgrade() {
                Some(inner) => waited(&inner, family, &name, thread, res),
                None => {
                    if let Ok(file) = res {
                        sys::unlock_and_close(file);
                    }
                }
            }
        })?;
        entry.threads[slot(thread)] = true;
        Ok(())
    }
}

/// End of the waiting thread of side `thread` of `name` (`None`: of the turnstile), after its
/// `flock` returned: keeps the lock it got for the waiters of its side (the turnstile: for the
/// writers), or unlocks it at once if none waits for it any more.
fn waited(
    inner: &Inner,
    family: Family,
    name: &Arc<str>,
    thread: Option<Side>,
    res: io::Result<File>,
) {
    let mut table = inner.table(family);
    let entry = table.entry(name.clone()).or_default();
    let waiting = entry.waiters[thread.unwrap_or(Side::Write) as usize] > 0;
    let wanted = match thread {
        None => waiting,
        Some(Side::Write) => waiting && !entry.held(),
        Some(Side::Read) => waiting && entry.writer().is_none(),
    };
    entry.threads[slot(thread)] = false;
    let parked = &mut entry.parked[slot(thread)];
    match res {
        Ok(file) if wanted && parked.is_none() => *parked = Some(file),
        Ok(file) => sys::unlock_and_close(file),
        Err(e) => {
            tracing::warn!(name = %name, error = %e, "waiting for the lock file failed");
            if entry.interested() > 0 {
                let path = inner.lock_path(family, name);
                let what = format!("cannot wait for lock file {}", path.display());
                entry.kernel_error = Some(inner.io_error(what, e));
            }
        }
    }
    entry.bump();
    remove_if_idle(&mut table, name);
}

/// Starts a thread named `thread` that runs `body`; `what` says what it does, in the error
/// when it cannot be started ("cannot start a thread to {what}").
pub(crate) fn spawn(
    inner: &Inner,
    thread: &str,
    what: &str,
    body: impl FnOnce() + Send + 'static,
) -> Result<()> {
    std::thread::Builder::new()
        .name(thread.into())
        .stack_size(256 * 1024)
        .spawn(body)
        .map(drop)
        .map_err(|e| inner.io_error(format!("cannot start a thread to {what}"), e))
}
