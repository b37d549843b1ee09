//! Releasing a grant and giving up an attempt: deleting (or updating) its node, recording the fence.

use crate::grant::Grant;
use crate::layout::{self, Family, NodeData, NodeKind};
use crate::node::{busy, foreign_data, token_of, DATA_ATTEMPTS};
use crate::session::{connection_died, Inner, Session};
use distlock_core::backend::{AcquireRequest, AttemptId, GrantRef};
use distlock_core::{ReleaseOutcome, Result};
use std::sync::Arc;
use zookeeper_client as zk;

/// What releasing a grant does to its node.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role<'a> {
    /// The node is the grant's own: delete it (a `write-` node that readers joined is marked
    /// downgraded instead).
    Own,
    /// A read grant listed in a write node: take it off the list.
    Joined(&'a str),
}

pub(crate) fn parse_fence(data: &[u8]) -> Option<u64> {
    if data.is_empty() {
        return Some(0);
    }
    std::str::from_utf8(data).ok()?.trim().parse().ok()
}

/// What releasing a grant does to its `read-`/`write-` node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The grant is not in the node any more: nothing to do.
    NotThere,
    /// Write this data (the node stays: others hold it).
    Update(NodeData),
    /// Delete the node (recording the fence).
    Delete,
}

/// What releasing `role` of a grant whose node is of kind `node` (`Read` or `Write`) and
/// holds `nd` does to that node.
pub(crate) fn step(node: NodeKind, role: Role<'_>, mut nd: NodeData) -> Step {
    match role {
        Role::Own if node == NodeKind::Write && nd.downgraded => Step::NotThere,
        // Readers joined the write side: the node stays theirs (a downgrade).
        Role::Own if node == NodeKind::Write && !nd.readers.is_empty() => {
            nd.downgraded = true;
            Step::Update(nd)
        }
        Role::Own => Step::Delete,
        Role::Joined(attempt) => {
            let before = nd.readers.len();
            nd.readers.retain(|r| r != attempt);
            if nd.readers.len() == before {
                Step::NotThere
            } else if nd.downgraded && nd.readers.is_empty() {
                // The last reader of a downgraded node: nobody holds it any more.
                Step::Delete
            } else {
                Step::Update(nd)
            }
        }
    }
}

