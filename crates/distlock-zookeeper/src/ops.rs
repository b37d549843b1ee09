//! A lock's holders, read through the leader (`inspect`, and the forced release), and the
//! operator commands: `dlock list`, `dlock release --force`, `dlock doctor` (docs/zookeeper.md,
//! *Operator commands*).

use crate::election::{owner_of, Proclaimed};
use crate::layout::{self, decode_segment, Child, Family, NodeData, NodeKind};
use crate::node::{foreign, foreign_data, token_of, unexpected_answer, DATA_ATTEMPTS};
use crate::release::parse_fence;
use crate::session::{Inner, Session};
use crate::ZkBackend;
use crate::KIND;
use distlock_core::conn::is_loopback;
use distlock_core::{
    operator, Backend, Error, Finding, ForceReleased, HolderInfo, ListedLock, LockInfo, LockKind,
    Operator, Result, Severity,
};
use std::sync::Arc;
use std::time::Duration;
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
            _ => parse_fence(&dir_data).ok_or_else(|| {
                foreign(
                    &format!("the lock directory {dir}"),
                    &dir_data,
                    "a fencing token",
                )
            })?,
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

#[distlock_core::async_trait]
impl Operator for ZkBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let inner = &self.inner;
        let sess = inner.session().await?;
        inner.sync(&sess, &inner.base).await?;
        let mut out = Vec::new();
        for name in names(inner, &sess, &inner.base, prefix).await? {
            let children = inner.list(&sess, &inner.dir(&name, Family::Mutex)).await?;
            let has_rw = children.iter().any(|c| c == "rw");
            let mutex_nodes = !layout::queue(&children, Family::Mutex).is_empty();
            // A name directory is mutex state unless it only carries the `rw` directory: then it
            // is the parent the rw recipe created, and its own fence stays 0.
            let mutex = Backend::inspect(self, &name, LockKind::Mutex).await?;
            if mutex_nodes || mutex.fencing_token > 0 || !has_rw {
                out.push(ListedLock::new(LockKind::Mutex, mutex));
            }
            if has_rw {
                let rw = Backend::inspect(self, &name, LockKind::Write).await?;
                out.push(ListedLock::new(LockKind::Write, rw));
            }
        }
        // Elections, in their own root beside the namespace.
        let root = format!("{}{}", inner.base, layout::ELECTION_SUFFIX);
        for name in names(inner, &sess, &root, prefix).await? {
            let info = Backend::inspect(self, &name, LockKind::Election).await?;
            out.push(ListedLock::new(LockKind::Election, info));
        }
        Ok(out)
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        let inner = &self.inner;
        let family = NodeKind::of(kind)?.family();
        let dir = inner.dir(name, family);
        let sess = inner.session().await?;
        let what = "forcing the release";
        for _ in 0..DATA_ATTEMPTS {
            let held = match inner.holders(&sess, &dir, family, what).await? {
                // Never used: no token was ever handed out, nothing to remove.
                None => return Ok(ForceReleased::new(Vec::new(), 0)),
                // Released meanwhile: the holders may be others now; look again.
                Some(h) if h.changed => continue,
                // An election without a leader: nobody to put out.
                Some(h) if family == Family::Election && h.read.is_empty() => {
                    return Ok(ForceReleased::new(Vec::new(), 0))
                }
                Some(h) => h,
            };
            // One transaction: the directory's data rewritten at the version we read (the
            // fence, so `list` keeps the last token; an election's proclamation record as it
            // is) and every holder's node deleted at the version we read — a node whose data
            // changed meanwhile (a reader joined or left a write node, a downgrade) fails the
            // whole op and we look again. The transaction's zxid is above every czxid handed out
            // before it, and every later node's czxid is above it: that is the counter we report.
            let record = match family {
                Family::Election => held.dir_data.clone(),
                _ => held.fence.to_string().into_bytes(),
            };
            let mut w = sess.zk.new_multi_writer();
            w.add_set_data(&dir, &record, Some(held.dir_stat.version))
                .map_err(|e| inner.err(what, e))?;
            for r in &held.read {
                w.add_delete(&format!("{dir}/{}", r.child.name), Some(r.stat.version))
                    .map_err(|e| inner.err(what, e))?;
            }
            let results = match inner.commit(what, w).await? {
                Ok(r) => r,
                Err((Some(_), zk::Error::BadVersion | zk::Error::NoNode)) => continue,
                Err((_, e)) => return Err(inner.err(what, e)),
            };
            let Some(zk::MultiWriteResult::SetData { stat }) = results.first() else {
                return Err(unexpected_answer(what, &results.first()));
            };
            let mzxid = u64::try_from(stat.mzxid).unwrap_or(0);
            let fencing_token = mzxid.max(held.fence);
            let removed = held.read.iter().map(Read::info).collect();
            return Ok(ForceReleased::new(removed, fencing_token));
        }
        Err(Error::unexpected(KIND, format!(
                "forced release of `{name}`: the holders kept changing ({DATA_ATTEMPTS} tries); run it again"
            )))
    }

    async fn diagnose(&self) -> Result<Vec<Finding>> {
        let inner = &self.inner;
        let sess = inner.session().await?;
        let synced = inner
            .timed("syncing with the leader", sess.zk.sync(&inner.base))
            .await;
        // Membership from the config node: every client may read it, unlike the four-letter
        // words (`srvr`, `mntr`), which are often disabled.
        let config = inner
            .timed("reading /zookeeper/config", sess.zk.get_config())
            .await?
            .map(|(data, _)| String::from_utf8_lossy(&data).into_owned());
        Ok(vec![
            session_finding(sess.timeout, inner.requested_timeout, inner.watchdog_lease),
            leader_finding(synced),
            ensemble_finding(config),
            transport(inner).await,
            access(inner),
            distlock_core::operator::clock_not_checked("ZooKeeper offers clients no clock reading, and nothing here depends on it (sessions expire on the leader's ticks, tokens are zxids, not times)"),
        ])
    }
}

