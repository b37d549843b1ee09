//! Operator commands: `dlock list`, `dlock release --force`, `dlock doctor`. Each asks every
//! node on its own and merges the answers the way the lock does (see `docs/redlock.md`,
//! "Operator commands").

use crate::node::{epoch_valid, quarantine_left, View};
use crate::tally;
use crate::RedlockBackend;
use distlock_core::operator::unix_ms;
use distlock_core::{
    Finding, ForceReleased, HolderInfo, ListedLock, LockInfo, LockKind, Operator, Result, Severity,
};
use distlock_redis::{NodeHold, RedisNode};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Locks inspected at once by `list` (each is one round trip per node).
const LIST_CONCURRENCY: usize = 16;

/// One node's answer, or why there is none (`host:port: …`).
type NodeAnswer<T> = std::result::Result<T, String>;

/// Runs `op` on every connected node of `views` in parallel, each bounded by `t`, in node order.
async fn per_node<T, Fut>(
    s: &RedlockBackend,
    views: &[View],
    t: Duration,
    op: impl Fn(Arc<RedisNode>) -> Fut,
) -> Vec<NodeAnswer<T>>
where
    Fut: Future<Output = Result<T>> + Send,
{
    let mut out: Vec<NodeAnswer<T>> = views.iter().map(|_| Err("not connected".into())).collect();
    let mut answers = s.fan_out(views, t, op);
    while let Some((i, r)) = answers.next().await {
        out[i] = r.map_or_else(
            || Err(format!("no answer within {t:?}")),
            |r| r.map_err(|e| e.to_string()),
        );
    }
    let out = out.into_iter().zip(&s.health.nodes);
    out.map(|(a, n)| a.map_err(|p| format!("{}: {p}", n.endpoint)))
        .collect()
}

/// The answers of the nodes that answered `op` ([`per_node`]), if a majority did.
async fn from_majority<T, Fut>(
    s: &RedlockBackend,
    t: Duration,
    op: impl Fn(Arc<RedisNode>) -> Fut,
) -> Result<Vec<T>>
where
    Fut: Future<Output = Result<T>> + Send,
{
    let mut problems = Vec::new();
    let answers = per_node(s, &s.health.views(), t, op).await.into_iter();
    let ok: Vec<T> = answers
        .filter_map(|a| a.map_err(|p| problems.push(p)).ok())
        .collect();
    if ok.len() < s.quorum() {
        return Err(s.no_quorum(ok.len(), &problems));
    }
    Ok(ok)
}

/// `owner`, or `owner (on k of n nodes)` when not every node agrees.
fn agreement(owner: &str, k: usize, n: usize) -> String {
    if k == n {
        owner.to_owned()
    } else {
        format!("{owner} (on {k} of {n} nodes)")
    }
}

/// The lease a majority still has: the `q`-th longest of the nodes' leases (`None`, no
/// expiry, counts as the longest), or `None` when fewer than `q` nodes have the hold.
fn majority_lease(mut leases: Vec<Option<Duration>>, q: usize) -> Option<Duration> {
    leases.sort_by_key(|l| std::cmp::Reverse((l.is_none(), *l)));
    leases.get(q.checked_sub(1)?).copied().flatten()
}

/// One view of a lock from the holds of the nodes that answered (of `n`): a holder is an
/// attempt a majority has, with the lease a majority still has (`labelled`: its owner says how
/// many nodes agree, see [`agreement`]). An election's leader (holds that carry a value)
/// advertises the value of the highest proclamation number among its majority. The token is
/// the one a majority of the holder's nodes stored with the hold (at most one token can be);
/// else a leader's largest stored (the quorum's token has not reached every node yet; the
/// largest is the grant's); else (a free lock, or a lock hold whose token did not reach a
/// majority) the last one handed out as the counters tell ([`tally::last_token`]).
pub(crate) fn merge(
    name: &str,
    views: &[(Option<NodeHold>, u64)],
    n: usize,
    labelled: bool,
) -> LockInfo {
    let q = tally::quorum(n);
    let mut by_attempt: BTreeMap<&str, Vec<&NodeHold>> = BTreeMap::new();
    for h in views.iter().filter_map(|(h, _)| h.as_ref()) {
        // Foreign data (no attempt) is no holder of ours.
        if !h.attempt.is_empty() {
            by_attempt.entry(&h.attempt).or_default().push(h);
        }
    }
    let mut token = None;
    let mut holders = Vec::new();
    for hs in by_attempt.values().filter(|hs| hs.len() >= q) {
        let tokens = hs.iter().filter_map(|h| h.token);
        let newest = (hs.iter().filter_map(|h| h.value.as_ref())).max_by_key(|(_, seq)| *seq);
        token = match tally::plurality(tokens.clone()) {
            Some((t, k)) if k >= q => Some(t),
            _ => newest.and(tokens.max()),
        };
        let lease_left = majority_lease(hs.iter().map(|h| h.lease_left).collect(), q);
        // Unlabelled: as if every node agreed.
        let of = if labelled { n } else { hs.len() };
        let owner = agreement(&hs[0].owner, hs.len(), of);
        let holder = HolderInfo::new(owner, 1).with_lease_left(lease_left);
        holders.push(holder.with_value(newest.map(|(value, _)| value.clone())));
    }
    holders.sort_by(|a, b| a.owner.cmp(&b.owner));
    // Redlock keeps no server-side queue (waiters poll and watch): no waiter count.
    LockInfo::new(name)
        .with_holders(holders)
        .with_fencing_token(token.unwrap_or_else(|| {
            let counters: Vec<u64> = views.iter().map(|v| v.1).collect();
            tally::last_token(&counters, n)
        }))
}

