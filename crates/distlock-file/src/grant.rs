//! Granting, releasing, giving up and renewing either side of a lock (one non-blocking
//! attempt at a time, under the table lock). A mutex or an election is the write side of a
//! lock with no readers and no turnstile.

use crate::record::Side;
use crate::table::{downgrade_of, remove_if_idle, slot, Entry, Family, Hold, Target, TURNSTILE};
use crate::{sys, Inner};
use distlock_core::{
    AcquireReply, AcquireRequest, Error, GrantRef, HoldKey, ReleaseOutcome, RenewOutcome, Result,
};
use std::fs::File;
use std::sync::Arc;

const HELD: AcquireReply = AcquireReply::Held { ttl: None };

/// What [`Inner::next_lock`] found.
enum Step {
    /// A descriptor on the lock file, locked for the side asked.
    Lock(File),
    /// The grant is covered by the lock this backend holds already.
    Join,
    /// Held: wait (on this descriptor, if any).
    Wait(Option<File>),
}

impl Inner {
    /// One non-blocking attempt, under the table lock. With `arm` (a waiter), a failed attempt
    /// queues: starts the waiting threads it needs. `first` is false for the later attempts
    /// of one wait (upgrades, below).
    ///
    /// An owner that reads (in this backend) and asks for the write side is refused at once:
    /// two readers upgrading would wait for each other for ever. The check is by owner id (the
    /// request names no read grant), which can only refuse, never grant; and only on the first
    /// attempt of a wait: a writer that was already waiting when a read grant of its owner came
    /// through (another task of the same handle) waits on for it, as for any reader.
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        t @ (family, _): Target,
        req: &AcquireRequest,
        arm: bool,
        first: bool,
    ) -> Result<AcquireReply> {
        let mut table = self.table(family);
        let entry = table.entry(req.key.name.clone()).or_default();
        let r = self.try_in(t, entry, req, arm, first);
        remove_if_idle(&mut table, &req.key.name);
        r
    }

    fn try_in(
        self: &Arc<Self>,
        t @ (family, side): Target,
        entry: &mut Entry,
        req: &AcquireRequest,
        arm: bool,
        first: bool,
    ) -> Result<AcquireReply> {
        let key = &req.key;
        // A retry of an attempt that holds this side: the same grant. The lease is the
        // process's lifetime, so there is nothing to lengthen.
        if let Some(h) = entry.holds(side).iter().find(|h| h.attempt == req.attempt) {
            return Ok(AcquireReply::Granted { token: h.token });
        }
        if side == Side::Write {
            if family != Family::Rw && entry.writer().is_some() {
                // Any other attempt, even of the same owner id, is another holder; its
                // release wakes this backend's waiters.
                return Ok(HELD);
            }
            if first && entry.holds(Side::Read).iter().any(|h| h.owner == key.owner) {
                return Err(Error::invalid(format!(
                    "owner `{}` holds the read side of read-write lock `{}` and asked for the write side: upgrades are refused (two readers upgrading would wait for each other forever); release the read side first",
                    key.owner, key.name
                )));
            }
        }
        if arm {
            entry.kernel_error.take().map_or(Ok(()), Err)?;
        }
        let main_path = self.lock_path(family, &key.name);
        // A few rounds in case the file is deleted or replaced while we lock it.
        for _ in 0..3 {
            let f = match self.next_lock(t, entry, req)? {
                Step::Lock(f) => f,
                Step::Join => return self.add(t, entry, req, None),
                Step::Wait(f) if arm => return self.queue(t, entry, &key.name, f).map(|()| HELD),
                Step::Wait(_) => return Ok(HELD),
            };
            // Still the lock's file? Else it was deleted or replaced after we opened it: again.
            match self.same_file(&f, &main_path) {
                Ok(true) => return self.add(t, entry, req, Some(f)),
                same => {
                    sys::unlock_and_close(f);
                    same.inspect_err(|_| entry.bump())?;
                }
            }
        }
        let replaced = "the lock file was deleted or replaced three times while locking it; is something removing files in the lock directory?";
        Err(crate::fs::at(&self.endpoint, "cannot lock", &main_path)(
            std::io::Error::other(replaced),
        ))
    }

    /// The next step of an attempt at side `side`: a descriptor on the lock file, locked
    /// (parked by a waiting thread, or locked now without waiting); a grant covered by this
    /// backend's lock; or the lock is held, and the descriptor to wait on, if any.
    fn next_lock(
        &self,
        (family, side): Target,
        entry: &mut Entry,
        req: &AcquireRequest,
    ) -> Result<Step> {
        let main_path = self.lock_path(family, &req.key.name);
        if side == Side::Write {
            // No descriptor to try (and none to wait on) while other owners of this backend
            // hold a side: their release wakes the waiters.
            if let Some(f) = entry.parked[side as usize].take() {
                return Ok(Step::Lock(f));
            }
            let f = (!entry.held()).then(|| self.open_rw(&main_path));
            return Ok(match f.transpose()? {
                Some(f) if self.try_flock(&f, sys::Mode::Exclusive, &main_path)? => Step::Lock(f),
                f => Step::Wait(f),
            });
        }
        if let Some(w) = entry.writer() {
            // A downgrade: the request names this very write grant, whose exclusive lock
            // covers the read side. (Never for the owner id alone: another client with the
            // same owner id is another holder.)
            return Ok(match downgrade_of(req, w) {
                true => Step::Join,
                false => Step::Wait(None),
            });
        }
        match entry.parked[side as usize].take() {
            // The read thread passed the turnstile before it blocked: its lock is ours (or,
            // while other owners of this backend read, theirs covers us).
            Some(f) if entry.main.is_some() => {
                sys::unlock_and_close(f);
                return Ok(Step::Join);
            }
            Some(f) => return Ok(Step::Lock(f)),
            None => {}
        }
        // A new reader passes the turnstile first: it cannot while a writer waits.
        let ts_path = self.file(&req.key.name, TURNSTILE);
        let ts = self.open_rw(&ts_path)?;
        if !self.try_flock(&ts, sys::Mode::Shared, &ts_path)? {
            return Ok(Step::Wait(None));
        }
        if entry.main.is_some() {
            // Other owners of this backend read: join them.
            sys::unlock_and_close(ts);
            return Ok(Step::Join);
        }
        let locked = (self.open_rw(&main_path))
            .and_then(|f| Ok((self.try_flock(&f, sys::Mode::Shared, &main_path)?, f)));
        sys::unlock_and_close(ts);
        // If a writer holds the lock: we passed the turnstile, so we wait ahead of any writer
        // that starts waiting from now on, blocking on the lock file directly.
        Ok(match locked? {
            (true, f) => Step::Lock(f),
            (false, f) => Step::Wait(Some(f)),
        })
    }

    /// Records a new hold of `side` (taking `main` as the backend's lock if given: for the
    /// write side, locked exclusively), with the next fencing token, written to the record
    /// (with the holder, and an election leader's value at seq 0) before it is returned.
    fn add(
        &self,
        (family, side): Target,
        entry: &mut Entry,
        req: &AcquireRequest,
        main: Option<File>,
    ) -> Result<AcquireReply> {
        if let Some(old) = main.and_then(|f| entry.main.replace(f)) {
            // Only possible after the old file was replaced: that descriptor locks nothing.
            sys::unlock_and_close(old);
        }
        entry.grants[side as usize].push(Hold::new(req, family));
        let token = (self.sync(family, &req.key.name, entry, true)).inspect_err(|_| {
            entry.grants[side as usize].pop();
            entry.unlock_if_unheld();
            // Other waiters may have been counting on the lock this process had.
            entry.bump();
        })?;
        if let Some(h) = entry.grants[side as usize].last_mut() {
            h.token = token;
        }
        // Give the turnstile back even if other writers of this backend still wait, so that a
        // chain of writers cannot keep readers out for ever (see the docs).
        if let Some(ts) = entry.parked[slot(None)].take_if(|_| side == Side::Write) {
            sys::unlock_and_close(ts);
        }
        Ok(AcquireReply::Granted { token })
    }

    pub(crate) async fn release(
        &self,
        t @ (family, side): Target,
        grant: &GrantRef,
    ) -> Result<ReleaseOutcome> {
        let name = &grant.key.name;
        {
            let mut table = self.table(family);
            if let Some(entry) = table.get_mut(name) {
                if self.release_in(t, entry, &grant.key, |h| h.is(grant)) {
                    remove_if_idle(&mut table, name);
                    return Ok(ReleaseOutcome::Released);
                }
                // A writer took either side (other readers share the read side); readers of
                // other owners took the write side (the owner's own, a downgrade it kept, not).
                let mut readers = entry.holds(Side::Read).iter();
                if entry.writer().is_some()
                    || (side == Side::Write && readers.any(|h| h.owner != grant.key.owner))
                {
                    return Ok(ReleaseOutcome::TakenByOther);
                }
                if entry.parked[Side::Write as usize].is_some() {
                    // Locked exclusively by this backend's waiting thread, for its waiting
                    // writers: nobody holds it.
                    return Ok(ReleaseOutcome::Expired);
                }
            }
        }
        // Not held here: held by another process (or backend), or by nobody.
        let elsewhere = match (family, side) {
            (Family::Rw, Side::Write) => self.rw_held_elsewhere(name).await?,
            _ => self
                .held_elsewhere(&self.lock_path(family, name))?
                .is_some(),
        };
        Ok(if elsewhere {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// The attempt `req.attempt` stops: give back its grant of this side if it has one (a
    /// grant nobody received). Other attempts' grants, even of the same owner, stay.
    pub(crate) fn give_up(&self, t @ (family, _): Target, req: &AcquireRequest) {
        let name = &req.key.name;
        let mut table = self.table(family);
        let Some(entry) = table.get_mut(name) else {
            return;
        };
        if self.release_in(t, entry, &req.key, |h| h.attempt == req.attempt) {
            tracing::debug!(name = %name, attempt = %req.attempt, "gave back the grant of an attempt that gave up");
            remove_if_idle(&mut table, name);
        }
    }

    /// Releases the grant of `side` that `which` picks, if there is one: the record first,
    /// then the lock (a hold listed is never gone yet), then the waiters are woken. True if
    /// it released one. The read grants made beside a write grant (downgrades) keep the lock,
    /// now shared.
    fn release_in(
        &self,
        (family, side): Target,
        entry: &mut Entry,
        key: &HoldKey,
        which: impl Fn(&Hold) -> bool,
    ) -> bool {
        let grants = &mut entry.grants[side as usize];
        let Some(i) = grants.iter().position(which) else {
            return false;
        };
        grants.remove(i);
        if let (Side::Write, false, Some(main)) =
            (side, entry.holds(Side::Read).is_empty(), &entry.main)
        {
            // The writer keeps reading: convert the lock to shared. Linux converts in place, so
            // no waiting writer slips in; should it fail, the read hold is lost (docs:
            // *Downgrade*).
            let res = sys::try_lock(main, sys::Mode::Shared);
            if !matches!(res, Ok(true)) {
                tracing::warn!(name = %key.name, owner = %key.owner, result = ?res,
                    "could not keep the read side after releasing the write side; the read hold is lost");
                entry.grants[Side::Read as usize].clear();
            }
        }
        self.sync_best_effort(family, &key.name, entry);
        entry.unlock_if_unheld();
        entry.bump();
        true
    }

    /// The lease is the process's lifetime: a renewal only confirms that the grant is still
    /// ours and its file still the lock's file, whatever duration it asks for. With
    /// `proclaim = Some((seq, value))` (an election), also advertises `value` if `seq` is
    /// above the last proclamation's.
    pub(crate) fn renew(
        &self,
        (family, side): Target,
        grant: &GrantRef,
        proclaim: Option<(u64, &str)>,
    ) -> Result<RenewOutcome> {
        let key = &grant.key;
        let mut table = self.table(family);
        let Some(entry) = table.get_mut(&key.name) else {
            return Ok(RenewOutcome::NotHeld);
        };
        if !entry.holds(side).iter().any(|h| h.is(grant)) {
            return Ok(RenewOutcome::NotHeld);
        }
        let path = self.lock_path(family, &key.name);
        let intact = entry.main.as_ref().map(|f| self.same_file(f, &path));
        if intact.transpose()? == Some(true) {
            if let Some((seq, value)) = proclaim {
                self.proclaim(entry, &key.name, seq, value)?;
            }
            return Ok(RenewOutcome::Renewed);
        }
        tracing::warn!(name = %key.name, path = %path.display(),
            "the lock file was deleted or replaced while held; every hold on it is lost");
        // Every hold is dropped: renewals report them lost.
        entry.grants = Default::default();
        entry.unlock_if_unheld();
        entry.bump();
        // A mutex's record went with its file; a read-write lock's loses our lines.
        self.sync_best_effort(family, &key.name, entry);
        remove_if_idle(&mut table, &key.name);
        Ok(RenewOutcome::NotHeld)
    }
}
