//! Fenced files: the fence in the file's first line, checked under `flock(2)`, the file
//! replaced atomically by `rename(2)`.
//!
//! A [`FencedFile`] at `PATH` is the file `PATH`, whose first line is the fence
//! (`distlock-fence <token> <seq>`, or `distlock-fence -` before the first fenced write) and
//! whose rest is your data, and the lock file `PATH.lock` beside it. Every operation takes
//! `flock(2)` on the lock file (shared to read, exclusive otherwise), so the check of the fence
//! and the write are one step for every process on the host; a write goes to a temporary file
//! in the same directory, is flushed to the disk (`fsync`, unless [`FencedFile::durable`] says
//! otherwise) and renamed over `PATH`, so a reader or a crash sees the old file or the new one,
//! fence and data together, never a mix.
//!
//! ```
//! use distlock_fence::file::FencedFile;
//! use distlock_fence::{Error, Stamp};
//!
//! # fn main() -> Result<(), Error> {
//! # let dir = std::env::temp_dir().join(format!("fence-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! let stock = FencedFile::new(dir.join("stock"));
//! stock.write_unfenced(b"10")?; // set up before any holder
//!
//! // The holder of the grant with token 7: read under the fence, then write.
//! let left: i64 = String::from_utf8_lossy(&stock.read(Stamp::new(7))?.unwrap_or_default())
//!     .parse()
//!     .unwrap_or(0);
//! let _ = stock.write(Stamp::new(7), (left - 1).to_string().as_bytes())?;
//!
//! // A holder of an older grant, back from a pause: rejected, nothing written.
//! let late = stock.write(Stamp::new(5), b"9");
//! assert!(matches!(late, Err(Error::Stale { token: 5, newer: 7 })));
//! assert_eq!(stock.peek()?.as_deref(), Some(&b"9"[..]));
//! # stock.remove()?;
//! # Ok(()) }
//! ```

use crate::{decide, recorded_after, Decision, Error, Outcome, Result, Stamp};
use distlock_file::sys::{self, Mode};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The first word of a fenced file's first line.
const MAGIC: &str = "distlock-fence";

/// A file whose writes are fenced: see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct FencedFile {
    path: PathBuf,
    lock: PathBuf,
    durable: bool,
}

/// What a fenced file holds: the fence and the data.
struct Content {
    fence: Option<Stamp>,
    data: Vec<u8>,
}

impl FencedFile {
    /// The fenced file at `path` (its lock file is `path` with `.lock` appended). Nothing is
    /// touched until the first operation.
    pub fn new(path: impl Into<PathBuf>) -> FencedFile {
        let path = path.into();
        let mut lock = path.clone().into_os_string();
        lock.push(".lock");
        FencedFile {
            path,
            lock: PathBuf::from(lock),
            durable: true,
        }
    }

    /// Whether writes are flushed to the disk before they replace the file (default `true`):
    /// `false` keeps them atomic for readers and other processes but a power loss may lose
    /// the last ones (fine on a tmpfs, or for data you can rebuild).
    #[must_use]
    pub fn durable(mut self, durable: bool) -> FencedFile {
        self.durable = durable;
        self
    }

    /// The data file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock file's path (`PATH.lock`).
    pub fn lock_path(&self) -> &Path {
        &self.lock
    }

    /// The stamp of the last fenced write (or fenced read), `None` before the first one or
    /// when the file does not exist.
    ///
    /// # Errors
    /// [`Error::Store`] when the file cannot be read or is not a fenced file.
    pub fn fence(&self) -> Result<Option<Stamp>> {
        let _lock = self.lock(Mode::Shared)?;
        Ok(self.load()?.and_then(|c| c.fence))
    }

    /// The data without touching the fence, `None` when the file does not exist. For readers
    /// that do not write from what they read.
    ///
    /// # Errors
    /// [`Error::Store`] when the file cannot be read or is not a fenced file.
    pub fn peek(&self) -> Result<Option<Vec<u8>>> {
        let _lock = self.lock(Mode::Shared)?;
        Ok(self.load()?.map(|c| c.data))
    }