/// Lock or election `name` (by `kind`) as a majority of nodes sees it ([`merge`]), each
/// node given `t`.
pub(crate) async fn merged(
    s: &RedlockBackend,
    name: &str,
    kind: LockKind,
    t: Duration,
    labelled: bool,
) -> Result<LockInfo> {
    let views = from_majority(s, t, |b| async move { b.hold(name, kind).await }).await?;
    Ok(merge(name, &views, s.node_count(), labelled))
}

#[distlock_core::async_trait]
impl Operator for RedlockBackend {
    /// Every mutex and election a node has state for, merged by name and kind: a holder is an
    /// attempt on a majority of nodes (see `docs/redlock.md`, "Operator commands").
    async fn list(&self, prefix: &str) -> Result<Vec<ListedLock>> {
        // A SCAN of a large namespace takes more than one call's time.
        let scan_t = self.health.opts.get_op_timeout() * 10;
        let lists = from_majority(self, scan_t, |b| async move {
            Operator::list(b.backend(), prefix).await
        })
        .await?;
        // Only mutexes and elections are Redlock's; another kind's keys (a redis:// client
        // sharing the namespace) are not listed here.
        // By name, the lock before the election of the same name.
        let names: BTreeSet<(String, bool)> = lists
            .into_iter()
            .flatten()
            .filter(|l| matches!(l.kind, LockKind::Mutex | LockKind::Election))
            .map(|l| (l.info.name, l.kind == LockKind::Election))
            .collect();
        let t = self.call_timeout();
        stream::iter(names)
            .map(|(name, election)| async move {
                let kind = [LockKind::Mutex, LockKind::Election][usize::from(election)];
                Ok(ListedLock::new(
                    kind,
                    merged(self, &name, kind, t, true).await?,
                ))
            })
            .buffered(LIST_CONCURRENCY)
            .try_collect()
            .await
    }

    /// Removes the hold (a lock's or an election's) on every reachable node and raises every
    /// counter past every token seen; done only when a majority of nodes did both (the core
    /// checked the kind).
    async fn force_release(&self, name: &str, kind: LockKind) -> Result<ForceReleased> {
        let (n, q) = (self.node_count(), self.quorum());
        let t = self.call_timeout();
        // Every reachable node, quarantined or not: a hold left on any node could make a
        // majority with the others later. Per node, distlock-redis's script removes the hold and
        // advances the node's counter past its own tokens in one atomic step.
        let mut views = self.health.views();
        let removed = per_node(self, &views, t, |b| async move {
            Operator::force_release(b.backend(), name, kind).await
        })
        .await;
        // Then past every token seen: a node that missed the grant's raise has a lower counter
        // than the token a majority agreed on, and must not hand out a token below it.
        let top = removed.iter().flatten().map(|r| r.fencing_token);
        let top = top.max().unwrap_or(0);
        // Only where the removal was done: a node that did not answer it is not waited for twice.
        for (v, r) in views.iter_mut().zip(&removed) {
            v.backend = v.backend.take().filter(|_| r.is_ok());
        }
        let raised = per_node(self, &views, t, |b| async move {
            b.raise_fences(&[(name.to_owned(), kind, top)]).await
        })
        .await;
        let mut holds: BTreeMap<String, Vec<Option<Duration>>> = BTreeMap::new();
        let mut problems = Vec::new();
        for (r, x) in removed.into_iter().zip(raised) {
            match (r, x) {
                (Ok(r), Ok(_)) => r.removed.into_iter().for_each(|h| {
                    holds.entry(h.owner).or_default().push(h.lease_left);
                }),
                (Err(p), _) | (_, Err(p)) => problems.push(p),
            }
        }
        let (done, problems) = (n - problems.len(), problems.join("; "));
        if done < q {
            return Err(self.unavailable(format!(
                "forced release of `{name}` done on only {done} of {n} nodes (need {q}): {problems}; the holds removed there stay removed, run it again when a majority answers"
            )));
        }
        if done < n {
            // A minority kept its hold: the old holder cannot renew on a majority any more, and
            // the hold there expires with its lease.
            tracing::warn!(name, unreached = %problems, "forced release done on {done} of {n} redlock nodes");
        }
        let removed = holds
            .into_iter()
            .map(|(owner, leases)| {
                let k = leases.len();
                HolderInfo::new(agreement(&owner, k, n), 1)
                    .with_lease_left(majority_lease(leases, q))
            })
            .collect();
        Ok(ForceReleased::new(removed, top))
    }

