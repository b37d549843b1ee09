//! Embedded `file://` backend for [dlock](https://docs.rs/dlock): locks shared by the processes
//! of **one host** through OS file locks (`flock(2)`), with no server to run.
//!
//! ```no_run
//! # async fn f() -> dlock_core::Result<()> {
//! use std::sync::Arc;
//! use dlock_core::{Client, ClientOptions};
//! use dlock_file::FileBackend;
//!
//! let opts = ClientOptions::default();
//! let backend = FileBackend::from_url("file:///var/lib/myapp/locks", &opts)?;
//! let client = Client::new(Arc::new(backend), opts)?;
//! let guard = client.lock("orders:42")?.acquire().await?;
//! println!("fencing token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # URLs and files
//! - `file:///abs/dir` keeps the locks in `/abs/dir`; `file://` (empty path) in the default
//!   directory, `$XDG_RUNTIME_DIR/dlock` or, without `XDG_RUNTIME_DIR`, `/tmp/dlock-$UID`. A
//!   directory that does not exist is created with mode `0700`. The default directory must be
//!   a real directory owned by the calling user (so that nobody else can plant it in `/tmp`).
//! - The client's namespace is a subdirectory: `<dir>/<namespace>/`. Bytes outside
//!   `[A-Za-z0-9._-]` and a leading `.` are percent-encoded; a namespace whose encoding exceeds
//!   128 bytes becomes `ns-<FNV-1a-128 hex>`. When dlock creates it, it gets the owner and group
//!   permission bits (and setgid bit) of the directory it is in, never permissions for others.
//!   To share locks between users of one group, use a group-writable (setgid) directory and a
//!   umask of `002`, so that the lock files are group-writable too.
//! - Each lock is one file, `<dir>/<namespace>/<hash>.lock`, where `<hash>` is the 32
//!   lower-case hex digits of the **FNV-1a 128-bit** hash of the lock name's UTF-8 bytes, so
//!   names may hold any printable character, `/` included. The file holds a small text
//!   record (the original name is kept for `inspect`; a second name that hashes to the same
//!   file is refused with [`Error::UnexpectedReply`] instead of silently sharing the lock):
//!
//!   ```text
//!   dlock-file 1
//!   token 42                        <- last fencing token granted
//!   name orders:42                  <- the lock name
//!   holder 12345 2 host:12345:ab:7  <- pid, hold count, owner id; only while held
//!   end
//!   ```
//!
//!   Files are created with mode `0666` less the umask and are never deleted by dlock: the
//!   file carries the fencing counter. Delete them only when no process uses the directory.
//!
//! # Why this is a mutex (the safety argument)
//! - **Exclusion between processes.** A holder keeps an open descriptor on the lock file with
//!   `flock(LOCK_EX)` on it. The kernel grants an exclusive `flock` to one open file
//!   description at a time, so at most one process holds a lock file.
//! - **Exclusion inside a process.** `flock` locks belong to open file descriptions, not to
//!   owners, so the backend also keeps a table *name → (owner, descriptor, count, token)*. A
//!   lock held by owner A of this backend is reported [`AcquireReply::Held`] to owner B without
//!   touching the file; every new grant opens its own descriptor. Two separately opened
//!   `FileBackend`s (even in one process; clones share one table) exclude each other through
//!   the kernel, like two processes.
//! - **Re-entry.** The same owner acquiring again through the same backend increments the
//!   count and gets the same token; only the last release unlocks (`LOCK_UN`, then close). An
//!   owner id used in two processes does not re-enter across them: the second one waits.
//! - **Crashes: the lease is the process lifetime.** There is no lease and nothing to renew:
//!   [`Backend::renew`] reports `Renewed` while the backend still holds the lock. When the
//!   holding process dies, however it dies (`SIGKILL` included), the kernel closes its
//!   descriptors and releases the `flock`, and a waiter gets the lock at once. A fixed lease
//!   ([`Lock::lease`](dlock_core::Lock::lease)) is therefore *not* enforced by this backend:
//!   the guard's lost signal fires at the lease end, but the lock stays held until the guard is
//!   released or dropped, or the process exits.
//! - **Fencing tokens** are a counter in the lock file, read, incremented and written (the
//!   write completes before the grant is returned) only while holding the exclusive lock.
//!   Grants are serialised by that lock, so tokens strictly increase across processes and
//!   process restarts. They restart from 1 only if the file is deleted, e.g. when the default
//!   directory (a tmpfs under `$XDG_RUNTIME_DIR` or `/tmp`) is wiped at logout or reboot; pick a
//!   persistent directory if tokens must survive that. The counter is not `fsync`ed, so a
//!   power loss can also lose the last increments.
//! - **A deleted or replaced lock file** (an operator, or a `/tmp` cleaner such as
//!   `systemd-tmpfiles` removing old files) would let a new process lock a new file while the
//!   old holder still locks the unlinked one. A grant is only returned after checking that the
//!   path still names the locked file, and every renewal (every watchdog tick) checks it again:
//!   a holder whose file disappeared reports the lock lost
//!   ([`LostReason::NotHeld`](dlock_core::LostReason::NotHeld)) and unlocks.
//! - **Children.** Descriptors are opened close-on-exec, so an `exec`ed child does not inherit
//!   a lock. A child that `fork`s without `exec` shares the open file description while it
//!   lives; releases unlock explicitly (`LOCK_UN`) so that the lock still frees on release.
//!
//! **One host, local filesystems only.** `flock` on NFS is emulated with byte-range locks (or
//! not at all) and is not reliable across clients; on CIFS and FUSE filesystems semantics
//! vary. Use this backend only for a directory on a local filesystem of a single host, and a
//! networked backend (Redis, …) for locks between hosts.
//!
//! # Waiting without polling
//! [`Backend::acquire_wait`] is overridden; waiters never poll.
//! - While the lock is held **by another owner of this backend**, waiters sleep on an
//!   in-process notifier that every release (and every hand-over below) wakes.
//! - While it is held **by another process** (or another `FileBackend`), one thread per lock
//!   name and backend — not per waiter — blocks in the kernel in `flock(LOCK_EX)` on its own
//!   descriptor, so it is woken the instant the holder unlocks or dies. It then parks the
//!   lock it got and wakes the waiters; the first to run takes the parked descriptor as its
//!   grant, the others wait on.
//! - **Deadlines and cancellation.** A waiter whose deadline passes or whose `cancel` fires
//!   returns `Ok(None)` at once. A thread blocked in `flock` cannot be interrupted without
//!   signals (which a library must not use), so the thread may go on blocking after every
//!   waiter gave up: when it finally gets the lock and nobody waits any more, it unlocks
//!   immediately and ends; a parked lock nobody claimed is unlocked as soon as the last
//!   waiter gives up. At most one such thread exists per lock name and backend, whatever
//!   the number of waiters, and it holds no lock while it blocks. (For the instant it holds
//!   the lock before handing it over or unlocking it, another process's `try_acquire` may see
//!   the lock held.)
//!   A waiting thread whose lock is never released lives as long as the process (blocked,
//!   holding an open descriptor but no lock).
//! - [`Backend::watch`] uses the same two mechanisms, so it reports releases by this process
//!   and by other processes alike, from the moment `watch` returns. The waiting thread is
//!   re-armed at each `changed` call: a release that happens between two calls is reported
//!   by the next call if the lock is still free then (it resolves at once); if another
//!   process took the lock in between, the next release is what wakes it.
//!
//! # Inspect
//! [`Backend::inspect`] reports the holder of this backend from its table (owner and count);
//! for another process it reads the holder line of the file, after a non-blocking shared-lock
//! probe (`LOCK_SH|LOCK_NB`) showed the lock is held (a free lock reports no holders, whatever
//! a crashed holder left in the file). `lease_left` is always `None`; `fencing_token` is the
//! counter.
#![warn(missing_docs)]

