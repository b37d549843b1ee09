//! `dlock doctor` on etcd: every member's status (reachable, errors and alarms, version), one
//! leader all members agree on, the raft index spread, and etcd's minimum lease TTL against
//! the watchdog lease. etcd has no clock API, so the server/local clock offset is not checked
//! (locks do not depend on it: see the finding). Each finding is a function of what was read.

use crate::EtcdBackend;
use distlock_core::operator::{self, clock_not_checked, parse_version};
use distlock_core::{Finding, Result, Severity};
use etcd_client::Client;
use std::time::Duration;

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

/// Every finding of `doctor`.
pub(crate) async fn diagnose(b: &EtcdBackend) -> Result<Vec<Finding>> {
    let members = b
        .call("member list", |mut c| async move { c.member_list().await })
        .await?;
    let voters = members.members().iter().filter(|m| !m.is_learner()).count();
    let statuses = members.members().iter().map(|m| async move {
        MemberStatus {
            name: match m.name() {
                "" => format!("{:x}", m.id()),
                name => name.to_owned(),
            },
            id: m.id(),
            status: member_status(b, m.client_urls().to_vec()).await,
        }
    });
    let statuses = futures_util::future::join_all(statuses).await;
    let mut out = vec![
        health_finding(&statuses, voters),
        version_finding(&statuses),
        leader_finding(&statuses),
    ];
    out.extend(raft_finding(&statuses));
    // etcd's minimum lease TTL (1.5 × election timeout, rounded up to seconds): it raises a
    // lease of 1 s to it. The probe carries nothing (and expires within a second or two).
    let probe = b.grant(Duration::from_secs(1)).await?;
    b.revoke_in_background(probe.id);
    let min_ttl = Duration::from_secs(probe.ttl.unsigned_abs());
    out.push(lease_finding(min_ttl, b.watchdog_lease));
    out.push(b.transport.clone());
    out.push(clock_not_checked("etcd has no API that tells its clock; locks do not depend on it (etcd counts a lease on the leader's monotonic clock from when it applied the request, dlock on the local CLOCK_BOOTTIME from before sending it; only clock rates matter); run NTP anyway so that logs agree"));
    Ok(out)
}

/// What a member answered to `Status`, as the findings read it.
#[derive(Debug, Clone, Default)]
struct Status {
    version: String,
    leader: u64,
    raft_index: u64,
    errors: Vec<String>,
}

/// One member: its name (its id in hex when it has none), its id, and its status or why it
/// has none.
struct MemberStatus {
    name: String,
    id: u64,
    status: std::result::Result<Status, String>,
}

async fn member_status(b: &EtcdBackend, urls: Vec<String>) -> std::result::Result<Status, String> {
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
        let st = c.status().await.map_err(|e| e.to_string())?;
        Ok(Status {
            version: st.version().to_owned(),
            leader: st.leader(),
            raft_index: st.raft_index(),
            errors: st.errors().to_vec(),
        })
    };
    let limit = b.op_timeout + b.connect_timeout;
    (tokio::time::timeout(limit, connect).await)
        .unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}

/// Health: every member answers, without errors (alarms are reported here: NOSPACE makes
/// the cluster refuse writes, CORRUPT means members disagree on the data).
fn health_finding(statuses: &[MemberStatus], voters: usize) -> Finding {
    let down: Vec<_> = (statuses.iter())
        .filter_map(|s| Some(format!("{} ({})", s.name, s.status.as_ref().err()?)))
        .collect();
    let errors: Vec<_> = answered(statuses)
        .filter(|(_, st)| !st.errors.is_empty())
        .map(|(name, st)| format!("{name}: {}", st.errors.join("; ")))
        .collect();
    let (n, up) = (statuses.len(), statuses.len() - down.len());
    let (severity, message) = if !errors.is_empty() {
        (
            Severity::Unsafe,
            format!("members report errors: {}; an alarm (NOSPACE: the cluster refuses every write, so no lock can be taken or moved; CORRUPT: members disagree on the data, so a lock can be granted twice) must be fixed first (`etcdctl alarm list`, defragment/compact or restore the member, then `etcdctl alarm disarm`)", errors.join(", ")),
        )
    } else if down.is_empty() {
        (Severity::Ok, format!("all {n} members answer"))
    } else if up * 2 > voters.max(1) {
        (
            Severity::Warning,
            format!("{} of {n} members do not answer: {}; the cluster still has a quorum, but one more failure stops every lock; restart or replace them (`etcdctl member list`, `etcdctl endpoint health --cluster`)", down.len(), down.join(", ")),
        )
    } else {
        (
            Severity::Unsafe,
            format!("only {up} of {n} members answer ({}): without a quorum no lock can be taken, renewed or released, and every holder loses its lock at its lease's end; bring members back", down.join(", ")),
        )
    };
    Finding::new(severity, "members", message)
}

