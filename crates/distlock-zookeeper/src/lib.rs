//! ZooKeeper backend for dlock: Apache Curator's lock recipes on a real ensemble.
//!
//! URL: `zk://host:port[,host:port…][/chroot][?namespace=NS&session_timeout=DUR]`.
//!
//! # Recipes
//! - **Mutex** (Curator's `InterProcessMutex`): every acquisition attempt creates an
//!   *ephemeral sequential* node `/<chroot>/<ns>/<name>/_c_<attempt>-lock-<seq>` holding its
//!   owner id; the lowest sequence holds the lock; every other contender watches only its
//!   predecessor (no herd), and looks again when that node goes. An attempt that stops waiting
//!   (deadline, cancellation, give-up) deletes its node, so nothing is left behind. The queue is
//!   first come first served, so [`LockKind::Fair`] is the same recipe (and the same lock).
//!   The names follow Curator's, so dlock and Curator's `InterProcessMutex` on the same path
//!   exclude each other.
//! - **Read-write lock** (Curator's `InterProcessReadWriteLock`): `read-` and `write-` nodes in
//!   `/<ns>/<name>/rw`; a writer holds when its node is the lowest; a reader holds when no
//!   `write-` node precedes it, so readers overlap, wait only for earlier writers, and queue
//!   behind a waiting writer. A writer may also take the read side (the core names its write
//!   grant in the request): the read grant joins the writer's node (its attempt is listed in
//!   the node's data), and when the write side is released the node is marked as a reader's
//!   (a downgrade), so the readers behind it join while writers still wait. A reader asking
//!   for the write side is refused, since it would wait for itself.
//! - Semaphores are not supported: a hold here ends with its session, not with a lease.
//! - **No re-entry here**: the core counts re-entrant guards in the client; every acquisition
//!   attempt is its own node (two attempts of one owner are two contenders).
//! - The node name carries the attempt id (Curator's "protection" id), so a retried attempt —
//!   after a create whose answer was lost — finds its node again and gets the same fencing
//!   token instead of queueing a second node.
//!
//! # Fencing tokens
//! A grant's token is the **czxid** of its node: the zxid of the transaction that created it.
//! Zxids are totally ordered across the ensemble, survive leader changes (the high 32 bits are
//! the leader epoch, which only grows) and never repeat, and holders of one lock succeed each
//! other in node-creation order, so tokens strictly increase across grants, forever. See
//! `docs/zookeeper.md` for the argument.
//!
//! # Session = lease
//! Lock nodes are ephemeral: they live as long as the client's ZooKeeper session, which the
//! driver keeps alive with heartbeats. A crashed holder's lock frees itself when the server
//! expires its session. The core's renewals become checks, **through the leader** (a `sync`
//! before the read), that the session and the node are still there. A confirmed request
//! promises the core its lease from its send time; the session only promises its timeout from
//! there, so every lease must fit in the negotiated session timeout: [`ZkBackend::connect`]
//! refuses a session shorter than the watchdog lease, and a fixed lease or an extension longer
//! than the session is refused with [`Error::InvalidArgument`]. A fixed lease does not end a
//! lock on the server (it lasts as long as the session, or until released); the hold's lost
//! signal fires at its end. The lost signal of every hold of a session fires when the session
//! expires or is closed, and — before the server can expire it — when the connection has been
//! down for 2/5 of the session timeout. Then a new session is opened on the next call.
#![warn(missing_docs)]

mod error;
mod layout;
mod ops;
mod url;

pub use layout::encode_segment;

use crate::error::{map, session_gone, timed_out, KIND};
use crate::layout::{Child, Family, NodeData, NodeKind, Turn};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{
    async_trait, AcquireReply, AcquireRequest, AttemptId, Backend, ClientOptions, Error, GrantRef,
    Granted, HoldKey, HolderInfo, LockInfo, LockKind, LostReason, LostSignal, ReleaseOutcome,
    ReleaseWatch, RenewOutcome, Result, Wake,
};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

/// Shortest session timeout the backend asks for by default (the watchdog lease when longer).
/// The server may still negotiate it into its `[2, 20] × tickTime` range (4 s to 40 s by
/// default). Every lease must fit in the session, and a session must survive a leader
/// election and a collection pause: 10 s leaves room for both and for fixed leases of a few
/// seconds.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts to create a lock node (missing parents, lost replies) before giving up.
const CREATE_ATTEMPTS: usize = 4;

/// Attempts of a compare-and-set on a node's data (concurrent joins and releases of one
/// node) before giving up.
const DATA_ATTEMPTS: usize = 8;

/// Path of the directory that holds the lock nodes of `name` of `kind`, for a backend without
/// chroot using namespace `namespace` (`/<ns>/<name>`, `/<ns>/<name>/rw` for read-write locks).
/// Operators can list it with `zkCli.sh ls`.
pub fn lock_dir(namespace: &str, name: &str, kind: LockKind) -> Result<String> {
    let base = format!("/{}", encode_segment(namespace));
    Ok(layout::dir(&base, name, NodeKind::of(kind)?.family()))
}

/// The ZooKeeper backend. Build it with [`ZkBackend::connect`] (or through `distlock::connect`).
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: String,
    hosts: String,
    /// `/<chroot>/<ns>`.
    base: String,
    requested_timeout: Duration,
    /// The client's watchdog lease: every session must last at least this long.
    watchdog_lease: Duration,
    connect_timeout: Duration,
    op_timeout: Duration,
    /// How long after its node vanished a hold's lost signal fires if the watchdog has not
    /// fired it first (one renewal interval and one call).
    lost_grace: Duration,
    state: Mutex<State>,
    /// Serializes opening a new session.
    connecting: tokio::sync::Mutex<()>,
    shutdown: CancellationToken,
}

#[derive(Default)]
struct State {
    session: Option<Arc<Session>>,
    next_gen: u64,
    /// The live grants made through this backend, by attempt: what their node is, and the
    /// lost signal to fire when the node or the session goes.
    grants: HashMap<AttemptId, Grant>,
    /// Attempts that sent a create and hold no grant (waiting, or the outcome of the create is
    /// unknown): a retry of one looks for its node on the server before creating one.
    pending: HashSet<AttemptId>,
    /// Why the last session ended, for error messages.
    last_end: Option<String>,
}

/// One ZooKeeper session (the driver reconnects within it; a new one gets a new `gen`).
struct Session {
    zk: zk::Client,
    gen: u64,
    id: i64,
    timeout: Duration,
    /// Cancelled when dlock stops using the session (expired, closed, or cut off too long).
    ended: CancellationToken,
}

/// One grant: an attempt's node, or (`joined`) a read grant listed in its owner's write node.
#[derive(Clone)]
struct Grant {
    key: HoldKey,
    path: String,
    dir: String,
    /// What the node at `path` is (a joined read grant's node is a `write-` node).
    node: NodeKind,
    token: u64,
    gen: u64,
    lost: LostSignal,
    joined: bool,
    /// Our own release of it is under way: the node's deletion is no loss.
    releasing: bool,
    /// A delete was sent but its outcome is unknown: the node's deletion is no loss, and the
    /// release's retry that finds it gone reports it released.
    delete_sent: bool,
}

/// A node this backend created (or found again) for an attempt.
struct Created {
    dir: String,
    path: String,
    name: String,
    node: NodeKind,
    token: u64,
}

/// How a wait for one node's turn ended.
enum WaitEnd {
    /// Granted; no later than the server's confirmation of the grant.
    Granted(LeaseInstant),
    GaveUp,
}

/// What releasing a grant does to its node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role<'a> {
    /// The node is the grant's own: delete it (a `write-` node that readers joined is marked
    /// downgraded instead).
    Own,
    /// A read grant listed in a write node: take it off the list.
    Joined(&'a str),
}

fn token_of(stat: &zk::Stat) -> Option<u64> {
    u64::try_from(stat.czxid).ok().filter(|t| *t > 0)
}

