//! Elections on a real ensemble: the `LeaderLatch` layout, proclamations numbered by the data
//! version, observers woken by watches, cancelled campaigns leaving nothing behind.

use distlock_core::{
    AcquireReply, AcquireRequest, Backend, Client, HoldKey, LockKind, LostSignal, ReleaseOutcome,
    RenewOutcome,
};
use distlock_testkit::conformance::{fast_opts, unique_name, wait_for_waiters};
use distlock_testkit::ZkEnsemble;
use distlock_zookeeper::{lock_dir, ZkBackend};
use std::time::{Duration, Instant};

mod common;
use common::shared_client;

async fn client() -> Client {
    shared_client(fast_opts()).await
}

async fn operator() -> zookeeper_client::Client {
    zookeeper_client::Client::connect(&ZkEnsemble::shared().connect_string())
        .await
        .expect("operator session")
}

fn election_dir(name: &str) -> String {
    lock_dir("dlock", name, LockKind::Election).expect("dir")
}

/// Waits (at most 10 s) until the election directory has `n` children.
async fn wait_children(zk: &zookeeper_client::Client, dir: &str, n: usize) -> Vec<String> {
    let t = Instant::now();
    loop {
        let c = match zk.list_children(dir).await {
            Ok(c) => c,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => panic!("list {dir}: {e}"),
        };
        if c.len() == n {
            return c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{dir} has {c:?}, expected {n} children"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_layout_and_takeover() {
    let a = client().await;
    let b = client().await;
    let name = unique_name("el-basic");
    let ea = a.election(&name).expect("election");
    let eb = b.election(&name).expect("election");
    assert_eq!(ea.leader().await.expect("leader"), None);
    let la = ea.campaign("10.0.0.1:80").await.expect("campaign");
    let t1 = la.fencing_token();

    // The node: in the election root, Curator's name shape, the value alone as data.
    let zk = operator().await;
    let dir = election_dir(&name);
    assert_eq!(dir, format!("/dlock-election/{name}"));
    let children = wait_children(&zk, &dir, 1).await;
    assert!(
        children[0].starts_with("_c_") && children[0].contains("-latch-"),
        "{children:?}"
    );
    let (data, stat) = zk
        .get_data(&format!("{dir}/{}", children[0]))
        .await
        .expect("data");
    assert_eq!(data, b"10.0.0.1:80");
    assert_eq!(u64::try_from(stat.czxid).expect("czxid"), t1);
    // The mutex of the same name is untouched.
    assert!(!a.inspect(&name).await.expect("inspect").held());

    let l = eb.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (l.owner.as_str(), l.value.as_str(), l.fencing_token),
        (ea.owner(), "10.0.0.1:80", t1)
    );
    assert!(eb.try_campaign("b").await.expect("try").is_none());
    let waiting = tokio::spawn(async move {
        let r = eb
            .campaign_timeout("10.0.0.2:80", Duration::from_secs(20))
            .await;
        (r, Instant::now())
    });
    wait_for_waiters(&a, &name, LockKind::Election, 1).await;
    let info = a
        .inspect_kind(&name, LockKind::Election)
        .await
        .expect("inspect");
    assert_eq!((info.holders.len(), info.waiters), (1, Some(1)), "{info:?}");

    let resigned_at = Instant::now();
    assert_eq!(la.resign().await.expect("resign"), ReleaseOutcome::Released);
    let (lb, at) = waiting.await.expect("join");
    let lb = lb.expect("b leads after a resigned");
    // Woken by the watch on its predecessor: 5 s is generous on a loaded machine.
    assert!(
        at - resigned_at < Duration::from_secs(5),
        "{:?}",
        at - resigned_at
    );
    assert!(lb.fencing_token() > t1);
    let l = ea.leader().await.expect("leader").expect("a leader");
    assert_eq!(
        (l.value.as_str(), l.fencing_token),
        ("10.0.0.2:80", lb.fencing_token())
    );
    lb.resign().await.expect("resign");
    wait_children(&zk, &dir, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_see_leaders_and_values() {
    let a = client().await;
    let b = client().await;
    let name = unique_name("el-observe");
    let mut obs = b.election(&name).expect("election").observe();
    assert_eq!(obs.next().await.expect("first"), None);
    let ea = a.election(&name).expect("election");
    let la = ea.campaign("one").await.expect("campaign");
    let within = Duration::from_secs(10);
    let l = tokio::time::timeout(within, obs.next())
        .await
        .expect("no change seen")
        .expect("next")
        .expect("a leader");
    assert_eq!((l.owner.as_str(), l.value.as_str()), (ea.owner(), "one"));
    la.proclaim("two").await.expect("proclaim");
    assert_eq!(la.value(), "two");
    let l = tokio::time::timeout(within, obs.next())
        .await
        .expect("no change seen")
        .expect("next")
        .expect("a leader");
    assert_eq!(
        (l.value.as_str(), l.fencing_token),
        ("two", la.fencing_token())
    );
    la.resign().await.expect("resign");
    let l = tokio::time::timeout(within, obs.next())
        .await
        .expect("no change seen")
        .expect("next");
    assert_eq!(l, None);
}

/// A proclamation retried, duplicated or arriving late has the effect of one: the number of
/// the last one is recorded with its value, and a number at or below it changes nothing. The
/// candidate's node keeps the value it campaigned with (Curator's waiters watch its data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclamations_are_numbered() {
    let opts = fast_opts();
    let backend = ZkBackend::connect(&ZkEnsemble::shared().url(), &opts)
        .await
        .expect("connect");
    let name = unique_name("el-proclaim");
    let key = HoldKey {
        name: name.as_str().into(),
        owner: "proclaimer".into(),
        kind: LockKind::Election,
    };
    let mut req = AcquireRequest::new(key, Duration::from_secs(1), LostSignal::new());
    req.value = Some("v0".into());
    let token = match backend.acquire(&req).await.expect("acquire") {
        AcquireReply::Granted { token } => token,
        other => panic!("not granted: {other:?}"),
    };
    let grant = req.grant(token);
    let zk = operator().await;
    let dir = election_dir(&name);
    let node = format!("{dir}/{}", wait_children(&zk, &dir, 1).await[0]);
    let client = Client::new(std::sync::Arc::new(backend.clone()), opts).expect("client");
    let election = client.election(&name).expect("election");
    let read = || async {
        let (data, stat) = zk.get_data(&dir).await.expect("data");
        let l = election.leader().await.expect("leader").expect("a leader");
        assert_eq!(l.fencing_token == token, l.owner == "proclaimer", "{l:?}");
        (
            String::from_utf8(data).expect("utf-8"),
            stat.version,
            l.value,
        )
    };
    assert_eq!(read().await, (String::new(), 0, "v0".into()));
    let p = |seq, v: &'static str| backend.proclaim(&grant, seq, v);
    let rec = |seq: u64, v: &str| format!("{token}\n{seq}\n{v}");
    assert_eq!(p(1, "v1").await.expect("1"), RenewOutcome::Renewed);
    // The retry of 1 (its answer lost): nothing changes.
    assert_eq!(p(1, "v1").await.expect("1 again"), RenewOutcome::Renewed);
    assert_eq!(read().await, (rec(1, "v1"), 1, "v1".into()));
    assert_eq!(p(2, "v2").await.expect("2"), RenewOutcome::Renewed);
    // A late duplicate of 1 after 2: ignored.
    assert_eq!(p(1, "v1").await.expect("late 1"), RenewOutcome::Renewed);
    assert_eq!(read().await, (rec(2, "v2"), 2, "v2".into()));
    // A gap (3 and 4 never arrived), then 4 late.
    assert_eq!(
        p(5, "v5\nwith a line break").await.expect("5"),
        RenewOutcome::Renewed
    );
    assert_eq!(p(4, "v4").await.expect("late 4"), RenewOutcome::Renewed);
    assert_eq!(
        read().await,
        (
            rec(5, "v5\nwith a line break"),
            3,
            "v5\nwith a line break".into()
        )
    );
    // The node's own data is untouched.
    let (data, stat) = zk.get_data(&node).await.expect("node");
    assert_eq!((data.as_slice(), stat.version), (&b"v0"[..], 0));

    // After the node is gone, a proclamation says so and changes nothing; the next leader
    // advertises its own value, not the stale record.
    assert_eq!(
        backend.release(&grant).await.expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(p(6, "x").await.expect("gone"), RenewOutcome::NotHeld);
    wait_children(&zk, &dir, 0).await;
    let l = election.campaign("next").await.expect("campaign");
    assert_eq!(read().await.2, "next");
    l.resign().await.expect("resign");
}

/// A campaign dropped while it waits deletes its node; a try that finds a leader leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaign_leaves_nothing() {
    let a = client().await;
    let b = client().await;
    let name = unique_name("el-cancel");
    let la = a
        .election(&name)
        .expect("election")
        .campaign("a")
        .await
        .expect("campaign");
    let zk = operator().await;
    let dir = election_dir(&name);
    let eb = b.election(&name).expect("election");
    assert!(eb.try_campaign("b").await.expect("try").is_none());
    wait_children(&zk, &dir, 1).await;
    let campaign = tokio::spawn({
        let eb = eb.clone();
        async move { eb.campaign("b").await }
    });
    wait_for_waiters(&a, &name, LockKind::Election, 1).await;
    wait_children(&zk, &dir, 2).await;
    campaign.abort();
    let _ = campaign.await;
    wait_children(&zk, &dir, 1).await;
    // A timed-out campaign too.
    let e = eb
        .campaign_timeout("b", Duration::from_millis(300))
        .await
        .expect_err("a leads");
    assert!(e.is_timeout(), "{e}");
    wait_children(&zk, &dir, 1).await;
    la.resign().await.expect("resign");
    wait_children(&zk, &dir, 0).await;
}

/// `dlock list` shows elections (leader, value, candidates); `release --force` puts the
/// leader out: its lost signal fires, the next candidate leads with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_force_release() {
    let a = client().await;
    let b = client().await;
    let name = unique_name("el-ops");
    let la = a
        .election(&name)
        .expect("election")
        .campaign("first")
        .await
        .expect("campaign");
    let eb = b.election(&name).expect("election");
    let waiting = tokio::spawn({
        let eb = eb.clone();
        async move { eb.campaign_timeout("second", Duration::from_secs(20)).await }
    });
    wait_for_waiters(&a, &name, LockKind::Election, 1).await;
    let listed = b.list(&name).await.expect("list");
    let e = listed
        .iter()
        .find(|l| l.kind == LockKind::Election)
        .unwrap_or_else(|| panic!("no election listed: {listed:?}"));
    assert_eq!(e.info.name, name);
    assert_eq!(e.info.holders[0].value.as_deref(), Some("first"));
    assert_eq!(
        (e.info.fencing_token, e.info.waiters),
        (la.fencing_token(), Some(1))
    );
    assert!(
        !listed.iter().any(|l| l.kind == LockKind::Mutex),
        "an election is no mutex: {listed:?}"
    );

    let forced = b
        .force_release(&name, LockKind::Election)
        .await
        .expect("force");
    assert_eq!(forced.removed.len(), 1);
    assert_eq!(forced.removed[0].owner, la.owner());
    assert!(forced.fencing_token > la.fencing_token());
    let lb = waiting
        .await
        .expect("join")
        .expect("the next candidate leads");
    // Queued before the forced release, so its node's czxid may be below the reported
    // counter; it is above the forced-out leader's.
    assert!(lb.fencing_token() > la.fencing_token());
    tokio::time::timeout(Duration::from_secs(10), la.lost())
        .await
        .expect("the forced-out leader never learned it");
    assert!(la.proclaim("still?").await.is_err());
    assert_eq!(
        eb.leader().await.expect("leader").map(|l| l.value),
        Some("second".to_owned())
    );
    lb.resign().await.expect("resign");
}