mod location;
mod record;
mod sys;

use dlock_core::{
    async_trait, AcquireReply, AcquireRequest, Backend, ClientOptions, Error, Granted, HoldKey,
    HolderInfo, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome, Result, Wake,
};
use location::Target;
use record::{HolderLine, Record};
use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use record::{file_name, fnv1a_128};

/// The backend kind, as reported by [`Backend::kind`].
pub const KIND: &str = "file";

/// Locks shared by the processes of one host through `flock` on files in one directory.
///
/// Cheap to clone; clones share the in-process table (and so exclude each other as one
/// process). See the [crate documentation](crate) for the guarantees and the file layout.
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
    /// Fails with [`Error::InvalidArgument`] on invalid options and [`Error::Connection`] when
    /// the directory cannot be created or is not a directory.
    pub fn open(dir: impl AsRef<Path>, opts: &ClientOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let base = std::path::absolute(dir).map_err(|e| {
            io_error(
                &format!("file://{}", dir.display()),
                format!("cannot make {} absolute", dir.display()),
                e,
            )
        })?;
        Self::open_base(base, opts, false)
    }

    /// Opens the lock directory a `file://` URL names: `file:///abs/dir`, or `file://` for
    /// [`FileBackend::default_dir`]. `file://localhost/abs/dir` is accepted too; `%XX`
    /// escapes in the path are decoded.
    ///
    /// Fails with [`Error::InvalidUrl`] (saying what to write instead) on any other form, and
    /// as [`FileBackend::open`] otherwise.
    pub fn from_url(url: &str, opts: &ClientOptions) -> Result<Self> {
        match location::parse_url(url) {
            Ok(Target::Default) => Self::open_base(Self::default_dir(), opts, true),
            Ok(Target::Dir(dir)) => Self::open(dir, opts),
            Err(reason) => Err(Error::InvalidUrl {
                url: url.to_owned(),
                reason,
            }),
        }
    }

    /// The directory `file://` uses: `$XDG_RUNTIME_DIR/dlock` when `XDG_RUNTIME_DIR` is set
    /// to an absolute path, else `/tmp/dlock-$UID`.
    pub fn default_dir() -> PathBuf {
        location::default_dir()
    }

    /// The directory holding this backend's lock files (the namespace subdirectory).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The lock file of lock `name`.
    pub fn lock_file(&self, name: &str) -> PathBuf {
        self.inner.path(name)
    }

    fn open_base(base: PathBuf, opts: &ClientOptions, default: bool) -> Result<Self> {
        opts.validate()?;
        let endpoint = format!("file://{}", base.display());
        let base_meta = create_dir(&base, &endpoint)?;
        if default {
            check_private(&base, &endpoint)?;
        }
        let dir = base.join(location::namespace_dir(opts.get_namespace()));
        let endpoint = format!("file://{}", dir.display());
        let existed = std::fs::symlink_metadata(&dir).is_ok();
        create_dir(&dir, &endpoint)?;
        if !existed {
            // Share the namespace directory as the base directory is shared, never with
            // everyone: a group-writable (setgid) base gives a group-writable subdirectory.
            let mode = (base_meta.mode() & 0o2770) | 0o700;
            if let Err(e) = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot set the mode of the namespace directory");
            }
        }
        Ok(FileBackend {
            inner: Arc::new(Inner {
                dir,
                endpoint,
                table: Mutex::new(HashMap::new()),
            }),
        })
    }
}

