//! Embedded `file://` backend for [dlock](https://docs.rs/dlock): locks shared by the processes
//! of **one host** through OS file locks (`flock(2)`), with no server to run.
//!
//! ```no_run
//! # async fn f() -> distlock_core::Result<()> {
//! use std::sync::Arc;
//! use distlock_core::{Client, ClientOptions};
//! use distlock_file::FileBackend;
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
//! - Each mutex is one file, `<dir>/<namespace>/<hash>.lock`, where `<hash>` is the 32
//!   lower-case hex digits of the **FNV-1a 128-bit** hash of the lock name's UTF-8 bytes, so
//!   names may hold any printable character, `/` included. The file holds a small text
//!   record (the original name is kept for `inspect`; a second name that hashes to the same
//!   file is refused with [`Error::UnexpectedReply`] instead of silently sharing the lock):
//!
//!   ```text
//!   distlock-file 1
//!   token 1764650000123456          <- last fencing token granted
//!   name orders:42                  <- the lock name
//!   holder 12345 1 host:12345:ab:7  <- pid, 1 (one grant), owner id; only while held
//!   end
//!   ```
//!
//!   (The second field of the holder line was a re-entry count before re-entry moved into
//!   the client; it is always 1 now, and other numbers written by older versions are shown as
//!   they are.)
//!
//!   Files are created with mode `0666` less the umask and are never deleted by dlock: the
//!   file carries the fencing counter. Delete them only when no process uses the directory.
//! - A read-write lock of the same name is another lock, with three files of its own,
//!   `<hash>.rw`, `<hash>.rw-turnstile` and `<hash>.rw-record` (see
//!   [Read-write locks](#read-write-locks)).
//!
//! # The hold protocol: one grant per attempt
//! Every acquisition attempt has an [`AttemptId`] ([`AcquireRequest::attempt`]), and the
//! backend keeps, per lock name, the attempt that holds it with its fencing token and the
//! descriptor whose `flock` is the lock (the lock itself is the kernel's; the table is this
//! process's memory of whom it belongs to).
//! - **A retried acquire** of the attempt that holds the lock returns the same grant (same
//!   token, counter not incremented). Any other attempt — even of the same owner id, from
//!   another client sharing this backend — is another holder and gets
//!   [`AcquireReply::Held`]. There is no re-entry counting here: the client counts re-entrant
//!   guards and sends one acquire per hold.
//! - **Release and renew name the grant** ([`GrantRef`]: attempt and token). A release of a
//!   grant this backend does not have (released already, lost with a deleted file, another
//!   process's) frees nothing and answers [`ReleaseOutcome::Expired`] when nobody holds the lock,
//!   [`ReleaseOutcome::TakenByOther`] when someone does; a repeated release is reported, never
//!   repeated. Renewal never changes anything: the lease is the process's lifetime, so
//!   [`Backend::renew`] only confirms that the grant is still ours and its file still the lock's
//!   file ([`RenewOutcome::NotHeld`] otherwise, whatever the duration asked for).
//! - **Giving up** ([`Backend::give_up`]) releases the grant of that attempt, if it has one,
//!   and never another attempt's. It is what the client calls when an attempt ends without
//!   the caller receiving its answer; and the client gives back a grant that reaches an
//!   acquire whose caller is gone (cancelled, or timed out as it arrived). So a grant nobody
//!   receives is not held for the life of the process. Waiting leaves nothing to give up: a
//!   waiter's registration ends with its wait, and a lock that a waiting thread gets after the
//!   last waiter left is unlocked at once (see [Waiting without polling](#waiting-without-polling)).
//!
//! # Why this is a mutex (the safety argument)
//! - **Exclusion between processes.** A holder keeps an open descriptor on the lock file with
//!   `flock(LOCK_EX)` on it. The kernel grants an exclusive `flock` to one open file
//!   description at a time, so at most one process holds a lock file.
//! - **Exclusion inside a process.** `flock` locks belong to open file descriptions, not to
//!   attempts: a second `flock(LOCK_EX)` through a description that already holds the lock
//!   succeeds. So attempts never share a description: the table holds at most one grant per
//!   name, an attempt other than its holder is answered [`AcquireReply::Held`] without touching
//!   the file (the attempts of one backend are serialised in memory), and every new grant opens
//!   its own descriptor (which the kernel excludes from every other description: other
//!   backends, other processes). Two separately opened `FileBackend`s (even in one process;
//!   clones share one table) exclude each other through the kernel, like two processes.
//! - **Owner ids are not identities of holders.** Two clients (or two processes) using one
//!   owner id are two holders and exclude each other; only the attempt id tells a retry from a
//!   new acquisition.
//! - **Crashes: the lease is the process lifetime.** There is no lease and nothing to renew.
//!   When the holding process dies, however it dies (`SIGKILL` included), the kernel closes its
//!   descriptors and releases the `flock`, and a waiter gets the lock at once. A fixed lease
//!   ([`Lock::lease`](distlock_core::Lock::lease)) is therefore *not* enforced by this backend:
//!   the guard's lost signal fires at the lease end, but the lock stays held until the guard is
//!   released or dropped, or the process exits.
//! - **Fencing tokens** are a counter in the lock file, read, incremented and written (the
//!   write completes before the grant is returned) only while holding the exclusive lock, so
//!   grants are serialised by that lock. Each token is the last one plus one, **and at least the
//!   wall clock in microseconds since the Unix epoch**: when the counter is lost — the file
//!   deleted while a process still holds the unlinked one, or the directory (a tmpfs under
//!   `$XDG_RUNTIME_DIR` or `/tmp`) wiped at a reboot — the new counter starts at the clock, above
//!   every token handed out before (each was at most its own grant's time, plus one per grant
//!   made within the same microsecond). Tokens so strictly increase across processes, process
//!   restarts and lost files, unless the wall clock is set back by more than the time between the
//!   last grant on the old file and the first on the new one (a step back while the file stays
//!   does nothing: the counter still increases by one). Tokens are large numbers (about 1.8e15
//!   in 2026), never 1, 2, 3. The counter is not `fsync`ed; the clock floor covers a power loss
//!   that loses the last increments too.
//! - **A deleted or replaced lock file** (an operator, or a `/tmp` cleaner such as
//!   `systemd-tmpfiles` removing old files) would let a new process lock a new file while the
//!   old holder still locks the unlinked one. A grant is only returned after checking that the
//!   path still names the locked file, and every renewal (every watchdog tick) checks it again:
//!   a holder whose file disappeared reports the lock lost
//!   ([`LostReason::NotHeld`](distlock_core::LostReason::NotHeld)) and unlocks. Until that tick, the
//!   two holders overlap; the new one's token is the higher (see above), so a fenced resource
//!   refuses the old one's writes.
//! - **Children.** Descriptors are opened close-on-exec, so an `exec`ed child does not inherit
//!   a lock. A child that `fork`s without `exec` shares the open file description while it
//!   lives; releases unlock explicitly (`LOCK_UN`) so that the lock still frees on release.
//!
//! **One host, local filesystems only.** `flock` on NFS is emulated with byte-range locks that
//! a client loses without being told when its lease with the server lapses, and SMB/CIFS locks
//! go with the session; on other network file systems a lock is local to one client. So
//! [`FileBackend::open`] refuses (with [`Error::Unsupported`], naming the file system) a lock
//! directory whose `statfs(2)` type is NFS (`0x6969`), SMB (`0x517B`), CIFS (`0xFF534D42`),
//! SMB2 (`0xFE534D42`), AFS or CephFS. FUSE file systems (`0x65735546`) are allowed with a
//! warning in the log: `statfs` cannot tell a local one (fuse-overlayfs in rootless
//! containers, whose `flock` is the host's) from a remote one (sshfs, whose `flock` is not
//! shared with other hosts); do not use a remote one. Use this backend only for a directory
//! on a local filesystem of a single host, and a networked backend (Redis, …) for locks
//! between hosts. (The check is made on Linux and Android; elsewhere it is up to you.)
//!
//! # Read-write locks
//! [`Client::rw_lock`](distlock_core::Client::rw_lock) → `.read()` / `.write()`
//! ([`LockKind::Read`] / [`LockKind::Write`]), with the semantics of the Redis backend:
//! - both sides are re-entrant per owner (`read()` and `write()` of one `RwLock` share an
//!   owner), counted in the client: the backend sees one grant per attempt, with its own
//!   fencing token; a retried attempt gets the same grant;
//! - a **downgrade** is allowed: the writer may also take the read side, and keeps it after it
//!   releases the write side. The read request names the write grant it may be granted beside
//!   ([`AcquireRequest::write_grant`]); a read request that names none, or a grant this
//!   backend does not hold, waits like any other reader — the owner id alone never lets a
//!   reader in beside a writer (another client with the same owner id is another holder);
//! - an **upgrade** (an owner that reads asking for the write side) is refused at once with
//!   [`Error::InvalidArgument`]: two readers upgrading would wait for each other forever;
//! - **writers are not starved**: once a writer waits, a new reader does not pass it.
//!
//! Fair locks and semaphores are not implemented ([`Error::Unsupported`]).
//!
//! **Files.** Three per name, next to the mutex's `<hash>.lock`, which they never touch (a
//! mutex and a read-write lock of one name are two locks that do not exclude each other):
//! - `<hash>.rw`, the lock (empty): readers hold `flock(LOCK_SH)` on it, a writer `LOCK_EX`;
//! - `<hash>.rw-turnstile` (empty): the gate that keeps new readers behind a waiting writer;
//! - `<hash>.rw-record`: the fencing counter, the name and one line per holder and side:
//!
//!   ```text
//!   distlock-file 1
//!   token 57                          <- last fencing token granted (either side)
//!   name orders:42                    <- the lock name
//!   hold w 12345 0 1 host:12345:ab:7  <- side, pid, backend number in that process,
//!   hold r 12345 0 1 host:12345:ab:7     1 (one grant), owner id; one line per grant
//!   hold r 23456 0 1 host:23456:cd:1
//!   end
//!   ```
//!
//! **Why this is a read-write lock (the safety argument).**
//! - **Between processes.** A backend one of whose owners writes holds `LOCK_EX` on
//!   `<hash>.rw`; a backend whose owners only read holds `LOCK_SH`. The kernel never grants
//!   `LOCK_EX` on a file while any other open file description holds a lock on it, nor
//!   `LOCK_SH` while one holds `LOCK_EX`: a writer excludes every reader and writer of every
//!   other process and backend, and readers share.
//! - **Inside a process.** A backend keeps one descriptor on `<hash>.rw` for all its grants and
//!   a table *name → write grant (attempt, owner, token), read grants (attempt, owner, token)*.
//!   The write side is granted only when the backend has no grant of either side (and then
//!   only with a new `LOCK_EX`, so nobody anywhere holds one); the read side only while the
//!   backend has no write grant (a backend that reads lets its new readers join its shared
//!   lock, after the turnstile check below), except beside the write grant the request names
//!   (a downgrade). Two backends, even in one process, exclude each other through the kernel,
//!   like two processes.
//! - **One grant per attempt.** A retried attempt gets its grant again; every other attempt,
//!   whatever its owner id, is another holder. A release or a renewal names its grant (attempt
//!   and token) and touches no other; the backend unlocks `<hash>.rw` when it has no grant of
//!   either side any more.
//! - **Downgrade.** A read request that names the backend's write grant
//!   ([`AcquireRequest::write_grant`], attempt and token) gets the read side from the table (the
//!   exclusive lock covers it), with a new token. When the write grant is released while read
//!   grants made beside it remain,
//!   the backend converts its `LOCK_EX` to `LOCK_SH` on the same descriptor. Linux converts in
//!   place: the old lock is removed and the new one inserted under the file's lock-list
//!   spinlock, so no waiting writer can slip in between. Should a conversion ever fail (where
//!   `flock(2)` makes no such promise), the read hold is given up and its next renewal reports
//!   it lost, so no owner believes it reads while someone else writes.
//! - **Upgrade** is checked in the table at an attempt's first request: an owner id with a
//!   read grant in this backend gets [`Error::InvalidArgument`] when it asks for the write side.
//!   The check is by owner id (a write request names no read grant), which can only refuse,
//!   never grant — so a second client that shares the backend and the owner id is refused
//!   rather than queued. A writer that was already waiting when a read grant of its owner came
//!   through (a read waiter of the same `RwLock` handle) goes on waiting for it to be released.
//! - **Writers are not starved: the turnstile.** `flock` has no queue: a process blocked in
//!   `LOCK_EX` never stops new `LOCK_SH` requests from being granted. So a writer that cannot
//!   have the lock at once takes `LOCK_EX` on `<hash>.rw-turnstile` (waiting for it behind
//!   another waiting writer if need be) and keeps it until it has the lock; and a reader that
//!   does not hold the read side yet must first get `LOCK_SH | LOCK_NB` on the turnstile,
//!   takes `LOCK_SH | LOCK_NB` on `<hash>.rw` while it holds it, then lets the turnstile go. Once
//!   a writer waits, no new reader of any process or backend gets in: the readers inside
//!   leave, and the writer gets the lock. A reader that passed the turnstile before the writer
//!   started waiting may still get in ahead of it (it was first), and a re-entrant read guard
//!   never reaches the backend (the client counts it), so it never waits for the turnstile
//!   (the writer waits for that very hold). A writer gives the
//!   turnstile back as soon as it has the lock, so readers that arrive while it writes pass it
//!   and wait on the lock itself, alongside the next writer: a chain of writers cannot keep
//!   readers out for ever either. The order among writers, and between those readers and the next
//!   writer, is not first come first served (the kernel wakes every waiter of a released lock
//!   and the first to run wins).
//! - **Fencing tokens.** Every grant (read, write, or the read side of a downgrade)
//!   increments the counter in `<hash>.rw-record` under `LOCK_EX` on the record itself (with
//!   the mutex's clock floor: at least the wall clock in microseconds), and writes it (with
//!   the holder lines) before the grant is returned. Readers only hold a
//!   shared lock on `<hash>.rw`, so the record's own lock is what serialises their increments:
//!   tokens strictly increase across all grants of the name, both sides, all processes and
//!   restarts. The record's lock is held for that one read and one write, and never while
//!   waiting for another lock, so it cannot take part in a deadlock; it is a blocking `flock`,
//!   so a process stopped (`SIGSTOP`, a debugger) in the middle of an update delays the other
//!   updates of that record until it continues (or dies). A deleted record restarts the
//!   counter at the clock floor, above the tokens before it; it is not `fsync`ed. It is not shared with the mutex of the same name:
//!   the mutex's counter lives in `<hash>.lock`, which its holder keeps locked for its whole
//!   hold, and a counter shared through a third file would add a file to every mutex name (and
//!   a race with holders of earlier versions when it is first created); the two are different
//!   locks anyway.
//! - **Crashes.** As for the mutex, the lease is the process lifetime: the kernel releases a
//!   dead process's locks on `<hash>.rw` and the turnstile, and a waiter gets the lock at once.
//!   Its `hold` lines stay in the record, but are ignored as soon as the process is gone
//!   (`kill(pid, 0)` fails with `ESRCH`), removed by the next update of the record, and all
//!   removed by the next write grant.
//! - **A deleted or replaced `<hash>.rw`** is caught as for the mutex: a grant checks that the
//!   path still names the locked file, and every renewal checks it again; a backend whose file
//!   disappeared reports every hold on it lost. Deleting the turnstile while a writer waits
//!   only lets new readers pass that writer (the writer still excludes them once it is in);
//!   deleting the record restarts the counter at the clock floor.
//!
//! # Waiting without polling
//! [`Backend::acquire_wait`] is overridden; waiters never poll.
//! - While the lock is held **by another attempt of this backend**, waiters sleep on an
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
//! - **A grant as the caller goes.** A waiter's attempt and its grant happen in one step
//!   under the table lock, so a wait returns either a grant or nothing, never a grant lost in
//!   between. When the caller of `acquire` is gone by then (its future dropped as the lock
//!   came free), the client gives the grant back ([`Backend::release`] with its address, or
//!   [`Backend::give_up`] when the wait failed): the lock is free again at once, not held for
//!   the life of the process.
//! - **Read-write locks** wait the same way, with up to three threads per name and backend,
//!   each holding nothing while it blocks: a *read thread* blocks for `LOCK_SH` on the
//!   turnstile (unless the waiter passed it already) and then for `LOCK_SH` on `<hash>.rw`; a
//!   *write thread* blocks for `LOCK_EX` on `<hash>.rw`; a *turnstile thread* blocks for
//!   `LOCK_EX` on the turnstile when another writer holds it. What they get is parked for the
//!   waiters of their side, or unlocked at once if none waits any more. The turnstile a
//!   backend holds for its waiting writers is given back the moment the last of them gets the
//!   lock or gives up, so a writer that times out or is cancelled does not keep readers out.
//! - [`Backend::watch`] uses the same two mechanisms, so it reports releases by this process
//!   and by other processes alike, from the moment `watch` returns. The waiting thread is
//!   re-armed at each `changed` call: a release that happens between two calls is reported
//!   by the next call if the lock is still free then (it resolves at once); if another
//!   process took the lock in between, the next release is what wakes it.
//!
//! # Inspect
//! [`Backend::inspect`] reports the holder of this backend from its table (owner, count 1: one
//! grant, however many re-entrant guards its client counts);
//! for another process it reads the holder line of the file, after a non-blocking shared-lock
//! probe (`LOCK_SH|LOCK_NB`) showed the lock is held (a free lock reports no holders, whatever
//! a crashed holder left in the file). `lease_left` is always `None`; `fencing_token` is the
//! counter.
//!
//! For a read-write lock (ask for [`LockKind::Read`] or [`LockKind::Write`]; both report every
//! holder, with `side` set), the holders of this backend come from its table, and those of
//! other processes and backends from the `hold` lines of the record, read under a shared lock
//! on it: lines of live processes only, and write lines only if `<hash>.rw` is locked
//! exclusively (a non-blocking `LOCK_SH` probe, made only when there are such lines). The
//! listing is exact except that a line can outlive its holder (until the next update of the
//! record) when the holder's process was killed and its pid reused since, and that holders in
//! another PID namespace (another container sharing the directory) are not listed: their pids
//! mean nothing here. The locks themselves do not depend on the lines. `fencing_token` is the
//! record's counter.
//!
//! # What is still assumed
//! - **One host, local file system** (see above): the `statfs` check catches the usual network
//!   file systems, not a remote FUSE file system, nor a directory shared with another host
//!   through a bind mount of a network file system that reports a local type.
//! - **The wall clock** is not set back by more than the time between the last grant on a lost
//!   lock file and the first on its replacement (only then can a token go back; while the file
//!   stays, tokens increase by one whatever the clock does).
//! - **Nobody deletes lock files while they are used**, or else a second holder overlaps the
//!   first until the first's next renewal (every watchdog tick) reports it lost; fencing tokens
//!   tell the resource which one is current. A fixed-lease guard has no renewals: it learns of
//!   a deleted file only at its release.
//! - **Same PID namespace** for `inspect` of read-write locks held by other processes (the locks
//!   themselves work across namespaces: they are the kernel's).
#![warn(missing_docs)]

