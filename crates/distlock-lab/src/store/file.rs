//! The `file://` store: two small files next to the lock files, each operation under a short
//! `flock(2)` of the file it touches (shared to read, exclusive to write).

use super::{Store, StoreError, StoreResult};
use distlock::async_trait;
use distlock::file::FileBackend;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Stock and orders in the directory of a `file://` lock backend.
pub struct FileStore {
    backend: FileBackend,
    state: PathBuf,
    orders: PathBuf,
}

impl FileStore {
    /// Opens (creating the directory if needed) the store of `run` for the backend `url`.
    pub fn open(url: &str, prefix: &str, run: &str) -> StoreResult<Self> {
        let backend = FileBackend::from_url(url, &distlock::ClientOptions::default())
            .map_err(|e| StoreError(e.to_string()))?;
        let dir = backend.dir().to_path_buf();
        Ok(FileStore {
            backend,
            state: dir.join(format!("{prefix}-{run}.state")),
            orders: dir.join(format!("{prefix}-{run}.orders")),
        })
    }

    fn err(&self, path: &Path, what: &str, e: io::Error) -> StoreError {
        StoreError(format!("cannot {what} {}: {e}", path.display()))
    }

    fn open_state(&self, write: bool) -> StoreResult<File> {
        OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.state)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    StoreError(format!(
                        "the store file {} is missing (was the run cleaned up?)",
                        self.state.display()
                    ))
                } else {
                    self.err(&self.state, "open", e)
                }
            })
    }

    fn read_state(&self, f: &mut File) -> StoreResult<(i64, u64)> {
        let mut s = String::new();
        f.read_to_string(&mut s)
            .map_err(|e| self.err(&self.state, "read", e))?;
        parse_state(&s).ok_or_else(|| {
            StoreError(format!(
                "the store file {} holds `{}`, not `<stock> <version>`",
                self.state.display(),
                s.trim().escape_debug()
            ))
        })
    }

    fn write_state(&self, f: &File, stock: i64, version: u64) -> StoreResult<()> {
        let text = format!("{stock} {version}\n");
        f.set_len(0)
            .and_then(|()| f.write_all_at(text.as_bytes(), 0))
            .map_err(|e| self.err(&self.state, "write", e))
    }
}

fn parse_state(s: &str) -> Option<(i64, u64)> {
    let mut it = s.split_whitespace();
    let stock = it.next()?.parse().ok()?;
    let version = it.next()?.parse().ok()?;
    it.next().is_none().then_some((stock, version))
}

/// `flock(2)` on `f`, retried on EINTR. The lock goes with the descriptor when `f` closes.
fn flock(f: &File, exclusive: bool) -> io::Result<()> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    loop {
        // SAFETY: flock(2) on a descriptor we own; no memory is passed.
        let r = unsafe { libc::flock(f.as_raw_fd(), op) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[async_trait]
impl Store for FileStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.state)
            .map_err(|e| self.err(&self.state, "create", e))?;
        flock(&f, true).map_err(|e| self.err(&self.state, "lock", e))?;
        self.write_state(&f, stock, 0)?;
        let o = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.orders)
            .map_err(|e| self.err(&self.orders, "create", e))?;
        flock(&o, true).map_err(|e| self.err(&self.orders, "lock", e))?;
        o.set_len(0)
            .map_err(|e| self.err(&self.orders, "truncate", e))
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        let mut f = self.open_state(false)?;
        flock(&f, false).map_err(|e| self.err(&self.state, "lock", e))?;
        self.read_state(&mut f)
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        let mut f = self.open_state(true)?;
        flock(&f, true).map_err(|e| self.err(&self.state, "lock", e))?;
        let (_, version) = self.read_state(&mut f)?;
        self.write_state(&f, stock, version.wrapping_add(1))
    }

    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool> {
        let mut f = self.open_state(true)?;
        flock(&f, true).map_err(|e| self.err(&self.state, "lock", e))?;
        let (_, version) = self.read_state(&mut f)?;
        if version != expected_version {
            return Ok(false);
        }
        self.write_state(&f, new_stock, version.wrapping_add(1))?;
        Ok(true)
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        let mut o = OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.orders)
            .map_err(|e| self.err(&self.orders, "open", e))?;
        flock(&o, true).map_err(|e| self.err(&self.orders, "lock", e))?;
        o.write_all(format!("{buyer}\n").as_bytes())
            .map_err(|e| self.err(&self.orders, "append to", e))
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        let mut o = File::open(&self.orders).map_err(|e| self.err(&self.orders, "open", e))?;
        flock(&o, false).map_err(|e| self.err(&self.orders, "lock", e))?;
        let mut s = String::new();
        o.read_to_string(&mut s)
            .map_err(|e| self.err(&self.orders, "read", e))?;
        s.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.trim().parse::<u64>().map_err(|_| {
                    StoreError(format!(
                        "the orders file {} holds `{}`, not a buyer id",
                        self.orders.display(),
                        l.escape_debug()
                    ))
                })
            })
            .collect()
    }

    async fn cleanup(&self) -> StoreResult<()> {
        remove(&self.state).map_err(|e| self.err(&self.state, "remove", e))?;
        remove(&self.orders).map_err(|e| self.err(&self.orders, "remove", e))
    }

    async fn forget_lock(&self, name: &str) -> StoreResult<()> {
        let path = self.backend.lock_file(name);
        remove(&path).map_err(|e| self.err(&path, "remove", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_format() {
        assert_eq!(parse_state("10 0\n"), Some((10, 0)));
        assert_eq!(parse_state("-2 7"), Some((-2, 7)));
        assert_eq!(parse_state(""), None);
        assert_eq!(parse_state("1 2 3"), None);
        assert_eq!(parse_state("x 2"), None);
    }

    #[tokio::test]
    async fn operations() {
        let dir = distlock_testkit::TempDir::with_prefix("distlock-lab-store").expect("temp dir");
        let url = format!("file://{}", dir.path().display());
        let s = FileStore::open(&url, "t", "run-1").expect("open");
        s.setup(3).await.expect("setup");
        assert_eq!(s.read().await.expect("read"), (3, 0));
        s.write(2).await.expect("write");
        assert_eq!(s.read().await.expect("read"), (2, 1));
        assert!(!s.cas(0, 1).await.expect("cas"));
        assert!(s.cas(1, 1).await.expect("cas"));
        assert_eq!(s.read().await.expect("read"), (1, 2));
        s.add_order(7).await.expect("order");
        s.add_order(9).await.expect("order");
        assert_eq!(s.orders().await.expect("orders"), vec![7, 9]);
        s.setup(5).await.expect("setup again");
        assert_eq!(s.orders().await.expect("orders"), Vec::<u64>::new());
        s.cleanup().await.expect("cleanup");
        assert!(s.read().await.is_err());
    }
}