fn io_error(endpoint: &str, what: String, e: io::Error) -> Error {
    Error::Connection {
        backend: KIND,
        endpoint: endpoint.to_owned(),
        source: Box::new(io::Error::new(e.kind(), format!("{what}: {e}"))),
    }
}

/// Creates `dir` (and missing parents) with mode `0700`; returns its metadata.
fn create_dir(dir: &Path, endpoint: &str) -> Result<std::fs::Metadata> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            io_error(
                endpoint,
                format!("cannot create the lock directory {}", dir.display()),
                e,
            )
        })?;
    let meta = std::fs::metadata(dir)
        .map_err(|e| io_error(endpoint, format!("cannot stat {}", dir.display()), e))?;
    if !meta.is_dir() {
        return Err(io_error(
            endpoint,
            format!("{} is not a directory", dir.display()),
            io::Error::new(io::ErrorKind::NotADirectory, "choose a directory"),
        ));
    }
    Ok(meta)
}

/// The default directory may sit in the world-writable `/tmp`: refuse one planted by someone else.
fn check_private(dir: &Path, endpoint: &str) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| io_error(endpoint, format!("cannot stat {}", dir.display()), e))?;
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

/// State shared by clones of a backend, its waiters, watches and waiting threads.
struct Inner {
    dir: PathBuf,
    endpoint: String,
    table: Mutex<HashMap<Arc<str>, Entry>>,
}