/// The lock names (sorted) that start with `prefix` among the children of `dir` (children
/// that are no encoded name are no lock's).
async fn names(inner: &Inner, sess: &Session, dir: &str, prefix: &str) -> Result<Vec<String>> {
    let children = inner.list(sess, dir).await?.into_iter();
    let mut names: Vec<String> = children
        .filter_map(|seg| decode_segment(&seg))
        .filter(|name| name.starts_with(prefix))
        .collect();
    names.sort();
    Ok(names)
}

/// The voting members and observers listed in `/zookeeper/config` (`server.N=host:…:participant;…`).
fn members(config: &str) -> (usize, usize) {
    // Per server line: whether it is an observer.
    let observer: Vec<bool> = (config.lines())
        .filter_map(|line| {
            let (key, value) = line.trim().split_once('=')?;
            // The role is the fourth `:` field of the server part, `participant` when absent.
            let server = value.split(';').next().unwrap_or("");
            key.starts_with("server.")
                .then(|| server.split(':').any(|f| f == "observer"))
        })
        .collect();
    let observers = observer.iter().filter(|o| **o).count();
    (observer.len() - observers, observers)
}

/// How the connection is protected: TLS (with the version a handshake agrees on), or plain
/// TCP, fine on loopback only.
async fn transport(inner: &crate::session::Inner) -> Finding {
    let Some(tls) = &inner.tls else {
        let fix = "lock paths and owner ids travel unencrypted and unauthenticated; give the servers a secureClientPort (Netty connection factory) and connect with zks://…?cacert=PATH";
        return operator::plain(inner.hosts.split(','), "TCP", fix);
    };
    let within = inner.connect_timeout.min(std::time::Duration::from_secs(3));
    let client = operator::client_cert_shown(tls.client_cert());
    let (severity, message): (Severity, String) = match tls.probe(&inner.hosts, within).await.0 {
        Some(v) => (
            Severity::Ok,
            format!("encrypted ({v}): every server's certificate checked against cacert= (and its host name or address); {client}"),
        ),
        None => (
            Severity::Warning,
            format!("zks://, but no server completed a TLS handshake with this check just now (the session's own connection is encrypted); {client}"),
        ),
    };
    Finding::new(severity, "tls", message)
}

