//! ZooKeeper backend for dlock: Apache Curator's lock recipes on a real ensemble.
//!
//! URL: `zk://host:port[,host:port…][/chroot][?namespace=NS&session_timeout=DUR]`.
//!
//! # Recipes
//! - **Mutex** (Curator's `InterProcessMutex`): every contender creates an *ephemeral
//!   sequential* node `/<chroot>/<ns>/<name>/_c_<id>-lock-<seq>` holding its owner id; the
//!   lowest sequence holds the lock; every other contender watches only its predecessor (no
//!   herd), and looks again when that node goes. A contender that stops waiting (deadline,
//!   cancellation) deletes its node, so nothing is left behind. The queue is first come first
//!   served, so [`LockKind::Fair`] is the same recipe (and the same lock).
//! - **Read-write lock** (Curator's `InterProcessReadWriteLock`): `read-` and `write-` nodes in
//!   `/<ns>/<name>/rw`; a writer holds when its node is the lowest; a reader holds when no
//!   `write-` node precedes it, so readers overlap, wait only for earlier writers, and queue
//!   behind a waiting writer. The writer may also take the read side, and keep reading after it
//!   lets the write side go (a downgrade: its node is marked as a reader's, so the readers
//!   behind it join while writers still wait); a reader asking for the write side is refused,
//!   since it would wait for itself.
//! - Semaphores are not supported: a hold here ends with its session, not with a lease.
//! - **Re-entry** is counted in this backend per (name, owner): the node is created once and
//!   every re-entry returns the same fencing token.
//! - The node names carry a random id (Curator's "protection"), so a create whose reply was
//!   lost with the connection is found again instead of leaking a node.
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
//! expires its session (after the session timeout, default the watchdog lease but at least
//! [`MIN_SESSION_TIMEOUT`]). The core's renewals become checks that the session and the node
//! are still there ([`RenewOutcome::NotHeld`] once the node is gone). Fixed leases do not end
//! a lock on the server: it lasts as long as the session (or until released). The lost signal
//! of every hold of a session fires when the session expires or is closed, and — before the
//! server can expire it — when the connection has been down for 2/5 of the session timeout.
//! Then a new session is opened on the next call.
#![warn(missing_docs)]

mod error;
mod layout;
mod url;

pub use layout::encode_segment;

use crate::error::{map, session_gone, timed_out, KIND};
use crate::layout::{Child, Family, NodeKind, Turn};
use dlock_core::{
    async_trait, AcquireReply, AcquireRequest, Backend, ClientOptions, Error, Granted, HoldKey,
    HolderInfo, LockInfo, LockKind, LostReason, LostSignal, ReleaseOutcome, ReleaseWatch,
    RenewOutcome, Result, Wake,
};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

/// Shortest session timeout the backend asks for by default (the watchdog lease when longer).
/// The server may still negotiate it into its `[2, 20] × tickTime` range.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(4);

/// Attempts to create a lock node (missing parents, lost replies) before giving up.
const CREATE_ATTEMPTS: usize = 4;

/// Path of the directory that holds the lock nodes of `name` of `kind`, for a backend without
/// chroot using namespace `namespace` (`/<ns>/<name>`, `/<ns>/<name>/rw` for read-write locks).
/// Operators can list it with `zkCli.sh ls`.
pub fn lock_dir(namespace: &str, name: &str, kind: LockKind) -> Result<String> {
    let base = format!("/{}", encode_segment(namespace));
    Ok(layout::dir(&base, name, NodeKind::of(kind)?.family()))
}

/// The ZooKeeper backend. Build it with [`ZkBackend::connect`] (or through `dlock::connect`).
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
    connect_timeout: Duration,
    op_timeout: Duration,
    /// How long after its node vanished a hold's lost signal fires if the watchdog has not
    /// fired it first (one renewal interval and one call).
    lost_grace: Duration,
    state: Mutex<State>,
    /// Serializes opening a new session.
    connecting: tokio::sync::Mutex<()>,
    /// Bumped on every new grant, so that a waiting owner notices that another task of the
    /// same owner got the lock (and re-enters instead of waiting for itself).
    grants: watch::Sender<u64>,
    shutdown: CancellationToken,
}