/// What this backend knows about one lock name. Removed when idle.
#[derive(Default)]
struct Entry {
    /// The owner of this backend holding the lock.
    holder: Option<Holder>,
    /// A lock the waiting thread got and no waiter has claimed yet.
    parked: Option<File>,
    /// `acquire_wait` calls in progress.
    waiters: usize,
    /// Live watches.
    watchers: usize,
    /// A thread blocks in `flock(LOCK_EX)` for this name.
    kernel_waiting: bool,
    /// The waiting thread's `flock` failed; the next waiter or watch reports it.
    kernel_error: Option<io::Error>,
    /// Bumped (and `notify` woken) on every release, hand-over or waiting-thread event.
    generation: u64,
    notify: Arc<Notify>,
}

struct Holder {
    owner: Arc<str>,
    file: File,
    count: u32,
    token: u64,
}

impl Entry {
    fn idle(&self) -> bool {
        self.holder.is_none()
            && self.parked.is_none()
            && self.waiters == 0
            && self.watchers == 0
            && !self.kernel_waiting
    }

    /// Wakes every waiter and watch of this name.
    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.notify.notify_waiters();
    }
}

type Table = HashMap<Arc<str>, Entry>;

fn remove_if_idle(table: &mut Table, name: &str) {
    if table.get(name).is_some_and(Entry::idle) {
        table.remove(name);
    }
}

fn check_kind(kind: LockKind) -> Result<()> {
    match kind {
        LockKind::Mutex => Ok(()),
        other => Err(Error::unsupported(
            KIND,
            format!("lock kind `{}`", other.as_str()),
        )),
    }
}

fn check_key(key: &HoldKey) -> Result<()> {
    check_kind(key.kind)?;
    dlock_core::validate_name(&key.name)?;
    dlock_core::validate_owner(&key.owner)
}