    /// A fenced read: the data (`None` when the file does not exist), after checking `stamp`
    /// and recording it like a write does, so that from now on the writes of older grants are
    /// rejected ([why](crate#fence-the-read-too)). A duplicate stamp reads too.
    ///
    /// # Errors
    /// [`Error::Stale`] when a newer grant wrote or read already; [`Error::Store`] on I/O
    /// errors or a file that is not a fenced file.
    pub fn read(&self, stamp: Stamp) -> Result<Option<Vec<u8>>> {
        let _lock = self.lock(Mode::Exclusive)?;
        let content = self.load()?;
        let fence = content.as_ref().and_then(|c| c.fence);
        if decide(stamp, fence)? == Decision::Apply {
            let raised = recorded_after(stamp, fence);
            if fence != Some(raised) {
                let data = content.as_ref().map_or(&[][..], |c| &c.data[..]);
                self.store(Some(raised), data)?;
            }
        }
        Ok(content.map(|c| c.data))
    }

    /// A fenced write: replaces the data with `data` if `stamp` passes the fence, and records
    /// it; [`Outcome::Duplicate`] (nothing written) for a sequence number already applied.
    ///
    /// # Errors
    /// [`Error::Stale`] when a newer grant wrote or read already (nothing written);
    /// [`Error::Store`] on I/O errors or a file that is not a fenced file.
    pub fn write(&self, stamp: Stamp, data: &[u8]) -> Result<Outcome<()>> {
        self.update(stamp, |_| Ok::<_, Error>((data.to_vec(), ())))
    }

    /// A fenced read-modify-write in one step: `f` gets the current data (`None` when the file
    /// does not exist) and returns the new data and a value for the caller; nothing is written
    /// when `f` fails, the stamp is stale, or it is a duplicate.
    ///
    /// # Errors
    /// [`Error::Stale`]; [`Error::Store`] on I/O errors; `f`'s error, converted.
    pub fn update<T, E>(
        &self,
        stamp: Stamp,
        f: impl FnOnce(Option<&[u8]>) -> std::result::Result<(Vec<u8>, T), E>,
    ) -> std::result::Result<Outcome<T>, E>
    where
        E: From<Error>,
    {
        let _lock = self.lock(Mode::Exclusive)?;
        let content = self.load()?;
        let fence = content.as_ref().and_then(|c| c.fence);
        if decide(stamp, fence)? == Decision::Duplicate {
            return Ok(Outcome::Duplicate);
        }
        let (data, out) = f(content.as_ref().map(|c| &c.data[..]))?;
        self.store(Some(recorded_after(stamp, fence)), &data)?;
        Ok(Outcome::Applied(out))
    }

    /// Replaces the data without a token, keeping the fence: for setting up or repairing the
    /// data while no holder writes (the fence would stop nobody here).
    ///
    /// # Errors
    /// [`Error::Store`] on I/O errors or a file that is not a fenced file.
    pub fn write_unfenced(&self, data: &[u8]) -> Result<()> {
        self.update_unfenced(|_| Ok::<_, Error>((data.to_vec(), ())))
    }

    /// A read-modify-write without a token, keeping the fence (see
    /// [`write_unfenced`](FencedFile::write_unfenced)); nothing is written when `f` fails.
    ///
    /// # Errors
    /// [`Error::Store`] on I/O errors; `f`'s error, converted.
    pub fn update_unfenced<T, E>(
        &self,
        f: impl FnOnce(Option<&[u8]>) -> std::result::Result<(Vec<u8>, T), E>,
    ) -> std::result::Result<T, E>
    where
        E: From<Error>,
    {
        let _lock = self.lock(Mode::Exclusive)?;
        let content = self.load()?;
        let fence = content.as_ref().and_then(|c| c.fence);
        let (data, out) = f(content.as_ref().map(|c| &c.data[..]))?;
        self.store(fence, &data)?;
        Ok(out)
    }

    /// Removes the file and its lock file (the fence goes with them: do it only when no
    /// holder will write again).
    ///
    /// # Errors
    /// [`Error::Store`] when a file exists and cannot be removed.
    pub fn remove(&self) -> Result<()> {
        {
            let _lock = self.lock(Mode::Exclusive)?;
            remove_if_present(&self.path).map_err(|e| self.err("remove", &self.path, e))?;
        }
        remove_if_present(&self.lock).map_err(|e| self.err("remove", &self.lock, e))
    }

    fn err(&self, what: &str, path: &Path, e: io::Error) -> Error {
        Error::store("file", format!("cannot {what} {}: {e}", path.display()), e)
    }

