//! Granting, releasing and giving up either side of a read-write lock (one non-blocking
//! attempt at a time, under the table lock).

use super::{downgrade_of, remove_if_idle, Checked, RwEntry, RwHold, MAIN, TURNSTILE};
use crate::record::Side;
use crate::{sys, Inner};
use distlock_core::{
    AcquireReply, AcquireRequest, Error, GrantRef, HoldKey, ReleaseOutcome, Result,
};
use std::fs::File;
use std::sync::Arc;

impl Inner {
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

    pub(super) fn try_read(
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
        Err(self.replaced_too_often(&main_path))
    }

    /// Records a new read hold (taking `new_main` as the backend's lock if given), with the
    /// next fencing token.
    pub(super) fn add_reader(
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
    pub(super) fn try_write(
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
        Err(self.replaced_too_often(&main_path))
    }

    /// Records the write hold on `main` (locked exclusively), with the next fencing token.
    pub(super) fn add_writer(
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
    pub(super) fn release_in(
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
    pub(super) fn release_write(entry: &mut RwEntry, key: &HoldKey) {
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
}
