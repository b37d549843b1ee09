#![doc = include_str!("../README.md")]
//!
//! # This crate's API
//!
//! [`ZkBackend::connect`] opens the backend (most programs go through `distlock::connect`
//! instead); [`ZkBackend::builder`] ([`ZkBuilder`]) takes the digest credentials outside the
//! URL and [`NodeAcl`] says who may touch dlock's nodes; [`ZkBackend::from_connector`] opens
//! the backend's sessions with the application's own `zookeeper_client::Connector`
//! (re-exported as [`zookeeper_client`]); [`lock_dir`] and [`encode_segment`] name a lock's directory for operators and
//! tests; [`MIN_SESSION_TIMEOUT`] is the shortest session asked for by default.
#![warn(missing_docs)]

mod builder;
mod election;
mod grant;
mod layout;
mod node;
mod ops;
mod release;
mod session;
mod tls;
mod wait;

pub use builder::{ZkBuilder, ZkBuilderExt, ZkSettings, PASSWORD_ENV, PASSWORD_FILE_ENV, USER_ENV};
pub use distlock_core::conn::{TlsError, TlsErrorKind};
pub use layout::encode_segment;
/// The ZooKeeper driver this crate is built on, for [`ZkBackend::from_connector`].
pub use zookeeper_client;

use crate::layout::NodeKind;
use crate::session::{Inner, State};
use crate::wait::DirWatch;
use distlock_core::backend::{
    async_trait, AcquireReply, AcquireRequest, Capabilities, GrantRef, Granted, ReleaseWatch,
    RenewOutcome,
};
use distlock_core::conn;
use distlock_core::{Backend, ClientOptions, Error, LockInfo, LockKind, ReleaseOutcome, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The backend kind, as in messages and metrics.
pub(crate) const KIND: &str = "zookeeper";

/// Shortest session timeout the backend asks for by default (the watchdog lease when longer):
/// a session must outlast the window in which a deposed leader still answers its clients
/// (`syncLimit × tickTime`, 10 s on a default ensemble; docs/zookeeper.md, *What is still
/// assumed*). A holder that dies with a shorter lease keeps the lock this long;
/// `?session_timeout=` asks for less, knowingly.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Path of the directory that holds the lock nodes of `name` of `kind`, for a backend without
/// chroot using namespace `namespace` (`/<ns>/<name>`, `/<ns>/<name>/rw` for read-write locks,
/// `/<ns>-election/<name>` for elections: the path to give a Curator `LeaderLatch`).
/// Operators can list it with `zkCli.sh ls`.
pub fn lock_dir(namespace: &str, name: &str, kind: LockKind) -> Result<String> {
    let base = format!("/{}", encode_segment(namespace));
    Ok(layout::dir(&base, name, NodeKind::of(kind)?.family()))
}

/// Who may touch the nodes dlock creates (lock directories and lock nodes): `?acl=` in the
/// URL, or [`ZkBuilderExt::acl`]. Set when dlock creates a directory (an existing one keeps
/// its own); a lock node is deleted under its directory's ACL. See docs/zookeeper.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeAcl {
    /// `world:anyone:cdrwa` (the default): any client may read, queue on and delete the nodes
    /// (Curator and `zkCli.sh` without credentials). A protected chroot does not protect
    /// them: ZooKeeper never checks a node's ancestors' ACLs.
    #[default]
    Open,
    /// `auth::cdrwa` (CREATOR_ALL): only the same digest identity (or the superuser) may read,
    /// queue on, change or delete them; another gets `NoAuth` and cannot break or steal a
    /// hold. Needs credentials; Curator or `zkCli` on the same locks authenticate as that user.
    Creator,
}

impl NodeAcl {
    pub(crate) fn acls(self) -> zookeeper_client::Acls<'static> {
        match self {
            NodeAcl::Open => zookeeper_client::Acls::anyone_all(),
            NodeAcl::Creator => zookeeper_client::Acls::creator_all(),
        }
    }
}

/// The ZooKeeper backend. Build it with [`ZkBackend::connect`] (or through `distlock::connect`).
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

