//! The client: one per process (or per connection set), cheap to clone.

use crate::backend::{Backend, LockInfo, LockKind};
use crate::error::{Error, Result};
use crate::hold::{KeeperMsg, Shared};
use crate::lock::Lock;
use crate::options::ClientOptions;
use crate::semaphore::{MultiLock, Semaphore};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::{CancellationToken, DropGuard};

/// A connection to one lock service. Clones share the connection, the watchdog and the
/// owner-id space; build one per process and hand out clones.
///
/// ```no_run
/// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
/// let guard = client.lock("orders:42")?.acquire().await?;
/// println!("token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) shared: Arc<Shared>,
    pub(crate) keeper_tx: mpsc::UnboundedSender<KeeperMsg>,
    pub(crate) id: Arc<str>,
    next_handle: Arc<AtomicU64>,
    _stop: Arc<DropGuard>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.shared.backend.kind())
            .field("endpoint", &self.shared.backend.endpoint())
            .field("id", &self.id)
            .finish()
    }
}

impl Client {
    /// Wraps a connected backend. Must be called inside a tokio runtime: it starts the
    /// client's watchdog task.
    pub fn new(backend: Arc<dyn Backend>, opts: ClientOptions) -> Result<Client> {
        opts.validate()?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Runtime(
                "distlock::Client must be created inside a tokio runtime (or use distlock::blocking)"
                    .into(),
            )
        })?;
        let shared = Arc::new(Shared {
            timings: crate::hold::Timings::new(backend.kind()),
            backend,
            opts,
            holds: Mutex::new(crate::fasthash::FastMap::default()),
            wake: Notify::new(),
            attached: Notify::new(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        rt.spawn(crate::hold::keeper(shared.clone(), rx, stop.clone()));
        Ok(Client {
            shared,
            keeper_tx: tx,
            id: new_client_id().into(),
            next_handle: Arc::new(AtomicU64::new(1)),
            _stop: Arc::new(stop.drop_guard()),
        })
    }

    /// A handle on the reentrant mutex `name` with a fresh owner id (see [`Lock`]).
    /// Fails if the name is empty, longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or
    /// holds control characters.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        crate::name::validate_name(name)?;
        let owner = format!("{}:{}", self.id, self.next_seq());
        Ok(Lock::new(self.clone(), name, owner, LockKind::Mutex))
    }

    /// A handle on the read-write lock `name`: [`RwLock::read`] and [`RwLock::write`] share
    /// one owner id, so the writer may also take the read side (downgrade) without deadlock.
    /// Backends without read-write locks return [`Error::Unsupported`] on acquire.
    pub fn rw_lock(&self, name: &str) -> Result<RwLock> {
        let read = self.lock(name)?;
        let read = Lock::new(self.clone(), name, read.owner().to_owned(), LockKind::Read);
        let write = Lock::new(self.clone(), name, read.owner().to_owned(), LockKind::Write);
        Ok(RwLock { read, write })
    }

    /// A handle on the fair lock `name`: like [`Client::lock`], and first come first served
    /// across processes (a free lock goes to the oldest waiter). Backends without fair locks
    /// return [`Error::Unsupported`] on acquire.
    pub fn fair_lock(&self, name: &str) -> Result<Lock> {
        let lock = self.lock(name)?;
        Ok(Lock::new(
            self.clone(),
            name,
            lock.owner().to_owned(),
            LockKind::Fair,
        ))
    }

    /// A handle on the counting semaphore `name` with `permits` permits (the count is set on
    /// the server by the first user; change it with [`Semaphore::set_permits`]).
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        let lock = self.lock(name)?;
        Semaphore::new(self.clone(), name, lock.owner().to_owned(), permits)
    }

    /// A handle on the election `name`, as a candidate with a fresh owner id (see
    /// [`Election`](crate::Election)). Elections are apart from locks: `election("x")` and `lock("x")` never
    /// exclude each other. Backends without elections return [`Error::Unsupported`] on
    /// campaign.
    pub fn election(&self, name: &str) -> Result<crate::Election> {
        let lock = self.lock(name)?;
        Ok(crate::Election::new(Lock::new(
            self.clone(),
            name,
            lock.owner().to_owned(),
            LockKind::Election,
        )))
    }

    /// Several locks taken together, all or nothing, in a canonical order (sorted names) so
    /// that two clients taking overlapping sets in different orders never deadlock.
    pub fn multi_lock(&self, names: &[&str]) -> Result<MultiLock> {
        MultiLock::new(self, names)
    }

    /// What the server knows about the mutex `name` right now.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let info = client.inspect("orders:42").await?;
    /// for h in &info.holders {
    ///     println!("{} holds it, lease left {:?}", h.owner, h.lease_left);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// As [`Client::inspect_kind`].
    pub async fn inspect(&self, name: &str) -> Result<LockInfo> {
        self.inspect_kind(name, LockKind::Mutex).await
    }

    /// What the server knows about lock `name` of `kind` right now (for a read-write lock,
    /// ask for [`LockKind::Read`] or [`LockKind::Write`]; both report every holder).
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use distlock_core::LockKind;
    /// let readers = client.inspect_kind("catalog", LockKind::Read).await?;
    /// println!("{} holders, last token {}", readers.holders.len(), readers.fencing_token);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name; [`Error::Unsupported`] for a lock kind the
    /// backend lacks; [`Error::Connection`] if the server cannot be reached (after the client's
    /// retries); [`Error::UnexpectedReply`] for foreign data under the lock's key.
    pub async fn inspect_kind(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        crate::name::validate_name(name)?;
        self.shared.check_kind(kind)?;
        let backend = &self.shared.backend;
        crate::backoff::retry(self.shared.opts.retry, || backend.inspect(name, kind)).await
    }

    /// Every lock the server has state for whose name starts with `prefix` (see
    /// [`Operator::list`](crate::Operator::list)). Backends that cannot list return [`Error::Unsupported`].
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// for l in client.list("orders:").await? {
    ///     println!("{} ({}): {} holders", l.info.name, l.kind.as_str(), l.info.holders.len());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// [`Error::Unsupported`] if the backend cannot list; [`Error::Connection`] (after the
    /// client's retries); [`Error::UnexpectedReply`].
    pub async fn list(&self, prefix: &str) -> Result<Vec<crate::ListedLock>> {
        let op = self.operator(|c| c.can_list(), "listing locks")?;
        crate::backoff::retry(self.shared.opts.retry, || op.list(prefix)).await
    }

    /// Removes every holder of lock `name` of `kind` and advances its fencing counter past
    /// every token handed out (see [`Operator::force_release`](crate::Operator::force_release)): the operator's way out of a
    /// stuck lock. The removed holders learn it at their next renewal.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use distlock_core::LockKind;
    /// let out = client.force_release("orders:42", LockKind::Mutex).await?;
    /// println!("removed {} holders; tokens below {} are stale", out.removed.len(), out.fencing_token);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense that matters: if the future is dropped, the release may or
    /// may not have happened; call [`Client::inspect_kind`] to see.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad name; [`Error::Unsupported`] if the backend cannot
    /// (or lacks the kind); [`Error::Connection`] — not retried, since a retry after a lost
    /// reply would remove a holder that came after it: inspect, then decide.
    pub async fn force_release(&self, name: &str, kind: LockKind) -> Result<crate::ForceReleased> {
        crate::name::validate_name(name)?;
        self.shared.check_kind(kind)?;
        let op = self.operator(|c| c.can_force_release(), "forced release")?;
        // Not retried: a retry after a lost reply would remove a holder that came after it.
        op.force_release(name, kind).await
    }

    /// Checks the deployment behind this client for settings that break locks (see
    /// [`Operator::diagnose`](crate::Operator::diagnose)).
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// use distlock_core::Severity;
    /// for f in client.diagnose().await? {
    ///     if f.severity == Severity::Unsafe {
    ///         eprintln!("{}: {}", f.check, f.message);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// [`Error::Unsupported`] if the backend has no checks; [`Error::Connection`] if the
    /// server cannot be reached (a check that cannot be made is a finding, not an error).
    pub async fn diagnose(&self) -> Result<Vec<crate::Finding>> {
        self.operator(|c| c.can_diagnose(), "diagnosis")?
            .diagnose()
            .await
    }

    /// The lock service's clock now, or `None` when the backend has none to ask (see
    /// [`Operator::server_time`](crate::Operator::server_time)): what to measure schedules shared by several hosts by.
    ///
    /// ```no_run
    /// # async fn f(client: distlock_core::Client) -> distlock_core::Result<()> {
    /// let now = client.server_time().await?.unwrap_or_else(std::time::SystemTime::now);
    /// # let _ = now; Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    /// [`Error::Connection`] if the server cannot be reached (after the client's retries);
    /// [`Error::UnexpectedReply`].
    pub async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        match self.shared.backend.operator() {
            Some(op) => crate::backoff::retry(self.shared.opts.retry, || op.server_time()).await,
            None => Ok(None),
        }
    }

    /// The backend's operator commands, if its capabilities declare `what` (`can`) and it has
    /// them; else the standard [`Error::Unsupported`].
    fn operator(
        &self,
        can: impl FnOnce(&crate::backend::Capabilities) -> bool,
        what: &str,
    ) -> Result<&dyn crate::Operator> {
        let backend = &self.shared.backend;
        let caps = backend.capabilities();
        let op = backend.operator();
        caps.check_op(backend.kind(), can(&caps) && op.is_some(), what)?;
        op.ok_or_else(|| Error::unsupported(backend.kind(), what.to_owned()))
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// This client's id: the prefix of every default owner id it makes
    /// (`host:pid:random`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The backend kind, e.g. `redis`.
    pub fn backend_kind(&self) -> &'static str {
        self.shared.backend.kind()
    }

    /// Where the backend talks to (no credentials).
    pub fn endpoint(&self) -> String {
        self.shared.backend.endpoint()
    }

    /// The options this client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.shared.opts
    }

    /// The backend behind this client.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    /// Number of holds this client currently keeps alive (for tests and metrics).
    pub fn held_count(&self) -> usize {
        self.shared.holds().len()
    }
}

/// A read-write lock: many readers or one writer. See [`Client::rw_lock`].
#[derive(Clone, Debug)]
pub struct RwLock {
    read: Lock,
    write: Lock,
}

impl RwLock {
    /// The shared side.
    pub fn read(&self) -> Lock {
        self.read.clone()
    }

    /// The exclusive side.
    pub fn write(&self) -> Lock {
        self.write.clone()
    }

    /// Both sides with owner id `owner`.
    pub fn with_owner(self, owner: impl Into<String>) -> Result<RwLock> {
        let owner = owner.into();
        Ok(RwLock {
            read: self.read.with_owner(owner.clone())?,
            write: self.write.with_owner(owner)?,
        })
    }
}

/// `HOST:PID:RANDOM` (RANDOM: 8 hex digits); lock handles append `:SEQ`. The shape is read
/// back by [`HolderInfo::origin`](crate::HolderInfo::origin).
fn new_client_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!("{}:{}:{:08x}", host, std::process::id(), fastrand::u32(..))
}
