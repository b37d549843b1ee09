//! Sessions: opening one, watching it (and each granted node), ending it; driver errors as
//! dlock's.

use crate::grant::Grant;
use crate::layout::{self, Family};
use crate::tls::Tls;
use crate::KIND;
use distlock_core::backend::{AttemptId, Deadline, LostRegistry};
use distlock_core::{Error, LostReason, LostSignal, Result, Severity};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

/// True when a request failed with its connection: it may or may not have reached the server.
pub(crate) fn connection_died(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// The session that held (or would hold) the locks is gone.
pub(crate) fn session_gone(endpoint: &str, why: &str) -> Error {
    Error::connection(
        KIND,
        endpoint.to_owned(),
        format!("the ZooKeeper session ended ({why}); a new one is opened on the next call"),
    )
}

/// Who the backend's sessions authenticate as, for messages.
#[derive(Debug, Clone)]
pub(crate) enum Identity {
    /// No credentials.
    None,
    /// `digest` as this user.
    Digest(String),
    /// Whatever the application's connector carries.
    Application,
}

/// The backend proper, shared by its handles and its background tasks.
pub(crate) struct Inner {
    /// What every session is opened with (the application's, or a plain one), with the digest
    /// credentials added. Its `Debug` leaves them out.
    pub(crate) connector: zk::Connector,
    pub(crate) identity: Identity,
    /// The ACL of the nodes dlock creates.
    pub(crate) acl: crate::NodeAcl,
    pub(crate) endpoint: String,
    pub(crate) hosts: String,
    /// `zks://`: every server over TLS, with these settings.
    pub(crate) tls: Option<Tls>,
    /// `/<chroot>/<ns>`.
    pub(crate) base: String,
    pub(crate) requested_timeout: Duration,
    /// The client's watchdog lease: every session must last at least this long.
    pub(crate) watchdog_lease: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
    /// How long after its node vanished a hold's lost signal fires if the watchdog has not
    /// fired it first (one renewal interval and one call).
    pub(crate) lost_grace: Duration,
    pub(crate) state: Mutex<State>,
    /// Serializes opening a new session.
    pub(crate) connecting: tokio::sync::Mutex<()>,
    pub(crate) shutdown: CancellationToken,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) session: Option<Arc<Session>>,
    pub(crate) next_gen: u64,
    /// The live grants made through this backend, by attempt: what their node is, and the
    /// lost signal to fire when the node or the session goes.
    pub(crate) grants: HashMap<AttemptId, Grant>,
    /// Attempts that sent a create and hold no grant (waiting, or the outcome of the create is
    /// unknown): a retry of one looks for its node on the server before creating one.
    pub(crate) pending: HashSet<AttemptId>,
    /// Why the last session ended, for error messages.
    pub(crate) last_end: Option<String>,
}

