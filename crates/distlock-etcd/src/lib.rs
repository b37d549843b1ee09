#![doc = include_str!("../README.md")]
//!
//! # This crate's API
//!
//! [`EtcdBackend::connect`] opens the backend (most programs go through `distlock::connect`
//! instead); [`EtcdBackend::builder`] ([`EtcdBuilder`]) takes the password, the CA and the
//! client certificate outside the URL; [`EtcdBackend::from_client`] runs on an
//! `etcd_client::Client` the application already has. A TLS failure is an
//! [`Error::Connection`](distlock_core::Error::Connection) whose source is the core's [`TlsError`] (re-exported here).
//! [`EtcdBackend::queue_prefix`] and [`EtcdBackend::attempt_key`] name a lock's keys
//! for operators and tests; [`percent_decode`] decodes a URL's prefix.
#![warn(missing_docs)]

mod acquire;
mod builder;
mod client;
mod doctor;
mod election;
mod error;
mod kv;
mod lease;
mod ops;
mod renew;
mod tls;
mod wait;

pub use builder::{
    percent_decode, EtcdBuilder, EtcdSettings, PASSWORD_ENV, PASSWORD_FILE_ENV, USER_ENV,
};
pub use tls::{TlsError, TlsErrorKind};

use crate::error::KIND;
use crate::kv::{Keys, Slot};
use crate::lease::{Doubt, Lease};
use crate::wait::Waiter;
use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Capabilities, Deadline, GrantRef,
    Granted, HoldKey, ReleaseWatch, RenewOutcome,
};
use distlock_core::backoff::RetryPolicy;
use distlock_core::{Backend, ClientOptions, LockInfo, LockKind, ReleaseOutcome, Result};
use etcd_client::{Client, ConnectOptions};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The etcd backend. Build it with [`EtcdBackend::connect`] (or through `distlock::connect`).
pub struct EtcdBackend {
    client: Client,
    endpoint: String,
    prefix: String,
    op_timeout: Duration,
    /// For `diagnose`: how it connected (to reach each member on its own; `None` for an
    /// application's client without them), and the client's watchdog lease (against etcd's
    /// minimum lease TTL).
    connect_opts: Option<ConnectOptions>,
    connect_timeout: Duration,
    watchdog_lease: Duration,
    /// Per attempt, the leases a request with an unknown outcome may have attached to the
    /// attempt's key: revoked when the attempt ends, never before ([`EtcdBackend::doubt`]).
    doubtful: Mutex<HashMap<AttemptId, Vec<Doubt>>>,
    /// Per granted attempt, the lease its key was last seen on (a hint for renewals; the read
    /// that goes with every renewal decides). Dropped when the attempt ends.
    leases: Mutex<HashMap<AttemptId, Lease>>,
    /// How the connection is protected (`doctor`'s `tls` check).
    transport: distlock_core::Finding,
    /// Fires when the backend is dropped: background revokes of ended attempts' leases stop.
    closed: CancellationToken,
    _closing: tokio_util::sync::DropGuard,
}

