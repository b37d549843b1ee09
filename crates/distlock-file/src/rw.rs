//! Read-write locks ([`LockKind::Read`] / [`LockKind::Write`]): see the crate documentation,
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

use crate::record::{self, HoldLine, Record, Side};
use crate::{sys, Inner};
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Error, GrantRef, HoldKey, HolderInfo,
    LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result, Wake,
};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard, PoisonError, Weak};
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
    pub(crate) fn rw_table(&self) -> MutexGuard<'_, RwTable> {
        // Only changed by short, non-panicking updates: a poisoned lock holds consistent data.
        self.rw.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn rw_path(&self, name: &str, suffix: &str) -> PathBuf {
        self.dir.join(record::rw_file_name(name, suffix))
    }

    fn wait_error(&self, name: &str, e: io::Error) -> Error {
        self.io_error(
            format!(
                "cannot wait for read-write lock file {}",
                self.rw_path(name, MAIN).display()
            ),
            e,
        )
    }

    /// `flock(mode | LOCK_NB)` with the path in the error.
    fn try_flock(&self, file: &File, mode: sys::Mode, path: &Path) -> Result<bool> {
        sys::try_lock(file, mode)
            .map_err(|e| self.io_error(format!("cannot lock {}", path.display()), e))
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

    fn replaced_too_often(&self, name: &str) -> Error {
        self.io_error(
            format!("cannot lock {}", self.rw_path(name, MAIN).display()),
            io::Error::other(
                "the lock file was deleted or replaced three times while locking it; is something removing files in the lock directory?",
            ),
        )
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

    /// One non-blocking attempt, under the table lock. With `arm` (a waiter), a failed attempt
    /// queues: starts the waiting threads it needs. `first` is false for the later attempts
    /// of one wait (see [`Inner::try_write`] on upgrades).
    pub(crate) fn rw_try(
        self: &Arc<Self>,
        req: &AcquireRequest,
        side: Side,
        arm: bool,
        first: bool,
    ) -> Result<AcquireReply> {
        let mut table = self.rw_table();
        let entry = table.entry(req.key.name.clone()).or_default();
        let r = match side {
            Side::Read => self.try_read(entry, req, arm),
            Side::Write => self.try_write(entry, req, arm, first),
        };
        remove_if_idle(&mut table, &req.key.name);
        r
    }

    fn try_read(
        self: &Arc<Self>,
        entry: &mut RwEntry,
        req: &AcquireRequest,
        arm: bool,
    ) -> Result<AcquireReply> {
        let key = &req.key;
        // A retry of an attempt that reads already: the same grant.
        if let Some(h) = entry.readers.iter().find(|h| h.attempt == req.attempt) {
            return Ok(AcquireReply::Granted { token: h.token });
        }
        if arm {
            if let Some(e) = entry.kernel_error.take() {
                return Err(self.wait_error(&key.name, e));
            }
        }
        if let Some(w) = &entry.writer {
            if downgrade_of(req, w) {
                // A downgrade: the request names this very write grant, whose exclusive lock
                // covers the read side. (Never for the owner id alone: another client with
                // the same owner id is another holder.)
                return self.add_reader(entry, req, None);
            }
            if arm {
                self.arm_read(entry, &key.name, None)?;
            }
            return Ok(AcquireReply::Held { ttl: None });
        }
        let main_path = self.rw_path(&key.name, MAIN);
        for _ in 0..3 {
            // The read thread passed the turnstile before it blocked: its lock is ours to take.
            if let Some(f) = entry.parked_read.take() {
                if entry.main.is_some() {
                    sys::unlock_and_close(f);
                    return self.add_reader(entry, req, None);
                }
                match self.check_main(f, &key.name, entry)? {
                    Checked::Current(f) => return self.add_reader(entry, req, Some(f)),
                    Checked::Replaced => continue,
                }
            }
            // A new reader passes the turnstile first: it cannot while a writer waits.
            let ts_path = self.rw_path(&key.name, TURNSTILE);
            let ts = self.open_rw(&ts_path)?;
            if !self.try_flock(&ts, sys::Mode::Shared, &ts_path)? {
                drop(ts);
                if arm {
                    self.arm_read(entry, &key.name, None)?;
                }
                return Ok(AcquireReply::Held { ttl: None });
            }
            if entry.main.is_some() {
                // Other owners of this backend read: join them.
                sys::unlock_and_close(ts);
                return self.add_reader(entry, req, None);
            }
            let f = match self.open_rw(&main_path) {
                Ok(f) => f,
                Err(e) => {
                    sys::unlock_and_close(ts);
                    return Err(e);
                }
            };
            let got = self.try_flock(&f, sys::Mode::Shared, &main_path);
            sys::unlock_and_close(ts);
            if !got? {
                // A writer holds the lock. We passed the turnstile, so we wait ahead of any
                // writer that starts waiting from now on: block on the lock file directly.
                if arm {
                    self.arm_read(entry, &key.name, Some(f))?;
                }
                return Ok(AcquireReply::Held { ttl: None });
            }
            match self.check_main(f, &key.name, entry)? {
                Checked::Current(f) => return self.add_reader(entry, req, Some(f)),
                Checked::Replaced => continue,
            }
        }
        Err(self.replaced_too_often(&key.name))
    }

    /// Records a new read hold (taking `new_main` as the backend's lock if given), with the
    /// next fencing token.
    fn add_reader(
        &self,
        entry: &mut RwEntry,
        req: &AcquireRequest,
        new_main: Option<File>,
    ) -> Result<AcquireReply> {
        if let Some(f) = new_main {
            entry.main = Some(f);
        }
        entry.readers.push(RwHold::new(req));
        match self.rw_sync(&req.key.name, entry, true) {
            Ok(token) => {
                if let Some(h) = entry.readers.last_mut() {
                    h.token = token;
                }
                Ok(AcquireReply::Granted { token })
            }
            Err(e) => {
                entry.readers.pop();
                entry.unlock_if_unheld();
                entry.bump();
                Err(e)
            }
        }
    }

    /// An owner that reads (in this backend) and asks for the write side is refused at once:
    /// two readers upgrading would wait for each other for ever. The check is by owner id (the
    /// request names no read grant), which can only refuse, never grant; and only on the first
    /// attempt of a wait: a writer that was already waiting when a read grant of its owner
    /// came through (another task of the same handle) waits on for it, as for any reader.
    fn try_write(
        self: &Arc<Self>,
        entry: &mut RwEntry,
        req: &AcquireRequest,
        arm: bool,
        first: bool,
    ) -> Result<AcquireReply> {
        let key = &req.key;
        if let Some(w) = entry.writer.as_ref().filter(|w| w.attempt == req.attempt) {
            // A retry of the attempt that writes: the same grant.
            return Ok(AcquireReply::Granted { token: w.token });
        }
        if first && entry.readers.iter().any(|h| h.owner == key.owner) {
            return Err(Error::invalid(format!(
                "owner `{}` holds the read side of read-write lock `{}` and asked for the write side: upgrades are refused (two readers upgrading would wait for each other forever); release the read side first",
                key.owner, key.name
            )));
        }
        if arm {
            if let Some(e) = entry.kernel_error.take() {
                return Err(self.wait_error(&key.name, e));
            }
        }
        let main_path = self.rw_path(&key.name, MAIN);
        for _ in 0..3 {
            if let Some(f) = entry.parked_write.take() {
                match self.check_main(f, &key.name, entry)? {
                    Checked::Current(f) => return self.add_writer(entry, req, f),
                    Checked::Replaced => continue,
                }
            }
            if entry.held() {
                // Other owners of this backend hold a side.
                if arm {
                    self.queue_writer(entry, &key.name, None)?;
                }
                return Ok(AcquireReply::Held { ttl: None });
            }
            let f = self.open_rw(&main_path)?;
            if !self.try_flock(&f, sys::Mode::Exclusive, &main_path)? {
                if arm {
                    self.queue_writer(entry, &key.name, Some(f))?;
                }
                return Ok(AcquireReply::Held { ttl: None });
            }
            match self.check_main(f, &key.name, entry)? {
                Checked::Current(f) => return self.add_writer(entry, req, f),
                Checked::Replaced => continue,
            }
        }
        Err(self.replaced_too_often(&key.name))
    }

    /// Records the write hold on `main` (locked exclusively), with the next fencing token.
    fn add_writer(
        &self,
        entry: &mut RwEntry,
        req: &AcquireRequest,
        main: File,
    ) -> Result<AcquireReply> {
        if let Some(old) = entry.main.replace(main) {
            // Only possible after the old file was replaced: that descriptor locks nothing.
            sys::unlock_and_close(old);
        }
        entry.writer = Some(RwHold::new(req));
        match self.rw_sync(&req.key.name, entry, true) {
            Ok(token) => {
                if let Some(w) = entry.writer.as_mut() {
                    w.token = token;
                }
                // The turnstile kept new readers out while our writers waited. Give it back
                // even if other writers of this backend still wait: readers that arrive
                // while this writer holds the lock may pass it (they wait for this writer
                // on the lock itself); the other writers queue again when it releases. So a
                // chain of writers cannot keep readers out for ever.
                if let Some(ts) = entry.turnstile.take() {
                    sys::unlock_and_close(ts);
                }
                Ok(AcquireReply::Granted { token })
            }
            Err(e) => {
                entry.writer = None;
                entry.unlock_if_unheld();
                entry.bump();
                Err(e)
            }
        }
    }

    /// A writer of this backend waits: hold the turnstile (keeping new readers out), and have
    /// a thread block for the lock itself.
    fn queue_writer(
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
                let name = name.clone();
                self.spawn_waiter(move |inner| turnstile_wait(inner, name, ts))?;
                entry.turnstile_thread = true;
            }
        }
        self.arm_write(entry, name, main)
    }

    /// Starts the thread that blocks for `LOCK_EX` on `<hash>.rw` (for a waiting writer or a
    /// write-side watch), unless it runs already.
    fn arm_write(
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
        let name = name.clone();
        self.spawn_waiter(move |inner| write_wait(inner, name, f))?;
        entry.write_thread = true;
        Ok(())
    }

    /// Starts the thread that blocks for `LOCK_SH`, unless it runs already. With `main` (a
    /// descriptor on `<hash>.rw`), the caller passed the turnstile and the thread blocks on
    /// `main` directly; without, it passes the turnstile first.
    fn arm_read(
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
        let name = name.clone();
        self.spawn_waiter(move |inner| read_wait(inner, name, ts, main))?;
        entry.read_thread = true;
        Ok(())
    }

    fn spawn_waiter(self: &Arc<Self>, f: impl FnOnce(Weak<Inner>) + Send + 'static) -> Result<()> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("distlock-file-rw-wait".into())
            .stack_size(256 * 1024)
            .spawn(move || f(weak))
            .map(drop)
            .map_err(|e| {
                self.io_error(
                    "cannot start a thread to wait for the read-write lock".into(),
                    e,
                )
            })
    }

    pub(crate) fn rw_release(&self, grant: &GrantRef, side: Side) -> Result<ReleaseOutcome> {
        let name = &grant.key.name;
        {
            let mut table = self.rw_table();
            if let Some(entry) = table.get_mut(name) {
                if self.release_in(entry, &grant.key, side, |h| h.is(grant)) {
                    remove_if_idle(&mut table, name);
                    return Ok(ReleaseOutcome::Released);
                }
                let taken = match side {
                    // Other readers share the lock; only a writer takes it from a reader.
                    Side::Read => entry.writer.is_some(),
                    // The owner's own read grants (a downgrade it kept) took nothing from it.
                    Side::Write => {
                        entry.writer.is_some()
                            || entry.readers.iter().any(|h| h.owner != grant.key.owner)
                    }
                };
                if taken {
                    return Ok(ReleaseOutcome::TakenByOther);
                }
                if entry.parked_write.is_some() {
                    // Locked exclusively by this backend's waiting thread, for its waiting
                    // writers: nobody holds it.
                    return Ok(ReleaseOutcome::Expired);
                }
            }
        }
        // Not held here: held by another process (or backend), or by nobody.
        let elsewhere = match side {
            Side::Read => self.rw_write_locked(name)?,
            Side::Write => self.rw_held_elsewhere(name)?,
        };
        Ok(if elsewhere {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// The attempt `req.attempt` stops: give back its grant of this side if it has one (a
    /// grant nobody received). Other attempts' grants, even of the same owner, stay.
    pub(crate) fn rw_give_up(&self, req: &AcquireRequest, side: Side) {
        let name = &req.key.name;
        let mut table = self.rw_table();
        let Some(entry) = table.get_mut(name) else {
            return;
        };
        if self.release_in(entry, &req.key, side, |h| h.attempt == req.attempt) {
            tracing::debug!(name = %name, attempt = %req.attempt, "gave back the grant of an attempt that gave up");
            remove_if_idle(&mut table, name);
        }
    }

    /// Releases the grant of `side` that `which` picks, if there is one: the record first,
    /// then the lock (a hold listed is never gone yet). True if it released one.
    fn release_in(
        &self,
        entry: &mut RwEntry,
        key: &HoldKey,
        side: Side,
        which: impl Fn(&RwHold) -> bool,
    ) -> bool {
        let found = match side {
            Side::Read => match entry.readers.iter().position(&which) {
                Some(i) => {
                    entry.readers.remove(i);
                    true
                }
                None => false,
            },
            Side::Write if entry.writer.as_ref().is_some_and(&which) => {
                Self::release_write(entry, key);
                true
            }
            Side::Write => false,
        };
        if found {
            self.rw_sync_best_effort(&key.name, entry);
            entry.unlock_if_unheld();
            entry.bump();
        }
        found
    }

    /// Drops the write grant; the read grants made beside it (downgrades) keep the lock, now
    /// shared.
    fn release_write(entry: &mut RwEntry, key: &HoldKey) {
        entry.writer = None;
        if let (false, Some(main)) = (entry.readers.is_empty(), &entry.main) {
            // The writer keeps reading: convert the exclusive lock to a shared one. Linux
            // converts in place, under the file's lock list spinlock, so no waiting writer can
            // slip in between; where the conversion fails, the read hold is given up and its
            // next renewal reports it lost.
            match sys::try_lock(main, sys::Mode::Shared) {
                Ok(true) => {}
                res => {
                    tracing::warn!(name = %key.name, owner = %key.owner, result = ?res,
                        "could not keep the read side after releasing the write side; the read hold is lost");
                    entry.readers.clear();
                    entry.unlock_if_unheld();
                }
            }
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

    /// The record, read under a shared lock (`None` if the file does not exist).
    fn read_rw_record(&self, name: &str) -> Result<Option<Record>> {
        let path = self.rw_path(name, RECORD);
        let Some(file) = self.open_existing(&path)? else {
            return Ok(None);
        };
        sys::lock_blocking(&file, sys::Mode::Shared)
            .map_err(|e| self.io_error(format!("cannot lock {}", path.display()), e))?;
        let rec = self.read_record(&file, &path);
        sys::unlock_and_close(file);
        rec.map(Some)
    }

    /// True if a process (or backend) other than this one holds `<hash>.rw` exclusively
    /// (non-blocking `LOCK_SH` probe).
    fn rw_write_locked(&self, name: &str) -> Result<bool> {
        let path = self.rw_path(name, MAIN);
        let Some(file) = self.open_existing(&path)? else {
            return Ok(false);
        };
        let free = self.try_flock(&file, sys::Mode::Shared, &path)?;
        if free {
            sys::unlock_and_close(file);
        }
        Ok(!free)
    }

    /// The holds of other processes and backends, from the record: lines of live processes;
    /// write lines only if the lock file is locked exclusively (and then only the writer's own
    /// read line besides).
    fn foreign_holds(&self, name: &str, rec: &Record, reading_here: bool) -> Result<Vec<HoldLine>> {
        let me = (std::process::id(), self.instance);
        let mut lines: Vec<HoldLine> = rec
            .holds
            .iter()
            .filter(|h| (h.pid, h.instance) != me && sys::pid_alive(h.pid))
            .cloned()
            .collect();
        if lines.iter().any(|h| h.side == Side::Write) {
            let writer_elsewhere = !reading_here && self.rw_write_locked(name)?;
            if writer_elsewhere {
                let writers: Vec<(u32, u64, String)> = lines
                    .iter()
                    .filter(|h| h.side == Side::Write)
                    .map(|h| (h.pid, h.instance, h.owner.clone()))
                    .collect();
                lines.retain(|h| {
                    writers
                        .iter()
                        .any(|(p, i, o)| (*p, *i, o.as_str()) == (h.pid, h.instance, &*h.owner))
                });
            } else {
                lines.retain(|h| h.side == Side::Read);
            }
        }
        Ok(lines)
    }

    fn rw_held_elsewhere(&self, name: &str) -> Result<bool> {
        if self.rw_write_locked(name)? {
            return Ok(true);
        }
        let Some(rec) = self.read_rw_record(name)? else {
            return Ok(false);
        };
        Ok(!self.foreign_holds(name, &rec, false)?.is_empty())
    }

    pub(crate) fn rw_inspect(&self, name: &str) -> Result<LockInfo> {
        let (mut holders, writing, reading) = {
            let table = self.rw_table();
            match table.get(name) {
                Some(e) => {
                    let info = |side: Side, h: &RwHold| HolderInfo {
                        owner: h.owner.to_string(),
                        count: 1,
                        lease_left: None,
                        side: Some(kind_of(side)),
                    };
                    let holders: Vec<HolderInfo> = e
                        .writer
                        .iter()
                        .map(|h| info(Side::Write, h))
                        .chain(e.readers.iter().map(|h| info(Side::Read, h)))
                        .collect();
                    (holders, e.writer.is_some(), !e.readers.is_empty())
                }
                None => (Vec::new(), false, false),
            }
        };
        let rec = self.read_rw_record(name)?.unwrap_or_default();
        if !writing {
            // While this backend writes, nobody else can hold either side.
            for h in self.foreign_holds(name, &rec, reading)? {
                holders.push(HolderInfo {
                    owner: h.owner,
                    count: h.count,
                    lease_left: None,
                    side: Some(kind_of(h.side)),
                });
            }
        }
        Ok(LockInfo {
            name: name.to_owned(),
            holders,
            fencing_token: rec.token,
            ..Default::default()
        })
    }

    pub(crate) fn rw_watch(self: &Arc<Self>, key: &HoldKey, side: Side) -> Result<RwWatch> {
        let (interest, notify, seen) = RwInterest::new(self, &key.name, side, true);
        interest.rearm()?;
        Ok(RwWatch {
            interest,
            notify,
            seen,
        })
    }

    pub(crate) async fn rw_acquire_wait(
        self: &Arc<Self>,
        req: &AcquireRequest,
        side: Side,
        deadline: Option<std::time::Instant>,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<distlock_core::Granted>> {
        let (_interest, notify, _) = RwInterest::new(self, &req.key.name, side, false);
        let mut first = true;
        let attempt = || {
            let r = self.rw_try(req, side, true, first);
            first = false;
            r
        };
        crate::wait_loop(&notify, attempt, deadline, cancel).await
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

/// Records a waiting thread's failure for the next waiter or watch.
fn fail(entry: &mut RwEntry, name: &str, e: io::Error) {
    tracing::warn!(name, error = %e, "waiting for the read-write lock file failed");
    if entry.interested() > 0 {
        entry.kernel_error = Some(e);
    }
}

/// Body of the turnstile thread: blocks for `LOCK_EX` on the turnstile, then keeps it for the
/// backend's waiting writers (or unlocks it if none waits any more).
fn turnstile_wait(inner: Weak<Inner>, name: Arc<str>, ts: File) {
    let res = sys::lock_blocking(&ts, sys::Mode::Exclusive);
    let Some(inner) = inner.upgrade() else {
        if res.is_ok() {
            sys::unlock_and_close(ts);
        }
        return;
    };
    let mut table = inner.rw_table();
    let entry = table.entry(name.clone()).or_default();
    entry.turnstile_thread = false;
    match res {
        Ok(()) if entry.write_waiters > 0 && entry.turnstile.is_none() => {
            entry.turnstile = Some(ts);
        }
        Ok(()) => sys::unlock_and_close(ts),
        Err(e) => fail(entry, &name, e),
    }
    entry.bump();
    remove_if_idle(&mut table, &name);
}

/// Body of the write thread: blocks for `LOCK_EX` on `<hash>.rw`, then parks the lock for a
/// waiting writer (or unlocks it at once if none waits any more).
fn write_wait(inner: Weak<Inner>, name: Arc<str>, main: File) {
    let res = sys::lock_blocking(&main, sys::Mode::Exclusive);
    let Some(inner) = inner.upgrade() else {
        if res.is_ok() {
            sys::unlock_and_close(main);
        }
        return;
    };
    let mut table = inner.rw_table();
    let entry = table.entry(name.clone()).or_default();
    entry.write_thread = false;
    match res {
        Ok(()) if entry.write_waiters > 0 && !entry.held() && entry.parked_write.is_none() => {
            entry.parked_write = Some(main);
        }
        Ok(()) => sys::unlock_and_close(main),
        Err(e) => fail(entry, &name, e),
    }
    entry.bump();
    remove_if_idle(&mut table, &name);
}

/// Body of the read thread: passes the turnstile (if `ts` is given), blocks for `LOCK_SH` on
/// `<hash>.rw`, then parks the lock for a waiting reader (or unlocks it at once).
fn read_wait(inner: Weak<Inner>, name: Arc<str>, ts: Option<File>, main: File) {
    let res = (|| {
        if let Some(ts) = ts {
            sys::lock_blocking(&ts, sys::Mode::Shared)?;
            sys::unlock_and_close(ts);
        }
        sys::lock_blocking(&main, sys::Mode::Shared)
    })();
    let Some(inner) = inner.upgrade() else {
        if res.is_ok() {
            sys::unlock_and_close(main);
        }
        return;
    };
    let mut table = inner.rw_table();
    let entry = table.entry(name.clone()).or_default();
    entry.read_thread = false;
    match res {
        Ok(())
            if entry.read_waiters > 0 && entry.writer.is_none() && entry.parked_read.is_none() =>
        {
            entry.parked_read = Some(main);
        }
        Ok(()) => sys::unlock_and_close(main),
        Err(e) => fail(entry, &name, e),
    }
    entry.bump();
    remove_if_idle(&mut table, &name);
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
    fn new(
        inner: &Arc<Inner>,
        name: &Arc<str>,
        side: Side,
        watcher: bool,
    ) -> (RwInterest, Arc<Notify>, u64) {
        let mut table = inner.rw_table();
        let entry = table.entry(name.clone()).or_default();
        *Self::counter(entry, side, watcher) += 1;
        let reg = RwInterest {
            inner: inner.clone(),
            name: name.clone(),
            side,
            watcher,
        };
        (reg, entry.notify.clone(), entry.generation)
    }

    fn counter(entry: &mut RwEntry, side: Side, watcher: bool) -> &mut usize {
        match (side, watcher) {
            (Side::Read, false) => &mut entry.read_waiters,
            (Side::Write, false) => &mut entry.write_waiters,
            (Side::Read, true) => &mut entry.read_watchers,
            (Side::Write, true) => &mut entry.write_watchers,
        }
    }

    /// For a watch: takes the waiting threads' error, and starts the thread that notices a
    /// release by another process (or backend) unless this backend holds the lock itself
    /// (then its own release wakes the watch).
    fn rearm(&self) -> Result<()> {
        let mut table = self.inner.rw_table();
        let entry = table.entry(self.name.clone()).or_default();
        if let Some(e) = entry.kernel_error.take() {
            return Err(self.inner.wait_error(&self.name, e));
        }
        if entry.held() {
            return Ok(());
        }
        match self.side {
            Side::Read => self.inner.arm_read(entry, &self.name, None),
            Side::Write => self.inner.arm_write(entry, &self.name, None),
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

/// Release notifications of one side of a read-write lock.
pub(crate) struct RwWatch {
    interest: RwInterest,
    notify: Arc<Notify>,
    seen: u64,
}

#[async_trait]
impl ReleaseWatch for RwWatch {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            {
                let table = self.interest.inner.rw_table();
                let generation = table
                    .get(&self.interest.name)
                    .map_or(self.seen, |e| e.generation);
                if generation != self.seen {
                    self.seen = generation;
                    return Ok(Wake::Released);
                }
            }
            self.interest.rearm()?;
            notified.await;
        }
    }
}
