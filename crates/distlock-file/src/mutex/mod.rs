//! Mutexes ([`LockKind::Mutex`]): one file per name, `<hash>.lock`, whose `flock(LOCK_EX)` is
//! the lock and whose record carries the fencing counter. See docs/file-backend.md,
//! sections *The hold protocol* and *Why this is a mutex*.
//!
//! Elections ([`LockKind::Election`]) are mutexes of their own ([`Flavor::Election`]): one
//! file per name, `<hash>.election`, with a table of their own, whose record also carries the
//! leader's value and the number of its last proclamation (see `crate::election`).

mod waiting;

use crate::record::{self, HolderLine, Record};
use crate::{sys, Inner};
use distlock_core::{
    AcquireReply, AcquireRequest, AttemptId, GrantRef, HoldKey, HolderInfo, LockInfo, LockKind,
    ReleaseOutcome, RenewOutcome, Result,
};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard, PoisonError};
use tokio::sync::Notify;

/// The two kinds of lock this module implements: the same mutex on two sets of files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// A mutex: `<hash>.lock`.
    Mutex,
    /// An election: `<hash>.election`, its record with the leader's value.
    Election,
}

impl Flavor {
    /// The flavor of lock kind `kind`; `None` for the read-write sides.
    pub(crate) fn of(kind: LockKind) -> Option<Flavor> {
        match kind {
            LockKind::Mutex => Some(Flavor::Mutex),
            LockKind::Election => Some(Flavor::Election),
            _ => None,
        }
    }
}

/// Suffix of an election's file.
pub(crate) const ELECTION: &str = "election";

/// What this backend knows about one lock name. Removed when idle.
#[derive(Default)]
pub(crate) struct Entry {
    /// The owner of this backend holding the lock.
    holder: Option<Holder>,
    /// A lock the waiting thread got and no waiter has claimed yet.
    parked: Option<File>,
    /// `acquire_wait` calls in progress.
    waiters: usize,
    /// Live watches.
    watchers: usize,
    /// A thread blocks in `flock(LOCK_EX)` for this name.
    kernel_waiting: bool,
    /// The waiting thread's `flock` failed; the next waiter or watch reports it.
    kernel_error: Option<io::Error>,
    /// Bumped (and `notify` woken) on every release, hand-over or waiting-thread event.
    generation: u64,
    notify: Arc<Notify>,
}

/// The one grant of this backend on a mutex: the attempt that won it, its token, and the
/// descriptor whose `flock(LOCK_EX)` is the lock.
pub(crate) struct Holder {
    attempt: AttemptId,
    owner: Arc<str>,
    file: File,
    token: u64,
    /// An election leader's value (`None` for a mutex).
    value: Option<Arc<str>>,
    /// The number of the leader's last proclamation applied (0: none).
    seq: u64,
}

impl Holder {
    fn is(&self, grant: &GrantRef) -> bool {
        self.attempt == grant.attempt && self.token == grant.token
    }

    /// The record of this grant.
    fn record(&self, name: &str) -> Record {
        let value = self.value.as_deref();
        holder_record(name, &self.owner, self.token, value, self.seq)
    }
}

/// The record of a grant of `name` to `owner` (this process) with `token`, and for an
/// election leader its `value` as proclamation `seq`.
fn holder_record(name: &str, owner: &str, token: u64, value: Option<&str>, seq: u64) -> Record {
    Record {
        token,
        name: Some(name.to_owned()),
        holder: Some(HolderLine {
            pid: std::process::id(),
            count: 1,
            owner: owner.to_owned(),
        }),
        holds: Vec::new(),
        value: value.map(str::to_owned),
        seq,
    }
}

impl Entry {
    fn idle(&self) -> bool {
        self.holder.is_none()
            && self.parked.is_none()
            && self.waiters == 0
            && self.watchers == 0
            && !self.kernel_waiting
    }

    /// Wakes every waiter and watch of this name.
    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.notify.notify_waiters();
    }
}

