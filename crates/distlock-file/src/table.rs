//! What a backend knows about each lock name: one table per [`Family`] of lock files, one
//! [`Entry`] type for all of them. The files and the safety argument: docs/file-backend.md,
//! sections *URLs and files*, *Why this is a mutex* and *Read-write locks*. A mutex or an
//! election is taken as the write side of a lock with no readers. A read-write lock's record
//! (`<hash>.rw-record`) is changed only under its own `LOCK_EX`, held for one read and one
//! write and never while waiting for anything else, so it cannot take part in a deadlock.

use crate::record::{self, HoldLine, Side};
use crate::{sys, Inner};
use distlock_core::{AcquireRequest, AttemptId, GrantRef, LockKind, Result};
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, MutexGuard, PoisonError};
use tokio::sync::Notify;

/// Suffix of a read-write lock's turnstile.
pub(crate) const TURNSTILE: &str = "rw-turnstile";
/// Suffix of a read-write lock's record (counter, name, holders).
pub(crate) const RECORD: &str = "rw-record";

/// The three sets of lock files, each with a table of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// A mutex: `<hash>.lock`, the record in the lock file itself.
    Mutex,
    /// An election: `<hash>.election`, the record with the leader's value.
    Election,
    /// A read-write lock: `<hash>.rw`, its turnstile and its record.
    Rw,
}

impl Family {
    /// Suffix of the file whose `flock` is the lock.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Family::Mutex => "lock",
            Family::Election => "election",
            Family::Rw => "rw",
        }
    }

    /// Suffix of the file holding the record (and so the lock's name).
    pub(crate) fn record_suffix(self) -> &'static str {
        match self {
            Family::Rw => RECORD,
            family => family.suffix(),
        }
    }
}

/// A lock's family and the side a grant of it takes.
pub(crate) type Target = (Family, Side);

/// The family of lock kind `kind` and the side its grants take (a mutex or an election is
/// taken exclusively: the write side); `None` for kinds this backend does not implement.
pub(crate) fn target(kind: LockKind) -> Option<Target> {
    match kind {
        LockKind::Mutex => Some((Family::Mutex, Side::Write)),
        LockKind::Election => Some((Family::Election, Side::Write)),
        LockKind::Read => Some((Family::Rw, Side::Read)),
        LockKind::Write => Some((Family::Rw, Side::Write)),
        _ => None,
    }
}

/// One grant: the attempt that won it, its owner (for `inspect` and the record) and its
/// fencing token. Re-entry is counted by the client, so every grant is one hold.
pub(crate) struct Hold {
    pub(crate) attempt: AttemptId,
    pub(crate) owner: Arc<str>,
    pub(crate) token: u64,
    /// An election leader's value (`None` otherwise).
    pub(crate) value: Option<Arc<str>>,
    /// The number of the leader's last proclamation applied (0: none).
    pub(crate) seq: u64,
}

impl Hold {
    pub(crate) fn new(req: &AcquireRequest, family: Family) -> Hold {
        let value = (family == Family::Election)
            .then(|| req.value.clone().unwrap_or_else(|| Arc::from("")));
        Hold {
            attempt: req.attempt.clone(),
            owner: req.key.owner.clone(),
            token: 0,
            value,
            seq: 0,
        }
    }

    pub(crate) fn is(&self, grant: &GrantRef) -> bool {
        self.attempt == grant.attempt && self.token == grant.token
    }
}

/// The grant `req` (a read request) asks to be made beside `writer`, its owner's write
/// grant: the read side may then be granted (a downgrade).
pub(crate) fn downgrade_of(req: &AcquireRequest, writer: &Hold) -> bool {
    req.write_grant.as_ref().is_some_and(|g| {
        g.key.kind == LockKind::Write && g.key.name == req.key.name && writer.is(g)
    })
}

/// The index in [`Entry::parked`] and [`Entry::threads`] of the waiting thread for side
/// `thread`, or (`None`) for the turnstile.
pub(crate) fn slot(thread: Option<Side>) -> usize {
    thread.map_or(2, |side| side as usize)
}

/// What this backend knows about one lock name. Removed when idle.
#[derive(Default)]
pub(crate) struct Entry {
    /// This backend's grants, by side (`Side as usize`, as the arrays below): of the write
    /// side at most one (a mutex's or an election's holder); of the read side, while there is
    /// a writer, only grants made beside it to requests that named it (downgrades).
    pub(crate) grants: [Vec<Hold>; 2],
    /// The backend's descriptor on the lock file while any of its owners holds a side:
    /// `LOCK_EX` while it has a write grant, else `LOCK_SH`.
    pub(crate) main: Option<File>,
    /// What the waiting threads got and no waiter claimed yet, by [`slot`]: the lock file
    /// (`LOCK_SH` for the read side, after passing the turnstile; `LOCK_EX` for the write
    /// side), and `<hash>.rw-turnstile` (`LOCK_EX`, held for this backend's waiting writers).
    pub(crate) parked: [Option<File>; 3],
    /// `acquire_wait` calls in progress, by side.
    pub(crate) waiters: [usize; 2],
    /// Live watches, by side.
    pub(crate) watchers: [usize; 2],
    /// A thread blocks in `flock` for a slot: `LOCK_SH` on the turnstile and/or the lock file
    /// (read), `LOCK_EX` on the lock file (write), `LOCK_EX` on the turnstile.
    pub(crate) threads: [bool; 3],
    /// A waiting thread's `flock` failed; the next waiter or watch reports it.
    pub(crate) kernel_error: Option<distlock_core::Error>,
    /// Bumped (and `notify` woken) on every release, hand-over or waiting-thread event.
    pub(crate) generation: u64,
    pub(crate) notify: Arc<Notify>,
}