impl Inner {
    fn table(&self) -> MutexGuard<'_, Table> {
        // The table is only changed by short, non-panicking updates; a poisoned lock still
        // holds consistent data.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(record::file_name(name))
    }

    fn io_error(&self, what: String, e: io::Error) -> Error {
        io_error(&self.endpoint, what, e)
    }

    fn corrupt(&self, path: &Path, why: &str) -> Error {
        Error::UnexpectedReply {
            backend: KIND,
            message: format!(
                "lock file {} is not a dlock lock record: {why}. If no process uses this lock, delete the file to reset it (its fencing tokens then restart from 1)",
                path.display()
            ),
        }
    }

    fn open_rw(&self, path: &Path) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| self.io_error(format!("cannot open lock file {}", path.display()), e))
    }

    /// Opens an existing lock file read-only; `None` if it does not exist.
    fn open_existing(&self, path: &Path) -> Result<Option<File>> {
        match File::open(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io_error(format!("cannot open lock file {}", path.display()), e)),
        }
    }

    fn read_record(&self, file: &File, path: &Path) -> Result<Record> {
        let bytes = record::read(file)
            .map_err(|e| self.io_error(format!("cannot read lock file {}", path.display()), e))?;
        Record::parse(&bytes).map_err(|why| self.corrupt(path, &why))
    }

    /// Rewrites the holder line (count changes, release). The line is informational, so a
    /// failure is logged rather than failing the call.
    fn write_holder_best_effort(
        &self,
        file: &File,
        name: &str,
        token: u64,
        holder: Option<HolderLine>,
    ) {
        let rec = Record {
            token,
            name: Some(name.to_owned()),
            holder,
        };
        if let Err(e) = record::write(file, &rec) {
            tracing::warn!(name, error = %e, "cannot update the holder line of the lock file");
        }
    }

    /// One non-blocking attempt, under the table lock. With `arm`, a failed attempt against a
    /// lock held outside this backend starts the waiting thread.
    fn try_acquire(self: &Arc<Self>, key: &HoldKey, arm: bool) -> Result<AcquireReply> {
        let mut table = self.table();
        let entry = table.entry(key.name.clone()).or_default();
        let r = self.try_acquire_in(entry, key, arm);
        remove_if_idle(&mut table, &key.name);
        r
    }

    fn try_acquire_in(
        self: &Arc<Self>,
        entry: &mut Entry,
        key: &HoldKey,
        arm: bool,
    ) -> Result<AcquireReply> {
        if let Some(h) = entry.holder.as_mut() {
            if h.owner != key.owner {
                return Ok(AcquireReply::Held { ttl: None });
            }
            h.count = h.count.checked_add(1).ok_or_else(|| {
                Error::invalid(format!(
                    "lock `{}` was re-entered {} times by one owner; release some holds first",
                    key.name,
                    u32::MAX
                ))
            })?;
            let line = HolderLine {
                pid: std::process::id(),
                count: h.count,
                owner: h.owner.to_string(),
            };
            self.write_holder_best_effort(&h.file, &key.name, h.token, Some(line));
            return Ok(AcquireReply::Granted { token: h.token });
        }
        if arm {
            if let Some(e) = entry.kernel_error.take() {
                return Err(self.io_error(
                    format!(
                        "cannot wait for lock file {}",
                        self.path(&key.name).display()
                    ),
                    e,
                ));
            }
        }
        let path = self.path(&key.name);
        // A few rounds in case the file is deleted or replaced while we lock it.
        for _ in 0..3 {
            let file = match entry.parked.take() {
                Some(f) => f,
                None => {
                    let f = self.open_rw(&path)?;
                    let got = sys::try_lock(&f, sys::Mode::Exclusive)
                        .map_err(|e| self.io_error(format!("cannot lock {}", path.display()), e))?;
                    if !got {
                        if arm && !entry.kernel_waiting {
                            // Wait on this very descriptor.
                            self.arm(entry, &key.name, f)?;
                        }
                        return Ok(AcquireReply::Held { ttl: None });
                    }
                    f
                }
            };
            match sys::same_file(&file, &path) {
                Ok(true) => {}
                Ok(false) => {
                    // We locked a file that is no longer the lock's file: lock the current one.
                    sys::unlock_and_close(file);
                    continue;
                }
                Err(e) => {
                    sys::unlock_and_close(file);
                    entry.bump();
                    return Err(self.io_error(format!("cannot stat {}", path.display()), e));
                }
            }
            return match self.grant(&file, &path, key) {
                Ok(token) => {
                    entry.holder = Some(Holder {
                        owner: key.owner.clone(),
                        file,
                        count: 1,
                        token,
                    });
                    Ok(AcquireReply::Granted { token })
                }
                Err(e) => {
                    sys::unlock_and_close(file);
                    // Other waiters may have been counting on the lock this process had.
                    entry.bump();
                    Err(e)
                }
            };
        }
        Err(self.io_error(
            format!("cannot lock {}", path.display()),
            io::Error::other(
                "the lock file was deleted or replaced three times while locking it; is something removing files in the lock directory?",
            ),
        ))
    }

    /// Under the exclusive lock: next fencing token, written with the holder line before it is
    /// returned.
    fn grant(&self, file: &File, path: &Path, key: &HoldKey) -> Result<u64> {
        let rec = self.read_record(file, path)?;
        if let Some(other) = rec.name.as_deref() {
            if other != &*key.name {
                return Err(Error::UnexpectedReply {
                    backend: KIND,
                    message: format!(
                        "lock file {} belongs to lock `{other}`, not `{}`: the two names have the same FNV-1a-128 hash; rename one of the locks",
                        path.display(),
                        key.name
                    ),
                });
            }
        }
        let token = rec.token.checked_add(1).ok_or_else(|| {
            self.corrupt(path, "its fencing token is at the largest possible value")
        })?;
        let new = Record {
            token,
            name: Some(key.name.to_string()),
            holder: Some(HolderLine {
                pid: std::process::id(),
                count: 1,
                owner: key.owner.to_string(),
            }),
        };
        record::write(file, &new)
            .map_err(|e| self.io_error(format!("cannot write lock file {}", path.display()), e))?;
        Ok(token)
    }

    /// Starts the waiting thread of `name`, blocking on `file` (opened read-write, as the
    /// lock it gets may become a grant). The caller checked that no thread waits yet.
    fn arm(self: &Arc<Self>, entry: &mut Entry, name: &Arc<str>, file: File) -> Result<()> {
        let (weak, name) = (Arc::downgrade(self), name.clone());
        std::thread::Builder::new()
            .name("dlock-file-wait".into())
            .stack_size(256 * 1024)
            .spawn(move || kernel_wait(weak, name, file))
            .map_err(|e| self.io_error("cannot start a thread to wait for the lock".into(), e))?;
        // The thread reports under the table lock, which we hold: it sees this flag set.
        entry.kernel_waiting = true;
        Ok(())
    }

    fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        {
            let mut table = self.table();
            if let Some(entry) = table.get_mut(&key.name) {
                match entry.holder.as_mut() {
                    Some(h) if h.owner == key.owner && h.count > 1 => {
                        h.count -= 1;
                        let line = HolderLine {
                            pid: std::process::id(),
                            count: h.count,
                            owner: h.owner.to_string(),
                        };
                        self.write_holder_best_effort(&h.file, &key.name, h.token, Some(line));
                        return Ok(ReleaseOutcome::StillHeld { remaining: h.count });
                    }
                    Some(h) if h.owner == key.owner => {
                        if let Some(h) = entry.holder.take() {
                            self.write_holder_best_effort(&h.file, &key.name, h.token, None);
                            sys::unlock_and_close(h.file);
                        }
                        entry.bump();
                        remove_if_idle(&mut table, &key.name);
                        return Ok(ReleaseOutcome::Released);
                    }
                    Some(_) => return Ok(ReleaseOutcome::TakenByOther),
                    None => {}
                }
            }
        }
        // Not held here: held by another process, or by nobody.
        Ok(if self.probe_held(&key.name)? {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// True if someone outside this backend's table holds the lock (non-blocking probe).
    fn probe_held(&self, name: &str) -> Result<bool> {
        let path = self.path(name);
        let Some(file) = self.open_existing(&path)? else {
            return Ok(false);
        };
        let free = sys::try_lock(&file, sys::Mode::Shared)
            .map_err(|e| self.io_error(format!("cannot probe {}", path.display()), e))?;
        if free {
            sys::unlock_and_close(file);
        }
        Ok(!free)
    }

    fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        let mut table = self.table();
        let mut out = Vec::with_capacity(holds.len());
        for (key, _lease) in holds {
            let Some(entry) = table.get_mut(&key.name) else {
                out.push(RenewOutcome::NotHeld);
                continue;
            };
            let ours = key.kind == LockKind::Mutex
                && entry.holder.as_ref().is_some_and(|h| h.owner == key.owner);
            if !ours {
                out.push(RenewOutcome::NotHeld);
                continue;
            }
            let path = self.path(&key.name);
            let intact = match entry.holder.as_ref() {
                Some(h) => sys::same_file(&h.file, &path)
                    .map_err(|e| self.io_error(format!("cannot stat {}", path.display()), e))?,
                None => false,
            };
            if intact {
                out.push(RenewOutcome::Renewed);
                continue;
            }
            tracing::warn!(name = %key.name, path = %path.display(),
                "the lock file was deleted or replaced while held; the lock is lost");
            if let Some(h) = entry.holder.take() {
                sys::unlock_and_close(h.file);
            }
            entry.bump();
            remove_if_idle(&mut table, &key.name);
            out.push(RenewOutcome::NotHeld);
        }
        Ok(out)
    }

    /// The state of a lock, under the table lock for this backend's holder, else from the file.
    /// `Err(None)` asks the caller to try again shortly (another process is mid-write).
    fn inspect_once(&self, name: &str, last_try: bool) -> Result<Option<LockInfo>> {
        {
            let table = self.table();
            if let Some(h) = table.get(name).and_then(|e| e.holder.as_ref()) {
                return Ok(Some(LockInfo {
                    name: name.to_owned(),
                    holders: vec![HolderInfo {
                        owner: h.owner.to_string(),
                        count: h.count,
                        lease_left: None,
                        ..Default::default()
                    }],
                    fencing_token: h.token,
                    ..Default::default()
                }));
            }
        }
        let path = self.path(name);
        let Some(file) = self.open_existing(&path)? else {
            return Ok(Some(LockInfo {
                name: name.to_owned(),
                holders: Vec::new(),
                fencing_token: 0,
                ..Default::default()
            }));
        };
        let free = sys::try_lock(&file, sys::Mode::Shared)
            .map_err(|e| self.io_error(format!("cannot probe {}", path.display()), e))?;
        let rec = self.read_record(&file, &path);
        if free {
            // Writers hold the exclusive lock, so under our shared lock the record is whole.
            sys::unlock_and_close(file);
            let rec = rec?;
            return Ok(Some(LockInfo {
                name: name.to_owned(),
                holders: Vec::new(),
                fencing_token: rec.token,
                ..Default::default()
            }));
        }
        // Held by another process, which may be writing the record right now.
        let rec = match rec {
            Ok(rec) => rec,
            Err(e) if last_try => return Err(e),
            Err(_) => return Ok(None),
        };
        let holder = match rec.holder {
            Some(h) => HolderInfo {
                owner: h.owner,
                count: h.count,
                lease_left: None,
                ..Default::default()
            },
            None if !last_try => return Ok(None),
            // Locked but no holder line: a process between locking and writing, or another
            // backend's waiting thread handing the lock over.
            None => HolderInfo {
                owner: "unknown (another process holds the lock but has not recorded its owner)"
                    .into(),
                count: 1,
                lease_left: None,
                ..Default::default()
            },
        };
        Ok(Some(LockInfo {
            name: name.to_owned(),
            holders: vec![holder],
            fencing_token: rec.token,
            ..Default::default()
        }))
    }
}