/// The members that answered, with their status.
fn answered(statuses: &[MemberStatus]) -> impl Iterator<Item = (&str, &Status)> + Clone {
    (statuses.iter()).filter_map(|s| Some((s.name.as_str(), s.status.as_ref().ok()?)))
}

/// Version: every answering member runs an etcd whose transactions compare key ranges. The
/// member reported is the worst: one too old, else one whose version does not read, else the
/// oldest.
fn version_finding(statuses: &[MemberStatus]) -> Finding {
    let worst = |st: &Status| match parse_version(&st.version) {
        Some(v) if v < MIN_VERSION => (0, v),
        None => (1, MIN_VERSION),
        Some(v) => (2, v),
    };
    let oldest = answered(statuses).min_by_key(|(_, st)| worst(st));
    let version = oldest.map_or_else(String::new, |(name, st)| {
        format!("{} on {name}", st.version)
    });
    operator::version_finding(
        "etcd",
        &version,
        MIN_VERSION,
        "the acquire transaction's key-range comparison (\"nobody queued\")",
        "an older etcd ignores it, so every acquire would succeed and a lock be granted twice",
    )
}

/// Leader: the answering members agree on one leader, which is a member.
fn leader_finding(statuses: &[MemberStatus]) -> Finding {
    let mut leaders: Vec<u64> = answered(statuses).map(|(_, st)| st.leader).collect();
    leaders.sort_unstable();
    leaders.dedup();
    let name_of = |id: u64| {
        statuses.iter().find(|s| s.id == id).map_or_else(
            || format!("{id:x} (not a listed member)"),
            |s| s.name.clone(),
        )
    };
    let (severity, message) = match leaders.as_slice() {
        [] => (Severity::Unsafe, "no member answered, so no leader is known; no lock can be taken or renewed".to_owned()),
        [0] => (Severity::Unsafe, "the members have no leader: no lock can be taken, renewed or released until one is elected; check the members' logs and the network between them (peer URLs)".to_owned()),
        [l] if statuses.iter().any(|s| s.id == *l) => (
            Severity::Ok,
            format!("leader {}, agreed by every answering member", name_of(*l)),
        ),
        [l] => (Severity::Warning, format!("the leader {} is not in the member list: a membership change in progress?", name_of(*l))),
        many => (Severity::Warning, format!("the members do not agree on the leader ({}): an election in progress or a partitioned member; etcd keeps this safe (writes need a quorum), but run `doctor` again and check the network if it persists", many.iter().map(|l| if *l == 0 { "none".to_owned() } else { name_of(*l) }).collect::<Vec<_>>().join(", "))),
    };
    Finding::new(severity, "leader", message)
}

/// Raft index spread: a member far behind the others serves stale reads of nothing dlock
/// uses (its reads are linearizable), but is one failure from a lost quorum.
fn raft_finding(statuses: &[MemberStatus]) -> Option<Finding> {
    let indexes = answered(statuses).map(|(name, st)| (name, st.raft_index));
    let lo = indexes.clone().min_by_key(|i| i.1)?;
    let hi = indexes.max_by_key(|i| i.1)?;
    let spread = hi.1 - lo.1;
    let (severity, message) = if spread > RAFT_SPREAD_WARN {
        (
            Severity::Warning,
            format!("member {} is {spread} raft entries behind {} (more than {RAFT_SPREAD_WARN}): a slow disk or network; it does not count towards a quorum until it catches up, so one more failure can stop every lock; check its disk (fsync latency) and network", lo.0, hi.0),
        )
    } else {
        (
            Severity::Ok,
            format!("raft indexes within {spread} of each other"),
        )
    };
    Some(Finding::new(severity, "raft-index", message))
}

