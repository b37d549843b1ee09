//! Lock nodes: created (or found again after a lost answer), listed, deleted.

use crate::grant::Grant;
use crate::layout::{self, NodeData, NodeKind};
use crate::session::{connection_died, session_gone, Inner, Session};
use crate::KIND;
use distlock_core::backend::{AcquireRequest, AttemptId};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{Error, Result};
use std::sync::Arc;
use zookeeper_client as zk;

/// Attempts to create a lock node (missing parents, lost replies) before giving up.
pub(crate) const CREATE_ATTEMPTS: usize = 4;

/// Attempts of a compare-and-set on a node's data (concurrent joins and releases of one
/// node) before giving up.
pub(crate) const DATA_ATTEMPTS: usize = 8;

pub(crate) fn token_of(stat: &zk::Stat) -> Option<u64> {
    u64::try_from(stat.czxid).ok().filter(|t| *t > 0)
}

/// An answer of a multi-op that is not one of those asked for.
pub(crate) fn unexpected_answer(what: &str, answer: &impl std::fmt::Debug) -> Error {
    Error::unexpected(KIND, format!("{what}: unexpected answer {answer:?}"))
}

pub(crate) fn foreign_data(path: &str, data: &[u8]) -> Error {
    foreign(&format!("lock node {path}"), data, "dlock's data")
}

/// `place` holds `data` where dlock expects `expected`.
pub(crate) fn foreign(place: &str, data: &[u8], expected: &str) -> Error {
    let data = String::from_utf8_lossy(data);
    let e = format!("{place} holds `{data}`, not {expected}; is it used by another program?");
    Error::unexpected(KIND, e)
}

/// A compare-and-set on a node's data lost every race (readers joining and leaving it all the
/// time): retryable, like a busy connection.
pub(crate) fn busy(endpoint: &str, path: &str) -> Error {
    Error::connection(
        KIND,
        endpoint.to_owned(),
        format!("lock node {path} kept changing under {DATA_ATTEMPTS} compare-and-set attempts"),
    )
}

/// Deletes the children of `prefix`'s directory whose names start with its last segment.
pub(crate) async fn delete_by_prefix(zk: &zk::Client, prefix: &str) {
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
            Err(e) if connection_died(&e) => continue,
            Err(_) => return,
        }
    }
}

impl Inner {
    /// The node of attempt `req`: found again if an earlier request of the attempt sent a
    /// create (its answer may have been lost), created otherwise. Also returns a time no later
    /// than a request of ours that the leader processed after the node existed.
    pub(crate) async fn node_for(
        self: &Arc<Self>,
        sess: &Arc<Session>,
        req: &AcquireRequest,
        kind: NodeKind,
    ) -> Result<(Grant, LeaseInstant)> {
        let dir = self.dir(&req.key.name, kind.family());
        let prefix = layout::name_prefix(&req.attempt, kind, &req.key.owner);
        let grant = |(name, token)| Grant::new(&req.key, &dir, name, kind, token, sess.gen);
        if self.state().pending.contains(&req.attempt) {
            let at = LeaseInstant::now();
            if let Some(node) = self.find_node(sess, &dir, &prefix).await? {
                return Ok((grant(node), at));
            }
        }
        self.state().pending.insert(req.attempt.clone());
        let at = LeaseInstant::now();
        let node = self.create_node(sess, req, kind, &dir, &prefix).await?;
        Ok((grant(node), at))
    }

    /// The name and token of this session's node of the attempt whose names start with
    /// `prefix`, found again (a create whose answer was lost).
    async fn find_node(
        &self,
        sess: &Session,
        dir: &str,
        prefix: &str,
    ) -> Result<Option<(String, u64)>> {
        for name in self.attempt_nodes(sess, dir, prefix).await? {
            let path = format!("{dir}/{name}");
            match self
                .call("reading the lock node", sess.zk.check_stat(&path))
                .await?
            {
                Some(st) if st.ephemeral_owner == sess.id => {
                    if let Some(token) = token_of(&st) {
                        return Ok(Some((name, token)));
                    }
                }
                // This attempt's node of a session we stopped using (its holds were declared
                // lost then): nobody relies on it, and it would block the queue until the
                // server expires that session.
                Some(_) => self.remove_node(sess, &path).await,
                None => {}
            }
        }
        Ok(None)
    }

