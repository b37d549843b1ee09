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
mod error;
mod grant;
mod inspect;
mod layout;
mod node;
mod ops;
mod release;
mod renew;
mod session;
mod tls;
mod wait;

pub use builder::{ZkBuilder, ZkBuilderExt, ZkSettings, PASSWORD_ENV, PASSWORD_FILE_ENV, USER_ENV};
pub use distlock_core::conn::{TlsError, TlsErrorKind};
pub use layout::encode_segment;
/// The ZooKeeper driver this crate is built on, for [`ZkBackend::from_connector`].
pub use zookeeper_client;

use crate::error::KIND;
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

/// Shortest session timeout the backend asks for by default (the watchdog lease when longer).
/// A session must outlast the window in which a deposed leader still answers its clients
/// (`syncLimit × tickTime`, 10 s on a default ensemble: docs/zookeeper.md's *What is still
/// assumed*), and it is also the longest fixed lease or `extend` a client may ask for. The
/// price: a holder that dies with a shorter watchdog lease keeps the lock for this long, not
/// for its lease; `?session_timeout=` asks for less, knowingly.
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
/// URL, or [`ZkBuilderExt::acl`].
///
/// The ACL of a lock directory is set when dlock creates it; an existing directory keeps the
/// one it has (change it with `setAcl`). ZooKeeper checks a delete against the ACL of the
/// node's parent, so a lock node is protected by its directory's ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeAcl {
    /// `world:anyone:cdrwa` (the default): any client may read, queue on and delete the nodes —
    /// Curator's recipes and `zkCli.sh` work on them without credentials. A protected chroot
    /// does not protect them: ZooKeeper checks a node's own ACL (and its parent's, to create
    /// or delete it), never its ancestors', so a client that knows the path gets in.
    #[default]
    Open,
    /// `auth::cdrwa` (ZooKeeper's CREATOR_ALL): only sessions authenticated as the same digest
    /// identity (or the superuser) may read, queue on, change or delete them; another identity
    /// gets `NoAuth` and cannot break or steal a hold. Needs credentials. Curator (or `zkCli`)
    /// on the same locks must authenticate as the same user (`authorization("digest",
    /// "user:password")`, `addauth digest user:password`).
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
    /// with `opts`, so digest credentials come from the URL or, failing that, from
    /// [`USER_ENV`], [`PASSWORD_ENV`] and [`PASSWORD_FILE_ENV`].
    ///
    /// The session timeout is `session_timeout` from the URL, or else the client's watchdog
    /// lease but at least [`MIN_SESSION_TIMEOUT`]: the session is what a dead holder's lock
    /// nodes live on, so a holder (or a queued waiter) that crashes or is cut off frees the
    /// lock one session timeout after it fell silent. The server negotiates it into its own
    /// range (by default 2 to 20 ticks, i.e. 4 s to 40 s). A negotiated timeout shorter
    /// than the watchdog lease is refused ([`Error::InvalidArgument`]): renewals promise the
    /// core a whole lease, and the session would not keep that promise. A longer one (a lease
    /// below the servers' `minSessionTimeout`) is logged as a warning and reported by
    /// `doctor`: a dead holder then keeps the lock for the session timeout, not the lease.
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
    /// session dlock opens is `connector.clone()` connected to `cluster`, so it carries the
    /// application's authentication (`with_auth`, SASL) and TLS settings. `cluster` is the
    /// driver's connect string, `h1:2181,h2:2181[/chroot]` (`tcp+tls://h:p` for a server
    /// reached over the connector's TLS); locks live under `/<chroot>/<namespace>` as with
    /// [`connect`](Self::connect). dlock sets the
    /// session timeout (the watchdog lease, at least [`MIN_SESSION_TIMEOUT`]) and `with_fail_eagerly` on its clone. Nodes get [`NodeAcl::Open`] unless `acl` says
    /// otherwise.
    ///
    /// Why a connector and not a [`Client`](zookeeper_client::Client): a lock is held by a
    /// session, and dlock must own the sessions it holds locks in. It declares a session's
    /// holds lost after 2/5 of its timeout without a connection (before the server may expire
    /// it) and then drops it — closing it makes the server delete the nodes of holds it has
    /// just called lost — and opens a new one. On the application's shared client it could
    /// do neither: the nodes would stay, blocking every other holder, as long as the
    /// application's session lives, and an expired session cannot be reopened.
    ///
    /// So the backend's sessions are its own: they expire or close on their own (the locks in
    /// them are reported lost and the next call opens a new session), the application's
    /// sessions are never touched, and dropping the backend (every clone of it) closes its
    /// session, which deletes its nodes.
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
        // The chroot's checks are the URL's.
        let checked = builder::parse(&format!("zk://localhost{chroot}"))?;
        let u = builder::ZkUrl {
            hosts: hosts.to_owned(),
            chroot: checked.chroot,
            acl: Some(acl),
            ..Default::default()
        };
        Self::open(cluster, u, Some(connector), opts).await
    }

    pub(crate) async fn open(
        url: &str,
        u: builder::ZkUrl,
        connector: Option<zookeeper_client::Connector>,
        opts: &ClientOptions,
    ) -> Result<Self> {
        let namespace = u
            .namespace
            .clone()
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        if namespace.is_empty() {
            return Err(Error::invalid_url(
                conn::redact(url),
                "the namespace must not be empty",
            ));
        }
        let base = format!("{}/{}", u.chroot, encode_segment(&namespace));
        if base == "/zookeeper" {
            return Err(Error::invalid_url(
                conn::redact(url),
                "namespace `zookeeper` at the root is reserved by ZooKeeper; pick another or add a chroot",
            ));
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
        let dir = self.inner.dir(&req.key.name, family);
        Ok(Box::new(
            DirWatch::new(self.inner.clone(), dir, false).await?,
        ))
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
        match kind {
            LockKind::Election => self.inner.inspect_election(name).await,
            _ => self.inner.inspect(name, kind).await,
        }
    }

    /// Records the value and its proclamation number in the election directory's data, in a
    /// multi-op that checks the leader's node (see `docs/election-zk.md`): a retried or late
    /// proclamation finds its number reached already.
    async fn proclaim(&self, grant: &GrantRef, seq: u64, value: &str) -> Result<RenewOutcome> {
        self.inner.proclaim(grant, seq, value).await
    }

    /// A child watch on the election's directory and a data watch on the directory itself.
    async fn observe(&self, name: &str) -> Result<Box<dyn ReleaseWatch>> {
        let dir = self.inner.dir(name, layout::Family::Election);
        Ok(Box::new(
            DirWatch::new(self.inner.clone(), dir, true).await?,
        ))
    }

    fn operator(&self) -> Option<&dyn distlock_core::Operator> {
        Some(self)
    }
}