/// Who the sessions authenticate as and who may touch dlock's nodes.
fn access(inner: &crate::session::Inner) -> Finding {
    use crate::session::Identity;
    use crate::NodeAcl;
    let plain_off_loopback = inner.tls.is_none() && !inner.hosts.split(',').all(is_loopback);
    let (severity, message): (Severity, String) = match (&inner.identity, inner.acl) {
        (Identity::Digest(user), _) if plain_off_loopback => (
            Severity::Warning,
            format!("digest user `{user}` over plain TCP off loopback: the password travels in clear at every (re)connect; connect with zks://…?cacert=PATH"),
        ),
        (Identity::Digest(user), NodeAcl::Creator) => (
            Severity::Ok,
            format!("digest user `{user}`; dlock's nodes are that user's alone (acl=creator): other identities cannot break or steal a hold"),
        ),
        (Identity::Application, NodeAcl::Creator) => (
            Severity::Ok,
            "the application's connector's identity; dlock's nodes are that identity's alone (acl=creator)".into(),
        ),
        (Identity::None, _) => (
            Severity::Ok,
            "no credentials; dlock's nodes are world:anyone (acl=open): any client that reaches the path may delete a holder's node. Give a digest user and password with acl=creator to keep other identities off".into(),
        ),
        (_, NodeAcl::Open) => (
            Severity::Ok,
            "authenticated, but dlock's nodes are world:anyone (acl=open, e.g. for Curator without credentials): any client that reaches the path may delete a holder's node; acl=creator keeps other identities off".into(),
        ),
    };
    Finding::new(severity, "auth", message)
}

/// The session timeout the ensemble negotiated (`timeout`, asked for `requested`) against
/// the watchdog lease.
pub(crate) fn session_finding(timeout: Duration, requested: Duration, lease: Duration) -> Finding {
    let (severity, message): (Severity, String) = if timeout < lease {
        // `connect` refuses such a session (this message); reported in case the server's range
        // changed.
        (
            Severity::Unsafe,
            format!("the ensemble negotiated a session timeout of {timeout:?} (asked for {requested:?}), shorter than the watchdog lease {lease:?}: the server may expire the session (and delete the lock nodes) while the holder still counts on its lease; lower the client's watchdog_lease to at most {timeout:?}, or raise the servers' maxSessionTimeout (default 20 × tickTime) and ask for a longer session (`session_timeout` in the URL)"),
        )
    } else if timeout < requested {
        (
            Severity::Warning,
            format!("the ensemble shortened the session timeout to {timeout:?} (asked for {:?}; the servers' maxSessionTimeout, default 20 × tickTime): it still covers the watchdog lease {lease:?}, but fixed leases and extensions longer than {timeout:?} are refused; raise maxSessionTimeout if you need them", requested),
        )
    } else if timeout > requested {
        (
            Severity::Warning,
            format!("the ZooKeeper servers raised the session timeout to {timeout:?} (asked for {requested:?}; their minSessionTimeout, default 2 × tickTime): safe, but a holder or queued waiter that crashes or is cut off keeps the lock or its place in the queue for up to {timeout:?}, not the {lease:?} watchdog lease; lower the servers' minSessionTimeout (or tickTime), or use a watchdog lease of at least {timeout:?} so that the two agree"),
        )
    } else if timeout > lease {
        (
            Severity::Ok,
            format!("session timeout {timeout:?} (the URL's session_timeout, or at least {:?} by default) covers the watchdog lease {lease:?}; a holder or waiter that dies keeps the lock or its place in the queue for up to {timeout:?}, not {lease:?} (`session_timeout` in the URL asks for less)", crate::MIN_SESSION_TIMEOUT),
        )
    } else {
        (
            Severity::Ok,
            format!("negotiated session timeout {timeout:?} equals the watchdog lease: a holder or waiter that dies frees the lock or its place in the queue {lease:?} after it fell silent"),
        )
    };
    Finding::new(severity, "session-timeout", message)
}

