//! The lock directory: creating it, refusing one on a network file system or (for the default
//! directory) one planted by another user; opening and reading lock files.

use crate::record::{self, Record};
use crate::{sys, Inner, KIND};
use distlock_core::{Error, Result, Severity};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub(crate) fn io_error(endpoint: &str, what: String, e: io::Error) -> Error {
    Error::connection(
        KIND,
        endpoint,
        io::Error::new(e.kind(), format!("{what}: {e}")),
    )
}

/// The error of doing `what` to `path` (e.g. "cannot open lock file"), for `map_err`.
pub(crate) fn at<'a>(
    endpoint: &'a str,
    what: &'a str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> Error + 'a {
    move |e| io_error(endpoint, format!("{what} {}", path.display()), e)
}

/// Creates (if needed) and checks the lock directory `base` and its subdirectory of
/// `namespace`; returns that subdirectory and its endpoint (`file://<dir>`). `default` is true
/// for the default directory, which must be a real directory owned by the calling user.
pub(crate) fn open_dir(base: &Path, namespace: &str, default: bool) -> Result<(PathBuf, String)> {
    let endpoint = format!("file://{}", base.display());
    let base_meta = create_dir(base, &endpoint)?;
    if default {
        check_private(base, &endpoint)?;
    }
    let dir = base.join(crate::location::namespace_dir(namespace));
    let endpoint = format!("file://{}", dir.display());
    let existed = std::fs::symlink_metadata(&dir).is_ok();
    create_dir(&dir, &endpoint)?;
    check_local(&dir, &endpoint)?;
    if !existed {
        // Share the namespace directory as the base directory is shared, never with
        // everyone: a group-writable (setgid) base gives a group-writable subdirectory.
        let mode = (base_meta.mode() & 0o2770) | 0o700;
        if let Err(e) = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot set the mode of the namespace directory");
        }
    }
    Ok((dir, endpoint))
}

/// Creates `dir` (and missing parents) with mode `0700`; returns its metadata.
fn create_dir(dir: &Path, endpoint: &str) -> Result<std::fs::Metadata> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(at(endpoint, "cannot create the lock directory", dir))?;
    let meta = std::fs::metadata(dir).map_err(at(endpoint, "cannot stat", dir))?;
    if !meta.is_dir() {
        return Err(io_error(
            endpoint,
            format!("{} is not a directory", dir.display()),
            io::Error::new(io::ErrorKind::NotADirectory, "choose a directory"),
        ));
    }
    Ok(meta)
}

/// The network file systems a lock directory may not be on, by `statfs` magic number: their
/// `flock` is emulated with byte-range locks that the server can lose (an NFSv4 or SMB client
/// whose lease or session lapses loses its locks without being told), or is local to one
/// client, so it is no lock at all between the hosts that share the directory.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn network_fs(magic: u64) -> Option<&'static str> {
    match magic {
        0x6969 => Some("NFS"),
        0x517B => Some("SMB"),
        0xFF53_4D42 => Some("CIFS"),
        0xFE53_4D42 => Some("SMB2"),
        0x5346_414F | 0x6B41_4653 => Some("AFS"),
        0x00C3_6400 => Some("CephFS"),
        _ => None,
    }
}

/// `FUSE_SUPER_MAGIC`: local (fuse-overlayfs in rootless containers) or remote (sshfs), which
/// `statfs` cannot tell apart.
#[cfg(any(target_os = "linux", target_os = "android"))]
const FUSE_MAGIC: u64 = 0x6573_5546;

