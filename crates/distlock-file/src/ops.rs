//! Operator commands on `file://`: `dlock list`, `dlock release --force`, `dlock doctor`
//! (docs/file-backend.md, section *Operator commands*). A forced release of a **held** lock is
//! refused: it is the holder process's `flock(2)`, which no other process can drop (and
//! advancing the counter alone would let no next holder in). A free lock's counter is advanced
//! under the exclusive lock, as a grant would.

use super::{check, sys, FileBackend, KIND};
use crate::record::HoldLine;
use crate::table::{Entry, Family};
use distlock_core::{
    Error, Finding, ForceReleased, ListedLock, LockKind, Operator, Result, Severity,
};
use std::fs::File;
use std::io::Write;

#[distlock_core::async_trait]
impl Operator for FileBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let inner = &self.inner;
        let unreadable = crate::fs::at(&inner.endpoint, "cannot read", &inner.dir);
        let entries = std::fs::read_dir(&inner.dir).map_err(unreadable)?;
        // The files that carry a lock's record (and so its name: the file name is its hash).
        let kinds = [
            (Family::Mutex, LockKind::Mutex),
            (Family::Rw, LockKind::Write),
            (Family::Election, LockKind::Election),
        ];
        let mut found: Vec<(String, LockKind)> = Vec::new();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let suffix = file_name.to_str().and_then(|n| n.rsplit_once('.'));
            let Some(&(family, kind)) =
                (kinds.iter()).find(|(f, _)| suffix.is_some_and(|(_, s)| s == f.record_suffix()))
            else {
                continue;
            };
            // An unreadable record names no lock: skipped.
            let rec = inner.read_lock_record(family, &entry.path()).await;
            let name = rec.ok().flatten().and_then(|(rec, _)| rec.name);
            found.extend(name.filter(|n| n.starts_with(prefix)).map(|n| (n, kind)));
        }
        found.sort_by(|a, b| (&a.0, a.1.as_str()).cmp(&(&b.0, b.1.as_str())));
        found.dedup();
        let mut out = Vec::with_capacity(found.len());
        for (name, kind) in found {
            let info = distlock_core::Backend::inspect(self, &name, kind).await?;
            out.push(ListedLock::new(kind, info));
        }
        Ok(out)
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        let inner = &self.inner;
        let (family, _) = check(kind, name)?;
        if family == Family::Rw {
            let rec = inner.rw_record(name).await?;
            if rec.holds.is_empty() {
                // Free (as far as the record says): nothing to remove. The counter of a
                // read-write lock is advanced under its own protocol at the next grant.
                return Ok(ForceReleased::new(Vec::new(), rec.token));
            }
            return Err(held_error(name, &rec.holds));
        }
        let path = inner.lock_path(family, name);
        let Some(file) = inner.open_existing(&path, true)? else {
            return Ok(ForceReleased::new(Vec::new(), 0));
        };
        if !inner.try_flock(&file, sys::Mode::Exclusive, &path)? {
            let rec = inner.read_lock_record(family, &path).await;
            let holder = rec.ok().flatten().and_then(|(rec, _)| rec.holder);
            return Err(held_error(name, holder.as_slice()));
        }
        // Under the exclusive lock, as a grant to nobody: advance the counter past every
        // token issued, and leave no holder line.
        let mut entry = Entry {
            main: Some(file),
            ..Entry::default()
        };
        let token = inner.sync(family, name, &entry, true);
        entry.unlock_if_unheld();
        Ok(ForceReleased::new(Vec::new(), token?))
    }

    async fn diagnose(&self) -> Result<Vec<Finding>> {
        let (dir, mut out) = (&self.inner.dir, Vec::new());
        #[cfg(any(target_os = "linux", target_os = "android"))]
        out.push({
            let (severity, text) = match sys::fs_magic(dir) {
                Ok(magic) => crate::fs::fs_verdict(dir, magic),
                Err(e) => (
                    Severity::Unsafe,
                    format!("cannot statfs {}: {e}", dir.display()),
                ),
            };
            Finding::new(severity, "file-system", text)
        });
        // Writable: a lock file must be creatable and writable (the record carries the counter).
        let probe = dir.join(format!(".dlock-doctor-{}", std::process::id()));
        let written = File::create_new(&probe).and_then(|mut f| f.write_all(b"probe\n"));
        let _ = std::fs::remove_file(&probe);
        let (severity, text) = match written {
            Ok(()) => (Severity::Ok, format!("{} is writable", dir.display())),
            Err(e) => (Severity::Unsafe, format!("cannot create files in {}: {e}; locks cannot be taken: give the user write permission on the directory (for several users: a group-writable setgid directory and umask 002)", dir.display())),
        };
        out.push(Finding::new(severity, "writable", text));
        Ok(out)
    }
}

/// The refusal for a held lock: who holds it and what to do.
fn held_error(name: &str, holders: &[HoldLine]) -> Error {
    let who: Vec<String> = holders
        .iter()
        .map(|HoldLine { pid, owner, .. }| {
            let away = "; not running here: the holder may be in another PID namespace";
            format!(
                "pid {pid} (owner {owner}{})",
                if sys::pid_alive(*pid) { "" } else { away }
            )
        })
        .collect();
    let who = if who.is_empty() {
        "a process that has not recorded itself yet".to_owned()
    } else {
        who.join(", ")
    };
    Error::unsupported(
        KIND,
        format!(
            "forced release of `{name}`: the lock is held by {who}. On file:// a lock is the holder process's flock(2), which no other process can take away; the kernel frees it the moment that process exits. Stop the holder (e.g. `kill <pid>`); the next holder then gets a higher fencing token"
        ),
    )
}
