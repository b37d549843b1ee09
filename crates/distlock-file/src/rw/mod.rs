//! Read-write locks ([`LockKind::Read`] / [`LockKind::Write`]): see docs/file-backend.md,
//! section *Read-write locks*, for the files, the turnstile and the safety argument.
//!
//! Three files per name, next to the mutex's `<hash>.lock` (which they never touch):
//! - `<hash>.rw`: the lock. Readers hold `LOCK_SH` on it, a writer `LOCK_EX`. A backend keeps
//!   one descriptor on it for all its holders (`RwEntry::main`): exclusive while one of its
//!   owners writes, shared while its owners only read.
//! - `<hash>.rw-turnstile`: a writer that has to wait holds `LOCK_EX` on it until it has the
//!   lock; a reader that does not hold the read side yet must get `LOCK_SH` on it before it
//!   may take `<hash>.rw` (and lets it go right after). So once a writer waits, new readers
//!   wait behind it.
//! - `<hash>.rw-record`: the fencing counter, the name and one `hold` line per holder;
//!   changed only under its own `LOCK_EX`, which is held for one read and one write and never
//!   while waiting for anything else, so it cannot take part in a deadlock.

mod grant;
mod inspect;
mod waiting;

use crate::record::{self, HoldLine, Side};
use crate::{sys, Inner};
use distlock_core::{AcquireRequest, AttemptId, GrantRef, LockKind, RenewOutcome, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard, PoisonError};
use tokio::sync::Notify;

/// Suffix of the lock file itself.
pub(crate) const MAIN: &str = "rw";
/// Suffix of the turnstile.
pub(crate) const TURNSTILE: &str = "rw-turnstile";
/// Suffix of the record (counter, name, holders).
pub(crate) const RECORD: &str = "rw-record";

pub(crate) type RwTable = HashMap<Arc<str>, RwEntry>;

/// The side of a read-write lock `kind` asks for; `None` for other kinds.
pub(crate) fn side_of(kind: LockKind) -> Option<Side> {
    match kind {
        LockKind::Read => Some(Side::Read),
        LockKind::Write => Some(Side::Write),
        _ => None,
    }
}

fn kind_of(side: Side) -> LockKind {
    match side {
        Side::Read => LockKind::Read,
        Side::Write => LockKind::Write,
    }
}

/// One grant of one side: the attempt that won it, its owner (for `inspect` and the record)
/// and its fencing token. Re-entry is counted by the client, so every grant is one hold.
struct RwHold {
    attempt: AttemptId,
    owner: Arc<str>,
    token: u64,
}

impl RwHold {
    fn new(req: &AcquireRequest) -> RwHold {
        RwHold {
            attempt: req.attempt.clone(),
            owner: req.key.owner.clone(),
            token: 0,
        }
    }

    fn is(&self, grant: &GrantRef) -> bool {
        self.attempt == grant.attempt && self.token == grant.token
    }
}

/// What this backend knows about one read-write lock. Removed when idle.
#[derive(Default)]
pub(crate) struct RwEntry {
    /// This backend's grant of the write side.
    writer: Option<RwHold>,
    /// This backend's grants of the read side (while `writer` is set, only grants made beside
    /// it to requests that named it: downgrades).
    readers: Vec<RwHold>,
    /// The backend's descriptor on `<hash>.rw` while any of its owners holds a side:
    /// `LOCK_EX` while `writer` is set, else `LOCK_SH`.
    main: Option<File>,
    /// `<hash>.rw-turnstile`, locked `LOCK_EX` on behalf of this backend's waiting writers.
    turnstile: Option<File>,
    /// `<hash>.rw` locked `LOCK_SH` by the read thread (after it passed the turnstile),
    /// not claimed by a read waiter yet.
    parked_read: Option<File>,
    /// `<hash>.rw` locked `LOCK_EX` by the write thread, not claimed by a write waiter yet.
    parked_write: Option<File>,
    read_waiters: usize,
    write_waiters: usize,
    read_watchers: usize,
    write_watchers: usize,
    /// A thread blocks for `LOCK_SH` on the turnstile and/or `<hash>.rw`.
    read_thread: bool,
    /// A thread blocks for `LOCK_EX` on `<hash>.rw`.
    write_thread: bool,
    /// A thread blocks for `LOCK_EX` on the turnstile.
    turnstile_thread: bool,
    /// A waiting thread's `flock` failed; the next waiter or watch reports it.
    kernel_error: Option<io::Error>,
    /// Bumped (and `notify` woken) on every release, hand-over or waiting-thread event.
    generation: u64,
    notify: Arc<Notify>,
}