/// What the file system of lock directory `dir`, of `statfs` type `magic`, means for its
/// locks (for `open` and `doctor` alike): unsafe on a network file system (see
/// [`network_fs`]), a warning on FUSE, else fine.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn fs_verdict(dir: &Path, magic: u64) -> (Severity, String) {
    let dir = dir.display();
    match network_fs(magic) {
        Some(fs) => (Severity::Unsafe, format!("{dir} as a lock directory (it is on {fs}, statfs type {magic:#x}, a network file system whose flock locks can be lost by the client or do not exclude other hosts; use a directory on a local file system, e.g. `file://`, or a networked backend such as `redis://` or `etcd://` for locks between hosts)")),
        None if magic == FUSE_MAGIC => (Severity::Warning, format!("{dir} is on a FUSE file system: flock works there only if the file system implements it for this host (fuse-overlayfs does; sshfs and other network file systems do not); prefer a local directory")),
        None => (Severity::Ok, format!("{dir} is on a local file system (statfs type {magic:#x}); locks exclude the processes of this host only")),
    }
}

/// Refuses a lock directory on a network file system, warns of one on FUSE.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn check_local(dir: &Path, endpoint: &str) -> Result<()> {
    let magic = sys::fs_magic(dir).map_err(at(endpoint, "cannot statfs", dir))?;
    match fs_verdict(dir, magic) {
        (Severity::Unsafe, text) => Err(Error::unsupported(KIND, text)),
        (Severity::Warning, text) => {
            tracing::warn!("{text}");
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn check_local(_dir: &Path, _endpoint: &str) -> Result<()> {
    Ok(())
}

/// The default directory may sit in the world-writable `/tmp`: refuse one planted by someone else.
fn check_private(dir: &Path, endpoint: &str) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir).map_err(at(endpoint, "cannot stat", dir))?;
    let uid = sys::euid();
    if meta.file_type().is_symlink() || meta.uid() != uid {
        return Err(io_error(
            endpoint,
            format!(
                "the default lock directory {} is {} owned by uid {}, not by you (uid {uid}); another user may be trying to intercept your locks: remove it, or name a directory with file:///path",
                dir.display(),
                if meta.file_type().is_symlink() { "a symlink" } else { "a directory" },
                meta.uid()
            ),
            io::Error::new(io::ErrorKind::PermissionDenied, "untrusted lock directory"),
        ));
    }
    Ok(())
}

impl Inner {
    pub(crate) fn io_error(&self, what: String, e: io::Error) -> Error {
        io_error(&self.endpoint, what, e)
    }

    /// Locks `file` (at `path`) in `mode` if that needs no wait (`flock(mode | LOCK_NB)`):
    /// whether it did.
    pub(crate) fn try_flock(&self, file: &File, mode: sys::Mode, path: &Path) -> Result<bool> {
        sys::try_lock(file, mode).map_err(at(&self.endpoint, "cannot lock", path))
    }

    /// Runs `f` on `file` (at `path`) under `flock(mode)`, waiting for it; unlocks and closes
    /// the file after.
    pub(crate) fn locked<T>(
        &self,
        file: File,
        mode: sys::Mode,
        path: &Path,
        f: impl FnOnce(&File) -> Result<T>,
    ) -> Result<T> {
        sys::lock_blocking(&file, mode).map_err(at(&self.endpoint, "cannot lock", path))?;
        let res = f(&file);
        sys::unlock_and_close(file);
        res
    }

    /// The (unlocked) descriptor of `path` if a process (or backend) other than this one holds
    /// its lock exclusively (a non-blocking `LOCK_SH` probe); `None` when there is no such file.
    pub(crate) fn held_elsewhere(&self, path: &Path) -> Result<Option<File>> {
        let Some(file) = self.open_existing(path, false)? else {
            return Ok(None);
        };
        if self.try_flock(&file, sys::Mode::Shared, path)? {
            sys::unlock_and_close(file);
            return Ok(None);
        }
        Ok(Some(file))
    }

    pub(crate) fn corrupt(&self, path: &Path, why: &str) -> Error {
        Error::unexpected(
            KIND,
            format!(
                "lock file {} is not a dlock lock record: {why}. If no process uses this lock, delete the file to reset it (its fencing tokens then restart at the clock floor, above the earlier ones)",
                path.display()
            ),
        )
    }

