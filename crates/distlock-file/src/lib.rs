#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod election;
mod fs;
mod grant;
mod inspect;
mod location;
mod ops;
mod record;
pub mod sys;
mod table;
mod waiting;

use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, Backend, Capabilities, GrantRef, Granted, HoldKey,
    ReleaseWatch, RenewOutcome,
};
use distlock_core::{ClientOptions, Error, LockInfo, LockKind, ReleaseOutcome, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use table::{target, Family, Table, Target};
use tokio_util::sync::CancellationToken;

pub use record::{file_name, fnv1a_128};

/// The backend kind, as reported by [`Backend::kind`].
pub const KIND: &str = "file";

/// Locks shared by the processes of one host through `flock` on files in one directory.
///
/// Cheap to clone; clones share the in-process table (and so exclude each other as one
/// process). See `docs/file-backend.md` for the guarantees and the file layout.
#[derive(Clone)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl FileBackend {
    /// Opens (creating it with mode `0700` if needed) the lock directory `dir`; the locks live
    /// in its subdirectory named after `opts`' namespace. A relative `dir` is made absolute
    /// against the current directory.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] on invalid options;
    /// - [`Error::Connection`] when the directory cannot be created, is not a directory or
    ///   cannot be examined;
    /// - [`Error::Unsupported`] when it is on a network file system (NFS, SMB/CIFS, AFS,
    ///   CephFS: see the [user page](https://github.com/distlock-rs/distlock/blob/main/docs/file-backend.md#why-this-is-a-mutex-the-safety-argument)).
    pub fn open(dir: impl AsRef<Path>, opts: &ClientOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let endpoint = format!("file://{}", dir.display());
        let absolute = std::path::absolute(dir);
        let base = absolute.map_err(fs::at(&endpoint, "cannot make an absolute path of", dir))?;
        Self::open_base(base, opts, false)
    }

    /// Opens the lock directory a `file://` URL names: `file:///abs/dir`, or `file://` for
    /// [`FileBackend::default_dir`]. `file://localhost/abs/dir` is accepted too; `%XX`
    /// escapes in the path are decoded.
    ///
    /// # Errors
    /// - [`Error::InvalidUrl`] (saying what to write instead) on any other form;
    /// - [`Error::Connection`] when the default directory is a symlink or is owned by another
    ///   user (someone may be trying to intercept the locks);
    /// - as [`FileBackend::open`] otherwise.
    pub fn from_url(url: &str, opts: &ClientOptions) -> Result<Self> {
        match location::parse_url(url)? {
            None => Self::open_base(Self::default_dir(), opts, true),
            Some(dir) => Self::open(dir, opts),
        }
    }

    /// The directory `file://` uses: `$XDG_RUNTIME_DIR/dlock` when `XDG_RUNTIME_DIR` is set
    /// to an absolute path, else `/tmp/dlock-$UID`.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d).join("dlock"),
            _ => PathBuf::from(format!("/tmp/dlock-{}", sys::uid())),
        }
    }

    /// The directory holding this backend's lock files (the namespace subdirectory).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The lock file of mutex `name`.
    pub fn lock_file(&self, name: &str) -> PathBuf {
        self.inner.lock_path(Family::Mutex, name)
    }

    /// The file of election `name`: `<hash>.election` (its `flock(LOCK_EX)` is the
    /// leadership; the record carries the fencing counter, the leader and its value). See the
    /// [user page](https://github.com/distlock-rs/distlock/blob/main/docs/file-backend.md#elections).
    pub fn election_file(&self, name: &str) -> PathBuf {
        self.inner.lock_path(Family::Election, name)
    }

    /// The files of read-write lock `name`: the lock itself (`<hash>.rw`), the turnstile
    /// (`<hash>.rw-turnstile`) and the record (`<hash>.rw-record`: fencing counter, name,
    /// holders). See the [user page](https://github.com/distlock-rs/distlock/blob/main/docs/file-backend.md#read-write-locks).
    pub fn rw_lock_files(&self, name: &str) -> [PathBuf; 3] {
        [Family::Rw.suffix(), table::TURNSTILE, table::RECORD].map(|s| self.inner.file(name, s))
    }

    /// A duplicate (`dup(2)`) of the descriptor whose `flock` is this backend's grant of lock
    /// `name` of kind `kind` (a mutex, an election, or a side of a read-write lock) with fencing
    /// token `fencing_token`; `None` if this backend holds no such grant.
    ///
    /// The lock belongs to the open file, not to one descriptor: while any duplicate is open
    /// the lock stays held, even after this process exits. `dlock run` hands one to the guard
    /// process that kills the command, so that a killed `dlock` does not free the lock while
    /// the command is still being killed. Releasing the grant unlocks it for every duplicate
    /// (`flock(LOCK_UN)`).
    ///
    /// # Errors
    /// The descriptor could not be duplicated (e.g. too many open files).
    pub fn hold_file(
        &self,
        kind: LockKind,
        name: &str,
        fencing_token: u64,
    ) -> std::io::Result<Option<std::fs::File>> {
        let Some((family, side)) = target(kind) else {
            return Ok(None);
        };
        match self.inner.table(family).get(name) {
            Some(e) if e.holds(side).iter().any(|h| h.token == fencing_token) => {
                e.main.as_ref().map(std::fs::File::try_clone).transpose()
            }
            _ => Ok(None),
        }
    }

    fn open_base(base: PathBuf, opts: &ClientOptions, default: bool) -> Result<Self> {
        opts.validate()?;
        let (dir, endpoint) = fs::open_dir(&base, opts.get_namespace(), default)?;
        Ok(FileBackend {
            inner: Arc::new(Inner {
                dir,
                endpoint,
                instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
                tables: Default::default(),
            }),
        })
    }
}

