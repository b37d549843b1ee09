//! The `file://` store: the stock in a fenced file (distlock-fence's `FencedFile`: the fence in
//! its first line, every operation under `flock(2)` of its lock file, writes by `rename(2)`)
//! and the orders in a file of their own, appended under a short `flock(2)`.

use super::{Fenced, Store, StoreError, StoreResult};
use distlock::async_trait;
use distlock::file::sys::{lock_blocking, Mode};
use distlock::file::FileBackend;
use distlock_fence::file::FencedFile;
use distlock_fence::Stamp;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Stock and orders in the directory of a `file://` lock backend.
pub struct FileStore {
    backend: FileBackend,
    state: FencedFile,
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
            // The lab's data is rebuilt on every run: no fsync.
            state: FencedFile::new(dir.join(format!("{prefix}-{run}.state"))).durable(false),
            orders: dir.join(format!("{prefix}-{run}.orders")),
        })
    }

    fn err(&self, path: &Path, what: &str, e: io::Error) -> StoreError {
        StoreError(format!("cannot {what} {}: {e}", path.display()))
    }

    fn missing(&self) -> StoreError {
        StoreError(format!(
            "the store file {} is missing (was the run cleaned up?)",
            self.state.path().display()
        ))
    }

    fn parse(&self, data: Option<&[u8]>) -> StoreResult<(i64, u64)> {
        let data = data.ok_or_else(|| self.missing())?;
        let s = String::from_utf8_lossy(data);
        parse_state(&s).ok_or_else(|| {
            StoreError(format!(
                "the store file {} holds `{}`, not `<stock> <version>`",
                self.state.path().display(),
                s.trim().escape_debug()
            ))
        })
    }

    /// Replaces the stock, incrementing the version; without `stamp`, unfenced.
    fn write_stock(&self, stamp: Option<Stamp>, stock: i64) -> StoreResult<Fenced<()>> {
        let next = |d: Option<&[u8]>| -> Result<(Vec<u8>, ()), Error> {
            let (_, version) = self.parse(d)?;
            Ok((state_text(stock, version.wrapping_add(1)), ()))
        };
        match stamp {
            None => self
                .state
                .update_unfenced(next)
                .map(Fenced::Done)
                .map_err(Error::into_store),
            Some(stamp) => match self.state.update(stamp, next) {
                Ok(_) => Ok(Fenced::Done(())),
                Err(Error::Fence(e)) => Fenced::from_fence(Err(e)),
                Err(Error::Store(e)) => Err(e),
            },
        }
    }
}

/// A store error or the fence's, from inside an update.
enum Error {
    Store(StoreError),
    Fence(distlock_fence::Error),
}

impl Error {
    fn into_store(self) -> StoreError {
        match self {
            Error::Store(e) => e,
            Error::Fence(e) => StoreError(e.to_string()),
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Store(e)
    }
}

impl From<distlock_fence::Error> for Error {
    fn from(e: distlock_fence::Error) -> Self {
        Error::Fence(e)
    }
}

fn fence_err(e: distlock_fence::Error) -> StoreError {
    StoreError(e.to_string())
}

fn state_text(stock: i64, version: u64) -> Vec<u8> {
    format!("{stock} {version}\n").into_bytes()
}

fn parse_state(s: &str) -> Option<(i64, u64)> {
    let mut it = s.split_whitespace();
    let stock = it.next()?.parse().ok()?;
    let version = it.next()?.parse().ok()?;
    it.next().is_none().then_some((stock, version))
}

fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Takes the `flock(2)` of the lock file `lock_file` away from the stopped process `pid`, as a
/// lease server hands a lock on when its holder's lease ends: every descriptor of `pid` open on
/// that file is duplicated into this process (`pidfd_getfd(2)`, Linux 5.6: the same open file
/// description, which the lock belongs to) and unlocked. Returns how many were found.
#[cfg(target_os = "linux")]
fn take_flock(pid: u32, lock_file: &Path) -> io::Result<usize> {
    let target = std::fs::canonicalize(lock_file)?;
    let pid_t = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    // SAFETY: plain syscalls on integers; every descriptor returned is closed below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid_t, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    let pidfd = pidfd as libc::c_int;
    let mut found = 0;
    let result = (|| {
        for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
            let entry = entry?;
            if std::fs::read_link(entry.path()).ok().as_deref() != Some(target.as_path()) {
                continue;
            }
            let Some(fd) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<libc::c_int>().ok())
            else {
                continue;
            };
            // SAFETY: as above.
            let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) };
            if dup < 0 {
                return Err(io::Error::last_os_error());
            }
            let dup = dup as libc::c_int;
            // SAFETY: `dup` is ours; unlocking a description that holds nothing is a no-op.
            unsafe {
                libc::flock(dup, libc::LOCK_UN);
                libc::close(dup);
            }
            found += 1;
        }
        Ok(found)
    })();
    // SAFETY: closing our own descriptor.
    unsafe { libc::close(pidfd) };
    result
}