impl ZkBackend {
    /// Connects to the ensemble at `url` and opens a session: [`ZkBackend::builder`]`(url)`
    /// with `opts` (digest credentials from the URL, else [`USER_ENV`], [`PASSWORD_ENV`],
    /// [`PASSWORD_FILE_ENV`]).
    ///
    /// The session timeout is the URL's `session_timeout`, else the watchdog lease but at
    /// least [`MIN_SESSION_TIMEOUT`]: a holder or queued waiter that crashes frees the lock one
    /// session timeout after it fell silent. A negotiated timeout shorter than the watchdog
    /// lease is refused (renewals promise the core a whole lease); a longer one is logged and
    /// reported by `doctor` (docs/zookeeper.md, *Session = lease*).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that is not `zk://host:port[,…][/chroot][?…]` (or names
    /// the reserved `/zookeeper`, or an empty namespace); [`Error::Connection`] when no quorum
    /// answers within the connect timeout; [`Error::InvalidArgument`] for a negotiated session
    /// shorter than the watchdog lease; [`Error::Auth`] when the ensemble refuses the session.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future closes the session being opened (if any); nothing is
    /// created on the ensemble before the first lock is asked for.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        ZkBuilder::new(url).options(opts.clone()).connect().await
    }

    /// A builder for the ensemble at `url`: digest credentials outside the URL and the ACL of
    /// dlock's nodes (see [`ZkBuilder`]).
    pub fn builder(url: impl Into<String>) -> ZkBuilder {
        ZkBuilder::new(url)
    }

    /// The backend on the application's own [`Connector`](zookeeper_client::Connector): every
    /// session dlock opens is `connector.clone()` (with dlock's session timeout and
    /// `with_fail_eagerly`) connected to `cluster`, the driver's connect string
    /// `h1:2181,h2:2181[/chroot]` (`tcp+tls://h:p` over the connector's TLS), so it carries
    /// the application's `with_auth`, SASL and TLS settings. Locks live under
    /// `/<chroot>/<namespace>` as with [`connect`](Self::connect).
    ///
    /// Not a [`Client`](zookeeper_client::Client): dlock must own the sessions its locks live
    /// in, to drop one whose holds it declared lost (which deletes their nodes) and open a new
    /// one (docs/zookeeper.md, *Your own connector*). The application's sessions are never
    /// touched; dropping the backend (every clone) closes its session.
    ///
    /// ```no_run
    /// # async fn demo() -> distlock_core::Result<()> {
    /// use distlock_core::{Client, ClientOptions};
    /// use distlock_zookeeper::{zookeeper_client as zk, NodeAcl, ZkBackend};
    /// use std::sync::Arc;
    ///
    /// // The connector the application builds its own sessions with.
    /// let connector = zk::Client::connector().with_auth("digest", b"shop:s3cret");
    /// let opts = ClientOptions::default().namespace("locks");
    /// let cluster = "10.0.0.1:2181,10.0.0.2:2181/shop";
    /// let backend = ZkBackend::from_connector(connector, cluster, NodeAcl::Creator, &opts).await?;
    /// let locks = Client::new(Arc::new(backend), opts)?;
    /// let guard = locks.lock("nightly-report")?.acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect): [`Error::Connection`] when no quorum answers,
    /// [`Error::Auth`] when the ensemble refuses the session or the connector's identity may
    /// not read the backend's path, [`Error::InvalidArgument`] for an empty namespace or a
    /// session shorter than the watchdog lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`connect`](Self::connect).
    pub async fn from_connector(
        connector: zookeeper_client::Connector,
        cluster: &str,
        acl: NodeAcl,
        opts: &ClientOptions,
    ) -> Result<Self> {
        // The chroot starts at the first `/` after the last server's `scheme://`.
        let after = cluster.rfind("://").map_or(0, |i| i + 3);
        let (hosts, chroot) = match cluster[after..].find('/') {
            Some(i) => cluster.split_at(after + i),
            None => (cluster, ""),
        };
        if hosts.is_empty() {
            return Err(Error::invalid(
                "the connect string names no server; write host:port[,host:port…][/chroot]",
            ));
        }
        let u = builder::ZkUrl {
            hosts: hosts.to_owned(),
            acl: Some(acl),
            // The chroot's checks are the URL's.
            ..builder::parse(&format!("zk://localhost{chroot}"))?
        };
        Self::open(cluster, u, Some(connector), opts).await
    }

    pub(crate) async fn open(
        url: &str,
        u: builder::ZkUrl,
        connector: Option<zookeeper_client::Connector>,
        opts: &ClientOptions,
    ) -> Result<Self> {
        let namespace = u.namespace.as_deref().unwrap_or(opts.get_namespace());
        let base = format!("{}/{}", u.chroot, encode_segment(namespace));
        if namespace.is_empty() || base == "/zookeeper" {
            let why = match namespace {
                "" => "the namespace must not be empty",
                _ => "namespace `zookeeper` at the root is reserved by ZooKeeper; pick another or add a chroot",
            };
            return Err(Error::invalid_url(conn::redact(url), why));
        }
        let requested_timeout = u
            .session_timeout
            .unwrap_or_else(|| opts.get_watchdog_lease().max(MIN_SESSION_TIMEOUT));
        let tls = u.tls.as_ref().map(tls::Tls::load).transpose()?;
        let from_app = connector.is_some();
        let mut connector = connector.unwrap_or_else(zookeeper_client::Client::connector);
        if let (Some(user), Some(pw)) = (&u.user, &u.password) {
            let auth = format!("{user}:{}", pw.expose());
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        let identity = match (&u.user, from_app) {
            (Some(user), _) => session::Identity::Digest(user.clone()),
            (None, true) => session::Identity::Application,
            (None, false) => session::Identity::None,
        };
        let inner = Arc::new(Inner {
            connector,
            identity,
            acl: u.acl.unwrap_or_default(),
            endpoint: u.endpoint(),
            hosts: u.hosts,
            tls,
            base,
            requested_timeout,
            watchdog_lease: opts.get_watchdog_lease(),
            connect_timeout: opts.get_connect_timeout(),
            op_timeout: opts.get_op_timeout(),
            lost_grace: opts.renew_interval() + opts.get_op_timeout(),
            state: Mutex::new(State::default()),
            connecting: tokio::sync::Mutex::new(()),
            shutdown: CancellationToken::new(),
        });
        let sess = inner.session().await?;
        inner.probe_access(&sess).await?;
        Ok(ZkBackend { inner })
    }

    /// The negotiated timeout of the current session (`None` between sessions).
    pub fn session_timeout(&self) -> Option<Duration> {
        self.inner.current().map(|s| s.timeout)
    }

    /// The id of the current ZooKeeper session (`None` between sessions), as the server shows
    /// it (`ephemeralOwner` of our lock nodes).
    pub fn session_id(&self) -> Option<i64> {
        self.inner.current().map(|s| s.id)
    }

    /// The path under which this backend keeps its locks (`/<chroot>/<namespace>`).
    pub fn base_path(&self) -> &str {
        &self.inner.base
    }
}

