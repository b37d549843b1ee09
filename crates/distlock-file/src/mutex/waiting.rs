//! Waiting for a mutex held by another process: one thread per name and backend blocks in
//! `flock(LOCK_EX)` and parks the lock it gets for the waiters (see docs/file-backend.md,
//! section *Waiting without polling*).

use super::{remove_if_idle, Entry, Flavor};
use crate::waiting::{self, Registration, Watch};
use crate::{sys, Inner};
use distlock_core::{AcquireRequest, Error, Granted, Result};
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

impl Inner {
    /// Starts the waiting thread of `name`, blocking on `file` (opened read-write, as the
    /// lock it gets may become a grant). The caller checked that no thread waits yet.
    pub(super) fn arm(
        self: &Arc<Self>,
        f: Flavor,
        entry: &mut Entry,
        name: &Arc<str>,
        file: File,
    ) -> Result<()> {
        let name = name.clone();
        waiting::spawn_waiter(
            self,
            "distlock-file-wait",
            "the lock",
            move || sys::lock_wait(&file).map(|()| file),
            move |inner, res| kernel_wait(inner, f, &name, res),
        )?;
        // The thread reports under the table lock, which we hold: it sees this flag set.
        entry.kernel_waiting = true;
        Ok(())
    }

    /// The error of a waiting thread whose `flock` failed, for the next waiter or watch.
    pub(super) fn mutex_wait_error(&self, f: Flavor, name: &str, e: io::Error) -> Error {
        self.io_error(
            format!(
                "cannot wait for lock file {}",
                self.fpath(f, name).display()
            ),
            e,
        )
    }

    /// A watch of mutex `name`, catching releases by other processes from now on, not only
    /// from the first `changed`.
    pub(crate) fn watch(self: &Arc<Self>, f: Flavor, name: &Arc<str>) -> Result<Watch<Interest>> {
        Interest::new(self, f, name, true).armed()
    }

    /// Waits for mutex `req.key.name` without polling: every release wakes the waiters.
    pub(crate) async fn acquire_wait(
        self: &Arc<Self>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let waiter = Interest::new(self, super::flavor(&req.key), &req.key.name, false);
        let attempt = || self.try_acquire(req, true);
        waiter.wait(attempt, deadline, cancel).await
    }
}

/// End of the waiting thread of one lock name, after its `flock(LOCK_EX)` returned: hands
/// the lock to a waiter (parks it) or, if nobody waits any more, unlocks it at once.
fn kernel_wait(inner: &Inner, f: Flavor, name: &Arc<str>, res: io::Result<File>) {
    let mut table = inner.table(f);
    let entry = table.entry(name.clone()).or_default();
    entry.kernel_waiting = false;
    match res {
        Ok(file) if entry.waiters > 0 && entry.holder.is_none() && entry.parked.is_none() => {
            entry.parked = Some(file);
        }
        Ok(file) => sys::unlock_and_close(file),
        Err(e) => {
            tracing::warn!(name = %name, error = %e, "waiting for the lock file failed");
            if entry.waiters + entry.watchers > 0 {
                entry.kernel_error = Some(e);
            }
        }
    }
    entry.bump();
    remove_if_idle(&mut table, name);
}

/// A registered waiter or watch of one name; unregisters on drop.
pub(crate) struct Interest {
    inner: Arc<Inner>,
    flavor: Flavor,
    name: Arc<str>,
    watcher: bool,
}

impl Interest {
    /// Registers, from the name's current generation on.
    fn new(inner: &Arc<Inner>, flavor: Flavor, name: &Arc<str>, watcher: bool) -> Watch<Interest> {
        let mut table = inner.table(flavor);
        let entry = table.entry(name.clone()).or_default();
        if watcher {
            entry.watchers += 1;
        } else {
            entry.waiters += 1;
        }
        let reg = Interest {
            inner: inner.clone(),
            flavor,
            name: name.clone(),
            watcher,
        };
        Watch::new(reg, entry.notify.clone(), entry.generation)
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut table = self.inner.table(self.flavor);
        let Some(entry) = table.get_mut(&self.name) else {
            return;
        };
        if self.watcher {
            entry.watchers = entry.watchers.saturating_sub(1);
        } else {
            entry.waiters = entry.waiters.saturating_sub(1);
            if entry.waiters == 0 {
                if let Some(file) = entry.parked.take() {
                    // The last waiter gave up: nobody will claim the parked lock.
                    sys::unlock_and_close(file);
                    entry.bump();
                }
            }
        }
        if entry.waiters + entry.watchers == 0 {
            entry.kernel_error = None;
        }
        remove_if_idle(&mut table, &self.name);
    }
}

impl Registration for Interest {
    fn generation(&self) -> Option<u64> {
        self.inner
            .table(self.flavor)
            .get(&self.name)
            .map(|e| e.generation)
    }

    fn rearm(&self) -> Result<()> {
        let f = self.flavor;
        let mut table = self.inner.table(f);
        let entry = table.entry(self.name.clone()).or_default();
        if let Some(e) = entry.kernel_error.take() {
            return Err(self.inner.mutex_wait_error(f, &self.name, e));
        }
        if entry.holder.is_none() && entry.parked.is_none() && !entry.kernel_waiting {
            let file = self.inner.open_rw(&self.inner.fpath(f, &self.name))?;
            self.inner.arm(f, entry, &self.name, file)?;
        }
        Ok(())
    }
}
