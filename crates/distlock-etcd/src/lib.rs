#![doc = include_str!("../README.md")]
//!
//! # This crate's API
//!
//! [`EtcdBackend::connect`] opens the backend (most programs go through `distlock::connect`
//! instead); [`EtcdBackend::queue_prefix`] and [`EtcdBackend::attempt_key`] name a lock's keys
//! for operators and tests; [`redact`] and [`percent_decode`] are the URL helpers it uses.
#![warn(missing_docs)]

mod acquire;
mod client;
mod error;
mod keys;
mod lease;
mod ops;
mod renew;
mod url;
mod wait;

pub use url::{percent_decode, redact};

use crate::error::KIND;
use crate::keys::Keys;
use crate::lease::{Doubt, Lease};
use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Capabilities, GrantRef, Granted,
    ReleaseWatch, RenewOutcome,
};
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
    /// For `diagnose`: how it connected (to reach each member on its own), and the
    /// client's watchdog lease (against etcd's minimum lease TTL).
    connect_opts: ConnectOptions,
    connect_timeout: Duration,
    watchdog_lease: Duration,
    /// Per attempt, the leases that a request with an unknown outcome may have attached to
    /// the attempt's key. Never revoked while the attempt goes on (its next request may find
    /// the key on one of them and use it); revoked when the attempt ends, so that a request
    /// still travelling cannot create the key after that (etcd refuses a put with a revoked
    /// lease).
    doubtful: Mutex<HashMap<AttemptId, Vec<Doubt>>>,
    /// Per granted attempt, the lease its key was last seen on (a hint for renewals; the read
    /// that goes with every renewal decides). Dropped when the attempt ends.
    leases: Mutex<HashMap<AttemptId, Lease>>,
}

impl EtcdBackend {
    /// Connects to the etcd cluster at `url` and checks that it answers (a linearizable read,
    /// so a cluster without a quorum fails here).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](distlock_core::Error::InvalidUrl) for a URL that is not `etcd://[user:password@]host:port[,…][/prefix]`
    /// (the password is redacted in the message); [`Error::Connection`](distlock_core::Error::Connection) when the cluster does
    /// not answer the linearizable probe within twice the connect timeout (down, or without a
    /// quorum or leader); [`Error::Auth`](distlock_core::Error::Auth) for a refused user or password.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the connection being opened; connecting writes
    /// nothing to the cluster.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        Self::open(url, opts).await
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
        self.keys(name).attempt(attempt)
    }

    /// The prefix of every queue key of lock `name` (`PREFIX/NAME/`). etcd's own
    /// `concurrency.Mutex` on the same prefix (`etcdctl lock PREFIX/NAME`) queues here too.
    pub fn queue_prefix(&self, name: &str) -> Vec<u8> {
        self.keys(name).queue
    }

    pub(crate) fn keys(&self, name: &str) -> Keys {
        Keys::new(&self.prefix, name)
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Mutexes, and `fair`, which is the same lock: etcd's recipe is first come, first served.
    fn capabilities(&self) -> Capabilities {
        Capabilities::kinds(&[LockKind::Mutex, LockKind::Fair])
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
        wait::acquire_wait(self, req, deadline, cancel).await
    }

    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        self.watch_queue(req).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.leave(req).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.release_grant(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.renew_holds(holds).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<distlock_core::ListedLock>> {
        ops::list(self, prefix).await
    }

    async fn force_release(
        &self,
        name: &str,
        _kind: LockKind,
    ) -> Result<distlock_core::ForceReleased> {
        ops::force_release(self, name).await
    }

    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        ops::diagnose(self).await
    }

    async fn inspect(&self, name: &str, _kind: LockKind) -> Result<LockInfo> {
        self.inspect_lock(name).await
    }
}
