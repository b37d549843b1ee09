//! Renewals: confirming many grants at once through the leader.

use crate::grant::{still_held, Grant};
use crate::layout::{NodeData, NodeKind};
use crate::node::foreign_data;
use crate::session::Inner;
use crate::KIND;
use distlock_core::backend::{GrantRef, RenewOutcome};
use distlock_core::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use zookeeper_client as zk;

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
        let mut wanted: Vec<(usize, Grant)> = Vec::new();
        for (i, (grant, _)) in holds.iter().enumerate() {
            match self.local_grant(grant) {
                // Being released right now: nothing to confirm, nothing lost.
                Some(g) if g.releasing => results[i] = Ok(RenewOutcome::Renewed),
                Some(g) if g.gen == sess.gen => wanted.push((i, g)),
                // A grant of a session that ended (its lost signal fired), or none of ours.
                _ => {}
            }
        }
        // Each node once, with whether it is a candidate's (holding its value, not dlock's data).
        let mut paths: Vec<(&str, bool)> = (wanted.iter())
            .map(|(_, g)| (g.path.as_str(), g.node == NodeKind::Latch))
            .collect();
        paths.sort_unstable();
        paths.dedup();
        let answers = self.read_through_leader(&sess.zk, &paths).await?;
        // A node that cannot be read (data dlock did not write, an error for that node alone)
        // leaves the holds on it unconfirmed, not the others of the batch.
        let mut nodes: HashMap<&str, Read> = HashMap::new();
        for ((p, latch), r) in paths.iter().zip(answers) {
            let node = read_of(r, sess.id, *latch);
            if matches!(node, Ok(None)) {
                self.node_gone(p, sess.gen);
            }
            nodes.insert(p, node);
        }
        for (i, g) in &wanted {
            let held = match nodes.get(g.path.as_str()) {
                Some(Ok(Some((nd, stat)))) => still_held(g, nd, stat, &holds[*i].0.attempt),
                Some(Err(unread)) => {
                    results[*i] = Err(unread.error(self, &g.path));
                    continue;
                }
                _ => false,
            };
            if held {
                results[*i] = Ok(RenewOutcome::Renewed);
            } else {
                self.forget_grant(&holds[*i].0.attempt);
            }
        }
        RenewOutcome::each(KIND, holds, results)
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
    use distlock_core::backend::HoldKey;
    use distlock_core::LockKind;

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
        let g = Grant::new(
            key,
            &crate::node::Created::new("/d/n", "x".into(), node, 7),
            1,
        );
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