pub(crate) type Table = HashMap<Arc<str>, Entry>;

fn remove_if_idle(table: &mut Table, name: &str) {
    if table.get(name).is_some_and(Entry::idle) {
        table.remove(name);
    }
}

impl Inner {
    pub(crate) fn table(&self, f: Flavor) -> MutexGuard<'_, Table> {
        let table = match f {
            Flavor::Mutex => &self.table,
            Flavor::Election => &self.elections,
        };
        // The table is only changed by short, non-panicking updates; a poisoned lock still
        // holds consistent data.
        table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(record::file_name(name))
    }

    /// The lock file of `name` of flavor `f`.
    pub(crate) fn fpath(&self, f: Flavor, name: &str) -> PathBuf {
        match f {
            Flavor::Mutex => self.path(name),
            Flavor::Election => self.dir.join(record::rw_file_name(name, ELECTION)),
        }
    }

    /// Rewrites the holder line (count changes, release). The line is informational, so a
    /// failure is logged rather than failing the call.
    fn write_holder_best_effort(
        &self,
        file: &File,
        name: &str,
        token: u64,
        holder: Option<HolderLine>,
    ) {
        let rec = Record {
            token,
            name: Some(name.to_owned()),
            holder,
            ..Record::default()
        };
        if let Err(e) = record::write(file, &rec) {
            tracing::warn!(name, error = %e, "cannot update the holder line of the lock file");
        }
    }

    /// One non-blocking attempt, under the table lock. With `arm`, a failed attempt against a
    /// lock held outside this backend starts the waiting thread.
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        req: &AcquireRequest,
        arm: bool,
    ) -> Result<AcquireReply> {
        let f = flavor(&req.key);
        let mut table = self.table(f);
        let entry = table.entry(req.key.name.clone()).or_default();
        let r = self.try_acquire_in(f, entry, req, arm);
        remove_if_idle(&mut table, &req.key.name);
        r
    }

    fn try_acquire_in(
        self: &Arc<Self>,
        f: Flavor,
        entry: &mut Entry,
        req: &AcquireRequest,
        arm: bool,
    ) -> Result<AcquireReply> {
        let key = &req.key;
        if let Some(h) = &entry.holder {
            if h.attempt == req.attempt {
                // A retry of the attempt that holds the lock: the same grant. The lease is the
                // process's lifetime, so there is nothing to lengthen.
                return Ok(AcquireReply::Granted { token: h.token });
            }
            // Any other attempt, even of the same owner id, is another holder.
            return Ok(AcquireReply::Held { ttl: None });
        }
        if arm {
            if let Some(e) = entry.kernel_error.take() {
                return Err(self.mutex_wait_error(f, &key.name, e));
            }
        }
        let path = self.fpath(f, &key.name);
        // A few rounds in case the file is deleted or replaced while we lock it.
        for _ in 0..3 {
            let file = match entry.parked.take() {
                Some(f) => f,
                None => {
                    let file = self.open_rw(&path)?;
                    if !self.try_flock(&file, sys::Mode::Exclusive, &path)? {
                        if arm && !entry.kernel_waiting {
                            // Wait on this very descriptor.
                            self.arm(f, entry, &key.name, file)?;
                        }
                        return Ok(AcquireReply::Held { ttl: None });
                    }
                    file
                }
            };
            match sys::same_file(&file, &path) {
                Ok(true) => {}
                Ok(false) => {
                    // We locked a file that is no longer the lock's file: lock the current one.
                    sys::unlock_and_close(file);
                    continue;
                }
                Err(e) => {
                    sys::unlock_and_close(file);
                    entry.bump();
                    return Err(self.io_error(format!("cannot stat {}", path.display()), e));
                }
            }
            let value = match f {
                Flavor::Mutex => None,
                Flavor::Election => Some(req.value.clone().unwrap_or_else(|| Arc::from(""))),
            };
            return match self.grant(&file, &path, key, value.as_deref()) {
                Ok(token) => {
                    entry.holder = Some(Holder {
                        attempt: req.attempt.clone(),
                        owner: key.owner.clone(),
                        file,
                        token,
                        value,
                        seq: 0,
                    });
                    Ok(AcquireReply::Granted { token })
                }
                Err(e) => {
                    sys::unlock_and_close(file);
                    // Other waiters may have been counting on the lock this process had.
                    entry.bump();
                    Err(e)
                }
            };
        }
        Err(self.replaced_too_often(&path))
    }

    /// Under the exclusive lock: next fencing token, written with the holder line (and an
    /// election leader's value, at seq 0) before it is returned.
    fn grant(&self, file: &File, path: &Path, key: &HoldKey, value: Option<&str>) -> Result<u64> {
        let rec = self.read_record(file, path)?;
        self.check_name(&rec, &key.name, path)?;
        let token = record::next_token(rec.token).ok_or_else(|| {
            self.corrupt(path, "its fencing token is at the largest possible value")
        })?;
        let new = holder_record(&key.name, &key.owner, token, value, 0);
        record::write(file, &new)
            .map_err(|e| self.io_error(format!("cannot write lock file {}", path.display()), e))?;
        Ok(token)
    }

    pub(crate) fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let name = &grant.key.name;
        let f = flavor(&grant.key);
        {
            let mut table = self.table(f);
            if let Some(entry) = table.get_mut(name) {
                match &entry.holder {
                    Some(h) if h.is(grant) => {
                        self.unlock_holder(entry, name);
                        remove_if_idle(&mut table, name);
                        return Ok(ReleaseOutcome::Released);
                    }
                    Some(_) => return Ok(ReleaseOutcome::TakenByOther),
                    // Locked by this backend's waiting thread for its waiters: nobody holds it.
                    None if entry.parked.is_some() => return Ok(ReleaseOutcome::Expired),
                    None => {}
                }
            }
        }
        // Not held here: held by another process, or by nobody.
        Ok(if self.locked_elsewhere(&self.fpath(f, name))? {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Gives up this backend's grant on `name` (the holder line first, then the lock), and
    /// wakes the waiters.
    fn unlock_holder(&self, entry: &mut Entry, name: &str) {
        if let Some(h) = entry.holder.take() {
            self.write_holder_best_effort(&h.file, name, h.token, None);
            sys::unlock_and_close(h.file);
        }
        entry.bump();
    }

    /// The attempt `req.attempt` stops: if it holds the lock (a grant its caller never
    /// received), give the lock back. Another attempt's grant is never touched.
    pub(crate) fn give_up(&self, req: &AcquireRequest) {
        let name = &req.key.name;
        let mut table = self.table(flavor(&req.key));
        let Some(entry) = table.get_mut(name) else {
            return;
        };
        if entry
            .holder
            .as_ref()
            .is_some_and(|h| h.attempt == req.attempt)
        {
            tracing::debug!(name = %name, attempt = %req.attempt, "giving back the grant of an attempt that gave up");
            self.unlock_holder(entry, name);
            remove_if_idle(&mut table, name);
        }
    }

    /// A duplicate of the descriptor whose `flock` is this backend's grant of `name` (flavor
    /// `f`) with fencing token `token`; `None` without such a grant.
    pub(crate) fn holder_file(
        &self,
        f: Flavor,
        name: &str,
        token: u64,
    ) -> io::Result<Option<File>> {
        let table = self.table(f);
        match table.get(name).and_then(|e| e.holder.as_ref()) {
            Some(h) if h.token == token => h.file.try_clone().map(Some),
            _ => Ok(None),
        }
    }

    pub(crate) fn renew_mutex(&self, grant: &GrantRef) -> Result<RenewOutcome> {
        self.renew_or_proclaim(grant, None)
    }

    /// Renews `grant` (a mutex's or an election's); with `proclaim = Some((seq, value))`,
    /// also advertises `value` if `seq` is above the last proclamation's (an election's).
    pub(crate) fn renew_or_proclaim(
        &self,
        grant: &GrantRef,
        proclaim: Option<(u64, &str)>,
    ) -> Result<RenewOutcome> {
        let key = &grant.key;
        let f = flavor(key);
        let mut table = self.table(f);
        let Some(entry) = table.get_mut(&key.name) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let Some(h) = entry.holder.as_mut().filter(|h| h.is(grant)) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let path = self.fpath(f, &key.name);
        let intact = sys::same_file(&h.file, &path)
            .map_err(|e| self.io_error(format!("cannot stat {}", path.display()), e))?;
        if intact {
            if let Some((seq, value)) = proclaim {
                if seq > h.seq {
                    // Written under our exclusive lock; the table changes only once it is.
                    let mut rec = h.record(&key.name);
                    rec.value = Some(value.to_owned());
                    rec.seq = seq;
                    record::write(&h.file, &rec).map_err(|e| {
                        self.io_error(format!("cannot write lock file {}", path.display()), e)
                    })?;
                    h.value = Some(Arc::from(value));
                    h.seq = seq;
                }
            }
            return Ok(RenewOutcome::Renewed);
        }
        tracing::warn!(name = %key.name, path = %path.display(),
            "the lock file was deleted or replaced while held; the lock is lost");
        if let Some(h) = entry.holder.take() {
            sys::unlock_and_close(h.file);
        }
        entry.bump();
        remove_if_idle(&mut table, &key.name);
        Ok(RenewOutcome::NotHeld)
    }

    /// The state of a lock, under the table lock for this backend's holder, else from the file.
    /// `Err(None)` asks the caller to try again shortly (another process is mid-write).
    pub(crate) fn inspect_once(
        &self,
        f: Flavor,
        name: &str,
        last_try: bool,
    ) -> Result<Option<LockInfo>> {
        {
            let table = self.table(f);
            if let Some(h) = table.get(name).and_then(|e| e.holder.as_ref()) {
                let holder =
                    HolderInfo::new(&*h.owner, 1).with_value(h.value.as_deref().map(str::to_owned));
                return Ok(Some(
                    LockInfo::new(name)
                        .with_holders(vec![holder])
                        .with_fencing_token(h.token),
                ));
            }
        }
        let path = self.fpath(f, name);
        let Some(file) = self.open_existing(&path)? else {
            return Ok(Some(LockInfo::new(name)));
        };
        let free = self.try_flock(&file, sys::Mode::Shared, &path)?;
        let rec = self.read_record(&file, &path);
        if free {
            // Writers hold the exclusive lock, so under our shared lock the record is whole.
            sys::unlock_and_close(file);
            let rec = rec?;
            return Ok(Some(LockInfo::new(name).with_fencing_token(rec.token)));
        }
        // Held by another process, which may be writing the record right now.
        let rec = match rec {
            Ok(rec) => rec,
            Err(e) if last_try => return Err(e),
            Err(_) => return Ok(None),
        };
        let holder = match rec.holder {
            Some(h) => HolderInfo::new(h.owner, h.count).with_value(match f {
                Flavor::Mutex => None,
                Flavor::Election => Some(rec.value.unwrap_or_default()),
            }),
            None if !last_try => return Ok(None),
            // Locked but no holder line: a process between locking and writing, or another
            // backend's waiting thread handing the lock over.
            None => HolderInfo::new(
                "unknown (another process holds the lock but has not recorded its owner)",
                1,
            ),
        };
        Ok(Some(
            LockInfo::new(name)
                .with_holders(vec![holder])
                .with_fencing_token(rec.token),
        ))
    }
}

/// The flavor of a key the backend checked (mutex or election).
fn flavor(key: &HoldKey) -> Flavor {
    Flavor::of(key.kind).unwrap_or(Flavor::Mutex)
}