/// Numbers the backends of this process (for the `hold` lines of read-write locks).
static INSTANCES: AtomicU64 = AtomicU64::new(0);

/// State shared by clones of a backend, its waiters, watches and waiting threads.
struct Inner {
    dir: PathBuf,
    endpoint: String,
    /// Tells this backend's `hold` lines from those of other backends of this process.
    instance: u64,
    /// What it knows of each lock name, by [`Family`].
    tables: [Mutex<Table>; 3],
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.rw_forget_all();
    }
}

/// What this backend implements: mutexes, read-write locks and elections (no fair locks, no
/// semaphores), with no lease expiry (the lease is the holder process's lifetime).
fn capabilities() -> Capabilities {
    Capabilities::kinds(&[
        LockKind::Mutex,
        LockKind::Read,
        LockKind::Write,
        LockKind::Election,
    ])
    .lease_expiry(false)
}

/// The core checks the kind and the name before it calls a backend; a direct caller of the
/// [`Backend`] methods gets the same errors here. Returns the lock's family and the side it
/// takes.
fn check(kind: LockKind, name: &str) -> Result<Target> {
    capabilities().check(KIND, kind)?;
    distlock_core::validate_name(name)?;
    target(kind).ok_or_else(|| Error::unsupported(KIND, format!("lock kind {}", kind.as_str())))
}

fn check_key(key: &HoldKey) -> Result<Target> {
    let target = check(key.kind, &key.name)?;
    distlock_core::validate_owner(&key.owner).map(|()| target)
}

#[async_trait]
impl Backend for FileBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.inner.endpoint.clone()
    }

    fn capabilities(&self) -> Capabilities {
        capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.inner
            .try_acquire(check_key(&req.key)?, req, false, true)
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let watch = waiting::Watch::new(&self.inner, check_key(&req.key)?, &req.key.name, true);
        watch.rearm()?;
        Ok(Box::new(watch))
    }

    /// Waits without polling: see docs/file-backend.md. Every release wakes the waiters.
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let target = check_key(&req.key)?;
        let waiter = waiting::Watch::new(&self.inner, target, &req.key.name, false);
        waiter.wait(req, deadline, cancel).await
    }

    /// Gives back the lock if `req.attempt` holds it. There is no queue to leave: see
    /// docs/file-backend.md, *The hold protocol*.
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.inner.give_up(check_key(&req.key)?, req);
        Ok(())
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.inner.release(check_key(&grant.key)?, grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        holds
            .iter()
            .map(|(grant, _lease)| match target(grant.key.kind) {
                Some(target) => self.inner.renew(target, grant, None),
                None => Ok(RenewOutcome::NotHeld),
            })
            .collect()
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let (family, _) = check(kind, name)?;
        self.inner.inspect(family, name).await
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        let target = check_key(&grant.key)?;
        if target.0 != Family::Election {
            return Err(Error::invalid(format!(
                "proclaim is for elections, not {} locks",
                grant.key.kind.as_str()
            )));
        }
        self.inner.renew(target, grant, Some((seq, value)))
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        check(LockKind::Election, name)?;
        Ok(Box::new(election::ObserveWatch::new(&self.inner, name)?))
    }

    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}