fn anyone() -> zk::Acls<'static> {
    zk::Acls::anyone_all()
}

fn foreign_data(path: &str, data: &[u8]) -> Error {
    Error::UnexpectedReply {
        backend: KIND,
        message: format!(
            "lock node {path} holds `{}`, not dlock's data; is the directory used by another program?",
            String::from_utf8_lossy(data)
        ),
    }
}

impl ZkBackend {
    /// Connects to the ensemble at `url` and opens a session.
    ///
    /// The session timeout is `session_timeout` from the URL, or the client's watchdog lease
    /// but at least [`MIN_SESSION_TIMEOUT`]; the server may negotiate it into its own range
    /// (by default 2 to 20 ticks, i.e. 4 s to 40 s). A negotiated timeout shorter than the
    /// watchdog lease is refused ([`Error::InvalidArgument`]): renewals promise the core a
    /// whole lease, and the session would not keep that promise.
    pub async fn connect(url: &str, opts: &ClientOptions) -> Result<Self> {
        let u = url::parse(url)?;
        let namespace = u
            .namespace
            .clone()
            .unwrap_or_else(|| opts.get_namespace().to_owned());
        if namespace.is_empty() {
            return Err(Error::InvalidUrl {
                url: url.to_owned(),
                reason: "the namespace must not be empty".into(),
            });
        }
        let base = format!("{}/{}", u.chroot, encode_segment(&namespace));
        if base == "/zookeeper" {
            return Err(Error::InvalidUrl {
                url: url.to_owned(),
                reason: "namespace `zookeeper` at the root is reserved by ZooKeeper; pick another or add a chroot".into(),
            });
        }
        let requested_timeout = u
            .session_timeout
            .unwrap_or_else(|| opts.get_watchdog_lease().max(MIN_SESSION_TIMEOUT));
        let inner = Arc::new(Inner {
            endpoint: u.endpoint(),
            hosts: u.hosts,
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
        inner.session().await?;
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

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = st.session.take() {
            s.ended.cancel();
        }
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // The state is plain bookkeeping; a panic elsewhere mid-update leaves it usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn current(&self) -> Option<Arc<Session>> {
        self.state()
            .session
            .clone()
            .filter(|s| !s.ended.is_cancelled())
    }

    fn dir(&self, name: &str, family: Family) -> String {
        layout::dir(&self.base, name, family)
    }

    fn err(&self, what: &str, e: zk::Error) -> Error {
        map(&self.endpoint, what, e)
    }

    /// Runs one driver call with the per-call timeout. The outer error is the timeout (or a
    /// connection error); the inner result is the server's answer.
    async fn timed<T, E>(
        &self,
        what: &str,
        fut: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<std::result::Result<T, E>> {
        tokio::time::timeout(self.op_timeout, fut)
            .await
            .map_err(|_| timed_out(&self.endpoint, what, self.op_timeout))
    }

    /// Waits until the server we talk to has caught up with the leader: what we read next is
    /// at least as new as the leader's state when it processed the sync, and the sync only
    /// comes back if that server still follows a leader that still has our session.
    async fn sync(&self, sess: &Session, path: &str) -> Result<()> {
        match self
            .timed("syncing with the leader", sess.zk.sync(path))
            .await?
        {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(self.err("syncing with the leader", e)),
        }
    }

    /// The current session, opening a new one if the last one ended.
    async fn session(self: &Arc<Self>) -> Result<Arc<Session>> {
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let _one = self.connecting.lock().await;
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let connect = zk::Client::connector()
            .with_session_timeout(self.requested_timeout)
            .with_fail_eagerly()
            .connect(&self.hosts);
        let client = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.err("opening a session", e)),
            Err(_) => {
                return Err(timed_out(
                    &self.endpoint,
                    "opening a session (is a quorum of the ensemble up?)",
                    self.connect_timeout,
                ))
            }
        };
        let timeout = client.session_timeout();
        if timeout < self.watchdog_lease {
            // Renewals promise the core a whole watchdog lease from their send time; a session
            // the server may expire sooner would let a hold look alive after its node is gone.
            return Err(Error::invalid(format!(
                "the ZooKeeper ensemble at {} negotiated a session timeout of {timeout:?} \
                 (asked for {:?}), shorter than the watchdog lease {:?}: a lock would outlive \
                 its session in the holder's view; lower the client's watchdog_lease to at most \
                 {timeout:?}, or ask for a longer session (`session_timeout` in the URL) within \
                 the servers' maxSessionTimeout (default 20 × tickTime)",
                self.endpoint, self.requested_timeout, self.watchdog_lease
            )));
        }
        if timeout < self.requested_timeout {
            tracing::info!(requested = ?self.requested_timeout, negotiated = ?timeout,
                "the ZooKeeper server shortened the session timeout (its maxSessionTimeout)");
        }
        let watcher = client.state_watcher();
        let ended = CancellationToken::new();
        let session = {
            let mut st = self.state();
            let gen = st.next_gen;
            st.next_gen += 1;
            let s = Arc::new(Session {
                id: client.session_id().0,
                zk: client,
                gen,
                timeout,
                ended: ended.clone(),
            });
            st.session = Some(s.clone());
            s
        };
        tracing::debug!(
            session = format!("{:#x}", session.id),
            ?timeout,
            "ZooKeeper session opened"
        );
        tokio::spawn(monitor(
            Arc::downgrade(self),
            session.gen,
            watcher,
            timeout * 2 / 5,
            ended,
            self.shutdown.clone(),
        ));
        Ok(session)
    }

    /// A lease the core would measure from a request's send time must fit in the session:
    /// the server may expire the session (and delete the node) one session timeout after it
    /// last heard from us.
    fn check_lease(&self, sess: &Session, lease: Duration, what: &str) -> Result<()> {
        if lease > sess.timeout {
            return Err(Error::invalid(format!(
                "{what} of {lease:?} is longer than the ZooKeeper session timeout {:?}: the \
                 server may expire the session, and with it the lock, before the lease ends; \
                 use a lease of at most {:?}, or ask for a longer session (`session_timeout` \
                 in the URL, within the servers' maxSessionTimeout)",
                sess.timeout, sess.timeout
            )));
        }
        Ok(())
    }

    /// Stops using session `gen`: fires the lost signal of every hold it had.
    fn end_session(&self, gen: u64, reason: &str) {
        let signals: Vec<LostSignal> = {
            let mut st = self.state();
            if let Some(s) = st.session.as_ref().filter(|s| s.gen == gen) {
                s.ended.cancel();
                st.session = None;
                st.last_end = Some(reason.to_owned());
            }
            let mut fired = Vec::new();
            st.grants.retain(|_, g| {
                if g.gen == gen {
                    fired.push(g.lost.clone());
                    false
                } else {
                    true
                }
            });
            fired
        };
        if !signals.is_empty() {
            tracing::warn!(%reason, holds = signals.len(), "ZooKeeper session ended; its locks are lost");
        }
        for s in signals {
            s.fire(LostReason::SessionEnded(reason.to_owned()));
        }
    }

    /// Node `path` of session `gen` is gone: the grants on it are lost. The signal fires after
    /// a grace period, so that for watchdog holds the watchdog's next renewal reports it first.
    /// Not for a node we are deleting, or whose delete may have gone through before its answer
    /// was lost: that release's retry finds the node gone and reports it released.
    fn node_gone(&self, path: &str, gen: u64) {
        let signals: Vec<LostSignal> = {
            let mut st = self.state();
            let mut fired = Vec::new();
            st.grants.retain(|_, g| {
                if g.path == path && g.gen == gen && !g.releasing && !g.delete_sent {
                    fired.push(g.lost.clone());
                    false
                } else {
                    true
                }
            });
            fired
        };
        if signals.is_empty() {
            return;
        }
        tracing::warn!(%path, "lock node deleted behind its holder's back; the lock is lost");
        let grace = self.lost_grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            for s in signals {
                s.fire(LostReason::NotHeld);
            }
        });
    }

    /// True when this backend holds a read grant of `key`'s owner on `key`'s lock: a write
    /// attempt of that owner would queue behind its own reader and wait forever.
    fn owner_reads(&self, key: &HoldKey) -> bool {
        self.state().grants.values().any(|g| {
            g.key.kind == LockKind::Read && g.key.name == key.name && g.key.owner == key.owner
        })
    }

    /// The grant `grant` names, if this backend made it (attempt and token).
    fn local_grant(&self, grant: &GrantRef) -> Option<Grant> {
        self.state()
            .grants
            .get(&grant.attempt)
            .filter(|g| g.token == grant.token && g.key.kind == grant.key.kind)
            .cloned()
    }

    fn forget_grant(&self, attempt: &AttemptId) {
        self.state().grants.remove(attempt);
    }

    /// A retry of an attempt that already holds the lock: the same token, if its node is
    /// still there (checked after a sync, so against the leader's state).
    async fn regrant(
        &self,
        sess: &Session,
        req: &AcquireRequest,
    ) -> Result<Option<(u64, LeaseInstant)>> {
        let Some(g) = self
            .state()
            .grants
            .get(&req.attempt)
            .filter(|g| g.key.kind == req.key.kind)
            .cloned()
        else {
            return Ok(None);
        };
        if g.gen != sess.gen {
            // Its session ended (its lost signal fired): the attempt starts afresh.
            self.forget_grant(&req.attempt);
            return Ok(None);
        }
        let at = LeaseInstant::now();
        self.sync(sess, &g.path).await?;
        let read = self
            .timed("reading the lock node", sess.zk.get_data(&g.path))
            .await?;
        let still = match read {
            Ok((data, stat)) => {
                stat.ephemeral_owner == sess.id
                    && token_of(&stat) == Some(g.token)
                    && grant_in_data(&g, &req.attempt, &data)
            }
            Err(zk::Error::NoNode) => false,
            Err(e) => return Err(self.err("reading the lock node", e)),
        };
        if still {
            return Ok(Some((g.token, at)));
        }
        self.forget_grant(&req.attempt);
        self.node_gone(&g.path, g.gen);
        Ok(None)
    }

    /// The read side beside this owner's live write grant `wg` (a downgrade): the read grant
    /// is listed in the write node's data and shares its token. `None` if that write grant is
    /// not live here (the read side then queues like any reader).
    async fn join_write(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        req: &AcquireRequest,
        wg: &GrantRef,
    ) -> Result<Option<(u64, LeaseInstant)>> {
        let Some(w) = self
            .local_grant(wg)
            .filter(|w| w.gen == sess.gen && w.key.kind == LockKind::Write && !w.releasing)
        else {
            return Ok(None);
        };
        let at = LeaseInstant::now();
        self.sync(sess, &w.path).await?;
        for _ in 0..DATA_ATTEMPTS {
            let (data, stat) = match self
                .timed("reading the write node", sess.zk.get_data(&w.path))
                .await?
            {
                Ok(v) => v,
                Err(zk::Error::NoNode) => return Ok(None),
                Err(e) => return Err(self.err("reading the write node", e)),
            };
            if stat.ephemeral_owner != sess.id || token_of(&stat) != Some(w.token) {
                return Ok(None);
            }
            let mut nd = NodeData::parse(&data).ok_or_else(|| foreign_data(&w.path, &data))?;
            if nd.downgraded {
                // The write side was released: that grant is gone.
                return Ok(None);
            }
            let attempt = req.attempt.as_str();
            if !nd.readers.iter().any(|r| r == attempt) {
                nd.readers.push(attempt.to_owned());
                match self
                    .timed(
                        "joining the write node",
                        sess.zk.set_data(&w.path, &nd.encode(), Some(stat.version)),
                    )
                    .await?
                {
                    Ok(_) => {}
                    Err(zk::Error::BadVersion) => continue,
                    Err(zk::Error::NoNode) => return Ok(None),
                    Err(e) => return Err(self.err("joining the write node", e)),
                }
            }
            let grant = Grant {
                key: req.key.clone(),
                path: w.path.clone(),
                dir: w.dir.clone(),
                node: NodeKind::Write,
                token: w.token,
                gen: sess.gen,
                lost: req.lost.clone(),
                joined: true,
                releasing: false,
                delete_sent: false,
            };
            self.insert_grant(sess, req, grant)?;
            return Ok(Some((w.token, at)));
        }
        Err(busy(&self.endpoint, &w.path))
    }

    /// The node of attempt `req`: found again if an earlier request of the attempt sent a
    /// create (its answer may have been lost), created otherwise. Also returns a time no later
    /// than a request of ours that the leader processed after the node existed.
    async fn node_for(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        req: &AcquireRequest,
        kind: NodeKind,
    ) -> Result<(Created, LeaseInstant)> {
        let dir = self.dir(&req.key.name, kind.family());
        let prefix = layout::name_prefix(&req.attempt, kind);
        let sent_before = self.state().pending.contains(&req.attempt);
        if sent_before {
            let at = LeaseInstant::now();
            // After the sync we see every create of ours the leader applied, even one whose
            // answer was lost with the connection.
            self.sync(sess, &dir).await?;
            for name in self.list(sess, &dir).await? {
                if !name.starts_with(&prefix) {
                    continue;
                }
                let path = format!("{dir}/{name}");
                match self
                    .timed("reading the lock node", sess.zk.check_stat(&path))
                    .await?
                {
                    Ok(Some(st)) if st.ephemeral_owner == sess.id => {
                        if let Some(token) = token_of(&st) {
                            return Ok((
                                Created {
                                    dir,
                                    path,
                                    name,
                                    node: kind,
                                    token,
                                },
                                at,
                            ));
                        }
                    }
                    // This attempt's node of a session we stopped using (its holds were
                    // declared lost then): nobody relies on it, and it would block the queue
                    // until the server expires that session.
                    Ok(Some(_)) => self.remove_node(sess, &path).await,
                    Ok(None) => {}
                    Err(e) => return Err(self.err("reading the lock node", e)),
                }
            }
        }
        self.state().pending.insert(req.attempt.clone());
        let at = LeaseInstant::now();
        let node = self.create_node(sess, req, kind, &dir, &prefix).await?;
        Ok((node, at))
    }

    /// Creates the ephemeral sequential node `<dir>/<prefix><seq>` (and its parents when
    /// missing).
    async fn create_node(
        self: &Arc<Self>,
        sess: &Session,
        req: &AcquireRequest,
        kind: NodeKind,
        dir: &str,
        prefix: &str,
    ) -> Result<Created> {
        let mut made_dir = false;
        let data = NodeData::new(&req.key.owner).encode();
        for _ in 0..CREATE_ATTEMPTS {
            match self
                .create_detached(sess, &req.attempt, format!("{dir}/{prefix}"), data.clone())
                .await?
            {
                Ok((stat, seq)) => {
                    let name = format!("{prefix}{seq}");
                    let path = format!("{dir}/{name}");
                    let token = match token_of(&stat) {
                        Some(t) => t,
                        None => self.czxid(sess, &path).await?,
                    };
                    return Ok(Created {
                        dir: dir.to_owned(),
                        path,
                        name,
                        node: kind,
                        token,
                    });
                }
                Err(zk::Error::NoNode) if !made_dir => {
                    made_dir = true;
                    let opts = zk::CreateMode::Persistent.with_acls(anyone());
                    match self
                        .timed("creating the lock directory", sess.zk.mkdir(dir, &opts))
                        .await?
                    {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(self.err("creating the lock directory", e)),
                    }
                }
                Err(zk::Error::ConnectionLoss) => {
                    // The create may have happened: look for our attempt's node.
                    self.sync(sess, dir).await?;
                    if let Some(name) = self.find_child(sess, dir, prefix).await? {
                        let path = format!("{dir}/{name}");
                        let token = self.czxid(sess, &path).await?;
                        return Ok(Created {
                            dir: dir.to_owned(),
                            path,
                            name,
                            node: kind,
                            token,
                        });
                    }
                }
                Err(e) => return Err(self.err("creating the lock node", e)),
            }
        }
        Err(Error::Connection {
            backend: KIND,
            endpoint: self.endpoint.clone(),
            source: format!(
                "could not create a lock node in {dir} after {CREATE_ATTEMPTS} attempts"
            )
            .into(),
        })
    }

    /// Sends the create from a task of its own. If its answer comes after we stopped waiting
    /// for it, the node stays for the attempt's retry (which finds it by its name) or its
    /// give-up (which deletes it) — unless the attempt is no longer pending (given up, or its
    /// caller dropped), then the task deletes the node itself, so it is never left behind.
    async fn create_detached(
        self: &Arc<Self>,
        sess: &Session,
        attempt: &AttemptId,
        prefix: String,
        data: Vec<u8>,
    ) -> Result<std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let zk = sess.zk.clone();
        let inner = Arc::downgrade(self);
        let attempt = attempt.clone();
        tokio::spawn(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(anyone());
            let r = zk.create(&prefix, &data, &opts).await;
            let Err(late) = tx.send(r) else { return };
            let wanted = inner
                .upgrade()
                .is_some_and(|i| i.state().pending.contains(&attempt));
            if wanted {
                return;
            }
            match late {
                Ok((_, seq)) => {
                    let _ = zk.delete(&format!("{prefix}{seq}"), None).await;
                }
                Err(zk::Error::ConnectionLoss) => delete_by_prefix(&zk, &prefix).await,
                Err(_) => {}
            }
        });
        match tokio::time::timeout(self.op_timeout, rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(Error::Runtime(
                "the ZooKeeper create task ended unexpectedly".into(),
            )),
            Err(_) => Err(timed_out(
                &self.endpoint,
                "creating the lock node",
                self.op_timeout,
            )),
        }
    }

    async fn czxid(&self, sess: &Session, path: &str) -> Result<u64> {
        match self
            .timed("reading the lock node", sess.zk.check_stat(path))
            .await?
        {
            Ok(Some(st)) => token_of(&st).ok_or_else(|| Error::UnexpectedReply {
                backend: KIND,
                message: format!("node {path} has czxid {}", st.czxid),
            }),
            Ok(None) => Err(session_gone(
                &self.endpoint,
                "our lock node vanished right after its creation",
            )),
            Err(e) => Err(self.err("reading the lock node", e)),
        }
    }

    async fn find_child(&self, sess: &Session, dir: &str, prefix: &str) -> Result<Option<String>> {
        Ok(self
            .list(sess, dir)
            .await?
            .into_iter()
            .find(|c| c.starts_with(prefix)))
    }

    async fn list(&self, sess: &Session, dir: &str) -> Result<Vec<String>> {
        match self
            .timed("listing the lock queue", sess.zk.list_children(dir))
            .await?
        {
            Ok(c) => Ok(c),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.err("listing the lock queue", e)),
        }
    }

    /// Deletes a node we no longer want (a waiter that gives up, a try that found the lock
    /// held), retrying in the background if the connection is down; a node that cannot be
    /// deleted at all goes with its session.
    async fn remove_node(&self, sess: &Session, path: &str) {
        let zk = sess.zk.clone();
        let path = path.to_owned();
        let op_timeout = self.op_timeout;
        let task = tokio::spawn(async move {
            let mut backoff = distlock_core::backoff::Backoff::default();
            for _ in 0..5 {
                match tokio::time::timeout(op_timeout, zk.delete(&path, None)).await {
                    Ok(Ok(())) | Ok(Err(zk::Error::NoNode)) => return,
                    Ok(Err(zk::Error::SessionExpired | zk::Error::ClientClosed)) => return,
                    Ok(Err(e)) => {
                        tracing::debug!(%path, error = %e, "could not delete a lock node; retrying")
                    }
                    Err(_) => tracing::debug!(%path, "deleting a lock node timed out; retrying"),
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
            tracing::warn!(%path, "could not delete a lock node; it goes when its session ends");
        });
        // Wait for the first attempt in the normal case; the task goes on by itself.
        let _ = tokio::time::timeout(op_timeout, task).await;
    }

    /// Records the grant of `node` to `req`.
    fn register(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        node: &Created,
        req: &AcquireRequest,
    ) -> Result<()> {
        let grant = Grant {
            key: req.key.clone(),
            path: node.path.clone(),
            dir: node.dir.clone(),
            node: node.node,
            token: node.token,
            gen: sess.gen,
            lost: req.lost.clone(),
            joined: false,
            releasing: false,
            delete_sent: false,
        };
        self.insert_grant(sess, req, grant)
    }

    fn insert_grant(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        req: &AcquireRequest,
        grant: Grant,
    ) -> Result<()> {
        let path = grant.path.clone();
        {
            let mut st = self.state();
            if sess.ended.is_cancelled() || st.session.as_ref().is_none_or(|s| s.gen != sess.gen) {
                let why = st.last_end.clone().unwrap_or_else(|| "closed".into());
                return Err(session_gone(&self.endpoint, &why));
            }
            // One watch per node: a joined read grant shares its write node's.
            let watched = st
                .grants
                .values()
                .any(|g| g.path == path && g.gen == sess.gen);
            st.pending.remove(&req.attempt);
            st.grants.insert(req.attempt.clone(), grant);
            if watched {
                return Ok(());
            }
        }
        tokio::spawn(watch_node(
            Arc::downgrade(self),
            sess.gen,
            path,
            sess.ended.clone(),
        ));
        Ok(())
    }

    /// Where our node stands now. `via_leader`: sync first, so the answer is the leader's.
    async fn turn(&self, sess: &Session, node: &Created, via_leader: bool) -> Result<Turn> {
        let family = node.node.family();
        if via_leader {
            self.sync(sess, &node.dir).await?;
        }
        let children = self.list(sess, &node.dir).await?;
        let queue = layout::queue(&children, family);
        let head_downgraded = if layout::needs_head_check(&queue, &node.name) {
            match queue.first() {
                Some(head) => self.is_downgraded(sess, &node.dir, &head.name).await?,
                None => false,
            }
        } else {
            false
        };
        Ok(layout::turn(&queue, &node.name, head_downgraded))
    }

    /// Whether lock node `dir/name` belongs to a writer that downgraded to reading.
    async fn is_downgraded(&self, sess: &Session, dir: &str, name: &str) -> Result<bool> {
        let path = format!("{dir}/{name}");
        match self
            .timed("reading the head of the queue", sess.zk.get_data(&path))
            .await?
        {
            Ok((data, _)) => Ok(NodeData::parse(&data).is_some_and(|d| d.downgraded)),
            // Gone: the caller looks again when its watch fires.
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(self.err("reading the head of the queue", e)),
        }
    }

    /// Waits until `node` holds the lock, watching only the node it waits for.
    async fn wait_turn(
        &self,
        sess: &Session,
        node: &Created,
        confirmed_at: LeaseInstant,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<WaitEnd> {
        let mut at = confirmed_at;
        let mut via_leader = false;
        loop {
            if via_leader {
                at = LeaseInstant::now();
            }
            let pred = match self.turn(sess, node, via_leader).await? {
                Turn::Granted => return Ok(WaitEnd::Granted(at)),
                Turn::Gone => {
                    return Err(session_gone(
                        &self.endpoint,
                        "our waiting node vanished (deleted, or the session ended)",
                    ))
                }
                Turn::WaitFor(pred) => format!("{}/{pred}", node.dir),
            };
            // From now on the grant is decided by a watch event; look at the leader's state
            // then, so the grant's time is one the leader confirmed our session at.
            via_leader = true;
            let (stat, watcher) = match self
                .timed(
                    "watching the predecessor",
                    sess.zk.check_and_watch_stat(&pred),
                )
                .await?
            {
                Ok(v) => v,
                Err(e) => return Err(self.err("watching the predecessor", e)),
            };
            if stat.is_none() {
                continue;
            }
            tokio::select! {
                ev = watcher.changed() => {
                    if ev.event_type == zk::EventType::Session && ev.session_state.is_terminated() {
                        return Err(session_gone(&self.endpoint, &format!("{} while waiting", ev.session_state)));
                    }
                }
                _ = sess.ended.cancelled() => {
                    return Err(session_gone(&self.endpoint, "the session ended while waiting"));
                }
                _ = cancel.cancelled() => return Ok(WaitEnd::GaveUp),
                _ = until(deadline) => return Ok(WaitEnd::GaveUp),
            }
        }
    }

    /// One try at the lock: find or create this attempt's node, wait for its turn (or not),
    /// record the grant. On an error the node stays (the attempt's retry finds it again, its
    /// give-up deletes it).
    async fn attempt(
        self: &Arc<Self>,
        req: &AcquireRequest,
        wait: Option<(Option<Instant>, &CancellationToken)>,
    ) -> Result<Option<Granted>> {
        let kind = NodeKind::of(req.key.kind)?;
        layout::check_attempt(&req.attempt)?;
        if kind == NodeKind::Write && self.owner_reads(&req.key) {
            return Err(upgrade_refused(&req.key));
        }
        let sess = self.session().await?;
        self.check_lease(&sess, req.lease, "a lease")?;
        if let Some((token, at)) = self.regrant(&sess, req).await? {
            return Ok(Some(Granted {
                token,
                requested_at: at,
            }));
        }
        if let Some(wg) = req.write_grant.as_ref().filter(|_| kind == NodeKind::Read) {
            if let Some((token, at)) = self.join_write(&sess, req, wg).await? {
                return Ok(Some(Granted {
                    token,
                    requested_at: at,
                }));
            }
        }
        // If this future is dropped midway (a caller that gave up on it), the attempt gives up
        // in the background: its node must not stay in the queue. An error is no give-up: the
        // caller retries the attempt (which finds its node) or gives it up itself.
        let abandon = Abandon::new(self, req);
        let decided = async {
            let (node, confirmed_at) = self.node_for(&sess, req, kind).await?;
            let end = match wait {
                None => match self.turn(&sess, &node, false).await? {
                    Turn::Granted => WaitEnd::Granted(confirmed_at),
                    _ => WaitEnd::GaveUp,
                },
                Some((deadline, cancel)) => {
                    self.wait_turn(&sess, &node, confirmed_at, deadline, cancel)
                        .await?
                }
            };
            Ok::<_, Error>((node, end))
        }
        .await;
        abandon.disarm();
        let (node, end) = decided?;
        match end {
            WaitEnd::Granted(at) => {
                if let Err(e) = self.register(&sess, &node, req) {
                    self.drop_attempt_node(&sess, req, &node.path).await;
                    return Err(e);
                }
                Ok(Some(Granted {
                    token: node.token,
                    requested_at: at,
                }))
            }
            WaitEnd::GaveUp => {
                self.drop_attempt_node(&sess, req, &node.path).await;
                Ok(None)
            }
        }
    }

    /// The attempt is over without a grant: its node goes.
    async fn drop_attempt_node(&self, sess: &Session, req: &AcquireRequest, path: &str) {
        self.state().pending.remove(&req.attempt);
        self.remove_node(sess, path).await;
    }

    /// Deletes the node of a released grant and records its token as the lock's last one (the
    /// directory's data), in one atomic multi-op. Readers overlap, so a reader writes the
    /// maximum with a version check; a writer or mutex holder is alone and just writes its own.
    /// `version`: the node's data version the caller decided on (a `write-` node others may
    /// join), or `None` for any.
    async fn delete_recording_fence(
        &self,
        sess: &Session,
        g: &Grant,
        reads_only: bool,
        version: Option<i32>,
    ) -> Result<std::result::Result<(), zk::Error>> {
        for _ in 0..DATA_ATTEMPTS {
            let (fence, dir_version) = if reads_only {
                match self
                    .timed("reading the fencing record", sess.zk.get_data(&g.dir))
                    .await?
                {
                    Ok((data, stat)) => {
                        let stored = parse_fence(&data).unwrap_or(0);
                        (stored.max(g.token), Some(stat.version))
                    }
                    Err(zk::Error::NoNode) => (g.token, None),
                    Err(err) => return Ok(Err(err)),
                }
            } else {
                (g.token, None)
            };
            let mut w = sess.zk.new_multi_writer();
            let fence = fence.to_string();
            if let Err(err) = w.add_set_data(&g.dir, fence.as_bytes(), dir_version) {
                return Ok(Err(err));
            }
            if let Err(err) = w.add_delete(&g.path, version) {
                return Ok(Err(err));
            }
            match self.timed("releasing the lock node", w.commit()).await? {
                Ok(_) => return Ok(Ok(())),
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::BadVersion,
                }) => continue,
                Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NoNode,
                }) => break,
                Err(zk::MultiWriteError::OperationFailed { source, .. }) => return Ok(Err(source)),
                Err(zk::MultiWriteError::RequestFailed { source }) => return Ok(Err(source)),
            }
        }
        // Busy readers (or no directory data): delete without recording.
        self.timed("releasing the lock node", sess.zk.delete(&g.path, version))
            .await
    }

    /// Releases grant `g` (whose node is in session `sess`): deletes its node, or for a node
    /// others share, changes its data. `Ok(None)` when the grant was not there any more.
    async fn retire(
        &self,
        sess: &Session,
        g: &Grant,
        role: Role<'_>,
    ) -> Result<std::result::Result<Option<()>, zk::Error>> {
        if g.node == NodeKind::Lock {
            return Ok(
                match self.delete_recording_fence(sess, g, false, None).await? {
                    Ok(()) => Ok(Some(())),
                    Err(zk::Error::NoNode) => Ok(None),
                    Err(e) => Err(e),
                },
            );
        }
        for _ in 0..DATA_ATTEMPTS {
            let (data, stat) = match self
                .timed("reading the lock node", sess.zk.get_data(&g.path))
                .await?
            {
                Ok(v) => v,
                Err(zk::Error::NoNode) => return Ok(Ok(None)),
                Err(e) => return Ok(Err(e)),
            };
            if token_of(&stat) != Some(g.token) {
                return Ok(Ok(None));
            }
            let mut nd = NodeData::parse(&data).ok_or_else(|| foreign_data(&g.path, &data))?;
            let reads_only = g.node == NodeKind::Read || nd.downgraded;
            let change = match role {
                Role::Own if g.node == NodeKind::Write && nd.downgraded => return Ok(Ok(None)),
                // Readers joined the write side: the node stays theirs (a downgrade).
                Role::Own if g.node == NodeKind::Write && !nd.readers.is_empty() => {
                    nd.downgraded = true;
                    Some(nd)
                }
                Role::Own => None,
                Role::Joined(attempt) => {
                    let before = nd.readers.len();
                    nd.readers.retain(|r| r != attempt);
                    if nd.readers.len() == before {
                        return Ok(Ok(None));
                    }
                    // The last reader of a downgraded node: nobody holds it any more.
                    (!nd.downgraded || !nd.readers.is_empty()).then_some(nd)
                }
            };
            let r = match change {
                Some(nd) => self
                    .timed(
                        "updating the lock node",
                        sess.zk.set_data(&g.path, &nd.encode(), Some(stat.version)),
                    )
                    .await?
                    .map(|_| ()),
                None => {
                    self.delete_recording_fence(sess, g, reads_only, Some(stat.version))
                        .await?
                }
            };
            match r {
                Ok(()) => return Ok(Ok(Some(()))),
                Err(zk::Error::BadVersion) => continue,
                Err(zk::Error::NoNode) => return Ok(Ok(None)),
                Err(e) => return Ok(Err(e)),
            }
        }
        Err(busy(&self.endpoint, &g.path))
    }

    /// What a release of a grant that is not there says: `TakenByOther` if someone holds the
    /// lock now, `Expired` if nobody does (read at the leader's state).
    async fn absent(&self, sess: &Session, dir: &str, family: Family) -> Result<ReleaseOutcome> {
        self.sync(sess, dir).await?;
        let queue = layout::queue(&self.list(sess, dir).await?, family);
        Ok(if queue.is_empty() {
            ReleaseOutcome::Expired
        } else {
            ReleaseOutcome::TakenByOther
        })
    }

    /// Releases grant `grant`.
    async fn release(self: &Arc<Self>, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let kind = NodeKind::of(grant.key.kind)?;
        let family = kind.family();
        let dir = self.dir(&grant.key.name, family);
        let sess = self.session().await?;
        let local = {
            let mut st = self.state();
            match st
                .grants
                .get_mut(&grant.attempt)
                .filter(|g| g.token == grant.token && g.key.kind == grant.key.kind)
            {
                Some(g) if g.gen == sess.gen => {
                    // The watch on the node will see our own delete: not a loss.
                    g.releasing = true;
                    Some(g.clone())
                }
                _ => None,
            }
        };
        let Some(g) = local else {
            // Not a grant of this session: find it on the server by its address.
            self.forget_grant(&grant.attempt);
            return self.release_unknown(&sess, grant, kind, &dir).await;
        };
        let role = if g.joined {
            Role::Joined(grant.attempt.as_str())
        } else {
            Role::Own
        };
        match self.retire(&sess, &g, role).await {
            Ok(Ok(Some(()))) => {
                self.forget_grant(&grant.attempt);
                Ok(ReleaseOutcome::Released)
            }
            Ok(Ok(None)) => {
                self.forget_grant(&grant.attempt);
                if g.delete_sent {
                    // An earlier attempt whose answer was lost did delete it.
                    return Ok(ReleaseOutcome::Released);
                }
                self.absent(&sess, &dir, family).await
            }
            Ok(Err(e)) => {
                self.release_failed(&grant.attempt, matches!(e, zk::Error::ConnectionLoss));
                Err(self.err("releasing the lock node", e))
            }
            Err(e) => {
                self.release_failed(&grant.attempt, e.is_connection());
                Err(e)
            }
        }
    }

    /// A release that did not go through: the grant stays (the caller may retry).
    /// `maybe_sent`: the change may have reached the server anyway (a lost answer).
    fn release_failed(&self, attempt: &AttemptId, maybe_sent: bool) {
        if let Some(g) = self.state().grants.get_mut(attempt) {
            g.releasing = false;
            g.delete_sent |= maybe_sent;
        }
    }

    /// Releases a grant this backend has no record of (another session's, or one it already
    /// released): its node is the attempt's node with the grant's token.
    async fn release_unknown(
        &self,
        sess: &Session,
        grant: &GrantRef,
        kind: NodeKind,
        dir: &str,
    ) -> Result<ReleaseOutcome> {
        layout::check_attempt(&grant.attempt)?;
        let prefix = layout::name_prefix(&grant.attempt, kind);
        self.sync(sess, dir).await?;
        if let Some(name) = self.find_child(sess, dir, &prefix).await? {
            let path = format!("{dir}/{name}");
            // The attempt's node, but is it this grant? (A stale address names an older token.)
            match self
                .timed("reading the lock node", sess.zk.check_stat(&path))
                .await?
            {
                Ok(Some(st)) if token_of(&st) == Some(grant.token) => {}
                Ok(_) | Err(zk::Error::NoNode) => {
                    return self.absent(sess, dir, kind.family()).await
                }
                Err(e) => return Err(self.err("reading the lock node", e)),
            }
            let g = Grant {
                key: grant.key.clone(),
                path,
                dir: dir.to_owned(),
                node: kind,
                token: grant.token,
                gen: sess.gen,
                lost: LostSignal::new(),
                joined: false,
                releasing: true,
                delete_sent: false,
            };
            if let Some(()) = self
                .retire(sess, &g, Role::Own)
                .await?
                .map_err(|e| self.err("releasing the lock node", e))?
            {
                return Ok(ReleaseOutcome::Released);
            }
        }
        self.absent(sess, dir, kind.family()).await
    }

    /// Gives up attempt `req`: its grant (if it got one) is released, its waiting node (if it
    /// created one) deleted, and a read grant it joined to its owner's write node taken off.
    /// Nothing of another attempt is touched: every node name and list entry carries the
    /// attempt id.
    async fn give_up(self: &Arc<Self>, req: &AcquireRequest) -> Result<()> {
        let kind = NodeKind::of(req.key.kind)?;
        layout::check_attempt(&req.attempt)?;
        self.state().pending.remove(&req.attempt);
        let granted = self
            .state()
            .grants
            .get(&req.attempt)
            .map(|g| req.grant(g.token));
        if let Some(grant) = granted {
            self.release(&grant).await?;
        }
        let sess = self.session().await?;
        let dir = self.dir(&req.key.name, kind.family());
        let prefix = layout::name_prefix(&req.attempt, kind);
        // After the sync we see a create of this attempt whose answer was lost.
        self.sync(&sess, &dir).await?;
        for name in self.list(&sess, &dir).await? {
            if name.starts_with(&prefix) {
                match self
                    .timed(
                        "deleting a lock node",
                        sess.zk.delete(&format!("{dir}/{name}"), None),
                    )
                    .await?
                {
                    Ok(()) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(self.err("deleting a lock node", e)),
                }
            }
        }
        if let Some(wg) = req.write_grant.as_ref().filter(|_| kind == NodeKind::Read) {
            // A join whose answer was lost: this attempt may be listed in the write node.
            if let Some(w) = self.local_grant(wg).filter(|w| w.gen == sess.gen) {
                let g = Grant {
                    key: req.key.clone(),
                    joined: true,
                    releasing: true,
                    ..w
                };
                if let Err(e) = self
                    .retire(&sess, &g, Role::Joined(req.attempt.as_str()))
                    .await?
                {
                    return Err(self.err("leaving the write node", e));
                }
            }
        }
        Ok(())
    }

    /// Confirms many grants at once through the leader.
    async fn renew(self: &Arc<Self>, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        let mut out = vec![RenewOutcome::NotHeld; holds.len()];
        if holds.is_empty() {
            return Ok(out);
        }
        let sess = self.session().await?;
        for (_, lease) in holds {
            self.check_lease(&sess, *lease, "a renewal")?;
        }
        // Which items have a live grant of this session, and where.
        let mut wanted: Vec<(usize, Grant)> = Vec::new();
        for (i, (grant, _)) in holds.iter().enumerate() {
            match self.local_grant(grant) {
                // Being released right now: nothing to confirm, nothing lost.
                Some(g) if g.releasing => out[i] = RenewOutcome::Renewed,
                Some(g) if g.gen == sess.gen => wanted.push((i, g)),
                // A grant of a session that ended (its lost signal fired), or none of ours.
                _ => {}
            }
        }
        if wanted.is_empty() {
            return Ok(out);
        }
        let mut paths: Vec<&str> = wanted.iter().map(|(_, g)| g.path.as_str()).collect();
        paths.sort_unstable();
        paths.dedup();
        // The sync goes to the leader, and the read is answered only after it: a server cut
        // off from the leader (which may have expired our session already) cannot confirm.
        // Both are sent at once (the server answers a session's requests in order).
        let mut reader = sess.zk.new_multi_reader();
        for p in &paths {
            reader
                .add_get_data(p)
                .map_err(|e| self.err("renewing", e))?;
        }
        let sync = sess.zk.sync(paths[0]);
        let read = reader.commit();
        let (synced, results) =
            tokio::time::timeout(self.op_timeout, async { tokio::join!(sync, read) })
                .await
                .map_err(|_| {
                    timed_out(
                        &self.endpoint,
                        "renewing through the leader",
                        self.op_timeout,
                    )
                })?;
        match synced {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(self.err("syncing with the leader", e)),
        }
        let results = results.map_err(|e| self.err("renewing", e))?;
        if results.len() != paths.len() {
            return Err(Error::UnexpectedReply {
                backend: KIND,
                message: format!(
                    "renewal read {} nodes and got {} answers",
                    paths.len(),
                    results.len()
                ),
            });
        }
        let mut nodes: HashMap<&str, Option<(NodeData, zk::Stat)>> = HashMap::new();
        for (p, r) in paths.iter().zip(results) {
            let node = match r {
                zk::MultiReadResult::Data { data, stat } if stat.ephemeral_owner == sess.id => {
                    Some((
                        NodeData::parse(&data).ok_or_else(|| foreign_data(p, &data))?,
                        stat,
                    ))
                }
                zk::MultiReadResult::Data { .. } => None,
                zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => None,
                zk::MultiReadResult::Error { err } => return Err(self.err("renewing", err)),
                other => {
                    return Err(Error::UnexpectedReply {
                        backend: KIND,
                        message: format!("renewal: unexpected answer {other:?}"),
                    })
                }
            };
            if node.is_none() {
                self.node_gone(p, sess.gen);
            }
            nodes.insert(p, node);
        }
        for (i, g) in &wanted {
            let held = match nodes.get(g.path.as_str()) {
                Some(Some((nd, stat))) => {
                    token_of(stat) == Some(g.token)
                        && if g.joined {
                            nd.readers
                                .iter()
                                .any(|r| *r == holds[*i].0.attempt.as_str())
                        } else {
                            g.node != NodeKind::Write || !nd.downgraded
                        }
                }
                _ => false,
            };
            if held {
                out[*i] = RenewOutcome::Renewed;
            } else {
                self.forget_grant(&holds[*i].0.attempt);
            }
        }
        Ok(out)
    }
}