/// The `lease` finding for etcd's minimum lease TTL `min_ttl` against the watchdog `lease`.
fn lease_finding(min_ttl: Duration, lease: Duration) -> Finding {
    // 1.5 × election timeout, rounded up: the election takes at least min_ttl / 1.5 − 1 s.
    let election = min_ttl.mul_f64(2.0 / 3.0);
    let (severity, message) = if min_ttl > lease {
        (
            Severity::Warning,
            format!("etcd's minimum lease TTL is {min_ttl:?} (1.5 × its election timeout), longer than the watchdog lease {lease:?}: every lease is rounded up to it (never shorter, so locks stay safe), but a crashed holder's lock stays blocked {min_ttl:?}; raise the watchdog lease to at least {min_ttl:?}, or lower etcd's --election-timeout"),
        )
    } else if lease < election * 2 {
        (
            Severity::Warning,
            format!("the watchdog lease {lease:?} is short against etcd's election timeout (about {election:?}, from the minimum lease TTL {min_ttl:?}): renewals fail during a leader election, and a lease shorter than two elections can be lost to one (a lost signal, never a double grant); use a watchdog lease of at least {:?}", election * 3),
        )
    } else {
        (
            Severity::Ok,
            format!("watchdog lease {lease:?}, etcd's minimum lease TTL {min_ttl:?}: renewals ride out a leader election"),
        )
    };
    Finding::new(severity, "lease", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, leader: u64, raft_index: u64, version: &str) -> MemberStatus {
        let status = Status {
            version: version.into(),
            leader,
            raft_index,
            errors: Vec::new(),
        };
        let name = format!("m{id}");
        MemberStatus {
            name,
            id,
            status: Ok(status),
        }
    }

    fn down(id: u64) -> MemberStatus {
        let (name, status) = (format!("m{id}"), Err("refused".into()));
        MemberStatus { name, id, status }
    }

    #[test]
    fn findings_of_what_the_members_said() {
        use Severity::{Ok, Unsafe, Warning};
        let three = [
            member(1, 1, 10, "3.5.9"),
            member(2, 1, 12, "3.5.9"),
            member(3, 1, 9, "3.5.9"),
        ];
        let severities = |s: &[MemberStatus]| {
            let raft = raft_finding(s).map(|f| f.severity);
            (
                health_finding(s, s.len()).severity,
                version_finding(s).severity,
                leader_finding(s).severity,
                raft,
            )
        };
        assert_eq!(severities(&three), (Ok, Ok, Ok, Some(Ok)));
        let one_down = [
            member(1, 1, 10, "3.5.9"),
            member(2, 1, 10, "3.5.9"),
            down(3),
        ];
        assert_eq!(severities(&one_down).0, Warning);
        let two_down = [member(1, 1, 10, "3.5.9"), down(2), down(3)];
        assert_eq!(severities(&two_down).0, Unsafe);
        let mut alarm = member(1, 1, 10, "3.5.9");
        alarm
            .status
            .as_mut()
            .map(|s| s.errors.push("NOSPACE".into()))
            .ok();
        assert_eq!(severities(&[alarm]).0, Unsafe);
        assert_eq!(severities(&[member(1, 1, 10, "3.2.32")]).1, Unsafe);
        assert!(parse_version("3.2.32").is_some_and(|v| v < MIN_VERSION));
        // A member too old is reported before one whose version does not read.
        let mixed = [member(1, 1, 10, "garbage"), member(2, 1, 10, "3.2.32")];
        assert_eq!(severities(&mixed).1, Unsafe);
        let unread = [member(1, 1, 10, "3.5.9"), member(2, 1, 10, "garbage")];
        assert_eq!(severities(&unread).1, Warning);
        assert_eq!(severities(&[member(1, 0, 10, "3.5.9")]).2, Unsafe);
        assert_eq!(severities(&[member(1, 7, 10, "3.5.9")]).2, Warning);
        let split = [member(1, 1, 10, "3.5.9"), member(2, 2, 10, "3.5.9")];
        assert_eq!(severities(&split).2, Warning);
        assert_eq!(severities(&[down(1)]).2, Unsafe);
        assert_eq!(raft_finding(&[down(1)]).map(|f| f.severity), None);
        let lagging = [
            member(1, 1, 10, "3.5.9"),
            member(2, 1, 10 + RAFT_SPREAD_WARN + 1, "3.5.9"),
        ];
        assert_eq!(severities(&lagging).3, Some(Warning));
    }

    #[test]
    fn the_watchdog_lease_against_the_minimum_ttl() {
        let s = |min, lease| {
            lease_finding(Duration::from_secs(min), Duration::from_secs(lease)).severity
        };
        assert_eq!(s(2, 30), Severity::Ok);
        assert_eq!(s(5, 3), Severity::Warning, "rounded up to the minimum");
        assert_eq!(s(3, 3), Severity::Warning, "shorter than two elections");
    }
}
