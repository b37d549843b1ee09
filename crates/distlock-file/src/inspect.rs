//! What a lock's holders are: this backend's from its table; other processes' from the
//! record (a mutex's holder line, read under a shared probe of the lock; a read-write lock's
//! `hold` lines, checked against live processes and the lock itself).

use crate::record::{HoldLine, Record, Side};
use crate::table::{Family, RECORD};
use crate::{sys, Inner, KIND};
use distlock_core::{Error, HolderInfo, LockInfo, LockKind, Result};
use std::time::Duration;

impl Inner {
    /// The state of lock `name` of `family`. A mutex's record is re-read a few times while
    /// another process is mid-write.
    pub(crate) async fn inspect(&self, family: Family, name: &str) -> Result<LockInfo> {
        if family == Family::Rw {
            return self.rw_inspect(name);
        }
        const TRIES: u32 = 5;
        for i in 1..=TRIES {
            if let Some(info) = self.inspect_once(family, name, i == TRIES)? {
                return Ok(info);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Err(Error::unexpected(
            KIND,
            format!("could not read a consistent record for lock `{name}`"),
        ))
    }

    /// The state of a mutex or an election, under the table lock for this backend's holder,
    /// else from the file. `Ok(None)` asks the caller to try again shortly (another process
    /// is mid-write).
    fn inspect_once(&self, family: Family, name: &str, last_try: bool) -> Result<Option<LockInfo>> {
        let election = family == Family::Election;
        let info = |holder: HolderInfo, token| {
            LockInfo::new(name)
                .with_holders(vec![holder])
                .with_fencing_token(token)
        };
        {
            let table = self.table(family);
            if let Some(h) = table.get(name).and_then(|e| e.writer.as_ref()) {
                let value = h.value.as_deref().map(str::to_owned);
                return Ok(Some(info(
                    HolderInfo::new(&*h.owner, 1).with_value(value),
                    h.token,
                )));
            }
        }
        let path = self.lock_path(family, name);
        let Some(file) = self.open_existing(&path, false)? else {
            return Ok(Some(LockInfo::new(name)));
        };
        let free = self.try_flock(&file, sys::Mode::Shared, &path)?;
        let rec = self.read_record(&file, &path);
        if free {
            // Writers hold the exclusive lock, so under our shared lock the record is whole.
            sys::unlock_and_close(file);
            return Ok(Some(LockInfo::new(name).with_fencing_token(rec?.token)));
        }
        // Held by another process, which may be writing the record right now.
        let rec = match rec {
            Ok(rec) => rec,
            Err(e) if last_try => return Err(e),
            Err(_) => return Ok(None),
        };
        let holder = match rec.holder {
            Some(h) => HolderInfo::new(h.owner, h.count)
                .with_value(election.then(|| rec.value.unwrap_or_default())),
            None if !last_try => return Ok(None),
            // Locked but no holder line: a process between locking and writing, or another
            // backend's waiting thread handing the lock over.
            None => HolderInfo::new(
                "unknown (another process holds the lock but has not recorded its owner)",
                1,
            ),
        };
        Ok(Some(info(holder, rec.token)))
    }

    /// A read-write lock's record, read under a shared lock (`None` if the file does not
    /// exist).
    pub(crate) fn read_rw_record(&self, name: &str) -> Result<Option<Record>> {
        let path = self.file(name, RECORD);
        let Some(file) = self.open_existing(&path, false)? else {
            return Ok(None);
        };
        (self.locked(file, sys::Mode::Shared, &path, |f| {
            self.read_record(f, &path)
        }))
        .map(Some)
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
            let main = self.lock_path(Family::Rw, name);
            if !reading_here && self.held_elsewhere(&main)?.is_some() {
                let id = |h: &HoldLine| (h.pid, h.instance, h.owner.clone());
                let writers: Vec<_> = lines
                    .iter()
                    .filter(|h| h.side == Side::Write)
                    .map(id)
                    .collect();
                lines.retain(|h| writers.contains(&id(h)));
            } else {
                lines.retain(|h| h.side == Side::Read);
            }
        }
        Ok(lines)
    }

    /// True if a process (or backend) other than this one holds either side of read-write
    /// lock `name`.
    pub(crate) fn rw_held_elsewhere(&self, name: &str) -> Result<bool> {
        if self
            .held_elsewhere(&self.lock_path(Family::Rw, name))?
            .is_some()
        {
            return Ok(true);
        }
        let Some(rec) = self.read_rw_record(name)? else {
            return Ok(false);
        };
        Ok(!self.foreign_holds(name, &rec, false)?.is_empty())
    }

    fn rw_inspect(&self, name: &str) -> Result<LockInfo> {
        let (mut holds, writing, reading) = match self.table(Family::Rw).get(name) {
            Some(e) => (
                e.lines(self.instance),
                e.writer.is_some(),
                !e.readers.is_empty(),
            ),
            None => (Vec::new(), false, false),
        };
        let rec = self.read_rw_record(name)?.unwrap_or_default();
        if !writing {
            // While this backend writes, nobody else can hold either side.
            holds.extend(self.foreign_holds(name, &rec, reading)?);
        }
        let holders = holds.into_iter().map(|h| {
            let side = [LockKind::Read, LockKind::Write][h.side as usize];
            HolderInfo::new(h.owner, h.count).with_side(Some(side))
        });
        Ok(LockInfo::new(name)
            .with_holders(holders.collect())
            .with_fencing_token(rec.token))
    }
}