/// True when the node data `data` still lists grant `g` of attempt `attempt`.
fn grant_in_data(g: &Grant, attempt: &str, data: &[u8]) -> bool {
    match NodeData::parse(data) {
        Some(nd) if g.joined => nd.readers.iter().any(|r| r == attempt),
        Some(nd) => g.node != NodeKind::Write || !nd.downgraded,
        None => false,
    }
}

/// A compare-and-set on a node's data lost every race (readers joining and leaving it all the
/// time): retryable, like a busy connection.
fn busy(endpoint: &str, path: &str) -> Error {
    Error::Connection {
        backend: KIND,
        endpoint: endpoint.to_owned(),
        source: format!(
            "lock node {path} kept changing under {DATA_ATTEMPTS} compare-and-set attempts"
        )
        .into(),
    }
}

/// Gives the attempt up in the background if the future running it is dropped before it
/// decided (a caller that stopped waiting for it): nobody would retry it or give it up.
struct Abandon {
    inner: Weak<Inner>,
    req: Option<AcquireRequest>,
}

impl Abandon {
    fn new(inner: &Arc<Inner>, req: &AcquireRequest) -> Self {
        Abandon {
            inner: Arc::downgrade(inner),
            req: Some(req.clone()),
        }
    }

    fn disarm(mut self) {
        self.req = None;
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        let (Some(req), Some(inner)) = (self.req.take(), self.inner.upgrade()) else {
            return;
        };
        // No longer pending: a create answered from now on is deleted by its own task.
        inner.state().pending.remove(&req.attempt);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { give_up_soon(&inner, &req).await });
        }
    }
}