#[async_trait]
impl Backend for ZkBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn endpoint(&self) -> String {
        self.inner.endpoint.clone()
    }

    /// Mutexes (`fair` is the same lock: the queue is first come, first served), read-write
    /// locks and elections (Curator's `LeaderLatch` recipe). No semaphores: a hold ends with
    /// its session, not with a lease, and for the same reason a fixed lease does not end a
    /// hold on the server.
    fn capabilities(&self) -> Capabilities {
        Capabilities::kinds(&[
            LockKind::Mutex,
            LockKind::Fair,
            LockKind::Read,
            LockKind::Write,
        ])
        .with(LockKind::Election)
        .lease_expiry(false)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireReply> {
        Ok(match self.inner.attempt(req, None).await? {
            Some(g) => AcquireReply::Granted { token: g.token },
            None => AcquireReply::Held { ttl: None },
        })
    }

    /// Wakes on every change of the lock's queue. There are no handoffs: a waiting attempt's
    /// own node gets the lock when the nodes before it go.
    async fn watch(&self, req: &AcquireRequest) -> Result<Box<dyn ReleaseWatch>> {
        let family = NodeKind::of(req.key.kind)?.family();
        DirWatch::open(&self.inner, &req.key.name, family, false).await
    }

    async fn give_up(&self, req: &AcquireRequest) -> Result<()> {
        self.inner.give_up(req).await
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        self.inner.acquire_wait(req, deadline, cancel).await
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.inner.release(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        self.inner.inspect(name, kind).await
    }

    /// Records the value and its proclamation number in the election directory's data, in a
    /// multi-op that checks the leader's node (see `docs/election-zk.md`): a retried or late
    /// proclamation finds its number reached already.
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.inner.proclaim(grant, seq, value).await
    }

    /// A child watch on the election's directory and a data watch on the directory itself.
    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        DirWatch::open(&self.inner, name, layout::Family::Election, true).await
    }

    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}