    /// Each node's Redis checks, its quarantine, the node count and the clock spread.
    async fn diagnose(&self) -> Result<Vec<Finding>> {
        let (n, q) = (self.node_count(), self.quorum());
        let t = self.health.opts.get_op_timeout();
        // At least `MIN_NODES` (3): the URL has no fewer.
        let tolerates = format!("{n} nodes, majority {q}: tolerates {} down", n - q);
        let odd = "with one more to fail; use an odd number";
        let (severity, message) = match n % 2 {
            0 => (
                Severity::Warning,
                format!("{tolerates} like {} nodes would, {odd}", n - 1),
            ),
            _ => (Severity::Ok, tolerates),
        };
        let mut out = vec![Finding::new(severity, "nodes", message)];
        let answers = per_node(self, &self.health.views(), t, |b| async move {
            let findings = Operator::diagnose(b.backend()).await?;
            let sent = unix_ms(SystemTime::now());
            let (info, epoch) = b.node_epoch().await?;
            let back = unix_ms(SystemTime::now());
            // Its offset from the local clock, and how uncertain that is: half the round
            // trip, plus the millisecond resolution on both sides.
            let offset = i64::try_from(info.now_ms).unwrap_or(i64::MAX) - (sent + back) / 2;
            Ok((findings, info, epoch, (offset, (back - sent) / 2 + 2)))
        })
        .await;
        let mut readings = Vec::new();
        for (node, a) in self.health.nodes.iter().zip(answers) {
            let ep = node.endpoint.as_str();
            match a {
                Ok((findings, info, epoch, (offset, error))) => {
                    out.extend(findings.into_iter().map(|f| {
                        Finding::new(f.severity, format!("{ep} {}", f.check), f.message)
                    }));
                    out.push(quarantine(ep, epoch.as_deref(), &info.run_id, info.now_ms));
                    readings.push((ep, offset, error));
                }
                Err(p) => out.push(Finding::new(
                    Severity::Warning,
                    format!("{ep} reachable"),
                    format!("{p}: this node counts toward no majority now, so the cluster tolerates one failure less; bring it back (its quarantine then keeps it out until leases granted without it ran out)"),
                )),
            }
        }
        let answered = readings.len();
        if answered < q {
            let why = format!("only {answered} of {n} nodes answered (need {q})");
            let message = format!("{why}: no lock can be granted now");
            out.push(Finding::new(Severity::Warning, "majority", message));
        }
        let lease = self.health.opts.get_watchdog_lease();
        out.push(clock_spread(&readings, lease));
        Ok(out)
    }
}

/// The finding for the nodes' clock spread (`readings`: endpoint, offset from the local clock
/// and its uncertainty, in ms), against the drift margin of the watchdog lease.
fn clock_spread(readings: &[(&str, i64, i64)], lease: Duration) -> Finding {
    let margin = distlock_core::drift(lease);
    let margin_ms = i64::try_from(margin.as_millis()).unwrap_or(i64::MAX);
    let (Some(lo), Some(hi)) = (
        readings.iter().min_by_key(|r| r.1),
        readings.iter().max_by_key(|r| r.1),
    ) else {
        return Finding::new(Severity::Warning, "clock spread", "no node answered TIME");
    };
    let spread = hi.1 - lo.1;
    // What the measurement itself cannot tell apart from a real spread.
    let sure = spread - hi.2 - lo.2;
    if sure > margin_ms {
        Finding::new(
            Severity::Warning,
            "clock spread",
            format!(
                "the node clocks are {spread} ms apart ({} is {} ms and {} is {} ms off the local clock), more than the {margin:?} drift margin of the {lease:?} watchdog lease: Redlock's safety assumes the nodes' clocks run at about the same rate (and fencing tokens, each at least its node's clock in 100 ms steps, that they agree within half the restart quarantine less 100 ms), and nodes whose clocks are set apart like this are likely to drift or jump (each node's lease expiry and restart quarantine run on its own clock); run NTP (chrony) on every node and slew, never step, the clocks",
                hi.0, hi.1, lo.0, lo.1
            ),
        )
    } else {
        Finding::new(
            Severity::Ok,
            "clock spread",
            format!(
                "the node clocks are within {spread} ms of each other (drift margin {margin:?} of the {lease:?} watchdog lease; fencing tokens need them within half the restart quarantine less 100 ms)"
            ),
        )
    }
}

