//! Operator commands on etcd: `dlock list`, `dlock release --force`, `dlock doctor`.
//!
//! - `list`: one range read over `PREFIX/` (paged, every page at the revision of the first, so
//!   the answer is one consistent snapshot); per lock name, the queue key with the lowest
//!   create revision is the holder, the other queue keys are waiters, and the fencing token is
//!   the holder's create revision (free: the mod revision of `PREFIX/NAME`), as `inspect`
//!   reports. Keys that `etcdctl lock PREFIX/NAME` or Go's `concurrency.Mutex` queued under the
//!   same prefix are listed too: they hold or wait for the same lock (a holder `(not dlock) KEY`).
//! - `force_release`: one transaction deletes the holder's key, guarded by its create revision
//!   (a holder that changed meanwhile is never the one removed), and rewrites `PREFIX/NAME`.
//!   The fencing token needs no counter of its own: every later grant is a key created later,
//!   so its create revision — its token — is higher than the removed holder's. The removed
//!   holder's next renewal reads no key: `NotHeld`, its lost signal. Waiters stay queued (the
//!   first of them is woken by the deletion, as by a release).
//! - `diagnose`: every member's status (reachable, errors and alarms, version), one leader
//!   all members agree on, the raft index spread, and etcd's minimum lease TTL against the
//!   watchdog lease. etcd has no clock API, so the server/local clock offset is not checked
//!   (locks do not depend on it: see the finding).

use crate::error::{is_lease_not_found, map};
use crate::kv::{first_of, gets, header_revision, nth_first, token_of, CAS_ATTEMPTS};
use crate::kv::{Entry, Keys};
use crate::url::percent_decode;
use crate::EtcdBackend;
use distlock_core::operator::{clock_not_checked, parse_version};
use distlock_core::{Finding, ForceReleased, ListedLock, LockKind, Operator, Result, Severity};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, StatusResponse, Txn,
    TxnOp,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// Keys per page of the range read (a page must fit a gRPC message whatever the values).
const PAGE: i64 = 1000;
/// Raft index spread above which a member is reported as lagging. etcd itself refuses new
/// proposals when a member's applied index trails its committed one by 5000
/// (`maxGapBetweenApplyAndCommitIndex`); a spread of that size between members means one
/// is far behind.
const RAFT_SPREAD_WARN: u64 = 5000;
/// The oldest etcd whose transactions compare a key *range*: the acquire transaction's
/// "nobody queued under PREFIX/NAME/" is such a comparison (`range_end`, etcd 3.3). An older
/// server ignores the unknown field and compares the single key `PREFIX/NAME/`, which never
/// exists: every acquire would succeed — two holders.
const MIN_VERSION: (u32, u32, u32) = (3, 3, 0);

/// One lock's keys, gathered by `list`.
#[derive(Default)]
struct Gathered {
    /// Queue keys (holder and waiters).
    queue: Vec<KeyValue>,
    /// `PREFIX/NAME`, if it exists.
    fence: Option<KeyValue>,
}

/// The lock name and, for a queue key, `true`, of key `key` under `PREFIX/` (`root`); `None`
/// for a key that is no lock's (an empty name).
fn parse_key(root: &[u8], key: &[u8]) -> Option<(String, bool)> {
    let rest = key.strip_prefix(root)?;
    let (name, queued) = match rest.iter().position(|b| *b == b'/') {
        Some(i) => (&rest[..i], true),
        None => (rest, false),
    };
    if name.is_empty() {
        return None;
    }
    let raw = String::from_utf8_lossy(name);
    // dlock escapes `%` and `/` in names; a foreign key may not decode: show it as it is.
    Some((
        percent_decode(&raw).unwrap_or_else(|| raw.into_owned()),
        queued,
    ))
}

