//! Waiting for a read-write lock without polling: up to three threads per name and backend
//! (read, write, turnstile) block in `flock` and park what they get for the waiters of their
//! side (see docs/file-backend.md, section *Waiting without polling*).

use super::{remove_if_idle, RwEntry, MAIN, TURNSTILE};
use crate::record::Side;
use crate::waiting::{self, Registration, Watch};
use crate::{sys, Inner};
use distlock_core::{AcquireRequest, Error, Granted, HoldKey, Result};
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

impl Inner {
    pub(super) fn wait_error(&self, name: &str, e: io::Error) -> Error {
        self.io_error(
            format!(
                "cannot wait for read-write lock file {}",
                self.rw_path(name, MAIN).display()
            ),
            e,
        )
    }

    /// A writer of this backend waits: hold the turnstile (keeping new readers out), and have
    /// a thread block for the lock itself.
    pub(super) fn queue_writer(
        self: &Arc<Self>,
        entry: &mut RwEntry,
        name: &Arc<str>,
        main: Option<File>,
    ) -> Result<()> {
        if entry.turnstile.is_none() && !entry.turnstile_thread {
            let path = self.rw_path(name, TURNSTILE);
            let ts = self.open_rw(&path)?;
            if self.try_flock(&ts, sys::Mode::Exclusive, &path)? {
                entry.turnstile = Some(ts);
            } else {
                // Another writer waits (or a reader is passing): queue behind it.
                self.spawn_waiter(Thread::Turnstile, name, move || {
                    sys::lock_blocking(&ts, sys::Mode::Exclusive).map(|()| ts)
                })?;
                entry.turnstile_thread = true;
            }
        }
        self.arm_write(entry, name, main)
    }

    /// Starts the thread that blocks for `LOCK_EX` on `<hash>.rw` (for a waiting writer or a
    /// write-side watch), unless it runs already.
    pub(super) fn arm_write(
        self: &Arc<Self>,
        entry: &mut RwEntry,
        name: &Arc<str>,
        main: Option<File>,
    ) -> Result<()> {
        if entry.write_thread || entry.parked_write.is_some() {
            return Ok(());
        }
        let f = match main {
            Some(f) => f,
            None => self.open_rw(&self.rw_path(name, MAIN))?,
        };
        self.spawn_waiter(Thread::Write, name, move || {
            sys::lock_blocking(&f, sys::Mode::Exclusive).map(|()| f)
        })?;
        entry.write_thread = true;
        Ok(())
    }

    /// Starts the thread that blocks for `LOCK_SH`, unless it runs already. With `main` (a
    /// descriptor on `<hash>.rw`), the caller passed the turnstile and the thread blocks on
    /// `main` directly; without, it passes the turnstile first.
    pub(super) fn arm_read(
        self: &Arc<Self>,
        entry: &mut RwEntry,
        name: &Arc<str>,
        main: Option<File>,
    ) -> Result<()> {
        if entry.read_thread || entry.parked_read.is_some() {
            return Ok(());
        }
        let (ts, main) = match main {
            Some(f) => (None, f),
            None => (
                Some(self.open_rw(&self.rw_path(name, TURNSTILE))?),
                self.open_rw(&self.rw_path(name, MAIN))?,
            ),
        };
        // Passes the turnstile first (if `ts` is given).
        self.spawn_waiter(Thread::Read, name, move || {
            if let Some(ts) = ts {
                sys::lock_blocking(&ts, sys::Mode::Shared)?;
                sys::unlock_and_close(ts);
            }
            sys::lock_blocking(&main, sys::Mode::Shared).map(|()| main)
        })?;
        entry.read_thread = true;
        Ok(())
    }

    /// Starts waiting thread `thread` of `name`, which blocks in `block`.
    fn spawn_waiter(
        self: &Arc<Self>,
        thread: Thread,
        name: &Arc<str>,
        block: impl FnOnce() -> io::Result<File> + Send + 'static,
    ) -> Result<()> {
        let name = name.clone();
        let then = move |inner: &Inner, res| waited(inner, &name, thread, res);
        waiting::spawn_waiter(
            self,
            "distlock-file-rw-wait",
            "the read-write lock",
            block,
            then,
        )
    }

    pub(crate) fn rw_watch(
        self: &Arc<Self>,
        key: &HoldKey,
        side: Side,
    ) -> Result<Watch<RwInterest>> {
        RwInterest::new(self, &key.name, side, true).armed()
    }

    pub(crate) async fn rw_acquire_wait(
        self: &Arc<Self>,
        req: &AcquireRequest,
        side: Side,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let waiter = RwInterest::new(self, &req.key.name, side, false);
        let mut first = true;
        let attempt = || {
            let r = self.rw_try(req, side, true, first);
            first = false;
            r
        };
        waiter.wait(attempt, deadline, cancel).await
    }
}

