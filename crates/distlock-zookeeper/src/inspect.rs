//! `inspect`: the lock's holders, waiters and last fencing token, read through the leader.

use crate::error::KIND;
use crate::layout::{self, Child, NodeData, NodeKind};
use crate::node::{foreign_data, token_of};
use crate::release::parse_fence;
use crate::session::Inner;
use distlock_core::{Error, HolderInfo, LockInfo, LockKind, Result};
use std::sync::Arc;
use zookeeper_client as zk;

impl Inner {
    /// What `inspect` reports for lock `name` of `kind`.
    pub(crate) async fn inspect(self: &Arc<Self>, name: &str, kind: LockKind) -> Result<LockInfo> {
        let inner = self;
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
            ) => return Ok(LockInfo::new(name).with_waiters(Some(0))),
            (Some(zk::MultiReadResult::Error { err }), _) => {
                return Err(inner.err("inspecting", err))
            }
            other => {
                return Err(Error::unexpected(
                    KIND,
                    format!("inspect: unexpected answer {other:?}"),
                ))
            }
        };
        let mut fencing_token = parse_fence(&fence_data).ok_or_else(|| Error::unexpected(KIND, format!(
                "the lock directory {dir} holds `{}`, not a fencing token; is it used by another program?",
                String::from_utf8_lossy(&fence_data)
            )))?;
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
                        return Err(Error::unexpected(
                            KIND,
                            format!("inspect: unexpected answer {other:?}"),
                        ))
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
            infos.push(HolderInfo::new(nd.owner.clone(), 1).with_side(side));
        }
        let waiters = u32::try_from(queue.len().saturating_sub(infos.len())).unwrap_or(u32::MAX);
        Ok(LockInfo::new(name)
            .with_holders(infos)
            .with_fencing_token(fencing_token)
            .with_waiters(Some(waiters)))
    }
}