impl RwEntry {
    fn held(&self) -> bool {
        self.writer.is_some() || !self.readers.is_empty()
    }

    fn idle(&self) -> bool {
        !self.held()
            && self.main.is_none()
            && self.turnstile.is_none()
            && self.parked_read.is_none()
            && self.parked_write.is_none()
            && self.interested() == 0
            && !self.read_thread
            && !self.write_thread
            && !self.turnstile_thread
    }

    fn interested(&self) -> usize {
        self.read_waiters + self.write_waiters + self.read_watchers + self.write_watchers
    }

    /// Wakes every waiter and watch of this name.
    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.notify.notify_waiters();
    }

    /// Gives up the lock on `<hash>.rw` once no owner of this backend holds a side.
    fn unlock_if_unheld(&mut self) {
        if !self.held() {
            if let Some(f) = self.main.take() {
                sys::unlock_and_close(f);
            }
        }
    }

    /// This backend's `hold` lines.
    fn lines(&self, instance: u64) -> Vec<HoldLine> {
        let pid = std::process::id();
        let line = |side, h: &RwHold| HoldLine {
            side,
            pid,
            instance,
            count: 1,
            owner: h.owner.to_string(),
        };
        self.writer
            .iter()
            .map(|h| line(Side::Write, h))
            .chain(self.readers.iter().map(|h| line(Side::Read, h)))
            .collect()
    }

    /// Drops every hold (the lock file was deleted or replaced): renewals report them lost.
    fn drop_all(&mut self) {
        self.writer = None;
        self.readers.clear();
        self.unlock_if_unheld();
        self.bump();
    }
}

/// True if `req` (a read request) names `writer` as its owner's write grant: the read side may
/// then be granted beside it.
fn downgrade_of(req: &AcquireRequest, writer: &RwHold) -> bool {
    req.write_grant.as_ref().is_some_and(|g| {
        g.key.kind == LockKind::Write && g.key.name == req.key.name && writer.is(g)
    })
}

fn remove_if_idle(table: &mut RwTable, name: &str) {
    if table.get(name).is_some_and(RwEntry::idle) {
        table.remove(name);
    }
}

/// Result of checking a freshly locked `<hash>.rw` descriptor against the path.
enum Checked {
    Current(File),
    /// The file was deleted or replaced after we opened it (already unlocked): try again.
    Replaced,
}

impl Inner {
    /// A duplicate of the descriptor on `<hash>.rw` whose `flock` carries this backend's grant
    /// of side `side` of `name` with fencing token `token`; `None` without such a grant.
    pub(crate) fn rw_holder_file(
        &self,
        name: &str,
        side: Side,
        token: u64,
    ) -> io::Result<Option<File>> {
        let table = self.rw_table();
        let Some(e) = table.get(name) else {
            return Ok(None);
        };
        let held = match side {
            Side::Write => e.writer.iter().any(|h| h.token == token),
            Side::Read => e.readers.iter().any(|h| h.token == token),
        };
        match &e.main {
            Some(f) if held => f.try_clone().map(Some),
            _ => Ok(None),
        }
    }

    pub(crate) fn rw_table(&self) -> MutexGuard<'_, RwTable> {
        // Only changed by short, non-panicking updates: a poisoned lock holds consistent data.
        self.rw.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn rw_path(&self, name: &str, suffix: &str) -> PathBuf {
        self.dir.join(record::rw_file_name(name, suffix))
    }

    /// Checks that a descriptor we just locked is still the lock's file; unlocks it if not.
    fn check_main(&self, file: File, name: &str, entry: &mut RwEntry) -> Result<Checked> {
        let path = self.rw_path(name, MAIN);
        match sys::same_file(&file, &path) {
            Ok(true) => Ok(Checked::Current(file)),
            Ok(false) => {
                sys::unlock_and_close(file);
                Ok(Checked::Replaced)
            }
            Err(e) => {
                sys::unlock_and_close(file);
                entry.bump();
                Err(self.io_error(format!("cannot stat {}", path.display()), e))
            }
        }
    }