#[cfg(not(target_os = "linux"))]
fn take_flock(_pid: u32, _lock_file: &Path) -> io::Result<usize> {
    Err(io::Error::other(
        "taking a stopped process's flock away needs Linux (pidfd_getfd)",
    ))
}

#[async_trait]
impl Store for FileStore {
    async fn setup(&self, stock: i64) -> StoreResult<()> {
        self.state.remove().map_err(fence_err)?;
        self.state
            .write_unfenced(&state_text(stock, 0))
            .map_err(fence_err)?;
        let o = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.orders)
            .map_err(|e| self.err(&self.orders, "create", e))?;
        lock_blocking(&o, Mode::Exclusive).map_err(|e| self.err(&self.orders, "lock", e))?;
        o.set_len(0)
            .map_err(|e| self.err(&self.orders, "truncate", e))
    }

    async fn read(&self) -> StoreResult<(i64, u64)> {
        let data = self.state.peek().map_err(fence_err)?;
        self.parse(data.as_deref())
    }

    async fn write(&self, stock: i64) -> StoreResult<()> {
        self.write_stock(None, stock).map(|_| ())
    }

    async fn cas(&self, expected_version: u64, new_stock: i64) -> StoreResult<bool> {
        self.state
            .update_unfenced(|d| -> Result<(Vec<u8>, bool), Error> {
                let (stock, version) = self.parse(d)?;
                if version != expected_version {
                    return Ok((state_text(stock, version), false));
                }
                Ok((state_text(new_stock, version.wrapping_add(1)), true))
            })
            .map_err(Error::into_store)
    }

    async fn fenced_read(&self, _lock: &str, token: u64) -> StoreResult<Fenced<i64>> {
        match Fenced::from_fence(self.state.read(Stamp::new(token)))? {
            Fenced::Done(data) => Ok(Fenced::Done(self.parse(data.as_deref())?.0)),
            Fenced::Stale { newer } => Ok(Fenced::Stale { newer }),
        }
    }

    async fn fenced_write(&self, _lock: &str, token: u64, stock: i64) -> StoreResult<Fenced<()>> {
        self.write_stock(Some(Stamp::new(token)), stock)
    }

    async fn add_order(&self, buyer: u64) -> StoreResult<()> {
        let mut o = OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.orders)
            .map_err(|e| self.err(&self.orders, "open", e))?;
        lock_blocking(&o, Mode::Exclusive).map_err(|e| self.err(&self.orders, "lock", e))?;
        o.write_all(format!("{buyer}\n").as_bytes())
            .map_err(|e| self.err(&self.orders, "append to", e))
    }

    async fn orders(&self) -> StoreResult<Vec<u64>> {
        let mut o = File::open(&self.orders).map_err(|e| self.err(&self.orders, "open", e))?;
        lock_blocking(&o, Mode::Shared).map_err(|e| self.err(&self.orders, "lock", e))?;
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
        self.state.remove().map_err(fence_err)?;
        remove(&self.orders).map_err(|e| self.err(&self.orders, "remove", e))
    }

    /// The kernel keeps a stopped process's `flock(2)` for as long as it lives: a `file://`
    /// lock has no lease. To show what a lease-based lock service does at the lease end, the
    /// lab takes the lock away from the stopped holder ([`take_flock`]): the next waiter, in
    /// another process, gets it at once.
    async fn expire_stopped_holder(&self, pid: u32, name: &str) -> StoreResult<()> {
        let path = self.backend.lock_file(name);
        match take_flock(pid, &path) {
            Ok(0) => Err(StoreError(format!(
                "process {pid} has no descriptor on the lock file {}",
                path.display()
            ))),
            Ok(_) => Ok(()),
            Err(e) => Err(StoreError(format!(
                "cannot take the lock {} away from the stopped process {pid}: {e} (needs Linux 5.6 and the right to ptrace it: the lab is its parent)",
                path.display()
            ))),
        }
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
        // Fenced: a read records the token, an older token is rejected afterwards.
        assert_eq!(
            s.fenced_read("l", 5).await.expect("fenced read"),
            Fenced::Done(1)
        );
        assert_eq!(
            s.fenced_write("l", 5, 0).await.expect("fenced write"),
            Fenced::Done(())
        );
        assert_eq!(
            s.fenced_write("l", 4, 7).await.expect("stale write"),
            Fenced::Stale { newer: 5 }
        );
        assert_eq!(
            s.fenced_read("l", 4).await.expect("stale read"),
            Fenced::Stale { newer: 5 }
        );
        assert_eq!(s.read().await.expect("read"), (0, 3));
        s.add_order(7).await.expect("order");
        s.add_order(9).await.expect("order");
        assert_eq!(s.orders().await.expect("orders"), vec![7, 9]);
        s.setup(5).await.expect("setup again");
        assert_eq!(s.orders().await.expect("orders"), Vec::<u64>::new());
        s.cleanup().await.expect("cleanup");
        assert!(s.read().await.is_err());
    }
}
