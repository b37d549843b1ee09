//! The live grants of this backend: recorded, found again, joined, renewed (many at once,
//! through the leader).

use crate::layout::{NodeData, NodeKind};
use crate::node::{busy, foreign_data, token_of, DATA_ATTEMPTS};
use crate::session::{session_gone, watch_node, Inner, Session};
use crate::KIND;
use distlock_core::backend::{AcquireRequest, AttemptId, GrantRef, Granted, HoldKey, RenewOutcome};
use distlock_core::clock::Instant as LeaseInstant;
use distlock_core::{Error, LockKind, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use zookeeper_client as zk;

/// One grant: an attempt's node, or (`joined`) a read grant listed in its owner's write node.
#[derive(Clone)]
pub(crate) struct Grant {
    pub(crate) key: HoldKey,
    pub(crate) dir: String,
    pub(crate) name: String,
    pub(crate) path: String,
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
    /// The grant to `key` in session `gen` of node `name` of kind `node` in `dir`, whose czxid
    /// is `token` (its own node, no release under way).
    pub(crate) fn new(
        key: &HoldKey,
        dir: &str,
        name: String,
        node: NodeKind,
        token: u64,
        gen: u64,
    ) -> Self {
        Grant {
            key: key.clone(),
            dir: dir.to_owned(),
            path: format!("{dir}/{name}"),
            name,
            node,
            token,
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

    /// This session's grant `grant` names, if this backend made it.
    pub(crate) fn live_grant(&self, grant: &GrantRef, sess: &Session) -> Option<Grant> {
        self.local_grant(grant).filter(|g| g.gen == sess.gen)
    }

    /// A retry of an attempt that already holds the lock: the same token, if its node is
    /// still there (read through the leader, as a renewal reads it).
    pub(crate) async fn regrant(
        &self,
        sess: &Session,
        req: &AcquireRequest,
    ) -> Result<Option<Granted>> {
        let g = self.state().grants.get(&req.attempt).cloned();
        let Some(g) = g.filter(|g| g.key.kind == req.key.kind) else {
            return Ok(None);
        };
        if g.gen != sess.gen {
            // Its session ended (its lost signal fired): the attempt starts afresh.
            self.forget_grant(&req.attempt);
            return Ok(None);
        }
        let at = LeaseInstant::now();
        let (token, held) = (g.token, [(&req.attempt, g)]);
        let still = self.confirm(sess, &held).await?.remove(0)?;
        Ok(still.then(|| Granted::new(token, at)))
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
        let live = self.live_grant(wg, sess);
        let Some(w) = live.filter(|w| w.key.kind == LockKind::Write && !w.releasing) else {
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

impl Inner {
    /// Confirms many grants at once through the leader.
    pub(crate) async fn renew(
        self: &Arc<Self>,
        holds: &[(GrantRef, Duration)],
    ) -> Result<Vec<RenewOutcome>> {
        if holds.is_empty() {
            return Ok(Vec::new());
        }
        let sess = self.session().await?;
        for (_, lease) in holds {
            self.check_lease(&sess, *lease, "a renewal")?;
        }
        let mut results: Vec<Result<RenewOutcome>> =
            holds.iter().map(|_| Ok(RenewOutcome::NotHeld)).collect();
        // Which items have a live grant of this session, and where.
        let (mut wanted, mut held) = (Vec::new(), Vec::new());
        for (i, (grant, _)) in holds.iter().enumerate() {
            match self.local_grant(grant) {
                // Being released right now: nothing to confirm, nothing lost.
                Some(g) if g.releasing => results[i] = Ok(RenewOutcome::Renewed),
                Some(g) if g.gen == sess.gen => {
                    wanted.push(i);
                    held.push((&grant.attempt, g));
                }
                // A grant of a session that ended (its lost signal fired), or none of ours.
                _ => {}
            }
        }
        for (i, r) in wanted.into_iter().zip(self.confirm(&sess, &held).await?) {
            let renewed = |held| match held {
                true => RenewOutcome::Renewed,
                false => RenewOutcome::NotHeld,
            };
            results[i] = r.map(renewed);
        }
        RenewOutcome::each(KIND, holds, results)
    }

    /// Whether each grant of `held` (its attempt and grant, of session `sess`) still holds, its
    /// node read through the leader; one found not held is forgotten (the caller reports it),
    /// and the other grants on a node found gone are lost. A node that cannot be read (data
    /// dlock did not write, an error for that node alone) leaves the grants on it unconfirmed,
    /// not the others.
    async fn confirm(
        &self,
        sess: &Session,
        held: &[(&AttemptId, Grant)],
    ) -> Result<Vec<Result<bool>>> {
        // Each node once, with whether it is a candidate's (holding its value, not dlock's data).
        let mut paths: Vec<(&str, bool)> = (held.iter())
            .map(|(_, g)| (g.path.as_str(), g.node == NodeKind::Latch))
            .collect();
        paths.sort_unstable();
        paths.dedup();
        let answers = self.read_through_leader(&sess.zk, &paths).await?;
        let nodes: HashMap<&str, Read> = (paths.iter().zip(answers))
            .map(|((p, latch), r)| (*p, read_of(r, sess.id, *latch)))
            .collect();
        let confirmed = (held.iter())
            .map(|(attempt, g)| match nodes.get(g.path.as_str()) {
                Some(Err(unread)) => Err(unread.error(self, &g.path)),
                Some(Ok(Some((nd, stat)))) if still_held(g, nd, stat, attempt) => Ok(true),
                _ => {
                    self.forget_grant(attempt);
                    Ok(false)
                }
            })
            .collect();
        for (p, _) in nodes.iter().filter(|(_, r)| matches!(r, Ok(None))) {
            self.node_gone(p, sess.gen);
        }
        Ok(confirmed)
    }

    /// Reads the nodes `paths` (sorted, deduplicated) through the leader: the sync goes to the
    /// leader, and the read is answered only after it, so a server cut off from the leader
    /// (which may have expired our session already) cannot confirm. Both are sent at once (the
    /// server answers a session's requests in order). One answer per path, in order.
    async fn read_through_leader(
        &self,
        zk: &zk::Client,
        paths: &[(&str, bool)],
    ) -> Result<Vec<zk::MultiReadResult>> {
        let what = "renewing through the leader";
        let Some((first, _)) = paths.first() else {
            return Ok(Vec::new());
        };
        let mut reader = zk.new_multi_reader();
        for (p, _) in paths {
            reader.add_get_data(p).map_err(|e| self.err(what, e))?;
        }
        let (sync, read) = (zk.sync(first), reader.commit());
        let both = async {
            match tokio::join!(sync, read) {
                (Ok(()) | Err(zk::Error::NoNode), read) => read,
                (Err(e), _) => Err(e),
            }
        };
        let results = self.call(what, both).await?;
        if results.len() != paths.len() {
            let (asked, got) = (paths.len(), results.len());
            let e = format!("renewal read {asked} nodes and got {got} answers");
            return Err(Error::unexpected(KIND, e));
        }
        Ok(results)
    }
}

/// What the renewal read `answer` of one node says, for session `session`: the node's data
/// and stat if the session still owns it (a latch node's data is the candidate's value, not
/// dlock's node data), `None` if it is gone or another session's.
fn read_of(answer: zk::MultiReadResult, session: i64, latch: bool) -> Read {
    match answer {
        zk::MultiReadResult::Data { stat, .. } if stat.ephemeral_owner == session && latch => {
            Ok(Some((NodeData::default(), stat)))
        }
        zk::MultiReadResult::Data { data, stat } if stat.ephemeral_owner == session => {
            match NodeData::parse(&data) {
                Some(nd) => Ok(Some((nd, stat))),
                None => Err(Unread::Foreign(data)),
            }
        }
        zk::MultiReadResult::Data { .. } => Ok(None),
        zk::MultiReadResult::Error {
            err: zk::Error::NoNode,
        } => Ok(None),
        zk::MultiReadResult::Error { err } => Err(Unread::Refused(err)),
        other => Err(Unread::Answer(format!("{other:?}"))),
    }
}

/// What the renewal read of one node found: the node if it is still this session's.
type Read = std::result::Result<Option<(NodeData, zk::Stat)>, Unread>;

/// Why a node of a renewal batch could not be read.
enum Unread {
    /// Data dlock did not write.
    Foreign(Vec<u8>),
    /// The server refused the read of this node (e.g. its ACL changed).
    Refused(zk::Error),
    /// An answer of a kind a read does not give.
    Answer(String),
}

impl Unread {
    fn error(&self, inner: &Inner, path: &str) -> Error {
        match self {
            Unread::Foreign(data) => foreign_data(path, data),
            Unread::Refused(e) => inner.err(&format!("renewing {path}"), e.clone()),
            Unread::Answer(a) => {
                Error::unexpected(KIND, format!("renewal of {path}: unexpected answer {a}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(czxid: i64, owner: i64) -> zk::Stat {
        zk::Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: owner,
            data_length: 0,
            num_children: 0,
        }
    }

    fn grant(node: NodeKind, joined: bool) -> Grant {
        let key = HoldKey::new("n", "o", LockKind::Mutex);
        let g = Grant::new(&key, "/d/n", "x".into(), node, 7, 1);
        Grant { joined, ..g }
    }

    #[test]
    fn a_grant_holds_while_its_node_has_its_token_and_lists_it() {
        let nd = NodeData::new("o");
        let down = NodeData {
            downgraded: true,
            ..nd.clone()
        };
        let shared = NodeData {
            readers: vec!["a".into()],
            ..nd.clone()
        };
        for (node, joined, data, czxid, attempt, held) in [
            (NodeKind::Lock, false, &nd, 7, "a", true),
            (NodeKind::Lock, false, &nd, 8, "a", false),
            (NodeKind::Write, false, &down, 7, "a", false),
            (NodeKind::Write, true, &shared, 7, "a", true),
            (NodeKind::Write, true, &shared, 7, "b", false),
        ] {
            let g = grant(node, joined);
            assert_eq!(still_held(&g, data, &stat(czxid, 1), attempt), held);
        }
    }

    #[test]
    fn a_node_read_is_ours_gone_or_unreadable() {
        let read = |data: &[u8], owner, latch| {
            let stat = stat(7, owner);
            read_of(
                zk::MultiReadResult::Data {
                    data: data.to_vec(),
                    stat,
                },
                1,
                latch,
            )
        };
        let error = |err| read_of(zk::MultiReadResult::Error { err }, 1, false);
        let data = NodeData::new("o").encode();
        assert!(matches!(read(&data, 1, false), Ok(Some((nd, _))) if nd.owner == "o"));
        let foreign = read(b"\xff not dlock's data", 1, false);
        assert!(matches!(foreign, Err(Unread::Foreign(_))));
        assert!(matches!(read(b"a candidate's value", 1, true), Ok(Some(_))));
        assert!(
            matches!(read(&data, 2, false), Ok(None)),
            "another session's"
        );
        assert!(matches!(error(zk::Error::NoNode), Ok(None)));
        assert!(matches!(error(zk::Error::NoAuth), Err(Unread::Refused(_))));
    }
}