    /// Rewrites the record under its exclusive lock: this backend's `hold` lines are derived
    /// from `entry`; lines that cannot be current are dropped (all others' while this backend
    /// writes, others' write lines while it reads, lines of dead processes); with `grant`, the
    /// counter is incremented. Returns the counter. The lock on the record is held for this
    /// read and write only, never while waiting for another lock.
    fn rw_sync(&self, name: &str, entry: &RwEntry, grant: bool) -> Result<u64> {
        let path = self.rw_path(name, RECORD);
        let file = self.open_rw(&path)?;
        sys::lock_blocking(&file, sys::Mode::Exclusive)
            .map_err(|e| self.io_error(format!("cannot lock {}", path.display()), e))?;
        let res = self.rw_sync_locked(&file, &path, name, entry, grant);
        sys::unlock_and_close(file);
        res
    }

    fn rw_sync_locked(
        &self,
        file: &File,
        path: &Path,
        name: &str,
        entry: &RwEntry,
        grant: bool,
    ) -> Result<u64> {
        let mut rec = self.read_record(file, path)?;
        self.check_name(&rec, name, path)?;
        let me = (std::process::id(), self.instance);
        let writing = entry.writer.is_some();
        let reading = !entry.readers.is_empty();
        rec.holds.retain(|h| {
            (h.pid, h.instance) != me
                && !writing
                && !(reading && h.side == Side::Write)
                && sys::pid_alive(h.pid)
        });
        rec.holds.extend(entry.lines(self.instance));
        if grant {
            rec.token = record::next_token(rec.token).ok_or_else(|| {
                self.corrupt(path, "its fencing token is at the largest possible value")
            })?;
        }
        rec.name = Some(name.to_owned());
        rec.holder = None;
        record::write(file, &rec)
            .map_err(|e| self.io_error(format!("cannot write {}", path.display()), e))?;
        Ok(rec.token)
    }

    /// [`Inner::rw_sync`] for count changes and releases: the lines are informational, so a
    /// failure is logged rather than failing the call.
    fn rw_sync_best_effort(&self, name: &str, entry: &RwEntry) {
        if let Err(e) = self.rw_sync(name, entry, false) {
            tracing::warn!(name, error = %e, "cannot update the holders in the read-write lock record");
        }
    }

    /// The lease is the process's lifetime: a renewal confirms that the grant is still ours
    /// and its file still the lock's file.
    pub(crate) fn rw_renew(&self, grant: &GrantRef, side: Side) -> Result<RenewOutcome> {
        let key = &grant.key;
        let mut table = self.rw_table();
        let Some(entry) = table.get_mut(&key.name) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let ours = match side {
            Side::Read => entry.readers.iter().any(|h| h.is(grant)),
            Side::Write => entry.writer.as_ref().is_some_and(|w| w.is(grant)),
        };
        if !ours {
            return Ok(RenewOutcome::NotHeld);
        }
        let path = self.rw_path(&key.name, MAIN);
        let intact = match &entry.main {
            Some(f) => sys::same_file(f, &path)
                .map_err(|e| self.io_error(format!("cannot stat {}", path.display()), e))?,
            None => false,
        };
        if intact {
            return Ok(RenewOutcome::Renewed);
        }
        tracing::warn!(name = %key.name, path = %path.display(),
            "the read-write lock file was deleted or replaced while held; every hold on it is lost");
        entry.drop_all();
        self.rw_sync_best_effort(&key.name, entry);
        remove_if_idle(&mut table, &key.name);
        Ok(RenewOutcome::NotHeld)
    }

    /// Removes this backend's lines from the records of the locks it still holds (the
    /// backend is being dropped; its descriptors close, and so its locks free, right after).
    pub(crate) fn rw_forget_all(&self) {
        let names: Vec<Arc<str>> = self
            .rw_table()
            .iter()
            .filter(|(_, e)| e.held())
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            self.rw_sync_best_effort(&name, &RwEntry::default());
        }
    }
}
