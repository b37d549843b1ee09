//! What other processes and backends hold of a read-write lock: the record's `hold` lines,
//! checked against live processes and the lock itself.

use super::{kind_of, RwHold, MAIN, RECORD};
use crate::record::{HoldLine, Record, Side};
use crate::{sys, Inner};
use distlock_core::{HolderInfo, LockInfo, Result};

impl Inner {
    /// The record, read under a shared lock (`None` if the file does not exist).
    pub(super) fn read_rw_record(&self, name: &str) -> Result<Option<Record>> {
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

    /// True if a process (or backend) other than this one holds `<hash>.rw` exclusively.
    pub(super) fn rw_write_locked(&self, name: &str) -> Result<bool> {
        self.locked_elsewhere(&self.rw_path(name, MAIN))
    }

    /// The holds of other processes and backends, from the record: lines of live processes;
    /// write lines only if the lock file is locked exclusively (and then only the writer's own
    /// read line besides).
    pub(super) fn foreign_holds(
        &self,
        name: &str,
        rec: &Record,
        reading_here: bool,
    ) -> Result<Vec<HoldLine>> {
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

    pub(super) fn rw_held_elsewhere(&self, name: &str) -> Result<bool> {
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
                    let info = |side: Side, h: &RwHold| {
                        HolderInfo::new(&*h.owner, 1).with_side(Some(kind_of(side)))
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
                holders.push(HolderInfo::new(h.owner, h.count).with_side(Some(kind_of(h.side))));
            }
        }
        Ok(LockInfo::new(name)
            .with_holders(holders)
            .with_fencing_token(rec.token))
    }
}