#[derive(Default)]
struct State {
    session: Option<Arc<Session>>,
    next_gen: u64,
    entries: HashMap<EntryKey, Entry>,
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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EntryKey {
    name: Arc<str>,
    owner: Arc<str>,
    family: Family,
}

impl EntryKey {
    fn of(key: &HoldKey) -> Result<(EntryKey, NodeKind)> {
        let kind = NodeKind::of(key.kind)?;
        Ok((
            EntryKey {
                name: key.name.clone(),
                owner: key.owner.clone(),
                family: kind.family(),
            },
            kind,
        ))
    }
}

/// One owner's node for one lock family, and its re-entrant holds.
struct Entry {
    path: String,
    dir: String,
    node: NodeKind,
    token: u64,
    gen: u64,
    /// Holds per requested kind: `[mutex, fair, read, write]`.
    counts: [u32; 4],
    signals: Vec<(LockKind, LostSignal)>,
    /// A delete of the node was sent but its outcome is unknown.
    delete_sent: bool,
    /// A `write-` node whose owner let the write side go and kept reading.
    downgraded: bool,
    /// Our own delete of the node is under way: its deletion is no loss.
    releasing: bool,
}

impl Entry {
    /// The node counts as a reader's: a `read-` node or a downgraded `write-` node.
    fn reads_only(&self) -> bool {
        self.node == NodeKind::Read || self.downgraded
    }
}

fn slot(kind: LockKind) -> usize {
    match kind {
        LockKind::Fair => 1,
        LockKind::Read => 2,
        LockKind::Write => 3,
        _ => 0,
    }
}

/// A node this backend created.
struct Created {
    dir: String,
    path: String,
    name: String,
    token: u64,
}

/// How a wait for one node's turn ended.
enum WaitEnd {
    Granted(Instant),
    /// Another task of the same owner got the lock meanwhile.
    Reenter,
    GaveUp,
}

fn token_of(stat: &zk::Stat) -> Option<u64> {
    u64::try_from(stat.czxid).ok().filter(|t| *t > 0)
}

fn anyone() -> zk::Acls<'static> {
    zk::Acls::anyone_all()
}