impl EtcdBackend {
    /// Connects to the etcd cluster at `url` and checks that it answers (a linearizable read,
    /// so a cluster without a quorum fails here). `etcds://` connects with TLS. A user without
    /// a password in the URL, or no user, is completed from the environment as
    /// [`EtcdBuilder`] describes (`DLOCK_ETCD_USER`, `DLOCK_ETCD_PASSWORD`,
    /// `DLOCK_ETCD_PASSWORD_FILE`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) for a URL that is not
    /// `etcd[s]://[user[:password]@]host:port[,…][/prefix][?cacert=…&cert=…&key=…]` (the
    /// password is redacted in the message); [`Error::InvalidArgument`](distlock_core::Error::InvalidArgument)
    /// for a user without a password (or the other way round) or a TLS or password file that
    /// cannot be read; [`Error::Connection`](distlock_core::Error::Connection) when the
    /// cluster does not answer the linearizable probe within twice the connect timeout (down,
    /// or without a quorum or leader), or when TLS fails — its source is then a [`TlsError`]
    /// ([`TlsErrorKind`]: the server's certificate is not trusted, the server requires or
    /// refused a client certificate, the member does not speak TLS, …);
    /// [`Error::Auth`](distlock_core::Error::Auth) for a refused user or password.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the connection being opened; connecting writes
    /// nothing to the cluster.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        EtcdBuilder::new(url).options(opts.clone()).connect().await
    }

    /// A builder for the cluster at `url`: credentials, CA and client certificate outside
    /// the URL (see [`EtcdBuilder`]).
    pub fn builder(url: impl Into<String>) -> EtcdBuilder {
        EtcdBuilder::new(url)
    }

    /// The backend on an `etcd_client::Client` the application already has (its TLS, its
    /// authentication), after a linearizable read got through. Keys live under
    /// `opts.get_namespace()` (`dlock` by default), as with `etcd://…` without a prefix.
    ///
    /// The client must stay usable for the backend's whole life (sharing it is fine), be built
    /// with [`ConnectOptions::with_require_leader`]`(true)` and HTTP/2 keep-alives at most every
    /// 5 s, and not be namespaced; docs/etcd.md, *Bring your own client*, says why, and when
    /// `doctor` needs [`with_member_options`](Self::with_member_options).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use distlock_core::{Client, ClientOptions};
    /// use distlock_etcd::EtcdBackend;
    /// use etcd_client::ConnectOptions;
    /// use std::{sync::Arc, time::Duration};
    ///
    /// let co = ConnectOptions::new()
    ///     .with_require_leader(true)
    ///     .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
    ///     .with_user("shop", "s3cret");
    /// let etcd = etcd_client::Client::connect(["http://10.0.0.1:2379"], Some(co.clone())).await?;
    /// // … the application uses `etcd` (a clone) for its own keys …
    /// let opts = ClientOptions::default().namespace("shop/locks");
    /// let backend = EtcdBackend::from_client(etcd.clone(), &opts)
    ///     .await?
    ///     .with_member_options(co);
    /// let locks = Client::new(Arc::new(backend), opts)?;
    /// let guard = locks.lock("nightly-report")?.acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Connection`](distlock_core::Error::Connection) when the cluster does not answer
    /// the probe within twice the connect timeout; [`Error::Auth`](distlock_core::Error::Auth)
    /// when it refuses the client's credentials.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the probe is a read.
    pub async fn from_client(client: Client, opts: &ClientOptions) -> Result<Self> {
        let endpoint = "etcd (the application's client)".to_owned();
        Self::new(client, endpoint, None, opts)
            .probed(None, &[])
            .await
    }

    /// The connect options `doctor` uses to reach each member on its own (for a backend made
    /// by [`from_client`](Self::from_client): those its client was built with).
    pub fn with_member_options(mut self, options: ConnectOptions) -> Self {
        self.connect_opts = Some(options);
        self
    }

    /// The key prefix every key of this backend starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The underlying etcd client (e.g. for tests that break locks behind a holder's back).
    pub fn etcd_client(&self) -> &Client {
        &self.client
    }

    /// The key of attempt `attempt` in the queue of lock `name` (`PREFIX/NAME/ATTEMPT`,
    /// escaped): where that attempt waits and, once first, holds the lock.
    pub fn attempt_key(&self, name: &str, attempt: &str) -> Vec<u8> {
        Keys::new(&self.prefix, name).attempt(attempt)
    }

    /// The prefix of every queue key of lock `name` (`PREFIX/NAME/`). etcd's own
    /// `concurrency.Mutex` on the same prefix (`etcdctl lock PREFIX/NAME`) queues here too.
    pub fn queue_prefix(&self, name: &str) -> Vec<u8> {
        lock_queue_prefix(&self.prefix, name)
    }

    /// The keys of attempt `attempt` of the lock or election `key` names.
    pub(crate) fn slot(&self, key: &HoldKey, attempt: &AttemptId) -> Slot {
        Keys::of_kind(&self.prefix, &key.name, key.kind).slot(attempt)
    }

    /// The prefix every candidate key of election `name` sits under
    /// (`PREFIX-election/NAME/`): etcd's `concurrency.Election` on `PREFIX-election/NAME`
    /// (`etcdctl elect dlock-election/NAME`) campaigns here too.
    pub fn election_prefix(&self, name: &str) -> Vec<u8> {
        Keys::of_kind(&self.prefix, name, LockKind::Election).queue
    }
}

/// The prefix of every queue key of lock `name` (`PREFIX/NAME/`, escaped) for a backend whose
/// key prefix is `prefix` (the URL's path, else the client's namespace, `dlock` by default):
/// what [`EtcdBackend::queue_prefix`] returns, without a backend (distlock-fence finds a
/// holder's key under it).
pub fn lock_queue_prefix(prefix: &str, name: &str) -> Vec<u8> {
    Keys::new(prefix, name).queue
}

#[async_trait]
impl Backend for EtcdBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Mutexes, and `fair`, which is the same lock: etcd's recipe is first come, first served;
    /// and elections, on the layout of etcd's `concurrency.Election`.
    fn capabilities(&self) -> Capabilities {
        Capabilities::kinds(&[LockKind::Mutex, LockKind::Fair, LockKind::Election])
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        self.acquire_once(req).await
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let (deadline, retry) = (Deadline::from(deadline), RetryPolicy::default());
        let waiter = &mut Waiter::new(self, req);
        distlock_core::backend::wait::run(waiter, deadline, cancel, retry).await
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let queue = Keys::of_kind(&self.prefix, &req.key.name, req.key.kind).queue;
        self.watch_prefix(queue, false).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.leave(req, None).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.release_grant(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.renew_holds(holds).await
    }

    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let keys = Keys::of_kind(&self.prefix, name, kind);
        let queue = self.queue_state(&keys, "inspect").await?;
        self.lock_info(&keys, name, queue).await
    }

    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.proclaim_value(grant, seq, value).await
    }

    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        self.watch_prefix(self.election_prefix(name), true).await
    }
}
