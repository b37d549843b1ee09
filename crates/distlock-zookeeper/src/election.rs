//! Elections: Curator's `LeaderLatch` recipe, with fencing tokens and numbered proclamations
//! (docs/election-zk.md). A candidate's node holds the value it campaigned with and never
//! changes: Curator's next candidate keeps a one-shot *data* watch on it and acts only on its
//! deletion, so a data change would leave it waiting forever. Proclamations go to the
//! directory's data, in a multi-op that checks the leader's node; one whose number is not above
//! the recorded one (a retry, a late duplicate) changes nothing.

use crate::layout::{self, NodeKind};
use crate::node::{foreign, token_of, DATA_ATTEMPTS};
use crate::session::Inner;
use distlock_core::backend::{GrantRef, RenewOutcome};
use distlock_core::Result;
use std::sync::Arc;
use zookeeper_client as zk;

/// The owner `inspect` reports for the candidate node `name`: the owner id in a dlock node's
/// name, or for a node dlock did not make (a Curator `LeaderLatch` participant)
/// `(not dlock) <node name>`, as the etcd backend marks `etcdctl elect`'s keys.
pub(crate) fn owner_of(name: &str) -> String {
    layout::latch_owner(name).unwrap_or_else(|| format!("(not dlock) {name}"))
}

/// A proclaimed value, as the election directory's data records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proclaimed {
    /// The token of the leader that proclaimed it (a record of an earlier leader is stale).
    pub(crate) token: u64,
    pub(crate) seq: u64,
    pub(crate) value: String,
}

impl Proclaimed {
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!("{}\n{}\n{}", self.token, self.seq, self.value).into_bytes()
    }

    /// `None` for an empty directory (nothing proclaimed since it was made).
    pub(crate) fn parse(dir: &str, data: &[u8]) -> Result<Option<Proclaimed>> {
        if data.is_empty() {
            return Ok(None);
        }
        let parsed = std::str::from_utf8(data).ok().and_then(|s| {
            let mut it = s.splitn(3, '\n');
            Some(Proclaimed {
                token: it.next()?.parse().ok()?,
                seq: it.next()?.parse().ok()?,
                value: it.next()?.to_owned(),
            })
        });
        let place = format!("the election directory {dir}");
        parsed
            .map(Some)
            .ok_or_else(|| foreign(&place, data, "a proclaimed value"))
    }
}

impl Inner {
    /// `proclaim`: records `value` as proclamation `seq` of the leader `grant` in the
    /// directory's data, unless a proclamation numbered `seq` or more is there already.
    pub(crate) async fn proclaim(
        self: &Arc<Self>,
        grant: &GrantRef,
        seq: u64,
        value: &str,
    ) -> Result<RenewOutcome> {
        let sess = self.session().await?;
        let Some(g) = (self.live_grant(grant, &sess)).filter(|g| g.node == NodeKind::Latch) else {
            // Not a live grant of this session (its session ended: its lost signal fired).
            return Ok(RenewOutcome::NotHeld);
        };
        let what = "proclaiming";
        // Read at the leader's state, so "still leads" is the leader's answer.
        self.sync(&sess, &g.path).await?;
        for _ in 0..DATA_ATTEMPTS {
            let node = match self.call(what, sess.zk.check_stat(&g.path)).await? {
                Some(st) if st.ephemeral_owner == sess.id && token_of(&st) == Some(g.token) => st,
                _ => return Ok(self.not_leading(grant, &g.path, g.gen)),
            };
            let read = sess.zk.get_data(&g.dir);
            // The node exists, so its directory does: `None` is a race with our own check.
            let Some((data, dir)) = self.call_unless(what, zk::Error::NoNode, read).await? else {
                continue;
            };
            // A granted node leads as long as it exists: every node before it is gone, and
            // every later one has a higher sequence number.
            let recorded = Proclaimed::parse(&g.dir, &data)?;
            if recorded.is_some_and(|p| p.token == g.token && p.seq >= seq) {
                return Ok(RenewOutcome::Renewed);
            }
            let record = Proclaimed {
                token: g.token,
                seq,
                value: value.to_owned(),
            };
            let mut w = sess.zk.new_multi_writer();
            w.add_check_version(&g.path, node.version)
                .and_then(|()| w.add_set_data(&g.dir, &record.encode(), Some(dir.version)))
                .map_err(|e| self.err(what, e))?;
            match self.commit(what, w).await? {
                Ok(_) => return Ok(RenewOutcome::Renewed),
                Err((Some(0), zk::Error::NoNode)) => {
                    return Ok(self.not_leading(grant, &g.path, g.gen))
                }
                // Another write got there first (our own earlier one whose answer was lost, a
                // Curator container's recreation): look again.
                Err((Some(_), zk::Error::BadVersion | zk::Error::NoNode)) => continue,
                Err((_, e)) => return Err(self.err(what, e)),
            }
        }
        Err(crate::node::busy(&self.endpoint, &g.dir))
    }

    fn not_leading(&self, grant: &GrantRef, path: &str, gen: u64) -> RenewOutcome {
        self.forget_grant(&grant.attempt);
        self.node_gone(path, gen);
        RenewOutcome::NotHeld
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proclaimed_records() {
        let p = Proclaimed {
            token: 0x1_0000_0007,
            seq: 3,
            value: "10.0.0.7:80\nsecond line".into(),
        };
        assert_eq!(Proclaimed::parse("/d", &p.encode()).expect("ours"), Some(p));
        assert_eq!(Proclaimed::parse("/d", b"").expect("empty"), None);
        // The empty value.
        let e = Proclaimed::parse("/d", b"5\n1\n")
            .expect("ours")
            .expect("some");
        assert_eq!((e.token, e.seq, e.value.as_str()), (5, 1, ""));
        for foreign in [&b"12"[..], b"a\n1\nv", b"1\nx\nv", b"1\n2", &[0xff, b'\n']] {
            let err = Proclaimed::parse("/d", foreign).expect_err("foreign");
            assert!(err.to_string().contains("not a proclaimed value"), "{err}");
        }
    }
}