impl ZkBackend {
    /// Connects to the ensemble at `url` and opens a session.
    ///
    /// The session timeout is `session_timeout` from the URL, or the client's watchdog lease
    /// but at least [`MIN_SESSION_TIMEOUT`]; the server may negotiate it into its own range
    /// (by default 2 to 20 ticks, i.e. 4 s to 40 s).
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
        let (grants, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            endpoint: u.endpoint(),
            hosts: u.hosts,
            base,
            requested_timeout,
            connect_timeout: opts.get_connect_timeout(),
            op_timeout: opts.get_op_timeout(),
            lost_grace: opts.renew_interval() + opts.get_op_timeout(),
            state: Mutex::new(State::default()),
            connecting: tokio::sync::Mutex::new(()),
            grants,
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

    /// Stops using session `gen`: fires the lost signal of every hold it had.
    fn end_session(&self, gen: u64, reason: &str) {
        let signals: Vec<LostSignal> = {
            let mut st = self.state();
            if let Some(s) = st.session.as_ref().filter(|s| s.gen == gen) {
                s.ended.cancel();
                st.session = None;
                st.last_end = Some(reason.to_owned());
            }
            let dead: Vec<EntryKey> = st
                .entries
                .iter()
                .filter(|(_, e)| e.gen == gen)
                .map(|(k, _)| k.clone())
                .collect();
            dead.iter()
                .filter_map(|k| st.entries.remove(k))
                .flat_map(|e| e.signals.into_iter().map(|(_, s)| s))
                .collect()
        };
        if !signals.is_empty() {
            tracing::warn!(holds = signals.len(), %reason, "ZooKeeper session lost; its locks are lost");
        }
        for s in signals {
            s.fire(LostReason::SessionEnded(reason.to_owned()));
        }
    }

    /// Node `path` of session `gen` is gone: its holds are lost. The signal fires after a
    /// grace period, so that for watchdog holds the watchdog's next renewal reports it first
    /// (it also forgets the hold then). Not for a node we are deleting, or whose delete may
    /// have gone through before its answer was lost: that release's retry finds the node gone
    /// and reports it released.
    fn node_gone(&self, path: &str, gen: u64) {
        let signals: Vec<LostSignal> = {
            let mut st = self.state();
            let key = st
                .entries
                .iter()
                .find(|(_, e)| e.path == path && e.gen == gen && !e.releasing && !e.delete_sent)
                .map(|(k, _)| k.clone());
            match key.and_then(|k| st.entries.remove(&k)) {
                Some(e) => e.signals.into_iter().map(|(_, s)| s).collect(),
                None => return,
            }
        };
        tracing::warn!(%path, "lock node deleted behind its holder's back; the lock is lost");
        let grace = self.lost_grace;
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            for s in signals {
                s.fire(LostReason::NotHeld);
            }
        });
    }

    fn has_live_entry(&self, key: &EntryKey, gen: u64) -> bool {
        self.state().entries.get(key).is_some_and(|e| e.gen == gen)
    }

    /// Re-entry: the owner already holds this lock family through this backend.
    async fn reenter(self: &Arc<Self>, req: &AcquireRequest) -> Result<Option<u64>> {
        let (ek, kind) = EntryKey::of(&req.key)?;
        let (path, gen, reads_only) = match self.state().entries.get(&ek) {
            None => return Ok(None),
            Some(e) => (e.path.clone(), e.gen, e.reads_only()),
        };
        if kind == NodeKind::Write && reads_only {
            return Err(upgrade_refused(&req.key));
        }
        let sess = self.session().await?;
        if sess.gen != gen {
            self.state().entries.remove(&ek);
            return Ok(None);
        }
        let stat = self
            .timed("checking the lock node", sess.zk.check_stat(&path))
            .await?;
        match stat {
            Ok(Some(st)) if st.ephemeral_owner == sess.id => {
                let mut guard = self.state();
                match guard.entries.get_mut(&ek) {
                    Some(e) if e.path == path => {
                        // The node is still ours: no earlier delete of it went through.
                        e.delete_sent = false;
                        e.counts[slot(req.key.kind)] += 1;
                        e.signals.push((req.key.kind, req.lost.clone()));
                        Ok(Some(e.token))
                    }
                    _ => Ok(None),
                }
            }
            Ok(_) | Err(zk::Error::NoNode) => {
                self.node_gone(&path, gen);
                Ok(None)
            }
            Err(e) => Err(self.err("checking the lock node", e)),
        }
    }

    /// Creates our ephemeral sequential node for `key` (and its parents when missing).
    async fn create_node(&self, sess: &Session, key: &HoldKey, kind: NodeKind) -> Result<Created> {
        let dir = self.dir(&key.name, kind.family());
        let id = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let name_prefix = format!("_c_{id}-{}-", kind.word());
        let prefix = format!("{dir}/{name_prefix}");
        let mut made_dir = false;
        for _ in 0..CREATE_ATTEMPTS {
            match self
                .create_detached(sess, prefix.clone(), layout::node_data(&key.owner, false))
                .await?
            {
                Ok((stat, seq)) => {
                    let name = format!("{name_prefix}{seq}");
                    let path = format!("{dir}/{name}");
                    let token = match token_of(&stat) {
                        Some(t) => t,
                        None => self.czxid(sess, &path).await?,
                    };
                    return Ok(Created {
                        dir,
                        path,
                        name,
                        token,
                    });
                }
                Err(zk::Error::NoNode) if !made_dir => {
                    made_dir = true;
                    let opts = zk::CreateMode::Persistent.with_acls(anyone());
                    match self
                        .timed("creating the lock directory", sess.zk.mkdir(&dir, &opts))
                        .await?
                    {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(self.err("creating the lock directory", e)),
                    }
                }
                Err(zk::Error::ConnectionLoss) => {
                    // The create may have happened: look for our id.
                    if let Some(name) = self.find_child(sess, &dir, &name_prefix).await? {
                        let path = format!("{dir}/{name}");
                        let token = self.czxid(sess, &path).await?;
                        return Ok(Created {
                            dir,
                            path,
                            name,
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

    /// Sends the create from a task of its own: if the answer comes after we stopped waiting
    /// for it, the task deletes the node, so an abandoned create never leaves a node behind.
    async fn create_detached(
        &self,
        sess: &Session,
        prefix: String,
        data: Vec<u8>,
    ) -> Result<std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let zk = sess.zk.clone();
        tokio::spawn(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(anyone());
            let r = zk.create(&prefix, &data, &opts).await;
            match tx.send(r) {
                Ok(()) => {}
                Err(Ok((_, seq))) => {
                    let _ = zk.delete(&format!("{prefix}{seq}"), None).await;
                }
                Err(Err(zk::Error::ConnectionLoss)) => delete_by_prefix(&zk, &prefix).await,
                Err(Err(_)) => {}
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
        match self
            .timed("listing the lock queue", sess.zk.list_children(dir))
            .await?
        {
            Ok(children) => Ok(children.into_iter().find(|c| c.starts_with(prefix))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.err("listing the lock queue", e)),
        }
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

    /// Deletes a node we no longer want (a waiter that gives up, a redundant grant), retrying
    /// in the background if the connection is down; a node that cannot be deleted at all goes
    /// with its session.
    async fn remove_node(&self, sess: &Session, path: &str) {
        let zk = sess.zk.clone();
        let path = path.to_owned();
        let op_timeout = self.op_timeout;
        let task = tokio::spawn(async move {
            let mut backoff = dlock_core::backoff::Backoff::default();
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

    /// Records a grant of `node` to `req`; returns the token the caller gets.
    fn register(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        node: &Created,
        req: &AcquireRequest,
    ) -> Result<u64> {
        let (ek, kind) = EntryKey::of(&req.key)?;
        let mut st = self.state();
        if sess.ended.is_cancelled() || st.session.as_ref().is_none_or(|s| s.gen != sess.gen) {
            let why = st.last_end.clone().unwrap_or_else(|| "closed".into());
            return Err(session_gone(&self.endpoint, &why));
        }
        if let Some(e) = st.entries.get_mut(&ek).filter(|e| e.gen == sess.gen) {
            // Another task of the same owner got the lock meanwhile: re-enter its grant.
            if kind == NodeKind::Write && e.reads_only() {
                return Err(upgrade_refused(&req.key));
            }
            e.counts[slot(req.key.kind)] += 1;
            e.signals.push((req.key.kind, req.lost.clone()));
            let token = e.token;
            drop(st);
            let (inner, sess, path) = (self.clone(), sess.clone(), node.path.clone());
            tokio::spawn(async move { inner.remove_node(&sess, &path).await });
            return Ok(token);
        }
        let mut counts = [0; 4];
        counts[slot(req.key.kind)] = 1;
        let token = node.token;
        st.entries.insert(
            ek,
            Entry {
                path: node.path.clone(),
                dir: node.dir.clone(),
                node: kind,
                token,
                gen: sess.gen,
                counts,
                signals: vec![(req.key.kind, req.lost.clone())],
                delete_sent: false,
                downgraded: false,
                releasing: false,
            },
        );
        drop(st);
        self.grants.send_modify(|n| *n = n.wrapping_add(1));
        tokio::spawn(watch_node(
            Arc::downgrade(self),
            sess.gen,
            node.path.clone(),
            sess.ended.clone(),
        ));
        Ok(token)
    }

    /// Where our node stands now, and the local time just before we asked.
    async fn turn(&self, sess: &Session, node: &Created) -> Result<(Turn, Instant)> {
        let family = layout::parse_child(&node.name)
            .map(|c| c.kind.family())
            .unwrap_or(Family::Mutex);
        let asked = Instant::now();
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
        Ok((layout::turn(&queue, &node.name, head_downgraded), asked))
    }

    /// Whether lock node `dir/name` belongs to a writer that downgraded to reading.
    async fn is_downgraded(&self, sess: &Session, dir: &str, name: &str) -> Result<bool> {
        let path = format!("{dir}/{name}");
        match self
            .timed("reading the head of the queue", sess.zk.get_data(&path))
            .await?
        {
            Ok((data, _)) => Ok(layout::parse_node_data(&data).is_some_and(|(_, d)| d)),
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
        ek: &EntryKey,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<WaitEnd> {
        let mut grants = self.grants.subscribe();
        loop {
            if self.has_live_entry(ek, sess.gen) {
                return Ok(WaitEnd::Reenter);
            }
            let pred = match self.turn(sess, node).await? {
                (Turn::Granted, asked) => return Ok(WaitEnd::Granted(asked)),
                (Turn::Gone, _) => {
                    return Err(session_gone(
                        &self.endpoint,
                        "our waiting node vanished (deleted, or the session ended)",
                    ))
                }
                (Turn::WaitFor(pred), _) => format!("{}/{pred}", node.dir),
            };
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
            let changed = watcher.changed();
            tokio::pin!(changed);
            loop {
                tokio::select! {
                    ev = &mut changed => {
                        if ev.event_type == zk::EventType::Session && ev.session_state.is_terminated() {
                            return Err(session_gone(&self.endpoint, &format!("{} while waiting", ev.session_state)));
                        }
                        break;
                    }
                    r = grants.changed() => {
                        if r.is_ok() && !self.has_live_entry(ek, sess.gen) {
                            continue;
                        }
                        return Ok(WaitEnd::Reenter);
                    }
                    _ = sess.ended.cancelled() => {
                        return Err(session_gone(&self.endpoint, "the session ended while waiting"));
                    }
                    _ = cancel.cancelled() => return Ok(WaitEnd::GaveUp),
                    _ = until(deadline) => return Ok(WaitEnd::GaveUp),
                }
            }
        }
    }

    /// One try at the lock: create a node, wait for its turn (or not), record the grant.
    async fn attempt(
        self: &Arc<Self>,
        req: &AcquireRequest,
        wait: Option<(Option<Instant>, &CancellationToken)>,
    ) -> Result<Option<Granted>> {
        let sent = Instant::now();
        if let Some(token) = self.reenter(req).await? {
            return Ok(Some(Granted {
                token,
                requested_at: sent,
            }));
        }
        let (ek, kind) = EntryKey::of(&req.key)?;
        let sess = self.session().await?;
        let node = self.create_node(&sess, &req.key, kind).await?;
        let end = match wait {
            None => match self.turn(&sess, &node).await {
                Ok((Turn::Granted, asked)) => Ok(WaitEnd::Granted(asked)),
                Ok(_) if self.has_live_entry(&ek, sess.gen) => Ok(WaitEnd::Reenter),
                Ok(_) => Ok(WaitEnd::GaveUp),
                Err(e) => Err(e),
            },
            Some((deadline, cancel)) => self.wait_turn(&sess, &node, &ek, deadline, cancel).await,
        };
        match end {
            Ok(WaitEnd::Granted(asked)) => match self.register(&sess, &node, req) {
                Ok(token) => Ok(Some(Granted {
                    token,
                    requested_at: asked,
                })),
                Err(e) => {
                    self.remove_node(&sess, &node.path).await;
                    Err(e)
                }
            },
            Ok(WaitEnd::Reenter) => {
                self.remove_node(&sess, &node.path).await;
                let again = Instant::now();
                match self.reenter(req).await? {
                    Some(token) => Ok(Some(Granted {
                        token,
                        requested_at: again,
                    })),
                    None => Err(session_gone(
                        &self.endpoint,
                        "the same owner's grant went away while re-entering",
                    )),
                }
            }
            Ok(WaitEnd::GaveUp) => {
                self.remove_node(&sess, &node.path).await;
                Ok(None)
            }
            Err(e) => {
                self.remove_node(&sess, &node.path).await;
                Err(e)
            }
        }
    }

    /// Deletes the node of a fully released hold and records its token as the lock's last one
    /// (the directory's data), in one atomic multi-op. Readers overlap, so a reader writes the
    /// maximum with a version check; a writer or mutex holder is alone and just writes its own.
    async fn delete_recording_fence(
        &self,
        sess: &Session,
        e: &EntryView,
    ) -> Result<std::result::Result<(), zk::Error>> {
        for _ in 0..5 {
            let (fence, version) = if e.reads_only {
                match self
                    .timed("reading the fencing record", sess.zk.get_data(&e.dir))
                    .await?
                {
                    Ok((data, stat)) => {
                        let stored = parse_fence(&data).unwrap_or(0);
                        (stored.max(e.token), Some(stat.version))
                    }
                    Err(zk::Error::NoNode) => (e.token, None),
                    Err(err) => return Ok(Err(err)),
                }
            } else {
                (e.token, None)
            };
            let mut w = sess.zk.new_multi_writer();
            let fence = fence.to_string();
            if let Err(err) = w.add_set_data(&e.dir, fence.as_bytes(), version) {
                return Ok(Err(err));
            }
            if let Err(err) = w.add_delete(&e.path, None) {
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
        self.timed("releasing the lock node", sess.zk.delete(&e.path, None))
            .await
    }

    async fn release_without_entry(self: &Arc<Self>, key: &HoldKey) -> Result<ReleaseOutcome> {
        let family = NodeKind::of(key.kind)?.family();
        let dir = self.dir(&key.name, family);
        let sess = self.session().await?;
        // Read what the leader has, not what a lagging follower had.
        match self.timed("syncing", sess.zk.sync(&dir)).await? {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(self.err("syncing", e)),
        }
        let queue = layout::queue(&self.list(&sess, &dir).await?, family);
        Ok(if queue.is_empty() {
            ReleaseOutcome::Expired
        } else {
            ReleaseOutcome::TakenByOther
        })
    }
}

/// What a release needs of an entry, copied out of the lock.
struct EntryView {
    path: String,
    dir: String,
    reads_only: bool,
    token: u64,
    gen: u64,
    delete_sent: bool,
    counts_total: u32,
}

impl EntryView {
    fn of(e: &Entry) -> Self {
        EntryView {
            path: e.path.clone(),
            dir: e.dir.clone(),
            reads_only: e.reads_only(),
            token: e.token,
            gen: e.gen,
            delete_sent: e.delete_sent,
            counts_total: e.counts.iter().sum(),
        }
    }
}

/// What a release does.
enum Step {
    /// Only the local count changes.
    Local(ReleaseOutcome),
    /// This backend has no such hold: ask the server who holds the lock.
    NoEntry,
    /// The last write hold of an owner that still reads.
    Downgrade(EntryView),
    /// The owner's last hold: delete the node.
    Delete(EntryView),
}

/// Drops the lost signal of one released hold of `kind`.
fn forget_signal(e: &mut Entry, kind: LockKind) {
    if let Some(i) = e.signals.iter().rposition(|(k, _)| *k == kind) {
        e.signals.remove(i);
    }
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

/// Watches one granted node: if it is deleted by anyone but us, its holds are lost.
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
                _ => continue,
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

    async fn watch(&self, key: &HoldKey) -> Result<Box<dyn ReleaseWatch>> {
        let family = NodeKind::of(key.kind)?.family();
        let mut w = ChildWatch {
            inner: self.inner.clone(),
            dir: self.inner.dir(&key.name, family),
            armed: None,
        };
        w.arm().await?;
        Ok(Box::new(w))
    }

    async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let mut backoff = dlock_core::backoff::Backoff::default();
        loop {
            if cancel.is_cancelled() || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            match self.inner.attempt(req, Some((deadline, cancel))).await {
                Ok(r) => return Ok(r),
                // Connection trouble or a lost session while waiting: keep waiting (bounded by
                // the deadline) in a new queue position rather than failing at the first blip.
                Err(e) if e.is_retryable() => {
                    let pause = backoff.next_delay();
                    tracing::debug!(error = %e, ?pause, "waiting for a ZooKeeper lock failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = cancel.cancelled() => return Ok(None),
                        _ = until(deadline) => return Ok(None),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn release(&self, key: &HoldKey) -> Result<ReleaseOutcome> {
        let inner = &self.inner;
        let (ek, _) = EntryKey::of(key)?;
        let s = slot(key.kind);
        let step = {
            let mut st = inner.state();
            match st.entries.get_mut(&ek) {
                None => Step::NoEntry,
                Some(e) if e.counts[s] == 0 => Step::NoEntry,
                Some(e) => {
                    let total: u32 = e.counts.iter().sum();
                    if total == 1 {
                        // The watch on our node will see our own delete: not a loss.
                        e.releasing = true;
                        Step::Delete(EntryView::of(e))
                    } else if e.counts[s] == 1 && key.kind == LockKind::Write && !e.downgraded {
                        // The last write hold goes while the owner still reads: downgrade.
                        Step::Downgrade(EntryView::of(e))
                    } else {
                        e.counts[s] -= 1;
                        forget_signal(e, key.kind);
                        Step::Local(if e.counts[s] > 0 {
                            ReleaseOutcome::StillHeld {
                                remaining: e.counts[s],
                            }
                        } else {
                            // This side is free; the owner's other side keeps the node.
                            ReleaseOutcome::Released
                        })
                    }
                }
            }
        };
        let view = match step {
            Step::Local(outcome) => return Ok(outcome),
            Step::NoEntry => return inner.release_without_entry(key).await,
            Step::Downgrade(view) | Step::Delete(view) => view,
        };
        let downgrade = key.kind == LockKind::Write && view.counts_total > 1;
        let forget = || {
            let mut st = inner.state();
            if st.entries.get(&ek).is_some_and(|e| e.path == view.path) {
                st.entries.remove(&ek);
            }
        };
        let Some(sess) = inner.current().filter(|s| s.gen == view.gen) else {
            // The node went with its session.
            forget();
            return Ok(ReleaseOutcome::Expired);
        };
        if downgrade {
            // Mark the write node as a reader's: readers behind it may join, writers still wait.
            let data = layout::node_data(&key.owner, true);
            return match inner
                .timed("downgrading", sess.zk.set_data(&view.path, &data, None))
                .await?
            {
                Ok(_) => {
                    let mut st = inner.state();
                    if let Some(e) = st.entries.get_mut(&ek).filter(|e| e.path == view.path) {
                        e.downgraded = true;
                        e.counts[s] = e.counts[s].saturating_sub(1);
                        forget_signal(e, key.kind);
                    }
                    Ok(ReleaseOutcome::Released)
                }
                Err(zk::Error::NoNode) => {
                    forget();
                    Ok(ReleaseOutcome::Expired)
                }
                Err(e) => Err(inner.err("downgrading", e)),
            };
        }
        match inner.delete_recording_fence(&sess, &view).await {
            Ok(Ok(())) => {
                forget();
                Ok(ReleaseOutcome::Released)
            }
            Ok(Err(zk::Error::NoNode)) => {
                forget();
                Ok(if view.delete_sent {
                    // An earlier attempt whose answer was lost did delete it.
                    ReleaseOutcome::Released
                } else {
                    ReleaseOutcome::Expired
                })
            }
            Ok(Err(e)) => {
                release_failed(
                    inner,
                    &ek,
                    &view.path,
                    matches!(e, zk::Error::ConnectionLoss),
                );
                Err(inner.err("releasing the lock node", e))
            }
            Err(e) => {
                release_failed(inner, &ek, &view.path, true);
                Err(e)
            }
        }
    }

    async fn renew(&self, holds: &[(HoldKey, Duration)]) -> Result<Vec<RenewOutcome>> {
        let inner = &self.inner;
        let mut out = vec![RenewOutcome::NotHeld; holds.len()];
        // Which items have a node, and which node.
        let mut wanted: Vec<(usize, String, u64)> = Vec::new();
        {
            let st = inner.state();
            for (i, (key, _)) in holds.iter().enumerate() {
                let (ek, _) = EntryKey::of(key)?;
                match st.entries.get(&ek).filter(|e| e.counts[slot(key.kind)] > 0) {
                    // Being released right now: nothing to confirm, nothing lost.
                    Some(e) if e.releasing => out[i] = RenewOutcome::Renewed,
                    Some(e) => wanted.push((i, e.path.clone(), e.gen)),
                    None => {}
                }
            }
        }
        if wanted.is_empty() {
            return Ok(out);
        }
        let sess = inner.session().await?;
        let mut paths: Vec<&str> = wanted
            .iter()
            .filter(|(_, _, g)| *g == sess.gen)
            .map(|(_, p, _)| p.as_str())
            .collect();
        paths.sort_unstable();
        paths.dedup();
        if paths.is_empty() {
            return Ok(out);
        }
        // One round trip for all holds: proves the session alive and each node present.
        let mut reader = sess.zk.new_multi_reader();
        for p in &paths {
            reader
                .add_get_data(p)
                .map_err(|e| inner.err("renewing", e))?;
        }
        let results = match inner.timed("renewing", reader.commit()).await? {
            Ok(r) => r,
            Err(e) => return Err(inner.err("renewing", e)),
        };
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
        let mut alive: HashMap<&str, bool> = HashMap::new();
        for (p, r) in paths.iter().zip(results) {
            let ok = match r {
                zk::MultiReadResult::Data { stat, .. } => stat.ephemeral_owner == sess.id,
                zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => false,
                zk::MultiReadResult::Error { err } => return Err(inner.err("renewing", err)),
                other => {
                    return Err(Error::UnexpectedReply {
                        backend: KIND,
                        message: format!("renewal: unexpected answer {other:?}"),
                    })
                }
            };
            if !ok {
                inner.node_gone(p, sess.gen);
            }
            alive.insert(p, ok);
        }
        for (i, p, g) in &wanted {
            if *g == sess.gen && alive.get(p.as_str()).copied().unwrap_or(false) {
                out[*i] = RenewOutcome::Renewed;
            }
        }
        Ok(out)
    }

    async fn inspect(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let inner = &self.inner;
        let family = NodeKind::of(kind)?.family();
        let dir = inner.dir(name, family);
        let sess = inner.session().await?;
        match inner.timed("syncing", sess.zk.sync(&dir)).await? {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(inner.err("syncing", e)),
        }
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
        let candidates: Vec<&Child> = if head_is_writer {
            layout::holders(&queue, true)
        } else {
            layout::holders(&queue, false)
        };
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
                        let (owner, downgraded) =
                            layout::parse_node_data(&data).ok_or_else(|| Error::UnexpectedReply {
                                backend: KIND,
                                message: format!(
                                    "lock node {dir}/{} does not hold an owner id; is the directory used by another program?",
                                    h.name
                                ),
                            })?;
                        read.push((*h, owner, downgraded, stat));
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
                .is_some_and(|(h, _, d, _)| h.kind == NodeKind::Write && !d)
        {
            read.truncate(1);
        }
        let st = inner.state();
        let mut infos = Vec::new();
        for (h, owner, downgraded, stat) in &read {
            if let Some(t) = token_of(stat) {
                fencing_token = fencing_token.max(t);
            }
            let path = format!("{dir}/{}", h.name);
            // Re-entry is counted by the holder's backend; other processes show 1.
            let count = st
                .entries
                .values()
                .find(|e| e.path == path)
                .map_or(1, |e| e.counts.iter().sum::<u32>().max(1));
            let side = match h.kind {
                NodeKind::Lock => None,
                NodeKind::Write if !downgraded => Some(LockKind::Write),
                _ => Some(LockKind::Read),
            };
            infos.push(HolderInfo {
                owner: owner.clone(),
                count,
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
}

fn upgrade_refused(key: &HoldKey) -> Error {
    Error::invalid(format!(
        "owner `{}` holds the read side of `{}` and asks for the write side: that could wait for \
         itself (or for another upgrading reader) forever; release the read side first \
         (a writer may take the read side, not the reverse)",
        key.owner, key.name
    ))
}

/// A release that did not go through: the hold stays (the caller may retry). `maybe_sent`: the
/// delete may have reached the server anyway (a lost answer).
fn release_failed(inner: &Inner, ek: &EntryKey, path: &str, maybe_sent: bool) {
    if let Some(e) = inner.state().entries.get_mut(ek) {
        if e.path == path {
            e.releasing = false;
            e.delete_sent |= maybe_sent;
        }
    }
}