#[distlock_core::async_trait]
impl Operator for EtcdBackend {
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        let root = format!("{}/", self.prefix).into_bytes();
        let mut from = root.clone();
        from.extend_from_slice(crate::kv::escape(prefix).as_bytes());
        let end = prefix_end(&from);
        let mut names: BTreeMap<String, Gathered> = BTreeMap::new();
        let mut at: Option<i64> = None;
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_sort(SortTarget::Key, SortOrder::Ascend)
                .with_limit(PAGE);
            if let Some(rev) = at {
                opts = opts.with_revision(rev);
            }
            let mut resp = self
                .call("list", |c| {
                    let (key, opts) = (from.clone(), opts.clone());
                    async move { c.kv_client().get(key, Some(opts)).await }
                })
                .await?;
            if at.is_none() {
                at = resp.header().map(|h| h.revision());
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last().map(|kv| kv.key().to_vec()) else {
                break;
            };
            for kv in kvs {
                if let Some((name, queued)) = parse_key(&root, kv.key()) {
                    if !name.starts_with(prefix) {
                        continue;
                    }
                    let g = names.entry(name).or_default();
                    if queued {
                        g.queue.push(kv);
                    } else {
                        g.fence = Some(kv);
                    }
                }
            }
            if !more {
                break;
            }
            // The next page starts just after the last key of this one.
            from = last;
            from.push(0);
        }
        let mut out = Vec::with_capacity(names.len());
        for (name, g) in names {
            let keys = self.keys(&name);
            let holder = g.queue.iter().min_by_key(|kv| kv.create_revision());
            let queued = i64::try_from(g.queue.len()).unwrap_or(i64::MAX);
            let info =
                (self.lock_info(&keys, &name, queued, holder, g.fence.as_ref(), None)).await?;
            out.push(ListedLock::new(LockKind::Mutex, info));
        }
        Ok(out)
    }

    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        let keys = Keys::of_kind(&self.prefix, name, kind);
        for _ in 0..CAS_ATTEMPTS {
            let resp = self
                .txn(
                    "forced release",
                    Txn::new().and_then([first_of(&keys.queue)]),
                )
                .await?;
            let first = nth_first(&mut gets(&resp), 0)?;
            // An election candidate is dlock's if its metadata key is there (then its lease is
            // its alone); its owner is in the metadata, its value in its key.
            let meta = match first.as_ref().and_then(|h| keys.meta_of(h.key())) {
                Some(m) => self.get("forced release", &m).await?,
                None => None,
            };
            let (guard, ops, removed) = match &first {
                // The holder is the key read: delete exactly it, if it is still that key (same
                // create revision); rewriting PREFIX/NAME makes `inspect` of the then free lock
                // report this transaction's revision, above every token handed out.
                Some(h) => (
                    Compare::create_revision(
                        h.key().to_vec(),
                        CompareOp::Equal,
                        h.create_revision(),
                    ),
                    [
                        TxnOp::delete(h.key().to_vec(), None),
                        TxnOp::put(keys.fence.clone(), "", None),
                    ]
                    .into_iter()
                    // An election candidate's metadata key goes with it.
                    .chain(keys.meta_of(h.key()).map(|m| TxnOp::delete(m, None)))
                    .collect(),
                    Some(
                        (keys.holder_info(h, meta.as_ref())?)
                            .with_lease_left(self.lease_left(h.lease()).await?),
                    ),
                ),
                // Free: nothing to remove; the counter still moves (the operator asked for it),
                // if nobody queued meanwhile.
                None => (
                    Compare::create_revision(keys.queue.clone(), CompareOp::Equal, 0).with_prefix(),
                    vec![TxnOp::put(keys.fence.clone(), "", None)],
                    None,
                ),
            };
            let resp = self
                .txn("forced release", Txn::new().when([guard]).and_then(ops))
                .await?;
            if !resp.succeeded() {
                // The holder changed between the read and the transaction: look again.
                continue;
            }
            let token = token_of(header_revision(&resp)?)?;
            if let Some(h) = &first {
                // A dlock key is alone on its attempt's lease: revoke it (it carries nothing now).
                // A foreign key (`etcdctl lock`, Go's session) may share its session's lease with
                // other keys of that program: leave the lease alone.
                // (An election candidate's value is the application's: never read as a lock's.)
                if keys.meta.is_none()
                    && Entry::decode(h.key(), h.value()).is_ok()
                    && h.lease() != 0
                {
                    self.revoke_in_background(h.lease());
                }
            }
            return Ok(ForceReleased::new(removed.into_iter().collect(), token));
        }
        Err(self.contended(&keys.queue))
    }

    async fn diagnose(&self) -> Result<Vec<Finding>> {
        let members = self
            .call("member list", |mut c| async move { c.member_list().await })
            .await?;
        let members: Vec<(String, u64, Vec<String>, bool)> = members
            .members()
            .iter()
            .map(|m| {
                (
                    m.name().to_owned(),
                    m.id(),
                    m.client_urls().to_vec(),
                    m.is_learner(),
                )
            })
            .collect();
        let voters = members.iter().filter(|m| !m.3).count();
        let statuses: Vec<MemberStatus> =
            futures_util::future::join_all(members.iter().map(|(name, id, urls, _)| async move {
                MemberStatus {
                    name: name.clone(),
                    id: *id,
                    status: member_status(self, urls.clone()).await,
                }
            }))
            .await;
        let mut out = vec![
            health_finding(&statuses, voters),
            version_finding(&statuses),
            leader_finding(&statuses),
        ];
        out.extend(raft_finding(&statuses));
        out.push(lease_finding(self).await?);
        out.push(self.transport.clone());

        out.push(clock_not_checked("etcd has no API that tells its clock; locks do not depend on it (etcd counts a lease on the leader's monotonic clock from when it applied the request, dlock on the local CLOCK_BOOTTIME from before sending it; only clock rates matter); run NTP anyway so that logs agree"));
        Ok(out)
    }
}