    /// Creates the ephemeral sequential node `<dir>/<prefix><seq>` (and its parents when
    /// missing): its name and token.
    pub(crate) async fn create_node(
        self: &Arc<Self>,
        sess: &Session,
        req: &AcquireRequest,
        kind: NodeKind,
        dir: &str,
        prefix: &str,
    ) -> Result<(String, u64)> {
        let mut made_dir = false;
        let data = match kind {
            // A candidate's node holds its value alone: Curator's `LeaderLatch` shows a node's
            // data as the participant's id (the owner id is in the node's name).
            NodeKind::Latch => req.value.as_deref().unwrap_or_default().as_bytes().to_vec(),
            _ => NodeData::new(&req.key.owner).encode(),
        };
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
                    return Ok((name, token));
                }
                Err(zk::Error::NoNode) if !made_dir => {
                    made_dir = true;
                    self.make_dir(sess, dir, "creating the lock directory")
                        .await?;
                }
                Err(e) if connection_died(&e) => {
                    // The create may have happened: look for our attempt's node.
                    if let Some(node) = self.find_node(sess, dir, prefix).await? {
                        return Ok(node);
                    }
                }
                Err(e) => return Err(self.err("creating the lock node", e)),
            }
        }
        Err(Error::connection(
            KIND,
            self.endpoint.clone(),
            format!("could not create a lock node in {dir} after {CREATE_ATTEMPTS} attempts"),
        ))
    }

    /// Sends the create from a task of its own. If its answer comes after we stopped waiting
    /// for it, the node stays for the attempt's retry (which finds it by its name) or its
    /// give-up (which deletes it) — unless the attempt is no longer pending (given up, or its
    /// caller dropped), then the task deletes the node itself, so it is never left behind.
    pub(crate) async fn create_detached(
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
        let acls = self.acl.acls();
        tokio::spawn(async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(acls);
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
                Err(e) if connection_died(&e) => delete_by_prefix(&zk, &prefix).await,
                Err(_) => {}
            }
        });
        (self.timed("creating the lock node", rx).await?)
            .map_err(|_| Error::runtime("the ZooKeeper create task ended unexpectedly"))
    }

    pub(crate) async fn czxid(&self, sess: &Session, path: &str) -> Result<u64> {
        let stat = self.call("reading the lock node", sess.zk.check_stat(path));
        let Some(stat) = stat.await? else {
            let why = "our lock node vanished right after its creation";
            return Err(session_gone(&self.endpoint, why));
        };
        token_of(&stat)
            .ok_or_else(|| Error::unexpected(KIND, format!("node {path} has czxid {}", stat.czxid)))
    }

    /// The nodes in `dir` whose names start with `prefix` (an attempt's), read after a sync:
    /// so every create of ours the leader applied is seen, even one whose answer was lost with
    /// the connection.
    pub(crate) async fn attempt_nodes(
        &self,
        sess: &Session,
        dir: &str,
        prefix: &str,
    ) -> Result<Vec<String>> {
        self.sync(sess, dir).await?;
        let mut names = self.list(sess, dir).await?;
        names.retain(|c| c.starts_with(prefix));
        Ok(names)
    }

    pub(crate) async fn list(&self, sess: &Session, dir: &str) -> Result<Vec<String>> {
        let what = "listing the lock queue";
        let children = self.call_unless(what, zk::Error::NoNode, sess.zk.list_children(dir));
        Ok(children.await?.unwrap_or_default())
    }

    /// Deletes a node we no longer want (a waiter that gives up, a try that found the lock
    /// held), retrying in the background if the connection is down; a node that cannot be
    /// deleted at all goes with its session.
    pub(crate) async fn remove_node(&self, sess: &Session, path: &str) {
        let (zk, path, op_timeout) = (sess.zk.clone(), path.to_owned(), self.op_timeout);
        let task = tokio::spawn(async move {
            let mut backoff = distlock_core::backoff::Backoff::default();
            for _ in 0..5 {
                match tokio::time::timeout(op_timeout, zk.delete(&path, None)).await {
                    Ok(Ok(()) | Err(zk::Error::NoNode)) => return,
                    // The node went with its session.
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
}