/// The `leader` finding from a sync through the leader: `synced` is its answer (the outer
/// error: no answer in time). A sync only comes back through a server that follows a leader
/// which still has our session (a quorum is up).
fn leader_finding(synced: Result<std::result::Result<(), zk::Error>>) -> Finding {
    let (severity, message): (Severity, String) = match synced {
        Ok(Ok(()) | Err(zk::Error::NoNode)) => (
            Severity::Ok,
            "a sync through the leader went through: the server we talk to follows a leader and a quorum is up".into(),
        ),
        Ok(Err(e)) => (
            Severity::Unsafe,
            format!("a sync through the leader failed ({e}): no leader or no quorum, so locks can be neither taken nor checked; bring a majority of the voting members up"),
        ),
        Err(e) => (
            Severity::Unsafe,
            format!("a sync through the leader got no answer ({e}): no leader or no quorum; bring a majority of the voting members up"),
        ),
    };
    Finding::new(severity, "leader", message)
}

/// The `ensemble` finding from `/zookeeper/config` as read (`Err`: the server refused it).
fn ensemble_finding(config: std::result::Result<String, zk::Error>) -> Finding {
    let (severity, message): (Severity, String) = match config.as_deref().map(members) {
        Ok((0, _)) => (
            Severity::Warning,
            "/zookeeper/config lists no servers (a standalone server, or dynamic configuration off): a single server has no failover; run three or five voting members for locks that survive a server failure".into(),
        ),
        Ok((1, obs)) => (
            Severity::Warning,
            format!("one voting member ({obs} observer(s)): locks are safe, but stop when it is down; run three or five voting members"),
        ),
        Ok((n, obs)) if n % 2 == 0 => (
            Severity::Warning,
            format!("{n} voting members ({obs} observer(s)): an even count tolerates no more failures than {} members; use an odd number", n - 1),
        ),
        Ok((n, obs)) => (
            Severity::Ok,
            format!("{n} voting members ({obs} observer(s)): the ensemble survives {} failure(s)", (n - 1) / 2),
        ),
        Err(e) => (
            Severity::Warning,
            format!("cannot read /zookeeper/config ({e}): the ensemble's size is unknown; allow reading it (or check with `srvr` on each server) and run three or five voting members"),
        ),
    };
    Finding::new(severity, "ensemble", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_round_trip() {
        for name in ["orders:42", "a/b c%", "π", ".", "..", "{x}"] {
            assert_eq!(
                decode_segment(&layout::encode_segment(name)).as_deref(),
                Some(name)
            );
        }
        // Not canonical, or not an encoding at all: no lock lives there.
        assert_eq!(decode_segment("%41"), None);
        assert_eq!(decode_segment("a%2"), None);
        assert_eq!(decode_segment("a%zz"), None);
        assert_eq!(decode_segment("a b"), None);
    }

    #[test]
    fn membership() {
        let cfg = "server.1=127.0.0.1:2888:3888:participant;0.0.0.0:2181\n\
                   server.2=127.0.0.1:2889:3889:participant;0.0.0.0:2182\n\
                   server.3=127.0.0.1:2890:3890:observer;0.0.0.0:2183\n\
                   version=100000000";
        assert_eq!(members(cfg), (2, 1));
        assert_eq!(members("server.1=h:1:2;3"), (1, 0));
        assert_eq!(members(""), (0, 0));
        let severity = |cfg: &str| ensemble_finding(Ok(cfg.to_owned())).severity;
        assert_eq!(severity(cfg), Severity::Warning, "two voters: even");
        assert_eq!(severity("server.1=h:1:2;3"), Severity::Warning, "one voter");
        assert_eq!(severity(""), Severity::Warning, "standalone");
        let three = "server.1=a:1:2;3\nserver.2=b:1:2;3\nserver.3=c:1:2;3";
        assert_eq!(severity(three), Severity::Ok);
        let unreadable = ensemble_finding(Err(zk::Error::NoAuth));
        assert_eq!(unreadable.severity, Severity::Warning);
        let leader = |e| leader_finding(Ok(Err(e))).severity;
        assert_eq!(leader(zk::Error::NoNode), Severity::Ok);
        assert_eq!(leader(zk::Error::ConnectionLoss), Severity::Unsafe);
    }
}