/// Body of the waiting thread of one lock name: blocks in `flock(LOCK_EX)`, then hands the lock
/// to a waiter (parks it) or, if nobody waits any more, unlocks it at once.
fn kernel_wait(inner: Weak<Inner>, name: Arc<str>, file: File) {
    let res = sys::lock_wait(&file);
    let Some(inner) = inner.upgrade() else {
        // The backend is gone.
        if res.is_ok() {
            sys::unlock_and_close(file);
        }
        return;
    };
    let mut table = inner.table();
    let entry = table.entry(name.clone()).or_default();
    entry.kernel_waiting = false;
    match res {
        Ok(()) => {
            if entry.waiters > 0 && entry.holder.is_none() && entry.parked.is_none() {
                entry.parked = Some(file);
            } else {
                sys::unlock_and_close(file);
            }
        }
        Err(e) => {
            tracing::warn!(name = %name, error = %e, "waiting for the lock file failed");
            if entry.waiters + entry.watchers > 0 {
                entry.kernel_error = Some(e);
            }
        }
    }
    entry.bump();
    remove_if_idle(&mut table, &name);
}

/// A registered waiter or watch of one name; unregisters on drop.
struct Interest {
    inner: Arc<Inner>,
    name: Arc<str>,
    watcher: bool,
}