/// Gives attempt `req` up now, or — if the connection fails — in the background, retrying a
/// few times: its node must not stay in the queue while the session lives.
async fn give_up_soon(inner: &Arc<Inner>, req: &AcquireRequest) {
    if inner.give_up(req).await.is_ok() {
        return;
    }
    let (inner, req) = (inner.clone(), req.clone());
    tokio::spawn(async move {
        let mut backoff = distlock_core::backoff::Backoff::default();
        for _ in 0..5 {
            tokio::time::sleep(backoff.next_delay()).await;
            match inner.give_up(&req).await {
                Ok(()) => return,
                Err(e) => tracing::debug!(error = %e, "could not give up an attempt; retrying"),
            }
        }
        tracing::warn!(name = %req.key.name, "could not give up an attempt; its node goes with the session");
    });
}

fn upgrade_refused(key: &HoldKey) -> Error {
    Error::invalid(format!(
        "owner `{}` holds the read side of `{}` and asks for the write side: that could wait for \
         itself (or for another upgrading reader) forever; release the read side first \
         (a writer may take the read side, not the reverse)",
        key.owner, key.name
    ))
}

fn parse_fence(data: &[u8]) -> Option<u64> {
    if data.is_empty() {
        return Some(0);
    }
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Deletes the children of `prefix`'s directory whose names start with its last segment.
async fn delete_by_prefix(zk: &zk::Client, prefix: &str) {
    let Some((dir, name)) = prefix.rsplit_once('/') else {
        return;
    };
    for _ in 0..3 {
        match zk.list_children(dir).await {
            Ok(children) => {
                for c in children.iter().filter(|c| c.starts_with(name)) {
                    let _ = zk.delete(&format!("{dir}/{c}"), None).await;
                }
                return;
            }
            Err(zk::Error::ConnectionLoss) => continue,
            Err(_) => return,
        }
    }
}

/// Watches the session: fires every hold's lost signal when it expires or closes, or when the
/// connection has been down for `lost_after` (2/5 of the session timeout: the driver notices a
/// silent connection after 2/5, so the server cannot have expired the session before 4/5).
async fn monitor(
    inner: Weak<Inner>,
    gen: u64,
    mut watcher: zk::StateWatcher,
    lost_after: Duration,
    ended: CancellationToken,
    shutdown: CancellationToken,
) {
    let mut down_since: Option<Instant> = None;
    let reason = loop {
        let cutoff = down_since.map(|t| t + lost_after);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ended.cancelled() => return,
            state = watcher.changed() => match state {
                zk::SessionState::Disconnected => {
                    tracing::debug!("ZooKeeper connection lost; the driver reconnects");
                    down_since.get_or_insert_with(Instant::now);
                }
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    if let Some(t) = down_since.take() {
                        tracing::debug!(after = ?t.elapsed(), "ZooKeeper connection back");
                    }
                }
                zk::SessionState::Expired => break "the session expired".to_owned(),
                zk::SessionState::Closed => break "the session was closed".to_owned(),
                zk::SessionState::AuthFailed => break "authentication failed".to_owned(),
            },
            _ = until(cutoff), if cutoff.is_some() => {
                break format!(
                    "no connection to ZooKeeper for {lost_after:?} (2/5 of the session timeout); \
                     the server may expire the session at any moment"
                );
            }
        }
    };
    if let Some(inner) = inner.upgrade() {
        inner.end_session(gen, &reason);
    }
}

