//! Waiting for a node's turn (watching only its predecessor), and one attempt at the lock.

use crate::grant::Grant;
use crate::layout::{self, Family, NodeData, NodeKind, Turn};
use crate::session::{session_gone, Inner, Session};
use distlock_core::backend::{
    async_trait, wait, AcquireRequest, Deadline, Granted, HoldKey, ReleaseWatch, Wake,
};
use distlock_core::backoff::RetryPolicy;
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

/// Gives the attempt up in the background if the future running it is dropped before it
/// decided (a caller that stopped waiting for it): nobody would retry it or give it up.
pub(crate) struct Abandon {
    pub(crate) inner: Weak<Inner>,
    pub(crate) req: Option<AcquireRequest>,
}

impl Abandon {
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
pub(crate) async fn give_up_soon(inner: &Arc<Inner>, req: &AcquireRequest) {
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

type Event = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// The changes of one lock or election directory: a child watch on it (nodes coming and
/// going: a release, a new leader) and for an election a data watch on the directory too (a
/// proclamation). Both are re-armed after each event before `changed` returns, so no change
/// after `watch` or `observe` returned is missed; a session event ends the watch with an
/// error.
pub(crate) struct DirWatch {
    inner: Arc<Inner>,
    dir: String,
    /// An election's: its data too.
    election: bool,
    armed: Option<(Event, CancellationToken)>,
    /// An event arrived but the watch was not re-armed yet (`changed` was dropped midway).
    fired: bool,
}

impl DirWatch {
    /// The watch of `name`'s directory of `family`; `election`: its proclamations too.
    pub(crate) async fn open(
        inner: &Arc<Inner>,
        name: &str,
        family: Family,
        election: bool,
    ) -> Result<Box<dyn ReleaseWatch>> {
        let (inner, dir) = (inner.clone(), inner.dir(name, family));
        let mut w = DirWatch {
            inner,
            dir,
            election,
            armed: None,
            fired: false,
        };
        w.arm().await?;
        Ok(Box::new(w))
    }

    async fn arm(&mut self) -> Result<()> {
        let inner = &self.inner;
        let sess = inner.session().await?;
        let (what, making) = match self.election {
            true => ("watching the election", "creating the election directory"),
            false => ("watching the lock queue", "creating the lock directory"),
        };
        let cw = inner.watch_children(&sess, &self.dir, what, making).await?;
        // Proclamations change an election directory's data; `None`: deleted meanwhile (a
        // Curator container), and the child watch fired for it.
        let lw = if self.election {
            let watch = sess.zk.check_and_watch_stat(&self.dir);
            let (stat, w) = inner.call(what, watch).await?;
            stat.map(|_| w)
        } else {
            None
        };
        let events: Event = Box::pin(async move {
            match lw {
                Some(lw) => tokio::select! {
                    ev = cw.changed() => ev,
                    ev = lw.changed() => ev,
                },
                None => cw.changed().await,
            }
        });
        self.armed = Some((events, sess.ended.clone()));
        Ok(())
    }
}

#[async_trait]
impl ReleaseWatch for DirWatch {
    async fn changed(&mut self) -> Result<Wake> {
        if !self.fired {
            if self.armed.is_none() {
                self.arm().await?;
            }
            let Some((events, ended)) = self.armed.as_mut() else {
                return Err(session_gone(&self.inner.endpoint, "no watch"));
            };
            let ev = tokio::select! {
                ev = events => ev,
                _ = ended.cancelled() => {
                    self.armed = None;
                    return Err(session_gone(&self.inner.endpoint, "the session ended"));
                }
            };
            self.armed = None;
            if ev.event_type == zk::EventType::Session {
                let why = ev.session_state.to_string();
                return Err(session_gone(&self.inner.endpoint, &why));
            }
            self.fired = true;
        }
        self.arm().await?;
        self.fired = false;
        Ok(Wake::Released)
    }
}

impl Inner {
    /// Where our node stands now. `via_leader`: sync first, so the answer is the leader's.
    pub(crate) async fn turn(
        &self,
        sess: &Session,
        node: &Grant,
        via_leader: bool,
    ) -> Result<Turn> {
        if via_leader {
            self.sync(sess, &node.dir).await?;
        }
        let queue = layout::queue(&self.list(sess, &node.dir).await?, node.node.family());
        // A reader behind a writer at the head asks whether that writer downgraded.
        let head = (queue.first()).filter(|_| layout::needs_head_check(&queue, &node.name));
        let head_downgraded = match head {
            Some(h) => {
                let read = sess.zk.get_data(&format!("{}/{}", node.dir, h.name));
                let what = "reading the head of the queue";
                // Gone (`None`): we look again when our watch fires.
                let read = self.call_unless(what, zk::Error::NoNode, read).await?;
                read.is_some_and(|(data, _)| NodeData::parse(&data).is_some_and(|d| d.downgraded))
            }
            None => false,
        };
        Ok(layout::turn(&queue, &node.name, head_downgraded))
    }

    /// Waits until `node` holds the lock (until `wait`'s deadline or cancellation; without
    /// `wait`, not at all), watching only the node it waits for: the grant's time (no later
    /// than the server's confirmation of it), or `None` when given up.
    pub(crate) async fn wait_turn(
        &self,
        sess: &Session,
        node: &Grant,
        confirmed_at: LeaseInstant,
        wait: Option<(Deadline, &CancellationToken)>,
    ) -> Result<Option<LeaseInstant>> {
        let mut at = confirmed_at;
        let mut via_leader = false;
        loop {
            if via_leader {
                at = LeaseInstant::now();
            }
            let pred = match self.turn(sess, node, via_leader).await? {
                Turn::Granted => return Ok(Some(at)),
                Turn::Gone => {
                    return Err(session_gone(
                        &self.endpoint,
                        "our waiting node vanished (deleted, or the session ended)",
                    ))
                }
                Turn::WaitFor(pred) => format!("{}/{pred}", node.dir),
            };
            let Some((deadline, cancel)) = wait else {
                return Ok(None);
            };
            // From now on the grant is decided by a watch event; look at the leader's state
            // then, so the grant's time is one the leader confirmed our session at.
            via_leader = true;
            let watch = sess.zk.check_and_watch_stat(&pred);
            let (stat, watcher) = self.call("watching the predecessor", watch).await?;
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
                _ = cancel.cancelled() => return Ok(None),
                _ = deadline.reached() => return Ok(None),
            }
        }
    }

    /// One try at the lock: find or create this attempt's node, wait for its turn (or not),
    /// record the grant. On an error the node stays (the attempt's retry finds it again, its
    /// give-up deletes it).
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        req: &AcquireRequest,
        wait: Option<(Deadline, &CancellationToken)>,
    ) -> Result<Option<Granted>> {
        let kind = NodeKind::of(req.key.kind)?;
        layout::check_attempt(&req.attempt)?;
        if kind == NodeKind::Write && self.owner_reads(&req.key) {
            let HoldKey { owner, name, .. } = &req.key;
            return Err(Error::invalid(format!(
                "owner `{owner}` holds the read side of `{name}` and asks for the write side: that \
                 could wait for itself (or for another upgrading reader) forever; release the \
                 read side first (a writer may take the read side, not the reverse)"
            )));
        }
        let sess = self.session().await?;
        self.check_lease(&sess, req.lease, "a lease")?;
        if let Some(g) = self.regrant(&sess, req).await? {
            return Ok(Some(g));
        }
        if let Some(wg) = req.write_grant.as_ref().filter(|_| kind == NodeKind::Read) {
            if let Some(g) = self.join_write(&sess, req, wg).await? {
                return Ok(Some(g));
            }
        }
        // If this future is dropped midway (a caller that gave up on it), the attempt gives up
        // in the background: its node must not stay in the queue. An error is no give-up: the
        // caller retries the attempt (which finds its node) or gives it up itself.
        let abandon = Abandon {
            inner: Arc::downgrade(self),
            req: Some(req.clone()),
        };
        let decided = async {
            let (node, confirmed_at) = self.node_for(&sess, req, kind).await?;
            let granted_at = (self.wait_turn(&sess, &node, confirmed_at, wait)).await?;
            Ok::<_, Error>((node, granted_at))
        }
        .await;
        abandon.disarm();
        let (node, granted_at) = decided?;
        let granted = match granted_at {
            Some(at) => (self.insert_grant(&sess, req, node.clone()))
                .map(|()| Some(Granted::new(node.token, at))),
            None => Ok(None),
        };
        if !matches!(granted, Ok(Some(_))) {
            // The attempt is over without a grant: its node goes.
            self.state().pending.remove(&req.attempt);
            self.remove_node(&sess, &node.path).await;
        }
        granted
    }

    /// `acquire_wait`: attempts until granted, the deadline or a cancellation, in the core's
    /// retrying loop (connection trouble or a lost session while waiting is retried, and the
    /// last such error reported if the deadline passes right after it). A retry is the same
    /// attempt: it finds its node and keeps its place in the queue if the session survived.
    pub(crate) async fn acquire_wait(
        self: &Arc<Self>,
        req: &AcquireRequest,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<Option<Granted>> {
        let deadline = Deadline::from(deadline);
        let failed = AtomicBool::new(false);
        let failed_ref = &failed;
        let res = wait::retrying(
            deadline,
            cancel,
            RetryPolicy::default(),
            move || async move {
                let r = self.attempt(req, Some((deadline, cancel))).await;
                if r.is_err() {
                    failed_ref.store(true, Ordering::Relaxed);
                }
                r
            },
        )
        .await;
        if !matches!(res, Ok(Some(_))) && failed.load(Ordering::Relaxed) {
            // The attempt's node (kept across the retries) goes.
            give_up_soon(self, req).await;
        }
        res
    }
}