impl Interest {
    /// Registers; returns the name's notifier and current generation.
    fn new(inner: &Arc<Inner>, name: &Arc<str>, watcher: bool) -> (Interest, Arc<Notify>, u64) {
        let mut table = inner.table();
        let entry = table.entry(name.clone()).or_default();
        if watcher {
            entry.watchers += 1;
        } else {
            entry.waiters += 1;
        }
        let reg = Interest {
            inner: inner.clone(),
            name: name.clone(),
            watcher,
        };
        (reg, entry.notify.clone(), entry.generation)
    }

    /// Takes the waiting thread's error, if any; starts the waiting thread if the lock is
    /// held outside this backend and no thread waits yet.
    fn rearm(&self) -> Result<()> {
        let mut table = self.inner.table();
        let entry = table.entry(self.name.clone()).or_default();
        if let Some(e) = entry.kernel_error.take() {
            return Err(self.inner.io_error(
                format!(
                    "cannot wait for lock file {}",
                    self.inner.path(&self.name).display()
                ),
                e,
            ));
        }
        if entry.holder.is_none() && entry.parked.is_none() && !entry.kernel_waiting {
            let file = self.inner.open_rw(&self.inner.path(&self.name))?;
            self.inner.arm(entry, &self.name, file)?;
        }
        Ok(())
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut table = self.inner.table();
        let Some(entry) = table.get_mut(&self.name) else {
            return;
        };
        if self.watcher {
            entry.watchers = entry.watchers.saturating_sub(1);
        } else {
            entry.waiters = entry.waiters.saturating_sub(1);
            if entry.waiters == 0 {
                if let Some(file) = entry.parked.take() {
                    // The last waiter gave up: nobody will claim the parked lock.
                    sys::unlock_and_close(file);
                    entry.bump();
                }
            }
        }
        if entry.waiters + entry.watchers == 0 {
            entry.kernel_error = None;
        }
        remove_if_idle(&mut table, &self.name);
    }
}