/// Watches one granted node: if it is deleted by anyone but us, its grants are lost.
async fn watch_node(inner: Weak<Inner>, gen: u64, path: String, ended: CancellationToken) {
    loop {
        let (zk, op_timeout) = {
            let Some(inner) = inner.upgrade() else { return };
            match inner.current().filter(|s| s.gen == gen) {
                Some(s) => (s.zk.clone(), inner.op_timeout),
                None => return,
            }
        };
        let armed = tokio::time::timeout(op_timeout, zk.check_and_watch_stat(&path)).await;
        // Hold no client while waiting: an abandoned session must be able to close.
        drop(zk);
        let watcher = match armed {
            Ok(Ok((Some(_), w))) => w,
            Ok(Ok((None, _))) => {
                if let Some(inner) = inner.upgrade() {
                    inner.node_gone(&path, gen);
                }
                return;
            }
            Ok(Err(_)) | Err(_) => {
                tokio::select! {
                    _ = ended.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                }
            }
        };
        tokio::select! {
            _ = ended.cancelled() => return,
            ev = watcher.changed() => match ev.event_type {
                zk::EventType::NodeDeleted => {
                    if let Some(inner) = inner.upgrade() {
                        inner.node_gone(&path, gen);
                    }
                    return;
                }
                zk::EventType::Session => return,
                // Data changes (a downgrade, a reader joining or leaving): watch on, unless
                // no grant of ours is on the node any more.
                _ => {
                    let Some(inner) = inner.upgrade() else { return };
                    if !inner.state().grants.values().any(|g| g.path == path && g.gen == gen) {
                        return;
                    }
                }
            },
        }
    }
}