impl Entry {
    /// This backend's grants of side `side`.
    pub(crate) fn holds(&self, side: Side) -> &[Hold] {
        &self.grants[side as usize]
    }

    /// This backend's grant of the write side.
    pub(crate) fn writer(&self) -> Option<&Hold> {
        self.holds(Side::Write).first()
    }

    pub(crate) fn held(&self) -> bool {
        self.grants.iter().any(|g| !g.is_empty())
    }

    fn idle(&self) -> bool {
        !self.held()
            && self.main.is_none()
            && self.parked.iter().all(Option::is_none)
            && self.interested() == 0
            && !self.threads.contains(&true)
    }

    /// A waiting thread runs, or has parked its lock, for side `thread` (`None`: the
    /// turnstile).
    pub(crate) fn waiting(&self, thread: Option<Side>) -> bool {
        self.threads[slot(thread)] || self.parked[slot(thread)].is_some()
    }

    pub(crate) fn interested(&self) -> usize {
        self.waiters.iter().chain(&self.watchers).sum()
    }

    /// Wakes every waiter and watch of this name.
    pub(crate) fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.notify.notify_waiters();
    }

    /// Gives up the lock on the lock file once no owner of this backend holds a side.
    pub(crate) fn unlock_if_unheld(&mut self) {
        if !self.held() {
            if let Some(f) = self.main.take() {
                sys::unlock_and_close(f);
            }
        }
    }

    /// This backend's `hold` lines (a read-write lock's record).
    pub(crate) fn lines(&self, instance: u64) -> Vec<HoldLine> {
        let pid = std::process::id();
        let line = |side, h: &Hold| HoldLine {
            side,
            pid,
            instance,
            count: 1,
            owner: h.owner.to_string(),
        };
        [Side::Write, Side::Read]
            .into_iter()
            .flat_map(|side| self.holds(side).iter().map(move |h| line(side, h)))
            .collect()
    }
}

pub(crate) type Table = HashMap<Arc<str>, Entry>;

pub(crate) fn remove_if_idle(table: &mut Table, name: &str) {
    if table.get(name).is_some_and(Entry::idle) {
        table.remove(name);
    }
}

impl Inner {
    pub(crate) fn table(&self, family: Family) -> MutexGuard<'_, Table> {
        // The tables are only changed by short, non-panicking updates; a poisoned lock still
        // holds consistent data.
        self.tables[family as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The file of lock `name` with suffix `suffix`.
    pub(crate) fn file(&self, name: &str, suffix: &str) -> PathBuf {
        self.dir.join(record::suffixed_name(name, suffix))
    }

    /// The file whose `flock` is lock `name` of `family`.
    pub(crate) fn lock_path(&self, family: Family, name: &str) -> PathBuf {
        self.file(name, family.suffix())
    }

    /// The file holding the record of lock `name` of `family`.
    pub(crate) fn record_path(&self, family: Family, name: &str) -> PathBuf {
        self.file(name, family.record_suffix())
    }

    /// Writes `entry`, this backend's state of `name`, into the lock's record, under the lock
    /// on the record; with `grant`, the counter is advanced first. Returns the counter.
    ///
    /// A mutex's or an election's record is under the lock itself, so it is written only while
    /// this backend holds it (else nothing is written, and 0 returned): the counter, the name
    /// and, while held, the holder line and an election leader's value. A read-write lock's
    /// record is locked for this read and write only, never while waiting for another lock;
    /// this backend's `hold` lines are derived from `entry`, and lines that cannot be current
    /// are dropped (all others' while this backend writes, others' write lines while it
    /// reads, lines of dead processes).
    pub(crate) fn sync(
        &self,
        family: Family,
        name: &str,
        entry: &Entry,
        grant: bool,
    ) -> Result<u64> {
        let path = self.record_path(family, name);
        let update = |file: &File| {
            let mut rec = self.read_own_record(file, &path, name, grant)?;
            let writer = entry.writer();
            rec.name = Some(name.to_owned());
            rec.value = writer.and_then(|h| h.value.as_deref().map(str::to_owned));
            rec.seq = writer.map_or(0, |h| h.seq);
            if family == Family::Rw {
                let me = (std::process::id(), self.instance);
                let reading = !entry.holds(Side::Read).is_empty();
                rec.holds.retain(|h| {
                    (h.pid, h.instance) != me
                        && writer.is_none()
                        && !(reading && h.side == Side::Write)
                        && sys::pid_alive(h.pid)
                });
                rec.holds.extend(entry.lines(self.instance));
            } else {
                rec.holder = entry.lines(0).into_iter().next();
            }
            self.write_record(file, &path, &rec)?;
            Ok(rec.token)
        };
        match &entry.main {
            _ if family == Family::Rw => {
                self.locked(self.open_rw(&path)?, sys::Mode::Exclusive, &path, update)
            }
            Some(file) => update(file),
            None => Ok(0),
        }
    }

    /// [`Inner::sync`] for count changes and releases: the lines are informational, so a
    /// failure is logged rather than failing the call.
    pub(crate) fn sync_best_effort(&self, family: Family, name: &str, entry: &Entry) {
        if let Err(e) = self.sync(family, name, entry, false) {
            tracing::warn!(name, error = %e, "cannot update the holders in the lock's record");
        }
    }

    /// Removes this backend's lines from the records of the read-write locks it still holds
    /// (the backend is being dropped; its descriptors close, and so its locks free, right
    /// after).
    pub(crate) fn rw_forget_all(&self) {
        let names: Vec<Arc<str>> = self
            .table(Family::Rw)
            .iter()
            .filter(|(_, e)| e.held())
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            self.sync_best_effort(Family::Rw, &name, &Entry::default());
        }
    }
}