mod location;
mod ops;
mod record;
mod rw;
mod sys;

use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Backend, ClientOptions, Error, GrantRef,
    Granted, HoldKey, HolderInfo, LockInfo, LockKind, ReleaseOutcome, ReleaseWatch, RenewOutcome,
    Result, Wake,
};
use location::Target;
use record::{HolderLine, Record};
use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
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

    /// The lock file of mutex `name`.
    pub fn lock_file(&self, name: &str) -> PathBuf {
        self.inner.path(name)
    }

    /// The files of read-write lock `name`: the lock itself (`<hash>.rw`), the turnstile
    /// (`<hash>.rw-turnstile`) and the record (`<hash>.rw-record`: fencing counter, name,
    /// holders). See the [crate documentation](crate#read-write-locks).
    pub fn rw_lock_files(&self, name: &str) -> [PathBuf; 3] {
        [rw::MAIN, rw::TURNSTILE, rw::RECORD].map(|suffix| self.inner.rw_path(name, suffix))
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
        check_local(&dir, &endpoint)?;
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
                instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
                table: Mutex::new(HashMap::new()),
                rw: Mutex::new(HashMap::new()),
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

/// Refuses a lock directory on a network file system (see [`network_fs`]).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn check_local(dir: &Path, endpoint: &str) -> Result<()> {
    let magic = sys::fs_magic(dir)
        .map_err(|e| io_error(endpoint, format!("cannot statfs {}", dir.display()), e))?;
    if let Some(fs) = network_fs(magic) {
        return Err(Error::unsupported(
            KIND,
            format!(
                "{} as a lock directory (it is on {fs}, statfs type {magic:#x}, a network file system whose flock locks can be lost by the client or do not exclude other hosts; use a directory on a local file system, e.g. `file://`, or a networked backend such as `redis://` for locks between hosts)",
                dir.display()
            ),
        ));
    }
    if magic == FUSE_MAGIC {
        tracing::warn!(dir = %dir.display(),
            "the lock directory is on a FUSE file system: flock works there only if the file system implements it for this host (fuse-overlayfs does; sshfs and other network file systems do not)");
    }
    Ok(())
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn check_local(_dir: &Path, _endpoint: &str) -> Result<()> {
    Ok(())
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

/// Numbers the backends of this process (for the `hold` lines of read-write locks).
static INSTANCES: AtomicU64 = AtomicU64::new(0);

/// State shared by clones of a backend, its waiters, watches and waiting threads.
struct Inner {
    dir: PathBuf,
    endpoint: String,
    /// Tells this backend's `hold` lines from those of other backends of this process.
    instance: u64,
    /// Mutexes.
    table: Mutex<HashMap<Arc<str>, Entry>>,
    /// Read-write locks.
    rw: Mutex<rw::RwTable>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.rw_forget_all();
    }
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

/// The one grant of this backend on a mutex: the attempt that won it, its token, and the
/// descriptor whose `flock(LOCK_EX)` is the lock.
struct Holder {
    attempt: AttemptId,
    owner: Arc<str>,
    file: File,
    token: u64,
}

impl Holder {
    fn is(&self, grant: &GrantRef) -> bool {
        self.attempt == grant.attempt && self.token == grant.token
    }
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
        LockKind::Mutex | LockKind::Read | LockKind::Write => Ok(()),
        other => Err(Error::unsupported(
            KIND,
            format!("lock kind `{}`", other.as_str()),
        )),
    }
}

fn check_key(key: &HoldKey) -> Result<()> {
    check_kind(key.kind)?;
    distlock_core::validate_name(&key.name)?;
    distlock_core::validate_owner(&key.owner)
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
            holds: Vec::new(),
        };
        if let Err(e) = record::write(file, &rec) {
            tracing::warn!(name, error = %e, "cannot update the holder line of the lock file");
        }
    }

    /// One non-blocking attempt, under the table lock. With `arm`, a failed attempt against a
    /// lock held outside this backend starts the waiting thread.
    fn try_acquire(self: &Arc<Self>, req: &AcquireRequest, arm: bool) -> Result<AcquireReply> {
        let mut table = self.table();
        let entry = table.entry(req.key.name.clone()).or_default();
        let r = self.try_acquire_in(entry, req, arm);
        remove_if_idle(&mut table, &req.key.name);
        r
    }

    fn try_acquire_in(
        self: &Arc<Self>,
        entry: &mut Entry,
        req: &AcquireRequest,
        arm: bool,
    ) -> Result<AcquireReply> {
        let key = &req.key;
        if let Some(h) = &entry.holder {
            if h.attempt == req.attempt {
                // A retry of the attempt that holds the lock: the same grant. The lease is the
                // process's lifetime, so there is nothing to lengthen.
                return Ok(AcquireReply::Granted { token: h.token });
            }
            // Any other attempt, even of the same owner id, is another holder.
            return Ok(AcquireReply::Held { ttl: None });
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
                        attempt: req.attempt.clone(),
                        owner: key.owner.clone(),
                        file,
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
        self.check_name(&rec, &key.name, path)?;
        let token = record::next_token(rec.token).ok_or_else(|| {
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
            holds: Vec::new(),
        };
        record::write(file, &new)
            .map_err(|e| self.io_error(format!("cannot write lock file {}", path.display()), e))?;
        Ok(token)
    }

    /// A record naming another lock: two names with the same hash.
    fn check_name(&self, rec: &Record, name: &str, path: &Path) -> Result<()> {
        match rec.name.as_deref() {
            Some(other) if other != name => Err(Error::UnexpectedReply {
                backend: KIND,
                message: format!(
                    "lock file {} belongs to lock `{other}`, not `{name}`: the two names have the same FNV-1a-128 hash; rename one of the locks",
                    path.display(),
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Starts the waiting thread of `name`, blocking on `file` (opened read-write, as the
    /// lock it gets may become a grant). The caller checked that no thread waits yet.
    fn arm(self: &Arc<Self>, entry: &mut Entry, name: &Arc<str>, file: File) -> Result<()> {
        let (weak, name) = (Arc::downgrade(self), name.clone());
        std::thread::Builder::new()
            .name("distlock-file-wait".into())
            .stack_size(256 * 1024)
            .spawn(move || kernel_wait(weak, name, file))
            .map_err(|e| self.io_error("cannot start a thread to wait for the lock".into(), e))?;
        // The thread reports under the table lock, which we hold: it sees this flag set.
        entry.kernel_waiting = true;
        Ok(())
    }

    fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let name = &grant.key.name;
        {
            let mut table = self.table();
            if let Some(entry) = table.get_mut(name) {
                match &entry.holder {
                    Some(h) if h.is(grant) => {
                        self.unlock_holder(entry, name);
                        remove_if_idle(&mut table, name);
                        return Ok(ReleaseOutcome::Released);
                    }
                    Some(_) => return Ok(ReleaseOutcome::TakenByOther),
                    // Locked by this backend's waiting thread for its waiters: nobody holds it.
                    None if entry.parked.is_some() => return Ok(ReleaseOutcome::Expired),
                    None => {}
                }
            }
        }
        // Not held here: held by another process, or by nobody.
        Ok(if self.probe_held(name)? {
            ReleaseOutcome::TakenByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Gives up this backend's grant on `name` (the holder line first, then the lock), and
    /// wakes the waiters.
    fn unlock_holder(&self, entry: &mut Entry, name: &str) {
        if let Some(h) = entry.holder.take() {
            self.write_holder_best_effort(&h.file, name, h.token, None);
            sys::unlock_and_close(h.file);
        }
        entry.bump();
    }

    /// The attempt `req.attempt` stops: if it holds the lock (a grant its caller never
    /// received), give the lock back. Another attempt's grant is never touched.
    fn give_up(&self, req: &AcquireRequest) {
        let name = &req.key.name;
        let mut table = self.table();
        let Some(entry) = table.get_mut(name) else {
            return;
        };
        if entry
            .holder
            .as_ref()
            .is_some_and(|h| h.attempt == req.attempt)
        {
            tracing::debug!(name = %name, attempt = %req.attempt, "giving back the grant of an attempt that gave up");
            self.unlock_holder(entry, name);
            remove_if_idle(&mut table, name);
        }
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

    /// The lease is the process's lifetime: a renewal only confirms that the grant is still
    /// ours (and its file still the lock's file), whatever duration it asks for.
    fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        holds
            .iter()
            .map(|(grant, _lease)| match rw::side_of(grant.key.kind) {
                Some(side) => self.rw_renew(grant, side),
                None if grant.key.kind == LockKind::Mutex => self.renew_mutex(grant),
                None => Ok(RenewOutcome::NotHeld),
            })
            .collect()
    }

    fn renew_mutex(&self, grant: &GrantRef) -> Result<RenewOutcome> {
        let key = &grant.key;
        let mut table = self.table();
        let Some(entry) = table.get_mut(&key.name) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let Some(h) = entry.holder.as_ref().filter(|h| h.is(grant)) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let path = self.path(&key.name);
        let intact = sys::same_file(&h.file, &path)
            .map_err(|e| self.io_error(format!("cannot stat {}", path.display()), e))?;
        if intact {
            return Ok(RenewOutcome::Renewed);
        }
        tracing::warn!(name = %key.name, path = %path.display(),
            "the lock file was deleted or replaced while held; the lock is lost");
        if let Some(h) = entry.holder.take() {
            sys::unlock_and_close(h.file);
        }
        entry.bump();
        remove_if_idle(&mut table, &key.name);
        Ok(RenewOutcome::NotHeld)
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
                        count: 1,
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

/// The waiting loop of every kind: one attempt (which, when the lock is held, starts the
/// waiting threads it needs), then sleep until the name's notifier fires, the deadline passes
/// or `cancel` fires. The caller keeps its waiter registered for the whole loop.
async fn wait_loop(
    notify: &Notify,
    mut attempt: impl FnMut() -> Result<AcquireReply>,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<Option<Granted>> {
    let mut backoff = distlock_core::backoff::Backoff::default();
    loop {
        // Registered before the attempt: a release after it wakes this future.
        let notified = notify.notified();
        tokio::pin!(notified);
        // On the lease clock, as every grant's start.
        let requested_at = distlock_core::clock::Instant::now();
        let pause = match attempt() {
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
        match rw::side_of(req.key.kind) {
            Some(side) => self.inner.rw_try(req, side, false, true),
            None => self.inner.try_acquire(req, false),
        }
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let key = &req.key;
        check_key(key)?;
        if let Some(side) = rw::side_of(key.kind) {
            return Ok(Box::new(self.inner.rw_watch(key, side)?));
        }
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
        if let Some(side) = rw::side_of(req.key.kind) {
            return self
                .inner
                .rw_acquire_wait(req, side, deadline, cancel)
                .await;
        }
        let (_interest, notify, _) = Interest::new(&self.inner, &req.key.name, false);
        wait_loop(
            &notify,
            || self.inner.try_acquire(req, true),
            deadline,
            cancel,
        )
        .await
    }

    /// Gives back the lock if `req.attempt` holds it (a grant nobody received). There is no
    /// queue to leave: a waiter's registration ends with its `acquire_wait`, and a lock the
    /// waiting thread gets after the last waiter left is unlocked at once.
    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        check_key(&req.key)?;
        match rw::side_of(req.key.kind) {
            Some(side) => self.inner.rw_give_up(req, side),
            None => self.inner.give_up(req),
        }
        Ok(())
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        check_key(&grant.key)?;
        match rw::side_of(grant.key.kind) {
            Some(side) => self.inner.rw_release(grant, side),
            None => self.inner.release(grant),
        }
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(holds)
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        check_kind(kind)?;
        distlock_core::validate_name(name)?;
        if rw::side_of(kind).is_some() {
            return self.inner.rw_inspect(name);
        }
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

    async fn list(&self, prefix: &str) -> Result<Vec<distlock_core::ListedLock>> {
        ops::list(self, prefix).await
    }

    async fn force_release(
        &self,
        name: &str,
        kind: LockKind,
    ) -> Result<distlock_core::ForceReleased> {
        ops::force_release(&self.inner, name, kind)
    }

    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        Ok(ops::diagnose(&self.inner))
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

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;

    #[test]
    fn network_file_systems_are_refused() {
        for (magic, fs) in [
            (0x6969, "NFS"),
            (0x517B, "SMB"),
            (0xFF53_4D42, "CIFS"),
            (0xFE53_4D42, "SMB2"),
        ] {
            assert_eq!(network_fs(magic), Some(fs));
        }
        // ext4, tmpfs, btrfs, xfs, overlayfs, FUSE: not refused.
        for magic in [
            0xEF53,
            0x0102_1994,
            0x9123_683E,
            0x5846_5342,
            0x794C_7630,
            FUSE_MAGIC,
        ] {
            assert_eq!(network_fs(magic), None, "{magic:#x}");
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