/// A delete or update's answer, with the node gone read as "the grant was not there".
fn gone_is_none(
    r: std::result::Result<(), zk::Error>,
) -> std::result::Result<Option<()>, zk::Error> {
    match r {
        Ok(()) => Ok(Some(())),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Inner {
    /// Deletes the node of a released grant and records its token as the lock's last one (the
    /// directory's data), in one atomic multi-op. Readers overlap, so a reader writes the
    /// maximum with a version check; a writer or mutex holder is alone and just writes its own.
    /// `version`: the node's data version the caller decided on (a `write-` node others may
    /// join), or `None` for any.
    pub(crate) async fn delete_recording_fence(
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
            let added = w.add_set_data(&g.dir, fence.as_bytes(), dir_version);
            if let Err(err) = added.and_then(|()| w.add_delete(&g.path, version)) {
                return Ok(Err(err));
            }
            match self.commit("releasing the lock node", w).await? {
                Ok(_) => return Ok(Ok(())),
                Err((Some(0), zk::Error::BadVersion)) => continue,
                Err((Some(0), zk::Error::NoNode)) => break,
                Err((_, e)) => return Ok(Err(e)),
            }
        }
        // Busy readers (or no directory data): delete without recording.
        self.timed("releasing the lock node", sess.zk.delete(&g.path, version))
            .await
    }

    /// Releases grant `g` (whose node is in session `sess`): deletes its node, or for a node
    /// others share, changes its data. `Ok(None)` when the grant was not there any more.
    pub(crate) async fn retire(
        &self,
        sess: &Session,
        g: &Grant,
        role: Role<'_>,
    ) -> Result<std::result::Result<Option<()>, zk::Error>> {
        let alone = match g.node {
            // No fence to record: an election's tokens are its leaders' creation zxids, and its
            // directory may be a container node of Curator's (deleted by the server when empty).
            NodeKind::Latch => Some(
                self.timed("resigning", sess.zk.delete(&g.path, None))
                    .await?,
            ),
            NodeKind::Lock => Some(self.delete_recording_fence(sess, g, false, None).await?),
            NodeKind::Read | NodeKind::Write => None,
        };
        if let Some(r) = alone {
            return Ok(gone_is_none(r));
        }
        for _ in 0..DATA_ATTEMPTS {
            let read = sess.zk.get_data(&g.path);
            let (data, stat) = match self.timed("reading the lock node", read).await? {
                Ok(v) => v,
                Err(e) => return Ok(gone_is_none(Err(e))),
            };
            if token_of(&stat) != Some(g.token) {
                return Ok(Ok(None));
            }
            let nd = NodeData::parse(&data).ok_or_else(|| foreign_data(&g.path, &data))?;
            let reads_only = g.node == NodeKind::Read || nd.downgraded;
            let r = match step(g.node, role, nd) {
                Step::NotThere => return Ok(Ok(None)),
                Step::Update(nd) => {
                    let set = sess.zk.set_data(&g.path, &nd.encode(), Some(stat.version));
                    self.timed("updating the lock node", set).await?.map(drop)
                }
                Step::Delete => {
                    self.delete_recording_fence(sess, g, reads_only, Some(stat.version))
                        .await?
                }
            };
            match r {
                Err(zk::Error::BadVersion) => continue,
                r => return Ok(gone_is_none(r)),
            }
        }
        Err(busy(&self.endpoint, &g.path))
    }

    /// What a release of a grant that is not there says: `TakenByOther` if someone holds the
    /// lock now, `Expired` if nobody does (read at the leader's state).
    pub(crate) async fn absent(
        &self,
        sess: &Session,
        dir: &str,
        family: Family,
    ) -> Result<ReleaseOutcome> {
        self.sync(sess, dir).await?;
        let queue = layout::queue(&self.list(sess, dir).await?, family);
        Ok(if queue.is_empty() {
            ReleaseOutcome::Expired
        } else {
            ReleaseOutcome::TakenByOther
        })
    }

    /// Releases grant `grant`.
    pub(crate) async fn release(self: &Arc<Self>, grant: &GrantRef) -> Result<ReleaseOutcome> {
        let kind = NodeKind::of(grant.key.kind)?;
        let dir = self.dir(&grant.key.name, kind.family());
        let sess = self.session().await?;
        let local = (self.state().grants.get_mut(&grant.attempt))
            .filter(|g| g.token == grant.token && g.key.kind == grant.key.kind && g.gen == sess.gen)
            .map(|g| {
                // The watch on the node will see our own delete: not a loss.
                g.releasing = true;
                g.clone()
            });
        let g = match local {
            Some(g) => g,
            None => {
                // Not a grant of this session: find it on the server by its address.
                self.forget_grant(&grant.attempt);
                match self.find_grant(&sess, grant, kind, &dir).await? {
                    Some(g) => g,
                    None => return self.absent(&sess, &dir, kind.family()).await,
                }
            }
        };
        let role = if g.joined {
            Role::Joined(grant.attempt.as_str())
        } else {
            Role::Own
        };
        match self.retire(&sess, &g, role).await {
            Ok(Ok(found)) => {
                self.forget_grant(&grant.attempt);
                // Not there after a delete whose answer was lost: that delete released it.
                if found.is_some() || g.delete_sent {
                    return Ok(ReleaseOutcome::Released);
                }
                self.absent(&sess, &dir, kind.family()).await
            }
            Ok(Err(e)) => {
                self.release_failed(&grant.attempt, connection_died(&e));
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
    pub(crate) fn release_failed(&self, attempt: &AttemptId, maybe_sent: bool) {
        if let Some(g) = self.state().grants.get_mut(attempt) {
            g.releasing = false;
            g.delete_sent |= maybe_sent;
        }
    }

    /// A grant this backend has no record of (another session's, or one it already released),
    /// found on the server: the attempt's node, if it has the grant's token.
    async fn find_grant(
        &self,
        sess: &Session,
        grant: &GrantRef,
        kind: NodeKind,
        dir: &str,
    ) -> Result<Option<Grant>> {
        layout::check_attempt(&grant.attempt)?;
        let prefix = layout::name_prefix(&grant.attempt, kind, &grant.key.owner);
        let found = self.attempt_nodes(sess, dir, &prefix).await?;
        let Some(name) = found.into_iter().next() else {
            return Ok(None);
        };
        // The attempt's node, but is it this grant? (A stale address names an older token.)
        let read = sess.zk.check_stat(&format!("{dir}/{name}"));
        let stat = self.call("reading the lock node", read).await?;
        if stat.is_none_or(|st| token_of(&st) != Some(grant.token)) {
            return Ok(None);
        }
        Ok(Some(Grant {
            releasing: true,
            ..Grant::new(&grant.key, dir, name, kind, grant.token, sess.gen)
        }))
    }

    /// Gives up attempt `req`: its grant (if it got one) is released, its waiting node (if it
    /// created one) deleted, and a read grant it joined to its owner's write node taken off.
    /// Nothing of another attempt is touched: every node name and list entry carries the
    /// attempt id.
    pub(crate) async fn give_up(self: &Arc<Self>, req: &AcquireRequest) -> Result<()> {
        let kind = NodeKind::of(req.key.kind)?;
        layout::check_attempt(&req.attempt)?;
        self.state().pending.remove(&req.attempt);
        let granted = (self.state().grants.get(&req.attempt)).map(|g| req.grant(g.token));
        if let Some(grant) = granted {
            self.release(&grant).await?;
        }
        let sess = self.session().await?;
        let dir = self.dir(&req.key.name, kind.family());
        let prefix = layout::name_prefix(&req.attempt, kind, &req.key.owner);
        for name in self.attempt_nodes(&sess, &dir, &prefix).await? {
            let delete = sess.zk.delete(&format!("{dir}/{name}"), None);
            (self.call_unless("deleting a lock node", zk::Error::NoNode, delete)).await?;
        }
        if let Some(wg) = req.write_grant.as_ref().filter(|_| kind == NodeKind::Read) {
            // A join whose answer was lost: this attempt may be listed in the write node.
            if let Some(w) = self.live_grant(wg, &sess) {
                let g = Grant {
                    key: req.key.clone(),
                    joined: true,
                    releasing: true,
                    ..w
                };
                let role = Role::Joined(req.attempt.as_str());
                if let Err(e) = self.retire(&sess, &g, role).await? {
                    return Err(self.err("leaving the write node", e));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(downgraded: bool, readers: &[&str]) -> NodeData {
        NodeData {
            owner: "o".into(),
            downgraded,
            readers: readers.iter().map(|r| (*r).to_owned()).collect(),
        }
    }

    #[test]
    fn what_a_release_does_to_its_node() {
        use NodeKind::{Read, Write};
        let (own, r1, r3) = (Role::Own, Role::Joined("r1"), Role::Joined("r3"));
        let up = |downgraded, readers| Step::Update(d(downgraded, readers));
        for (node, role, before, after) in [
            (Read, own, d(false, &[]), Step::Delete),
            (Write, own, d(false, &[]), Step::Delete),
            // The write side released while its owner's read grants share the node: a downgrade.
            (Write, own, d(false, &["r1"]), up(true, &["r1"])),
            // Released already (a retry after a lost reply).
            (Write, own, d(true, &["r1"]), Step::NotThere),
            (Write, r1, d(false, &["r1", "r2"]), up(false, &["r2"])),
            (Write, r1, d(false, &["r1"]), up(false, &[])),
            // The last reader of a downgraded node: nobody holds it.
            (Write, r1, d(true, &["r1"]), Step::Delete),
            (Write, r3, d(true, &["r1"]), Step::NotThere),
        ] {
            assert_eq!(step(node, role, before), after);
        }
    }
}