    pub(crate) fn open_rw(&self, path: &Path) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(at(&self.endpoint, "cannot open lock file", path))
    }

    /// Opens an existing lock file, read-only unless `write`; `None` if it does not exist.
    pub(crate) fn open_existing(&self, path: &Path, write: bool) -> Result<Option<File>> {
        match OpenOptions::new().read(true).write(write).open(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(at(&self.endpoint, "cannot open lock file", path)(e)),
        }
    }

    /// Replaces the record in `file` (at `path`) with `rec`, under the lock on the record.
    pub(crate) fn write_record(&self, file: &File, path: &Path, rec: &Record) -> Result<()> {
        let bytes = rec.encode();
        (file.write_all_at(bytes.as_bytes(), 0))
            .and_then(|()| file.set_len(bytes.len() as u64))
            .map_err(at(&self.endpoint, "cannot write lock file", path))
    }

    /// True if `path` still names the file `file` is open on (see [`sys::same_file`]).
    pub(crate) fn same_file(&self, file: &File, path: &Path) -> Result<bool> {
        sys::same_file(file, path).map_err(at(&self.endpoint, "cannot stat", path))
    }

    pub(crate) fn read_record(&self, file: &File, path: &Path) -> Result<Record> {
        let bytes =
            record::read(file).map_err(at(&self.endpoint, "cannot read lock file", path))?;
        Record::parse(&bytes).map_err(|why| self.corrupt(path, &why))
    }

    /// The record of lock `name` in `file` (at `path`), read under the lock on the record,
    /// refused if it names another lock (two names with the same hash); with `grant`, its
    /// counter advanced to the next grant's fencing token (see [`record::next_token`]).
    pub(crate) fn read_own_record(
        &self,
        file: &File,
        path: &Path,
        name: &str,
        grant: bool,
    ) -> Result<Record> {
        let mut rec = self.read_record(file, path)?;
        if let Some(other) = rec.name.as_deref().filter(|other| *other != name) {
            return Err(Error::unexpected(
                KIND,
                format!(
                    "lock file {} belongs to lock `{other}`, not `{name}`: the two names have the same FNV-1a-128 hash; rename one of the locks",
                    path.display(),
                ),
            ));
        }
        if grant {
            rec.token = record::next_token(rec.token).ok_or_else(|| {
                self.corrupt(path, "its fencing token is at the largest possible value")
            })?;
        }
        Ok(rec)
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;

    #[test]
    fn network_file_systems_are_refused() {
        use Severity::{Ok as Local, Unsafe, Warning};
        // NFS, SMB, CIFS, SMB2; FUSE; ext4, tmpfs, btrfs, xfs, overlayfs.
        for (magic, fs, severity) in [
            (0x6969, Some("NFS"), Unsafe),
            (0x517B, Some("SMB"), Unsafe),
            (0xFF53_4D42, Some("CIFS"), Unsafe),
            (0xFE53_4D42, Some("SMB2"), Unsafe),
            (FUSE_MAGIC, None, Warning),
            (0xEF53, None, Local),
            (0x0102_1994, None, Local),
            (0x9123_683E, None, Local),
            (0x5846_5342, None, Local),
            (0x794C_7630, None, Local),
        ] {
            assert_eq!(network_fs(magic), fs, "{magic:#x}");
            let (verdict, text) = fs_verdict(Path::new("/d"), magic);
            assert_eq!(verdict, severity, "{magic:#x}");
            if let Some(fs) = fs {
                let refused = format!("/d as a lock directory (it is on {fs}");
                assert!(text.contains(&refused), "{text}");
            }
        }
        // The directories the tests use are local: their statfs type is not refused.
        let tmp = std::env::temp_dir();
        let magic = sys::fs_magic(&tmp).expect("statfs");
        assert_eq!(
            network_fs(magic),
            None,
            "{} is on {magic:#x}",
            tmp.display()
        );
        assert!(sys::fs_magic(Path::new("/nonexistent/dlock")).is_err());
    }
}
