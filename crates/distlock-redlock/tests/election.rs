//! Redlock elections under node failures, on real redis-servers: a leader keeps leading on the
//! majority left when a node is killed; a leader whose majority is lost gets its lost signal,
//! and once the nodes come back (empty) a new leader is elected with a higher token.

mod common;

use common::{opts, Cluster};
use distlock_core::{Client, Election, Leader, Observer, ReleaseOutcome};
use std::time::{Duration, Instant};

const P: &str = "quarantine=500ms";

fn election(c: &Client, name: &str, owner: &str) -> Election {
    c.election(name)
        .expect("election")
        .with_owner(owner)
        .expect("owner")
}

/// Whether node `i` has a hold of election `name`.
fn has_election(c: &Cluster, i: usize, name: &str) -> bool {
    c.servers[i]
        .command(&["EXISTS", &format!("dlock:{{{name}}}:election")])
        .expect("EXISTS")
        == "1"
}

/// Waits until every node in `idx` has the election's hold (the slower nodes' votes finish in
/// the background after a majority decided).
async fn wait_elected_on(c: &Cluster, idx: &[usize], name: &str) {
    let t = Instant::now();
    while idx.iter().any(|&i| !has_election(c, i, name)) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "not every node got the hold of {name}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next observed change that `pred` accepts, within 10 s.
async fn observed(o: &mut Observer, pred: impl Fn(&Option<Leader>) -> bool) -> Option<Leader> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let l = o.next().await.expect("observe");
            if pred(&l) {
                return l;
            }
        }
    })
    .await
    .expect("the change was never observed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_survives_a_killed_node() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let name = "kept-leader";
    let a = c.client(P, opts(1000)).await;
    let b = c.client(P, opts(1000)).await;
    let (ea, eb) = (election(&a, name, "a"), election(&b, name, "b"));
    let l = ea
        .try_campaign("a0")
        .await
        .expect("campaign")
        .expect("a fresh election has a leader");
    wait_elected_on(&c, &[0, 1, 2], name).await;
    let mut o = eb.observe();
    let first = observed(&mut o, |_| true).await.expect("a leader");
    assert_eq!((first.owner.as_str(), first.value.as_str()), ("a", "a0"));
    assert_eq!(first.fencing_token, l.fencing_token());

    c.servers[0].kill();
    let killed = Instant::now();
    // Proclaimed on the two nodes left (a majority), and observed through them.
    l.proclaim("a1").await.expect("proclaim with a node down");
    let seen = observed(&mut o, |l| l.as_ref().is_some_and(|l| l.value == "a1"))
        .await
        .expect("a leader");
    assert_eq!(seen.owner, "a");
    assert_eq!(seen.fencing_token, l.fencing_token());
    // Renewed by the survivors through more than two leases: still the leader.
    tokio::time::sleep(Duration::from_millis(2500).saturating_sub(killed.elapsed())).await;
    assert!(!l.is_lost(), "{:?}", l.lost_signal().reason());
    assert!(eb.try_campaign("b0").await.expect("try").is_none());
    let now = eb.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (now.owner.as_str(), now.value.as_str(), now.fencing_token),
        ("a", "a1", l.fencing_token())
    );

    // A waiting candidate takes over at the resignation, with a higher token.
    let old = l.fencing_token();
    let cand = {
        let b = b.clone();
        tokio::spawn(async move {
            election(&b, name, "b")
                .campaign_timeout("b0", Duration::from_secs(10))
                .await
        })
    };
    let t = Instant::now();
    while c.queued_on_election(1, name) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "b never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(l.resign().await.expect("resign"), ReleaseOutcome::Released);
    let lb = cand
        .await
        .expect("join")
        .expect("b leads after the resignation");
    assert!(lb.fencing_token() > old, "{} <= {old}", lb.fencing_token());
    let next = observed(&mut o, |l| l.as_ref().is_some_and(|l| l.owner == "b"))
        .await
        .expect("a leader");
    assert_eq!(next.fencing_token, lb.fencing_token());
    assert_eq!(lb.resign().await.expect("resign"), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_majority_ends_the_leadership_then_a_new_leader_follows() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let name = "lost-majority";
    let a = c.client(P, opts(1000)).await;
    let (b, bb) = c.client_and_backend(P, opts(1000)).await;
    let (ea, eb) = (election(&a, name, "a"), election(&b, name, "b"));
    let l = ea
        .try_campaign("a0")
        .await
        .expect("campaign")
        .expect("a fresh election has a leader");
    wait_elected_on(&c, &[0, 1, 2], name).await;
    let old = l.fencing_token();

    c.servers[0].kill();
    c.servers[1].kill();
    // One node of three cannot renew it: the lost signal fires by the lease end.
    tokio::time::timeout(Duration::from_secs(5), l.lost())
        .await
        .expect("the leader never learned it lost its majority");
    // Nobody can lead on one node.
    let r = eb.try_campaign("b0").await;
    assert!(!matches!(r, Ok(Some(_))), "elected on one node of three");

    // The nodes come back without their data: the election is free, and the next leader's
    // token is above the old one.
    c.servers[0].restart().expect("restart 0");
    c.servers[1].restart().expect("restart 1");
    // Quarantined before they count again; their election counters are gone, and their votes
    // are floored by their clocks.
    common::wait_recounted(&bb, &c, &[0, 1], Duration::from_secs(15)).await;
    let lb = eb
        .campaign_timeout("b0", Duration::from_secs(20))
        .await
        .expect("a new leader after the nodes returned");
    assert!(lb.fencing_token() > old, "{} <= {old}", lb.fencing_token());
    let seen = ea.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (seen.owner.as_str(), seen.value.as_str(), seen.fencing_token),
        ("b", "b0", lb.fencing_token())
    );
    assert_eq!(lb.resign().await.expect("resign"), ReleaseOutcome::Released);
    drop(l);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_and_force_release_an_election() {
    let c = Cluster::start(3);
    c.settle().await;
    let name = "operated";
    let (a, ab) = c.client_and_backend(P, opts(1000)).await;
    let l = election(&a, name, "a")
        .try_campaign("a0")
        .await
        .expect("campaign")
        .expect("a fresh election has a leader");
    // The lock of the same name, held by someone else, is listed and left alone.
    let g = common::acquired(&a, name).await;
    wait_elected_on(&c, &[0, 1, 2], name).await;
    let listed = distlock_core::Operator::list(&*ab, name)
        .await
        .expect("list");
    let kinds: Vec<_> = listed.iter().map(|l| (l.kind, l.info.held())).collect();
    assert_eq!(
        kinds,
        vec![
            (distlock_core::LockKind::Mutex, true),
            (distlock_core::LockKind::Election, true)
        ],
        "{listed:?}"
    );
    let forced =
        distlock_core::Operator::force_release(&*ab, name, distlock_core::LockKind::Election)
            .await
            .expect("force release");
    assert_eq!(forced.removed.len(), 1, "{forced:?}");
    assert!((0..3).all(|i| !has_election(&c, i, name)));
    assert!(!g.is_lost(), "the lock of the same name was touched");
    tokio::time::timeout(Duration::from_secs(5), l.lost())
        .await
        .expect("the removed leader never learned");
    let next = election(&a, name, "b")
        .try_campaign("b0")
        .await
        .expect("campaign")
        .expect("free after the forced release");
    assert!(next.fencing_token() > l.fencing_token());
    assert_eq!(next.resign().await.expect("r"), ReleaseOutcome::Released);
    assert_eq!(g.release().await.expect("r"), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_publishes_what_it_did_and_an_election_tells_observers() {
    let c = Cluster::start(3);
    c.settle().await;
    let a = c.client(P, opts(1000)).await;
    let publishes = || -> Vec<u64> {
        c.servers
            .iter()
            .map(|s| s.command_calls("publish").expect("INFO commandstats"))
            .collect()
    };
    let delta = |before: &[u64], after: &[u64]| -> Vec<u64> {
        before.iter().zip(after).map(|(b, a)| a - b).collect()
    };
    // A lock: a grant publishes nothing, a release with nobody queued one `r` per node.
    let name = "plain";
    let before = publishes();
    let g = common::acquired(&a, name).await;
    c.wait_held_on(&[0, 1, 2], name, Duration::from_secs(5))
        .await;
    assert_eq!(
        delta(&before, &publishes()),
        vec![0, 0, 0],
        "a lock's grant published"
    );
    assert_eq!(g.release().await.expect("r"), ReleaseOutcome::Released);
    let t = Instant::now();
    while (0..3).any(|i| c.has_lock(i, name)) {
        assert!(t.elapsed() < Duration::from_secs(5), "release never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(delta(&before, &publishes()), vec![1, 1, 1]);
    // An election: each node publishes its grant (`g`) on the observe channel.
    let before = publishes();
    let l = election(&a, "elected", "a")
        .try_campaign("v")
        .await
        .expect("campaign")
        .expect("leads");
    wait_elected_on(&c, &[0, 1, 2], "elected").await;
    let d = delta(&before, &publishes());
    assert!(d.iter().all(|&p| p >= 1), "{d:?}");
    assert_eq!(l.resign().await.expect("r"), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_survives_a_minority_and_reports_a_lost_majority() {
    let mut c = Cluster::start(3);
    c.settle().await;
    let name = "watched";
    let a = c.client(P, opts(1000)).await;
    let b = c.client(P, opts(1000)).await;
    let l = election(&a, name, "a")
        .try_campaign("a0")
        .await
        .expect("campaign")
        .expect("leads");
    wait_elected_on(&c, &[0, 1, 2], name).await;
    let mut o = election(&b, name, "b").observe();
    let first = observed(&mut o, |_| true).await.expect("a leader");
    assert_eq!(first.owner, "a");
    // One subscription broken: the watch goes on with the majority left.
    c.servers[0].kill();
    l.proclaim("a1").await.expect("proclaim");
    observed(&mut o, |l| l.as_ref().is_some_and(|l| l.value == "a1")).await;
    // A majority broken: the observer says so (an error), instead of waiting for changes it
    // can no longer see.
    c.servers[1].kill();
    let r = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let Err(e) = o.next().await {
                return e;
            }
        }
    })
    .await
    .expect("the observer never reported the lost majority");
    assert!(r.is_retryable(), "{r}");
    // The nodes come back: the observer goes on, and sees the leader gone (its lease ended).
    c.servers[0].restart().expect("restart 0");
    c.servers[1].restart().expect("restart 1");
    let t = Instant::now();
    let now = loop {
        match tokio::time::timeout(Duration::from_secs(10), o.next()).await {
            Ok(Ok(now)) => break now,
            Ok(Err(_)) => {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "observer never recovered"
                );
            }
            Err(_) => panic!("no change observed after the nodes returned"),
        }
    };
    assert_eq!(now, None, "the old leader is still reported");
    tokio::time::timeout(Duration::from_secs(5), l.lost())
        .await
        .expect("the leader never learned it lost its majority");
}