/// The end of the range of every key starting with `p` (etcd's `GetPrefixRangeEnd`).
fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the key space.
    vec![0]
}

/// One member's answer to `Status`.
struct MemberStatus {
    name: String,
    id: u64,
    status: std::result::Result<StatusResponse, String>,
}

async fn member_status(
    b: &EtcdBackend,
    urls: Vec<String>,
) -> std::result::Result<StatusResponse, String> {
    if urls.is_empty() {
        return Err("the member has not started (no client URLs)".into());
    }
    let connect = async {
        // A client of its own, so that the status comes from this member (the shared client
        // balances over all of them).
        // A backend on an application's client without its connect options: plain ones
        // (enough for a cluster without TLS or authentication).
        let co = b.connect_opts.clone().unwrap_or_else(|| {
            etcd_client::ConnectOptions::new()
                .with_connect_timeout(b.connect_timeout)
                .with_require_leader(true)
        });
        let mut c = Client::connect(&urls, Some(co))
            .await
            .map_err(|e| e.to_string())?;
        c.status().await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(b.op_timeout + b.connect_timeout, connect).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no answer within {:?}",
            b.op_timeout + b.connect_timeout
        )),
    }
}

/// A member's name, or its id when it has none.
fn label(s: &MemberStatus) -> String {
    if s.name.is_empty() {
        format!("{:x}", s.id)
    } else {
        s.name.clone()
    }
}