/// The finding for a node's quarantine, from its epoch (`None`: none) and its process.
fn quarantine(ep: &str, epoch: Option<&str>, run_id: &str, node_now_ms: u64) -> Finding {
    let finding =
        |severity, message: &str| Finding::new(severity, format!("{ep} quarantine"), message);
    match epoch {
        None => finding(
            Severity::Warning,
            "no node epoch: a new node, or it lost its data, so its votes do not count until a client initialises it with a restart quarantine (every client does at connect and in its node checks); if it stays this way, check that a majority of the other nodes is reachable from the clients",
        ),
        Some(e) if !epoch_valid(e, run_id) => finding(
            Severity::Warning,
            "the node epoch was made for an earlier process of this node (it restarted): its votes do not count until a client initialises it again; if it keeps restarting, find out why (OOM killer, supervisor)",
        ),
        Some(e) => match quarantine_left(e, node_now_ms) {
            Some(left) => finding(
                Severity::Warning,
                &format!("in restart quarantine for {left:?} more by its own clock (it lost its data; leases granted before may still run): its votes do not count until then, so the cluster tolerates one failure less meanwhile"),
            ),
            None => finding(
                Severity::Ok,
                "initialised for its current process, not in restart quarantine",
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(attempt: &str, owner: &str, token: u64, ms: u64) -> Option<NodeHold> {
        Some(NodeHold::new(
            attempt,
            owner,
            Some(token),
            Some(Duration::from_millis(ms)),
        ))
    }

    #[test]
    fn merged_views_count_agreement() {
        let views = [
            (hold("a1", "x", 7, 900), 7),
            (hold("a1", "x", 7, 500), 7),
            (hold("a1", "x", 5, 800), 9),
        ];
        let m = merge("n", &views, 3, true);
        assert_eq!(m.holders.len(), 1);
        assert_eq!(m.holders[0].owner, "x");
        assert_eq!(m.holders[0].lease_left, Some(Duration::from_millis(800)));
        // The majority's token, not the largest counter.
        assert_eq!(m.fencing_token, 7);
        let m = merge("n", &views[1..], 3, true);
        assert_eq!(m.holders[0].owner, "x (on 2 of 3 nodes)");
        // No majority agrees on a token: the largest counter.
        assert_eq!(m.fencing_token, 9);
        // A minority hold is no holder, and its 7 was never handed out (a grant leaves a
        // majority at or above its token).
        let views = [(hold("a1", "x", 7, 900), 7), (None, 3), (None, 4)];
        let m = merge("n", &views, 3, true);
        assert!(!m.held());
        assert_eq!(m.fencing_token, 4);
    }

    #[test]
    fn merged_inspect() {
        let views = [
            (hold("a1", "x", 9, 900), 9),
            (hold("a1", "x", 9, 700), 9),
            (hold("b1", "y", 11, 500), 11),
            (hold("a1", "x", 9, 300), 9),
            (None, 3),
        ];
        let m = merge("n", &views, 5, false);
        let x = HolderInfo::new("x", 1).with_lease_left(Some(Duration::from_millis(300)));
        assert_eq!(m.holders, vec![x]);
        // The majority's 9, not the 11 of a minority's failed vote.
        assert_eq!(m.fencing_token, 9);
        assert!(!merge("n", &views[2..], 3, false).held());
        // Two attempts of one owner, each on a minority: nobody holds the lock.
        let views = [
            (hold("a1", "x", 9, 900), 9),
            (hold("a2", "x", 9, 900), 9),
            (hold("a1", "x", 9, 900), 9),
            (hold("a2", "x", 9, 900), 9),
            (hold("", "", 9, 900), 9),
        ];
        assert!(!merge("n", &views, 5, false).held());
    }

    #[test]
    fn spread_allows_for_measurement_error() {
        let lease = Duration::from_secs(1); // margin 12 ms
        let f = clock_spread(&[("a", 0, 2), ("b", 30, 20)], lease);
        assert_eq!(f.severity, Severity::Ok, "{}", f.message);
        let f = clock_spread(&[("a", 0, 2), ("b", 300, 2)], lease);
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.message.contains("300 ms"), "{}", f.message);
    }

    #[test]
    fn quarantine_from_the_epoch() {
        let f = quarantine("n1", Some("ab:5000:run1"), "run1", 4000);
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.message.contains("1s"), "{}", f.message);
        let f = quarantine("n1", Some("ab:5000:run1"), "run1", 6000);
        assert_eq!(f.severity, Severity::Ok);
        let f = quarantine("n1", Some("ab:5000:run0"), "run1", 6000);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(quarantine("n1", None, "r", 0).severity, Severity::Warning);
    }
}