/// Sleeps until `deadline`, forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

#[async_trait]
impl Backend for FileBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.inner.endpoint.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        check_key(&req.key)?;
        self.inner.try_acquire(&req.key, false)
    }

    async fn watch(&self, key: &HoldKey) -> Result<Box<dyn ReleaseWatch>> {
        dlock_core::validate_name(&key.name)?;
        let name: Arc<str> = key.name.clone();
        let (interest, notify, seen) = Interest::new(&self.inner, &name, true);
        // Catch releases by other processes from now on, not only from the first `changed`.
        interest.rearm()?;
        Ok(Box::new(FileWatch {
            interest,
            notify,
            seen,
        }))
    }

    /// Waits without polling: see the crate documentation. Every release wakes the waiters.
    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        check_key(&req.key)?;
        let (_interest, notify, _) = Interest::new(&self.inner, &req.key.name, false);
        let mut backoff = dlock_core::backoff::Backoff::default();
        loop {
            // Registered before the attempt: a release after it wakes this future.
            let notified = notify.notified();
            tokio::pin!(notified);
            let requested_at = Instant::now();
            let pause = match self.inner.try_acquire(&req.key, true) {
                Ok(AcquireReply::Granted { token }) => {
                    return Ok(Some(Granted {
                        token,
                        requested_at,
                    }))
                }
                Ok(AcquireReply::Held { .. }) => {
                    backoff.reset();
                    None
                }
                Err(e) if e.is_retryable() => {
                    let pause = backoff.next_delay();
                    tracing::debug!(error = %e, ?pause, "acquire attempt failed; retrying");
                    Some(pause)
                }
                Err(e) => return Err(e),
            };
            if cancel.is_cancelled() || past(deadline) {
                return Ok(None);
            }
            tokio::select! {
                _ = &mut notified, if pause.is_none() => {}
                _ = tokio::time::sleep(pause.unwrap_or_default()), if pause.is_some() => {}
                _ = until(deadline) => {
                    if past(deadline) {
                        return Ok(None);
                    }
                }
                _ = cancel.cancelled() => return Ok(None),
            }
        }
    }

    async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        check_key(key)?;
        self.inner.release(key)
    }

    async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(holds)
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        check_kind(kind)?;
        dlock_core::validate_name(name)?;
        const TRIES: u32 = 5;
        for i in 1..=TRIES {
            if let Some(info) = self.inner.inspect_once(name, i == TRIES)? {
                return Ok(info);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Err(Error::UnexpectedReply {
            backend: KIND,
            message: format!("could not read a consistent record for lock `{name}`"),
        })
    }
}

/// Release notifications of one lock name, from this backend and from other processes.
struct FileWatch {
    interest: Interest,
    notify: Arc<Notify>,
    seen: u64,
}

#[async_trait]
impl ReleaseWatch for FileWatch {
    async fn changed(&mut self) -> Result<Wake> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            {
                let table = self.interest.inner.table();
                let generation = table
                    .get(&self.interest.name)
                    .map_or(self.seen, |e| e.generation);
                if generation != self.seen {
                    self.seen = generation;
                    return Ok(Wake::Released);
                }
            }
            self.interest.rearm()?;
            notified.await;
        }
    }
}