/// Release notifications of one lock: a child watch on its directory, re-armed after each
/// event before returning, so no release after [`Backend::watch`] returned is missed.
struct ChildWatch {
    inner: Arc<Inner>,
    dir: String,
    armed: Option<(zk::OneshotWatcher, CancellationToken)>,
}

impl ChildWatch {
    async fn arm(&mut self) -> Result<()> {
        let sess = self.inner.session().await?;
        for _ in 0..2 {
            match self
                .inner
                .timed(
                    "watching the lock queue",
                    sess.zk.list_and_watch_children(&self.dir),
                )
                .await?
            {
                Ok((_, w)) => {
                    self.armed = Some((w, sess.ended.clone()));
                    return Ok(());
                }
                Err(zk::Error::NoNode) => {
                    let opts = zk::CreateMode::Persistent.with_acls(anyone());
                    match self
                        .inner
                        .timed(
                            "creating the lock directory",
                            sess.zk.mkdir(&self.dir, &opts),
                        )
                        .await?
                    {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(self.inner.err("creating the lock directory", e)),
                    }
                }
                Err(e) => return Err(self.inner.err("watching the lock queue", e)),
            }
        }
        Err(self.inner.err("watching the lock queue", zk::Error::NoNode))
    }
}

#[async_trait]
impl ReleaseWatch for ChildWatch {
    async fn changed(&mut self) -> Result<Wake> {
        if self.armed.is_none() {
            self.arm().await?;
        }
        let Some((watcher, ended)) = self.armed.take() else {
            return Err(session_gone(&self.inner.endpoint, "no watch"));
        };
        let ev = tokio::select! {
            ev = watcher.changed() => ev,
            _ = ended.cancelled() => return Err(session_gone(&self.inner.endpoint, "the session ended")),
        };
        if ev.event_type == zk::EventType::Session {
            return Err(session_gone(
                &self.inner.endpoint,
                &ev.session_state.to_string(),
            ));
        }
        self.arm().await?;
        Ok(Wake::Released)
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
        let mut w = ChildWatch {
            inner: self.inner.clone(),
            dir: self.inner.dir(&req.key.name, family),
            armed: None,
        };
        w.arm().await?;
        Ok(Box::new(w))
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
        let mut backoff = distlock_core::backoff::Backoff::default();
        let mut failed = false;
        loop {
            if cancel.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d) {
                if failed {
                    // The attempt's node (kept across the retries below) goes.
                    give_up_soon(&self.inner, req).await;
                }
                return Ok(None);
            }
            match self.inner.attempt(req, Some((deadline, cancel))).await {
                Ok(r) => return Ok(r),
                // Connection trouble or a lost session while waiting: keep waiting (bounded by
                // the deadline). The retry is the same attempt: it finds its node and keeps its
                // place in the queue if the session survived.
                Err(e) if e.is_retryable() => {
                    failed = true;
                    let pause = backoff.next_delay();
                    tracing::debug!(error = %e, ?pause, "waiting for a ZooKeeper lock failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = cancel.cancelled() => {}
                        _ = until(deadline) => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn release(&self, grant: &GrantRef) -> Result<ReleaseOutcome> {
        self.inner.release(grant).await
    }

    async fn renew(&self, holds: &[(GrantRef, Duration)]) -> Result<Vec<RenewOutcome>> {
        self.inner.renew(holds).await
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let inner = &self.inner;
        let family = NodeKind::of(kind)?.family();
        let dir = inner.dir(name, family);
        let sess = inner.session().await?;
        inner.sync(&sess, &dir).await?;
        let mut reader = sess.zk.new_multi_reader();
        reader
            .add_get_data(&dir)
            .and_then(|()| reader.add_get_children(&dir))
            .map_err(|e| inner.err("inspecting", e))?;
        let results = match inner.timed("inspecting", reader.commit()).await? {
            Ok(r) => r,
            Err(e) => return Err(inner.err("inspecting", e)),
        };
        let mut it = results.into_iter();
        let (fence_data, children) = match (it.next(), it.next()) {
            (
                Some(zk::MultiReadResult::Data { data, .. }),
                Some(zk::MultiReadResult::Children { children }),
            ) => (data, children),
            (
                Some(zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                }),
                _,
            ) => {
                return Ok(LockInfo {
                    name: name.to_owned(),
                    fencing_token: 0,
                    waiters: Some(0),
                    ..Default::default()
                })
            }
            (Some(zk::MultiReadResult::Error { err }), _) => {
                return Err(inner.err("inspecting", err))
            }
            other => {
                return Err(Error::UnexpectedReply {
                    backend: KIND,
                    message: format!("inspect: unexpected answer {other:?}"),
                })
            }
        };
        let mut fencing_token = parse_fence(&fence_data).ok_or_else(|| Error::UnexpectedReply {
            backend: KIND,
            message: format!(
                "the lock directory {dir} holds `{}`, not a fencing token; is it used by another program?",
                String::from_utf8_lossy(&fence_data)
            ),
        })?;
        let queue = layout::queue(&children, family);
        // The head's data tells a downgraded writer apart; read it with the holders' data.
        let head_is_writer = queue.first().is_some_and(|h| h.kind == NodeKind::Write);
        let candidates: Vec<&Child> = layout::holders(&queue, head_is_writer);
        let mut read = Vec::new();
        if !candidates.is_empty() {
            let mut reader = sess.zk.new_multi_reader();
            for h in &candidates {
                reader
                    .add_get_data(&format!("{dir}/{}", h.name))
                    .map_err(|e| inner.err("inspecting", e))?;
            }
            let results = match inner.timed("inspecting", reader.commit()).await? {
                Ok(r) => r,
                Err(e) => return Err(inner.err("inspecting", e)),
            };
            for (h, r) in candidates.iter().zip(results) {
                match r {
                    zk::MultiReadResult::Data { data, stat } => {
                        let nd = NodeData::parse(&data)
                            .ok_or_else(|| foreign_data(&format!("{dir}/{}", h.name), &data))?;
                        read.push((*h, nd, stat));
                    }
                    // Released between the two reads.
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    } => {}
                    zk::MultiReadResult::Error { err } => return Err(inner.err("inspecting", err)),
                    other => {
                        return Err(Error::UnexpectedReply {
                            backend: KIND,
                            message: format!("inspect: unexpected answer {other:?}"),
                        })
                    }
                }
            }
        }
        // A writer at the head that did not downgrade holds alone.
        if head_is_writer
            && read
                .first()
                .is_some_and(|(h, nd, _)| h.kind == NodeKind::Write && !nd.downgraded)
        {
            read.truncate(1);
        }
        let mut infos = Vec::new();
        for (h, nd, stat) in &read {
            if let Some(t) = token_of(stat) {
                fencing_token = fencing_token.max(t);
            }
            let side = match h.kind {
                NodeKind::Lock => None,
                NodeKind::Write if !nd.downgraded => Some(LockKind::Write),
                _ => Some(LockKind::Read),
            };
            // One grant per node (re-entry is counted by the holder's client).
            infos.push(HolderInfo {
                owner: nd.owner.clone(),
                count: 1,
                lease_left: None,
                side,
            });
        }
        let waiters = u32::try_from(queue.len().saturating_sub(infos.len())).unwrap_or(u32::MAX);
        Ok(LockInfo {
            name: name.to_owned(),
            holders: infos,
            fencing_token,
            waiters: Some(waiters),
            ..Default::default()
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
        ops::force_release(self, name, kind).await
    }

    async fn diagnose(&self) -> Result<Vec<distlock_core::Finding>> {
        ops::diagnose(self).await
    }
}
