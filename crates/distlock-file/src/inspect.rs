//! What a lock's holders are: this backend's from its table; other processes' from the
//! record (a mutex's holder line, read under a shared probe of the lock; a read-write lock's
//! `hold` lines, checked against live processes and the lock itself).

use crate::record::{HoldLine, Record, Side};
use crate::table::{Entry, Family};
use crate::{sys, Inner};
use distlock_core::{HolderInfo, LockInfo, LockKind, Result};
use std::path::Path;
use std::time::Duration;

impl Inner {
    /// The record in `path`, the record file of a lock of `family` (`None`: no such file), and
    /// whether a mutex or an election is held by another process (or backend). A read-write
    /// lock's record is read under its shared lock, which is only ever held for one read and
    /// one write, never while waiting: this cannot block behind a holder. A mutex's or an
    /// election's is read under a non-blocking shared probe of the lock; while someone holds
    /// it, the holder may be writing the record: read again a few times until it parses and
    /// names its holder.
    pub(crate) async fn read_lock_record(
        &self,
        family: Family,
        path: &Path,
    ) -> Result<Option<(Record, bool)>> {
        const TRIES: u32 = 5;
        let mut tries = 0;
        loop {
            tries += 1;
            let Some(file) = self.open_existing(path, false)? else {
                return Ok(None);
            };
            if family == Family::Rw {
                let rec = self.locked(file, sys::Mode::Shared, path, |f| self.read_record(f, path));
                return Ok(Some((rec?, false)));
            }
            let free = self.try_flock(&file, sys::Mode::Shared, path)?;
            let rec = self.read_record(&file, path);
            if free {
                // Writers hold the exclusive lock, so under our shared lock the record is whole.
                sys::unlock_and_close(file);
                return Ok(Some((rec?, false)));
            }
            match rec {
                Ok(rec) if rec.holder.is_some() || tries == TRIES => return Ok(Some((rec, true))),
                Err(e) if tries == TRIES => return Err(e),
                _ => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }

    /// The state of lock `name` of `family`: this backend's holder from its table, others'
    /// from the record.
    pub(crate) async fn inspect(&self, family: Family, name: &str) -> Result<LockInfo> {
        if family == Family::Rw {
            return self.rw_inspect(name).await;
        }
        let info = LockInfo::new(name);
        let own = (self.table(family).get(name).and_then(Entry::writer)).map(|h| {
            let value = h.value.as_deref().map(str::to_owned);
            (HolderInfo::new(&*h.owner, 1).with_value(value), h.token)
        });
        if let Some((holder, token)) = own {
            return Ok(info.with_holders(vec![holder]).with_fencing_token(token));
        }
        let path = self.lock_path(family, name);
        let Some((rec, held)) = self.read_lock_record(family, &path).await? else {
            return Ok(info);
        };
        let info = info.with_fencing_token(rec.token);
        let holder = match rec.holder {
            _ if !held => return Ok(info),
            Some(h) => HolderInfo::new(h.owner, h.count)
                .with_value((family == Family::Election).then(|| rec.value.unwrap_or_default())),
            // Locked but no holder line: a process between locking and writing, or another
            // backend's waiting thread handing the lock over.
            None => HolderInfo::new(
                "unknown (another process holds the lock but has not recorded its owner)",
                1,
            ),
        };
        Ok(info.with_holders(vec![holder]))
    }

    /// A read-write lock's record (the default when there is no such file).
    pub(crate) async fn rw_record(&self, name: &str) -> Result<Record> {
        let path = self.record_path(Family::Rw, name);
        let rec = self.read_lock_record(Family::Rw, &path).await?;
        Ok(rec.map(|(rec, _)| rec).unwrap_or_default())
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
        let id = |h: &HoldLine| (h.pid, h.instance, h.owner.clone());
        let writers: Vec<_> = (lines.iter().filter(|h| h.side == Side::Write).map(id)).collect();
        if !writers.is_empty() {
            let main = self.lock_path(Family::Rw, name);
            let written = !reading_here && self.held_elsewhere(&main)?.is_some();
            lines.retain(|h| match written {
                true => writers.contains(&id(h)),
                false => h.side == Side::Read,
            });
        }
        Ok(lines)
    }

    /// True if a process (or backend) other than this one holds either side of read-write
    /// lock `name`.
    pub(crate) async fn rw_held_elsewhere(&self, name: &str) -> Result<bool> {
        let rec = self.rw_record(name).await?;
        Ok(!self.foreign_holds(name, &rec, false)?.is_empty()
            || (self.held_elsewhere(&self.lock_path(Family::Rw, name))?).is_some())
    }

    async fn rw_inspect(&self, name: &str) -> Result<LockInfo> {
        let (mut holds, writing, reading) = match self.table(Family::Rw).get(name) {
            Some(e) => (
                e.lines(self.instance),
                e.writer().is_some(),
                !e.holds(Side::Read).is_empty(),
            ),
            None => (Vec::new(), false, false),
        };
        let rec = self.rw_record(name).await?;
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