/// Health: every member answers, without errors (alarms are reported here: NOSPACE makes
/// the cluster refuse writes, CORRUPT means members disagree on the data).
fn health_finding(statuses: &[MemberStatus], voters: usize) -> Finding {
    let mut down = Vec::new();
    let mut errors = Vec::new();
    for s in statuses {
        match &s.status {
            Err(e) => down.push(format!("{} ({e})", label(s))),
            Ok(st) if !st.errors().is_empty() => {
                errors.push(format!("{}: {}", label(s), st.errors().join("; ")))
            }
            Ok(_) => {}
        }
    }
    let up = statuses.len() - down.len();
    if !errors.is_empty() {
        Finding::new(
            Severity::Unsafe,
            "members",
            format!("members report errors: {}; an alarm (NOSPACE: the cluster refuses every write, so no lock can be taken or moved; CORRUPT: members disagree on the data, so a lock can be granted twice) must be fixed first (`etcdctl alarm list`, defragment/compact or restore the member, then `etcdctl alarm disarm`)", errors.join(", ")),
        )
    } else if down.is_empty() {
        Finding::new(
            Severity::Ok,
            "members",
            format!("all {} members answer", statuses.len()),
        )
    } else if up * 2 > voters.max(1) {
        Finding::new(
            Severity::Warning,
            "members",
            format!("{} of {} members do not answer: {}; the cluster still has a quorum, but one more failure stops every lock; restart or replace them (`etcdctl member list`, `etcdctl endpoint health --cluster`)", down.len(), statuses.len(), down.join(", ")),
        )
    } else {
        Finding::new(
            Severity::Unsafe,
            "members",
            format!("only {up} of {} members answer ({}): without a quorum no lock can be taken, renewed or released, and every holder loses its lock at its lease's end; bring members back", statuses.len(), down.join(", ")),
        )
    }
}

/// Version: every member runs an etcd whose transactions compare key ranges.
fn version_finding(statuses: &[MemberStatus]) -> Finding {
    let mut old = Vec::new();
    let mut versions = Vec::new();
    for s in statuses {
        if let Ok(st) = &s.status {
            versions.push(st.version().to_owned());
            if parse_version(st.version()).is_none_or(|v| v < MIN_VERSION) {
                old.push(format!("{} runs {}", label(s), st.version()));
            }
        }
    }
    versions.sort();
    versions.dedup();
    if old.is_empty() {
        Finding::new(
            Severity::Ok,
            "version",
            format!(
                "etcd {} (range comparisons in transactions need 3.3 or later)",
                versions.join(", ")
            ),
        )
    } else {
        Finding::new(
            Severity::Unsafe,
            "version",
            format!("{}: etcd before 3.3 ignores the key-range comparison of the acquire transaction (\"nobody queued\"), so every acquire would succeed and a lock be granted twice; upgrade to a maintained etcd (3.5 or later)", old.join(", ")),
        )
    }
}

/// Leader: the answering members agree on one leader, which is a member.
fn leader_finding(statuses: &[MemberStatus]) -> Finding {
    let mut leaders: Vec<u64> = statuses
        .iter()
        .filter_map(|s| s.status.as_ref().ok().map(StatusResponse::leader))
        .collect();
    leaders.sort_unstable();
    leaders.dedup();
    let name_of = |id: u64| {
        statuses
            .iter()
            .find(|s| s.id == id)
            .map_or_else(|| format!("{id:x} (not a listed member)"), label)
    };
    match leaders.as_slice() {
        [] => Finding::new(Severity::Unsafe, "leader", "no member answered, so no leader is known; no lock can be taken or renewed"),
        [0] => Finding::new(Severity::Unsafe, "leader", "the members have no leader: no lock can be taken, renewed or released until one is elected; check the members' logs and the network between them (peer URLs)"),
        [l] if statuses.iter().any(|s| s.id == *l) => Finding::new(
            Severity::Ok,
            "leader",
            format!("leader {}, agreed by every answering member", name_of(*l)),
        ),
        [l] => Finding::new(Severity::Warning, "leader", format!("the leader {} is not in the member list: a membership change in progress?", name_of(*l))),
        many => Finding::new(
            Severity::Warning,
            "leader",
            format!("the members do not agree on the leader ({}): an election in progress or a partitioned member; etcd keeps this safe (writes need a quorum), but run `doctor` again and check the network if it persists", many.iter().map(|l| if *l == 0 { "none".to_owned() } else { name_of(*l) }).collect::<Vec<_>>().join(", ")),
        ),
    }
}

