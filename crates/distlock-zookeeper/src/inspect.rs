//! Reading a lock or election directory's holders through the leader: for `inspect` (and
//! `list`) and for the forced release.

use crate::election::{owner_of, Proclaimed};
use crate::layout::{self, Child, Family, NodeData, NodeKind};
use crate::node::{foreign_data, token_of, unexpected_answer, DATA_ATTEMPTS};
use crate::release::parse_fence;
use crate::session::{Inner, Session};
use crate::KIND;
use distlock_core::{Error, HolderInfo, LockInfo, LockKind, Result};
use std::sync::Arc;
use zookeeper_client as zk;

/// One holder's node as read.
pub(crate) struct Read {
    pub(crate) child: Child,
    /// dlock's node data (a candidate's: its owner, from the node's name).
    pub(crate) data: NodeData,
    /// The node's data as stored (a candidate's: the value it campaigned with).
    pub(crate) raw: Vec<u8>,
    pub(crate) stat: zk::Stat,
}

impl Read {
    /// The holder as `inspect` reports it: one grant per node (re-entry is counted by the
    /// holder's client).
    pub(crate) fn info(&self) -> HolderInfo {
        HolderInfo::new(self.data.owner.clone(), 1)
            .with_side(layout::side(self.child.kind, self.data.downgraded))
    }
}

/// A lock directory's holders, as read through the leader.
pub(crate) struct Holders {
    /// The directory's data (an election's proclamation record) and stat (its version guards
    /// the forced release's rewrite of it).
    pub(crate) dir_data: Vec<u8>,
    pub(crate) dir_stat: zk::Stat,
    /// The fence: the token stored in the directory (none in an election's), raised by every
    /// holder's.
    pub(crate) fence: u64,
    /// The holders' nodes in queue order (a writer at the head that did not downgrade holds
    /// alone: readers behind it wait; an election's leader is its first candidate).
    pub(crate) read: Vec<Read>,
    /// A holder's node went away between the two reads (released meanwhile).
    pub(crate) changed: bool,
    /// How many nodes are queued, holders included.
    pub(crate) queued: usize,
}

impl Inner {
    /// What `inspect` reports for lock `name` of `kind` (for an election: the leader, with
    /// its value).
    pub(crate) async fn inspect(self: &Arc<Self>, name: &str, kind: LockKind) -> Result<LockInfo> {
        let family = NodeKind::of(kind)?.family();
        let sess = self.session().await?;
        let dir = self.dir(name, family);
        let mut tries = 1;
        let held = loop {
            match self.holders(&sess, &dir, family, "inspecting").await? {
                None => return Ok(LockInfo::new(name).with_waiters(Some(0))),
                // A holder went between the two reads: the next ones hold now, look again.
                Some(h) if h.changed && tries < DATA_ATTEMPTS => tries += 1,
                Some(h) => break h,
            }
        };
        let mut infos: Vec<HolderInfo> = held.read.iter().map(Read::info).collect();
        if let (Family::Election, Some(leader)) = (family, held.read.first()) {
            // What it proclaimed since its grant, if anything; else what it campaigned with.
            infos[0].value = Some(match Proclaimed::parse(&dir, &held.dir_data)? {
                Some(p) if Some(p.token) == token_of(&leader.stat) => p.value,
                _ => String::from_utf8_lossy(&leader.raw).into_owned(),
            });
        }
        let waiters = u32::try_from(held.queued.saturating_sub(infos.len())).unwrap_or(u32::MAX);
        Ok(LockInfo::new(name)
            .with_holders(infos)
            .with_fencing_token(held.fence)
            .with_waiters(Some(waiters)))
    }

    /// The holders of lock directory `dir`, read after a sync with the leader in two round
    /// trips (the directory's fence and children; then the holders' nodes, whose data tells a
    /// downgraded writer apart); `None` if the directory does not exist (no token was ever
    /// handed out). `what` names the operation in errors.
    pub(crate) async fn holders(
        &self,
        sess: &Session,
        dir: &str,
        family: Family,
        what: &str,
    ) -> Result<Option<Holders>> {
        self.sync(sess, dir).await?;
        let mut reader = sess.zk.new_multi_reader();
        reader
            .add_get_data(dir)
            .and_then(|()| reader.add_get_children(dir))
            .map_err(|e| self.err(what, e))?;
        let mut it = self.call(what, reader.commit()).await?.into_iter();
        let (dir_data, dir_stat, children) = match (it.next(), it.next()) {
            (
                Some(zk::MultiReadResult::Data { data, stat }),
                Some(zk::MultiReadResult::Children { children }),
            ) => (data, stat, children),
            (
                Some(zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                }),
                _,
            ) => return Ok(None),
            (Some(zk::MultiReadResult::Error { err }), _) => return Err(self.err(what, err)),
            other => return Err(unexpected_answer(what, &other)),
        };
        let stored = match family {
            // An election's directory records proclamations; its tokens are its leaders'.
            Family::Election => 0,
            _ => parse_fence(&dir_data).ok_or_else(|| Error::unexpected(KIND, format!(
                "the lock directory {dir} holds `{}`, not a fencing token; is it used by another program?",
                String::from_utf8_lossy(&dir_data)
            )))?,
        };
        let queue = layout::queue(&children, family);
        let head_is_writer = queue.first().is_some_and(|h| h.kind == NodeKind::Write);
        let candidates = layout::holders(&queue, head_is_writer);
        let mut held = Holders {
            dir_data,
            dir_stat,
            fence: stored,
            read: Vec::new(),
            changed: false,
            queued: queue.len(),
        };
        if candidates.is_empty() {
            return Ok(Some(held));
        }
        let mut reader = sess.zk.new_multi_reader();
        for h in &candidates {
            reader
                .add_get_data(&format!("{dir}/{}", h.name))
                .map_err(|e| self.err(what, e))?;
        }
        let reads = self.call(what, reader.commit()).await?;
        for (h, r) in candidates.iter().zip(reads) {
            match r {
                zk::MultiReadResult::Data { data: raw, stat } => {
                    let data = match h.kind {
                        NodeKind::Latch => NodeData::new(&owner_of(&h.name)),
                        _ => NodeData::parse(&raw)
                            .ok_or_else(|| foreign_data(&format!("{dir}/{}", h.name), &raw))?,
                    };
                    let child = (*h).clone();
                    held.read.push(Read {
                        child,
                        data,
                        raw,
                        stat,
                    });
                }
                zk::MultiReadResult::Error {
                    err: zk::Error::NoNode,
                } => held.changed = true,
                zk::MultiReadResult::Error { err } => return Err(self.err(what, err)),
                other => return Err(unexpected_answer(what, &other)),
            }
        }
        if head_is_writer
            && (held.read.first())
                .is_some_and(|r| r.child.kind == NodeKind::Write && !r.data.downgraded)
        {
            held.read.truncate(1);
        }
        held.fence = (held.read.iter())
            .filter_map(|r| token_of(&r.stat))
            .fold(stored, u64::max);
        Ok(Some(held))
    }
}