/// One ZooKeeper session (the driver reconnects within it; a new one gets a new `gen`).
pub(crate) struct Session {
    pub(crate) zk: zk::Client,
    pub(crate) gen: u64,
    pub(crate) id: i64,
    pub(crate) timeout: Duration,
    /// Cancelled when dlock stops using the session (expired, closed, or cut off too long).
    pub(crate) ended: CancellationToken,
    /// The lost signals of the session's grants, by attempt: all fired when it ends.
    pub(crate) lost: LostRegistry,
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
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // The state is plain bookkeeping; a panic elsewhere mid-update leaves it usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn current(&self) -> Option<Arc<Session>> {
        self.state()
            .session
            .clone()
            .filter(|s| !s.ended.is_cancelled())
    }

    pub(crate) fn dir(&self, name: &str, family: Family) -> String {
        layout::dir(&self.base, name, family)
    }

    /// A driver error during `what`.
    pub(crate) fn err(&self, what: &str, e: zk::Error) -> Error {
        use zk::Error as Z;
        let endpoint = self.endpoint.clone();
        match e {
            Z::ConnectionLoss
            | Z::Timeout
            | Z::NoHosts
            | Z::SessionExpired
            | Z::SessionMoved
            | Z::ClientClosed
            | Z::Throttled
            // The driver's own failures of a connection (an I/O error, "no response from
            // connection in …ms" after 2/5 of the session timeout of silence): it reconnects,
            // and the call is to be retried on the new connection, as after a `ConnectionLoss`.
            // A release taken for an unexpected reply was not retried, and its node stayed in
            // the session that lived on.
            | Z::Custom(_) => Error::connection(KIND, endpoint, format!("{what}: {e}")),
            Z::NoAuth | Z::AuthFailed => Error::auth(KIND, endpoint, self.refused(what, &e)),
            other => Error::unexpected(KIND, format!("{what}: {other}")),
        }
    }

    /// What to do about a `NoAuth` or `AuthFailed` during `what`, by the identity we have.
    fn refused(&self, what: &str, e: &zk::Error) -> String {
        use crate::builder::{PASSWORD_ENV, PASSWORD_FILE_ENV, USER_ENV};
        let failed = matches!(e, zk::Error::AuthFailed);
        match &self.identity {
            Identity::None => format!(
                "{what}: {e}: the ACL of the chroot or namespace node lets in only some \
                 identities and this session has no credentials; give a digest user and \
                 password (zk://USER:PASSWORD@…, ZkBackend::builder(url).user(…).password(…) \
                 or .password_file(…), or {USER_ENV} and {PASSWORD_ENV} or {PASSWORD_FILE_ENV})"
            ),
            Identity::Digest(user) if failed => format!(
                "{what}: the ensemble refused digest user `{user}` ({e}) and closed the \
                 session; check the user name and password"
            ),
            Identity::Digest(user) => format!(
                "{what}: {e}: digest user `{user}` is not allowed here; check the password \
                 (ZooKeeper does not check it when the session authenticates: a wrong one is \
                 another identity) and that the ACL of the chroot, namespace and lock \
                 directories grants this user (nodes made with acl=creator belong to the user \
                 that made them)"
            ),
            Identity::Application if failed => format!(
                "{what}: the ensemble refused the authentication of the application's connector \
                 (its with_auth or SASL settings; {e}) and closed the session"
            ),
            Identity::Application => format!(
                "{what}: {e}: the identity of the application's connector (its with_auth or \
                 SASL settings) is not allowed by the ACL of the backend's path"
            ),
        }
    }

    /// Reads the nearest existing node of the backend's path, so that an ACL that keeps this
    /// identity out is an [`Error::Auth`] at connect rather than at the first lock.
    pub(crate) async fn probe_access(&self, sess: &Session) -> Result<()> {
        let mut path = self.base.clone();
        loop {
            let what = format!("reading {path}");
            if self.call(&what, sess.zk.check_stat(&path)).await?.is_some() {
                let children = sess.zk.list_children(&path);
                return self
                    .call_unless(&what, zk::Error::NoNode, children)
                    .await
                    .map(drop);
            }
            match path.rfind('/') {
                Some(0) | None if path == "/" => return Ok(()),
                Some(0) | None => path = "/".to_owned(),
                Some(i) => path.truncate(i),
            }
        }
    }

    /// Runs one driver call with the per-call timeout. The outer error is the timeout (or a
    /// connection error); the inner result is the server's answer.
    pub(crate) async fn timed<T, E>(
        &self,
        what: &str,
        fut: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<std::result::Result<T, E>> {
        tokio::time::timeout(self.op_timeout, fut)
            .await
            .map_err(|_| Error::call_timeout(KIND, &self.endpoint, what, self.op_timeout))
    }

    /// [`timed`](Self::timed) with the server's error mapped by [`err`](Self::err).
    pub(crate) async fn call<T>(
        &self,
        what: &str,
        fut: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<T> {
        self.timed(what, fut).await?.map_err(|e| self.err(what, e))
    }

    /// [`call`](Self::call), with the answer `absent` (`NoNode`; `NodeExists` for a create)
    /// as `None` rather than an error.
    pub(crate) async fn call_unless<T>(
        &self,
        what: &str,
        absent: zk::Error,
        fut: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<Option<T>> {
        match self.timed(what, fut).await? {
            Ok(v) => Ok(Some(v)),
            Err(e) if e == absent => Ok(None),
            Err(e) => Err(self.err(what, e)),
        }
    }

    /// Commits multi-op `w` within the per-call timeout. A failure is the index of the
    /// operation that failed (`None`: the request as a whole) and the server's error.
    pub(crate) async fn commit(
        &self,
        what: &str,
        mut w: zk::MultiWriter<'_>,
    ) -> Result<std::result::Result<Vec<zk::MultiWriteResult>, (Option<usize>, zk::Error)>> {
        Ok(self.timed(what, w.commit()).await?.map_err(|e| match e {
            zk::MultiWriteError::OperationFailed { index, source } => (Some(index), source),
            zk::MultiWriteError::RequestFailed { source } => (None, source),
        }))
    }

    /// Creates the persistent directory `dir` (and its parents) unless it exists.
    pub(crate) async fn make_dir(&self, sess: &Session, dir: &str, what: &str) -> Result<()> {
        let opts = zk::CreateMode::Persistent.with_acls(self.acl.acls());
        self.call_unless(what, zk::Error::NodeExists, sess.zk.mkdir(dir, &opts))
            .await
            .map(drop)
    }

    /// A watch of the children of directory `dir`, which is created (`making` in errors)
    /// if missing.
    pub(crate) async fn watch_children(
        &self,
        sess: &Session,
        dir: &str,
        what: &str,
        making: &str,
    ) -> Result<zk::OneshotWatcher> {
        let mut made = false;
        loop {
            let watch = sess.zk.list_and_watch_children(dir);
            match self.call_unless(what, zk::Error::NoNode, watch).await? {
                Some((_, w)) => return Ok(w),
                None if !made => self.make_dir(sess, dir, making).await?,
                None => return Err(self.err(what, zk::Error::NoNode)),
            }
            made = true;
        }
    }

    /// Waits until the server we talk to has caught up with the leader: what we read next is
    /// at least as new as the leader's state when it processed the sync, and the sync only
    /// comes back if that server still follows a leader that still has our session.
    pub(crate) async fn sync(&self, sess: &Session, path: &str) -> Result<()> {
        let what = "syncing with the leader";
        self.call_unless(what, zk::Error::NoNode, sess.zk.sync(path))
            .await
            .map(drop)
    }

    /// The current session, opening a new one if the last one ended.
    pub(crate) async fn session(self: &Arc<Self>) -> Result<Arc<Session>> {
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let _one = self.connecting.lock().await;
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let connector = self
            .connector
            .clone()
            .with_session_timeout(self.requested_timeout)
            .with_fail_eagerly();
        let connecting = async {
            match &self.tls {
                None => connector.connect(&self.hosts).await,
                Some(tls) => tls.connect(connector, &self.hosts).await,
            }
        };
        let connected = tokio::time::timeout(self.connect_timeout, connecting).await;
        let client = match connected {
            Ok(Ok(c)) => c,
            failed => {
                if let Some(tls) = &self.tls {
                    // The driver does not say why no server answered: ask each ourselves.
                    let within = self.connect_timeout.min(Duration::from_secs(3));
                    if let (_, Some(e)) = tls.probe(&self.hosts, within).await {
                        return Err(Error::connection(KIND, self.endpoint.clone(), e));
                    }
                }
                return Err(match failed {
                    Ok(Err(e)) => self.err("opening a session", e),
                    _ => Error::call_timeout(
                        KIND,
                        &self.endpoint,
                        "opening a session (is a quorum of the ensemble up?)",
                        self.connect_timeout,
                    ),
                });
            }
        };
        let timeout = client.session_timeout();
        self.check_negotiated(timeout)?;
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
                lost: LostRegistry::new(),
            });
            st.session = Some(s.clone());
            s
        };
        let id = format!("{:#x}", session.id);
        tracing::debug!(session = id, ?timeout, "ZooKeeper session opened");
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

    /// Whether a session whose servers negotiated `timeout` may be used: refused when shorter
    /// than the watchdog lease (renewals promise the core a whole watchdog lease from their
    /// send time; a session the server may expire sooner would let a hold look alive after
    /// its node is gone); logged when it differs from the one asked for (doctor's finding).
    fn check_negotiated(&self, timeout: Duration) -> Result<()> {
        let f = crate::ops::session_finding(timeout, self.requested_timeout, self.watchdog_lease);
        match f.severity {
            Severity::Unsafe => Err(Error::invalid(format!(
                "ZooKeeper at {}: {}",
                self.endpoint, f.message
            ))),
            Severity::Warning => {
                tracing::warn!("{}", f.message);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A lease the core would measure from a request's send time must fit in the session:
    /// the server may expire the session (and delete the node) one session timeout after it
    /// last heard from us.
    pub(crate) fn check_lease(&self, sess: &Session, lease: Duration, what: &str) -> Result<()> {
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
    pub(crate) fn end_session(&self, gen: u64, reason: &str) {
        let ended = {
            let mut st = self.state();
            st.grants.retain(|_, g| g.gen != gen);
            let current = st.session.take_if(|s| s.gen == gen);
            if current.is_some() {
                st.last_end = Some(reason.to_owned());
            }
            current
        };
        // A session already ended fired its signals then.
        let Some(sess) = ended else { return };
        sess.ended.cancel();
        let holds = sess
            .lost
            .fire_all(LostReason::SessionEnded(reason.to_owned()));
        if holds > 0 {
            tracing::warn!(%reason, holds, "ZooKeeper session ended; its locks are lost");
        }
    }

    /// Node `path` of session `gen` is gone: the grants on it are lost. The signal fires after
    /// a grace period, so that for watchdog holds the watchdog's next renewal reports it first.
    /// Not for a node we are deleting, or whose delete may have gone through before its answer
    /// was lost: that release's retry finds the node gone and reports it released.
    pub(crate) fn node_gone(&self, path: &str, gen: u64) {
        let signals: Vec<LostSignal> = {
            let mut st = self.state();
            let mut gone = HashSet::new();
            st.grants.retain(|attempt, g| {
                let lost = g.path == path && g.gen == gen && !g.releasing && !g.delete_sent;
                if lost {
                    gone.insert(attempt.clone());
                }
                !lost
            });
            match st.session.as_ref().filter(|s| s.gen == gen) {
                Some(s) if !gone.is_empty() => s.lost.take_where(|a| gone.contains(a)),
                // A session that ended fired every signal of its grants already.
                _ => Vec::new(),
            }
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
}

/// Watches the session: fires every hold's lost signal when it expires or closes, or when the
/// connection has been down for `lost_after` (2/5 of the session timeout: the driver notices a
/// silent connection after 2/5, so the server cannot have expired the session before 4/5).
pub(crate) async fn monitor(
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
            _ = Deadline::from(cutoff).reached(), if cutoff.is_some() => {
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
pub(crate) async fn watch_node(
    inner: Weak<Inner>,
    gen: u64,
    path: String,
    ended: CancellationToken,
) {
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
            Ok(Ok((None, _))) => break,
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
                zk::EventType::NodeDeleted => break,
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
    if let Some(inner) = inner.upgrade() {
        inner.node_gone(&path, gen);
    }
}
