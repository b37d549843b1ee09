//! The live grants of this backend: recorded, found again, joined.

use crate::layout::{NodeData, NodeKind};
use crate::node::{busy, foreign_data, token_of, Created, DATA_ATTEMPTS};
use crate::session::{session_gone, watch_node, Inner, Session};
use distlock_core::backend::{AcquireRequest, AttemptId, GrantRef, Granted, HoldKey};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{LockKind, Result};
use std::sync::Arc;
use zookeeper_client as zk;

/// One grant: an attempt's node, or (`joined`) a read grant listed in its owner's write node.
#[derive(Clone)]
pub(crate) struct Grant {
    pub(crate) key: HoldKey,
    pub(crate) path: String,
    pub(crate) dir: String,
    /// What the node at `path` is (a joined read grant's node is a `write-` node).
    pub(crate) node: NodeKind,
    pub(crate) token: u64,
    pub(crate) gen: u64,
    pub(crate) joined: bool,
    /// Our own release of it is under way: the node's deletion is no loss.
    pub(crate) releasing: bool,
    /// A delete was sent but its outcome is unknown: the node's deletion is no loss, and the
    /// release's retry that finds it gone reports it released.
    pub(crate) delete_sent: bool,
}

impl Grant {
    /// The grant of `node` to `key` in session `gen` (its own node, no release under way).
    pub(crate) fn new(key: HoldKey, node: &Created, gen: u64) -> Self {
        Grant {
            key,
            path: node.path.clone(),
            dir: node.dir.clone(),
            node: node.node,
            token: node.token,
            gen,
            joined: false,
            releasing: false,
            delete_sent: false,
        }
    }
}

/// Whether grant `g` of attempt `attempt` still holds, its node read as `nd` with `stat`: the
/// node has the grant's token, and a reader joined to a shared node is still listed in it,
/// or a write grant's node was not downgraded. (A candidate's node holds its value, not
/// dlock's data: the node itself is the grant, read as the default data.)
pub(crate) fn still_held(g: &Grant, nd: &NodeData, stat: &zk::Stat, attempt: &str) -> bool {
    token_of(stat) == Some(g.token)
        && if g.joined {
            nd.readers.iter().any(|r| *r == attempt)
        } else {
            g.node != NodeKind::Write || !nd.downgraded
        }
}

impl Inner {
    /// True when this backend holds a read grant of `key`'s owner on `key`'s lock: a write
    /// attempt of that owner would queue behind its own reader and wait forever.
    pub(crate) fn owner_reads(&self, key: &HoldKey) -> bool {
        self.state().grants.values().any(|g| {
            g.key.kind == LockKind::Read && g.key.name == key.name && g.key.owner == key.owner
        })
    }

    /// The grant `grant` names, if this backend made it (attempt and token).
    pub(crate) fn local_grant(&self, grant: &GrantRef) -> Option<Grant> {
        self.state()
            .grants
            .get(&grant.attempt)
            .filter(|g| g.token == grant.token && g.key.kind == grant.key.kind)
            .cloned()
    }

    /// The grant of `attempt` is over (released, or found not held by a renewal, which
    /// reports it): no loss to signal.
    pub(crate) fn forget_grant(&self, attempt: &AttemptId) {
        let mut st = self.state();
        st.grants.remove(attempt);
        if let Some(s) = &st.session {
            s.lost.remove(attempt);
        }
    }

    /// A retry of an attempt that already holds the lock: the same token, if its node is
    /// still there (checked after a sync, so against the leader's state).
    pub(crate) async fn regrant(
        &self,
        sess: &Session,
        req: &AcquireRequest,
    ) -> Result<Option<Granted>> {
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
        let read = sess.zk.get_data(&g.path);
        let read = self.call_unless("reading the lock node", zk::Error::NoNode, read);
        let still = read.await?.is_some_and(|(data, stat)| {
            let nd = match g.node {
                NodeKind::Latch => Some(NodeData::default()),
                _ => NodeData::parse(&data),
            };
            stat.ephemeral_owner == sess.id
                && nd.is_some_and(|nd| still_held(&g, &nd, &stat, &req.attempt))
        });
        if still {
            return Ok(Some(Granted::new(g.token, at)));
        }
        self.forget_grant(&req.attempt);
        self.node_gone(&g.path, g.gen);
        Ok(None)
    }

    /// The read side beside this owner's live write grant `wg` (a downgrade): the read grant
    /// is listed in the write node's data and shares its token. `None` if that write grant is
    /// not live here (the read side then queues like any reader).
    pub(crate) async fn join_write(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        req: &AcquireRequest,
        wg: &GrantRef,
    ) -> Result<Option<Granted>> {
        let Some(w) = self
            .local_grant(wg)
            .filter(|w| w.gen == sess.gen && w.key.kind == LockKind::Write && !w.releasing)
        else {
            return Ok(None);
        };
        let at = LeaseInstant::now();
        self.sync(sess, &w.path).await?;
        for _ in 0..DATA_ATTEMPTS {
            let read = sess.zk.get_data(&w.path);
            let what = "reading the write node";
            let Some((data, stat)) = self.call_unless(what, zk::Error::NoNode, read).await? else {
                return Ok(None);
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
                let what = "joining the write node";
                let set = sess.zk.set_data(&w.path, &nd.encode(), Some(stat.version));
                match self.timed(what, set).await? {
                    Ok(_) => {}
                    Err(zk::Error::BadVersion) => continue,
                    Err(zk::Error::NoNode) => return Ok(None),
                    Err(e) => return Err(self.err(what, e)),
                }
            }
            let grant = Grant {
                key: req.key.clone(),
                joined: true,
                delete_sent: false,
                ..w
            };
            self.insert_grant(sess, req, grant)?;
            return Ok(Some(Granted::new(w.token, at)));
        }
        Err(busy(&self.endpoint, &w.path))
    }

    pub(crate) fn insert_grant(
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
            let watched = (st.grants.values()).any(|g| g.path == path && g.gen == sess.gen);
            st.pending.remove(&req.attempt);
            st.grants.insert(req.attempt.clone(), grant);
            sess.lost.register(req.attempt.clone(), req.lost.clone());
            if watched {
                return Ok(());
            }
        }
        let (inner, ended) = (Arc::downgrade(self), sess.ended.clone());
        tokio::spawn(watch_node(inner, sess.gen, path, ended));
        Ok(())
    }
}