    /// `flock(2)` on the lock file, held until the returned file is dropped. A lock file
    /// removed and created again while we waited is locked again, so that everybody locks the
    /// file the path names.
    fn lock(&self, mode: Mode) -> Result<File> {
        loop {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o666)
                .custom_flags(libc::O_CLOEXEC)
                .open(&self.lock)
                .map_err(|e| self.err("open the lock file", &self.lock, e))?;
            sys::lock_blocking(&f, mode).map_err(|e| self.err("lock", &self.lock, e))?;
            if sys::same_file(&f, &self.lock).map_err(|e| self.err("stat", &self.lock, e))? {
                return Ok(f);
            }
        }
    }

    /// The file's fence and data, `None` when it does not exist. Under the lock.
    fn load(&self) -> Result<Option<Content>> {
        let mut bytes = Vec::new();
        match File::open(&self.path) {
            Ok(mut f) => f
                .read_to_end(&mut bytes)
                .map_err(|e| self.err("read", &self.path, e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.err("open", &self.path, e)),
        };
        parse(&bytes).map(Some).ok_or_else(|| Error::Store {
            store: "file".into(),
            message: format!(
                "{} is not a fenced file: its first line is not `{MAGIC} <token> <seq>` or \
                 `{MAGIC} -`; write it with FencedFile (write_unfenced to start one from \
                 existing data)",
                self.path.display()
            ),
            source: None,
        })
    }

    /// Writes `fence` and `data` to a temporary file and renames it over the file. Under the
    /// exclusive lock.
    fn store(&self, fence: Option<Stamp>, data: &[u8]) -> Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let header = match fence {
            Some(s) => format!("{MAGIC} {s}\n"),
            None => format!("{MAGIC} -\n"),
        };
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o666)
                .custom_flags(libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(header.as_bytes())?;
            f.write_all(data)?;
            if self.durable {
                f.sync_all()?;
            }
            std::fs::rename(&tmp, &self.path)?;
            if self.durable {
                File::open(&dir)?.sync_all()?;
            }
            Ok::<_, io::Error>(())
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            self.err("write", &self.path, e)
        })
    }
}

/// Splits a fenced file into its fence and data.
fn parse(bytes: &[u8]) -> Option<Content> {
    let end = bytes.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&bytes[..end]).ok()?;
    let rest = line.strip_prefix(MAGIC)?.strip_prefix(' ')?;
    let fence = if rest == "-" {
        None
    } else {
        Some(Stamp::parse(rest)?)
    };
    Some(Content {
        fence,
        data: bytes[end + 1..].to_vec(),
    })
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> (PathBuf, FencedFile) {
        let dir =
            std::env::temp_dir().join(format!("distlock-fence-unit-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let f = FencedFile::new(dir.join("data")).durable(false);
        (dir, f)
    }

    #[test]
    fn the_rule_on_its_cases() {
        let (dir, f) = temp("cases");
        for &(recorded, stamp, expected) in crate::CASES {
            f.remove().expect("remove");
            f.write_unfenced(b"before").expect("seed");
            if let Some(r) = recorded {
                f.write(r, b"before")
                    .expect("record")
                    .applied()
                    .expect("applied");
            }
            let got = match f.write(stamp, b"after") {
                Ok(Outcome::Applied(())) => Ok(true),
                Ok(Outcome::Duplicate) => Ok(false),
                Err(Error::Stale { newer, .. }) => Err(newer),
                Err(e) => panic!("{e}"),
            };
            assert_eq!(got, expected, "{recorded:?} then {stamp:?}");
            let data = f.peek().expect("peek").expect("exists");
            assert_eq!(
                data == b"after",
                expected == Ok(true),
                "{recorded:?} then {stamp:?}"
            );
        }
        std::fs::remove_dir_all(dir).expect("cleanup");
    }

    #[test]
    fn not_a_fenced_file() {
        let (dir, f) = temp("foreign");
        std::fs::write(f.path(), b"plain data\n").expect("write");
        let e = f.peek().unwrap_err();
        assert!(e.to_string().contains("is not a fenced file"), "{e}");
        assert!(f.write(Stamp::new(1), b"x").is_err());
        assert_eq!(std::fs::read(f.path()).expect("read"), b"plain data\n");
        assert!(parse(b"distlock-fence 1\n").is_none());
        assert!(parse(b"distlock-fence -").is_none());
        assert_eq!(
            parse(b"distlock-fence 3 4\nab\n").map(|c| c.data),
            Some(b"ab\n".to_vec())
        );
        std::fs::remove_dir_all(dir).expect("cleanup");
    }
}