/// Raft index spread: a member far behind the others serves stale reads of nothing dlock
/// uses (its reads are linearizable), but is one failure from a lost quorum.
fn raft_finding(statuses: &[MemberStatus]) -> Option<Finding> {
    let indexes: Vec<(String, u64)> = statuses
        .iter()
        .filter_map(|s| s.status.as_ref().ok().map(|st| (label(s), st.raft_index())))
        .collect();
    let (Some(lo), Some(hi)) = (
        indexes.iter().min_by_key(|i| i.1),
        indexes.iter().max_by_key(|i| i.1),
    ) else {
        return None;
    };
    let spread = hi.1 - lo.1;
    Some(if spread > RAFT_SPREAD_WARN {
        Finding::new(
                Severity::Warning,
                "raft-index",
                format!("member {} is {spread} raft entries behind {} (more than {RAFT_SPREAD_WARN}): a slow disk or network; it does not count towards a quorum until it catches up, so one more failure can stop every lock; check its disk (fsync latency) and network", lo.0, hi.0),
            )
    } else {
        Finding::new(
            Severity::Ok,
            "raft-index",
            format!("raft indexes within {spread} of each other"),
        )
    })
}

/// etcd's minimum lease TTL (1.5 × election timeout, rounded up to seconds), probed by
/// granting a lease of 1 s — etcd raises a shorter TTL to its minimum — against the watchdog
/// lease.
async fn lease_finding(b: &EtcdBackend) -> Result<Finding> {
    let r = b
        .call("lease grant", |c| async move {
            c.lease_client().grant(1, None).await
        })
        .await?;
    let id = r.id();
    let min_ttl = Duration::from_secs(r.ttl().max(1).unsigned_abs());
    match b
        .raw("lease revoke", |c| async move {
            c.lease_client().revoke(id).await
        })
        .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if is_lease_not_found(&e) => {}
        Ok(Err(e)) => return Err(map(&b.endpoint, e)),
        // It carries nothing and expires within a second or two anyway.
        Err(_) => {}
    }
    // 1.5 × election timeout, rounded up: the election takes at least min_ttl / 1.5 − 1 s.
    let election = min_ttl.mul_f64(2.0 / 3.0);
    let lease = b.watchdog_lease;
    Ok(if min_ttl > lease {
        Finding::new(
            Severity::Warning,
            "lease",
            format!("etcd's minimum lease TTL is {min_ttl:?} (1.5 × its election timeout), longer than the watchdog lease {lease:?}: every lease is rounded up to it (never shorter, so locks stay safe), but a crashed holder's lock stays blocked {min_ttl:?}; raise the watchdog lease to at least {min_ttl:?}, or lower etcd's --election-timeout"),
        )
    } else if lease < election * 2 {
        Finding::new(
            Severity::Warning,
            "lease",
            format!("the watchdog lease {lease:?} is short against etcd's election timeout (about {election:?}, from the minimum lease TTL {min_ttl:?}): renewals fail during a leader election, and a lease shorter than two elections can be lost to one (a lost signal, never a double grant); use a watchdog lease of at least {:?}", election * 3),
        )
    } else {
        Finding::new(
            Severity::Ok,
            "lease",
            format!("watchdog lease {lease:?}, etcd's minimum lease TTL {min_ttl:?}: renewals ride out a leader election"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_names() {
        let root = b"dlock/";
        assert_eq!(
            parse_key(root, b"dlock/a%2Fb%25c/0f"),
            Some(("a/b%c".into(), true))
        );
        assert_eq!(parse_key(root, b"dlock/a"), Some(("a".into(), false)));
        // `etcdctl lock dlock/a/b` queues under dlock's lock `a`, and blocks it.
        assert_eq!(
            parse_key(root, b"dlock/a/b/694d8f2a"),
            Some(("a".into(), true))
        );
        assert_eq!(parse_key(root, b"dlock//x"), None);
        assert_eq!(parse_key(root, b"other/x"), None);
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert!(parse_version("3.2.32").is_some_and(|v| v < MIN_VERSION));
    }
}