/// Records a waiting thread's failure for the next waiter or watch.
fn fail(entry: &mut RwEntry, name: &str, e: io::Error) {
    tracing::warn!(name, error = %e, "waiting for the read-write lock file failed");
    if entry.interested() > 0 {
        entry.kernel_error = Some(e);
    }
}

/// The waiting threads of a read-write lock name.
#[derive(Debug, Clone, Copy)]
enum Thread {
    /// Blocks for `LOCK_EX` on the turnstile, then keeps it for the backend's waiting writers.
    Turnstile,
    /// Blocks for `LOCK_EX` on `<hash>.rw`, then parks the lock for a waiting writer.
    Write,
    /// Passes the turnstile (unless its caller did), blocks for `LOCK_SH` on `<hash>.rw`,
    /// then parks the lock for a waiting reader.
    Read,
}

/// End of waiting thread `thread` of `name`, after its `flock` returned: keeps the lock it
/// got for the waiters of its side, or unlocks it at once if none waits for it any more.
fn waited(inner: &Inner, name: &Arc<str>, thread: Thread, res: io::Result<File>) {
    let mut table = inner.rw_table();
    let entry = table.entry(name.clone()).or_default();
    let wanted = match thread {
        Thread::Turnstile => entry.write_waiters > 0,
        Thread::Write => entry.write_waiters > 0 && !entry.held(),
        Thread::Read => entry.read_waiters > 0 && entry.writer.is_none(),
    };
    let (running, slot) = match thread {
        Thread::Turnstile => (&mut entry.turnstile_thread, &mut entry.turnstile),
        Thread::Write => (&mut entry.write_thread, &mut entry.parked_write),
        Thread::Read => (&mut entry.read_thread, &mut entry.parked_read),
    };
    *running = false;
    match res {
        Ok(file) if wanted && slot.is_none() => *slot = Some(file),
        Ok(file) => sys::unlock_and_close(file),
        Err(e) => fail(entry, name, e),
    }
    entry.bump();
    remove_if_idle(&mut table, name);
}

/// A registered waiter or watch of one side of one name; unregisters on drop (and gives back
/// what was held for the waiters of that side if it was the last one).
pub(crate) struct RwInterest {
    inner: Arc<Inner>,
    name: Arc<str>,
    side: Side,
    watcher: bool,
}

impl RwInterest {
    fn new(inner: &Arc<Inner>, name: &Arc<str>, side: Side, watcher: bool) -> Watch<RwInterest> {
        let mut table = inner.rw_table();
        let entry = table.entry(name.clone()).or_default();
        *Self::counter(entry, side, watcher) += 1;
        let reg = RwInterest {
            inner: inner.clone(),
            name: name.clone(),
            side,
            watcher,
        };
        Watch::new(reg, entry.notify.clone(), entry.generation)
    }

    fn counter(entry: &mut RwEntry, side: Side, watcher: bool) -> &mut usize {
        match (side, watcher) {
            (Side::Read, false) => &mut entry.read_waiters,
            (Side::Write, false) => &mut entry.write_waiters,
            (Side::Read, true) => &mut entry.read_watchers,
            (Side::Write, true) => &mut entry.write_watchers,
        }
    }
}

impl Drop for RwInterest {
    fn drop(&mut self) {
        let mut table = self.inner.rw_table();
        let Some(entry) = table.get_mut(&self.name) else {
            return;
        };
        let n = Self::counter(entry, self.side, self.watcher);
        *n = n.saturating_sub(1);
        if !self.watcher {
            match self.side {
                Side::Read if entry.read_waiters == 0 => {
                    if let Some(f) = entry.parked_read.take() {
                        // The last reader gave up: nobody will claim the parked lock.
                        sys::unlock_and_close(f);
                        entry.bump();
                    }
                }
                Side::Write if entry.write_waiters == 0 => {
                    // The last writer gave up: let new readers in again, and give back a
                    // lock the write thread got for it.
                    let ts = entry.turnstile.take();
                    let parked = entry.parked_write.take();
                    let any = ts.is_some() || parked.is_some();
                    ts.into_iter().chain(parked).for_each(sys::unlock_and_close);
                    if any {
                        entry.bump();
                    }
                }
                _ => {}
            }
        }
        if entry.interested() == 0 {
            entry.kernel_error = None;
        }
        remove_if_idle(&mut table, &self.name);
    }
}

impl Registration for RwInterest {
    fn generation(&self) -> Option<u64> {
        self.inner.rw_table().get(&self.name).map(|e| e.generation)
    }

    fn rearm(&self) -> Result<()> {
        let mut table = self.inner.rw_table();
        let entry = table.entry(self.name.clone()).or_default();
        if let Some(e) = entry.kernel_error.take() {
            return Err(self.inner.wait_error(&self.name, e));
        }
        if entry.held() {
            // This backend's own release will wake the watch.
            return Ok(());
        }
        match self.side {
            Side::Read => self.inner.arm_read(entry, &self.name, None),
            Side::Write => self.inner.arm_write(entry, &self.name, None),
        }
    }
}
